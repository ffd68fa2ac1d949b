"""What every benchmark suite shares (benchmarks/README.md says where the
broker, Redis and asgi_redis come from):

* **the broker**: :func:`provide_broker`, one for the whole run, exported
  to every child process as ``AMQP_URL``/``AMQP_MANAGEMENT_URL``;
* **Redis**: :class:`RedisServer`, the one way to find or start it;
* **asgi_redis's virtualenv**: :func:`redis_python`;
* **worker processes** (:class:`Worker`, JSON lines over a pipe) and **the
  layer's source tree** (:class:`LayerSource`, :func:`apply_layer_source`);
* **result files**: :func:`write_result`, and :func:`rotate`, the order of
  rounds; **redaction**: :func:`redact` is ``asgi_amqp.urls.redact``.

Only the standard library is imported at module level: worker processes in
asgi_redis's virtualenv import this module too.
"""

import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
PROJECT_DIR = os.path.join(ROOT, "tests", "project")  # the chat example project

LAYER_SOURCE_ENV = "BENCH_LAYER_SRC"


def redact(url):
    """``asgi_amqp.urls.redact``: the URL with any password replaced by ``***``."""
    from asgi_amqp.urls import redact as _redact

    return _redact(url)


def package_versions(names):
    """``{name: version}`` of the installed distributions among ``names``."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def say(text=""):
    print(text, flush=True)


def rotate(items, round_no):
    """The order of round ``round_no``: AB, BA, AB, ... (ABC, BCA, CAB for three)."""
    items = list(items)
    if not items:
        return items
    shift = round_no % len(items)
    return items[shift:] + items[:shift]


# -- the broker ------------------------------------------------------------------------


class BrokerInfo(object):
    def __init__(self, amqp_url, management_url, description):
        self.amqp_url = amqp_url
        self.management_url = management_url
        self.description = description


@contextlib.contextmanager
def provide_broker(log=say):
    """A broker for the whole run: ``$AMQP_URL`` when it is set, else a private
    RabbitMQ node (``devtools.rabbitmq.provide_broker``: a Docker container if
    an engine answers, else a node run from the machine's ``rabbitmq-server``).
    ``AMQP_URL`` and ``AMQP_MANAGEMENT_URL`` are set in ``os.environ``
    meanwhile, for children."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from devtools import rabbitmq

    saved = {key: os.environ.get(key) for key in ("AMQP_URL", "AMQP_MANAGEMENT_URL")}
    if not os.environ.get("AMQP_URL"):
        log("starting a private RabbitMQ node (set AMQP_URL to use another broker) ...")
    with rabbitmq.provide_broker() as broker:
        os.environ["AMQP_URL"] = broker.amqp_url
        if broker.management_url:
            os.environ["AMQP_MANAGEMENT_URL"] = broker.management_url
        else:
            os.environ.pop("AMQP_MANAGEMENT_URL", None)
        try:
            yield BrokerInfo(broker.amqp_url, broker.management_url, broker.description)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# -- Redis ------------------------------------------------------------------------------


def redis_ping(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_binary():
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )


class RedisServer(object):
    """``url`` of the Redis to use: ``url``, ``$BENCH_REDIS_URL`` or ``$REDIS_URL``, else one
    answering on 127.0.0.1:6379, else a private ``redis-server`` without persistence, stopped
    by :meth:`stop`. With none, ``url`` is None and ``reason`` says why."""

    def __init__(self, url=None):
        self.url = None
        self.reason = None
        self.private = False
        self._process = None
        self._dir = None
        url = url or os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL")
        if url:
            self.url = url
            return
        if redis_ping("127.0.0.1", 6379):
            self.url = "redis://127.0.0.1:6379/0"
            return
        binary = redis_server_binary()
        if binary is None:
            self.reason = (
                "no Redis answers on 127.0.0.1:6379 and redis-server is not "
                "installed (as root: make redis-deps), or pass --redis-url"
            )
            return
        from devtools.rabbitmq import free_port

        port = free_port()
        self._dir = tempfile.mkdtemp(prefix="bench-redis-")
        self._process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--daemonize",
                "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if redis_ping("127.0.0.1", port):
                self.url = "redis://127.0.0.1:%d/0" % port
                self.private = True
                return
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        self.reason = "a private redis-server on port %d did not answer" % port
        self.stop()

    def describe(self):
        if not self.url:
            return "none (%s)" % self.reason
        return "%s%s" % (redact(self.url), " (private redis-server)" if self.private else "")

    def stop(self):
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


# -- asgi_redis's virtualenv -------------------------------------------------------------------

REDIS_VENV = os.path.join(ROOT, ".venv-redis")
REDIS_REQUIREMENTS = os.path.join(HERE, "requirements-redis.txt")
REDIS_LAYER = "asgi_redis==1.4.3"  # installed --no-deps, see requirements-redis.txt
# What both the layer suite's worker and the Channels suite's stack import.
REDIS_VENV_IMPORTS = "asgi_redis, txredisapi, channels, daphne, msgpack, redis"


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def redis_venv_problem(python):
    """None if ``python`` can run asgi_redis 1.4.3 beside msgpack 1.x, else why not."""
    if not python or not os.access(python, os.X_OK):
        return "no interpreter at %s" % python
    check = "import sys, %s; sys.exit(0 if msgpack.version >= (1,) else 3)" % REDIS_VENV_IMPORTS
    done = subprocess.run(
        [python, "-c", check], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120
    )
    if done.returncode == 3:
        return "%s has msgpack older than 1.0" % python
    if done.returncode != 0:
        return "%s cannot import %s: %s" % (
            python,
            REDIS_VENV_IMPORTS,
            done.stdout.decode("utf-8", "replace").strip().splitlines()[-1:],
        )
    return None


def redis_python(explicit=None, log=say):
    """The Python of asgi_redis's virtualenv: ``explicit`` (``--redis-python``),
    else ``$BENCH_REDIS_PYTHON``, else ``.venv-redis``, made with the recipe of
    ``make redis-venv`` when it is missing. Raises RuntimeError when it cannot
    be used."""
    python = explicit or os.environ.get("BENCH_REDIS_PYTHON")
    if python:
        python = os.path.abspath(python) if os.sep in python else python
        problem = redis_venv_problem(python)
        if problem:
            raise RuntimeError(problem + " (make redis-venv)")
        return python
    python = venv_python(REDIS_VENV)
    if not redis_venv_problem(python):
        return python
    log(
        "making %s for asgi_redis 1.4.3 (the recipe of make redis-venv) ..."
        % os.path.relpath(REDIS_VENV, ROOT)
    )
    if not os.access(python, os.X_OK):
        subprocess.run([sys.executable, "-m", "venv", REDIS_VENV], check=True)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["-r", REDIS_REQUIREMENTS], check=True)
    subprocess.run(pip + ["--no-deps", REDIS_LAYER], check=True)
    problem = redis_venv_problem(python)
    if problem:
        raise RuntimeError(problem)
    with open(os.path.join(REDIS_VENV, ".installed"), "w"):
        pass
    return python


# -- the layer's source tree ---------------------------------------------------------------------


def apply_layer_source():
    """In a child process: import ``asgi_amqp`` from ``$BENCH_LAYER_SRC``.

    ``python -m benchmarks.<module>`` puts this repository first on
    ``sys.path``, ahead of ``PYTHONPATH``, so the tree goes in front of it;
    the ``benchmarks`` package itself is already imported from here. Call it
    before anything imports ``asgi_amqp``."""
    src = os.environ.get(LAYER_SOURCE_ENV)
    if not src:
        return None
    src = os.path.abspath(src)
    if "asgi_amqp" in sys.modules:
        raise RuntimeError("asgi_amqp was imported before the layer's source was chosen")
    sys.path[:] = [src] + [p for p in sys.path if os.path.abspath(p or ".") != src]
    return src


def check_layer_source():
    """The imported ``asgi_amqp``'s directory; raises if it is not from
    ``$BENCH_LAYER_SRC`` (when set)."""
    import asgi_amqp

    where = os.path.dirname(os.path.realpath(asgi_amqp.__file__))
    src = os.environ.get(LAYER_SOURCE_ENV)
    if src and os.path.dirname(where) != os.path.realpath(src):
        raise RuntimeError("asgi_amqp was imported from %s, not from %s" % (where, src))
    return where


def git_revision(root):
    """``abc1234`` (``+local changes`` when asgi_amqp/ differs from HEAD), or None."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "asgi_amqp"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+local changes" if dirty.stdout.strip() else "")


class LayerSource(object):
    """A source tree holding an ``asgi_amqp`` package, for a contestant that
    runs the layer from it in a child process (``--baseline-src``)."""

    def __init__(self, path, label):
        self.path = os.path.abspath(path)
        self.label = label
        if not os.path.isfile(os.path.join(self.path, "asgi_amqp", "__init__.py")):
            raise ValueError("%s holds no asgi_amqp package (asgi_amqp/__init__.py)" % self.path)
        self.revision = git_revision(self.path)

    def describe(self):
        return "%s%s" % (self.path, " (git %s)" % self.revision if self.revision else "")

    def environ(self, base=None):
        """The environment of a child process importing the layer from this tree."""
        env = dict(os.environ if base is None else base)
        env[LAYER_SOURCE_ENV] = self.path
        env["PYTHONPATH"] = os.pathsep.join(
            [self.path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        return env


# -- worker processes ---------------------------------------------------------------------------


class WorkerError(RuntimeError):
    pass


class Worker(object):
    """A ``benchmarks.worker`` subprocess speaking JSON lines (see worker.py)."""

    def __init__(self, python, name="worker", env=None):
        self.name = name
        self.process = subprocess.Popen(
            [python, "-u", "-m", "benchmarks.worker"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def request(self, obj):
        if self.process.poll() is not None:
            raise WorkerError("%s exited with %s" % (self.name, self.process.returncode))
        self.process.stdin.write(json.dumps(obj) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise WorkerError(
                    "%s exited (status %s) during %s"
                    % (self.name, self.process.wait(), obj.get("cmd"))
                )
            reply = json.loads(line)
            if not reply.get("ok"):
                raise WorkerError("%s: %s" % (self.name, reply.get("error")))
            return reply

    def close(self):
        if self.process.poll() is None:
            try:
                self.request({"cmd": "teardown"})
            except (WorkerError, OSError, ValueError) as exc:
                sys.stderr.write("%s teardown: %s\n" % (self.name, exc))
            try:
                self.process.stdin.close()
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- result files ----------------------------------------------------------------------------------


def machine_line():
    load = os.getloadavg()
    return "%s, %s, Python %s, %d CPUs, load average %.2f" % (
        platform.node(),
        platform.platform(),
        platform.python_version(),
        os.cpu_count(),
        load[0],
    )


def write_result(results_dir, name, title, body, data=None, command=None):
    """``results_dir/<name>.md`` (a title, when and where, then ``body``) and,
    with ``data``, ``<name>.json``; returns the paths written."""
    os.makedirs(results_dir, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    text = "# %s\n\n`%s`, %s (UTC); %s; asgi_amqp git %s.\n\n%s\n" % (
        title,
        command or "python -m benchmarks",
        now.strftime("%Y-%m-%d %H:%M"),
        machine_line(),
        git_revision(ROOT) or "?",
        body.rstrip(),
    )
    paths = [os.path.join(results_dir, name + ".md")]
    with open(paths[0], "w") as handle:
        handle.write(text)
    if data is not None:
        paths.append(os.path.join(results_dir, name + ".json"))
        with open(paths[1], "w") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.write("\n")
    return paths


class SuiteResult(object):
    """What a suite hands back to the entry point: its exit status, its
    headline (markdown) and where it wrote its results."""

    def __init__(self, status=0, headline="", paths=(), note=""):
        self.status = status
        self.headline = headline
        self.paths = list(paths)
        self.note = note
        self.elapsed = None


class Context(object):
    """What the entry point gives every suite: the broker, Redis and asgi_redis's Python
    (each resolved once, at first use), the baseline tree, the results directory."""

    def __init__(self, args, broker, command):
        self.args = args
        self.amqp_url = broker.amqp_url
        self.management_url = broker.management_url
        self.command = command
        self.results = args.results
        self.progress = not args.no_progress
        self.baseline = args.baseline
        self._redis = None
        self._redis_python = None

    @property
    def redis(self):
        """The ``RedisServer`` of the run (found or started at first use)."""
        if self._redis is None:
            self._redis = RedisServer(self.args.redis_url)
            say("redis: %s" % self._redis.describe())
        return self._redis

    def redis_python(self):
        """(python, None) for asgi_redis's virtualenv, or (None, why not)."""
        if self._redis_python is None:
            try:
                self._redis_python = (redis_python(self.args.redis_python), None)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                self._redis_python = (None, str(exc))
                say("asgi_redis is left out: %s" % exc)
        return self._redis_python

    def close(self):
        if self._redis is not None:
            self._redis.stop()
