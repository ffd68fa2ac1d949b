"""Run the chat project for real: one daphne and N ``manage.py runworker``
processes on asgi_amqp, as child processes of the caller.

Used by ``examples/chat_demo.py`` (``make demo``), the end-to-end tests
(``tests/e2e``) and ``benchmarks/channels_bench.py``. Standard library only,
but for ``devtools.rabbitmq.free_port`` (from the repository, also standard
library only).

* Every child runs in its own session (a ^C in the terminal reaches only the
  caller, which then stops the children in order) and gets SIGTERM from the
  kernel if the thread that started it dies (``PR_SET_PDEATHSIG``), so
  nothing outlives a killed caller. Start stacks from the main thread.
* Children are only ever signalled by their own pid, never by name.
* Each child's output goes to ``<log_dir>/<name>.log`` and is kept in memory
  for :meth:`Proc.wait_for_line`; ``echo=True`` also prints it, prefixed.
* Every wait has a deadline; :class:`StackError` says which and shows the
  child's last lines.
"""

import base64
import collections
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

PROJECT_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(PROJECT_DIR))
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

from devtools.rabbitmq import free_port  # noqa: E402  (re-exported: chatstack.free_port)

NATIVE_MODE_LINE = "Using native Twisted mode on channel layer"
BUSY_LOOP_LINE = "Using busy-loop synchronous mode on channel layer"
WORKER_READY_LINE = "Listening on channels"

_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    pass


def _child_setup():
    """In the child, before exec: die with the parent (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


class Proc(object):
    """One child process: its Popen, its output lines and its log file."""

    def __init__(self, name, argv, env, cwd, log_path, echo=False):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.echo = echo
        self._lines = collections.deque(maxlen=5000)
        self._cond = threading.Condition()
        self._log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
        self.popen = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_child_setup if sys.platform.startswith("linux") else None,
        )
        self.pid = self.popen.pid
        self.started = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="read-%s" % name, daemon=True)
        self._reader.start()

    def __repr__(self):
        return "<Proc %s pid %d %s>" % (
            self.name,
            self.pid,
            "running" if self.alive() else "rc=%s" % self.popen.poll(),
        )

    def _read(self):
        stream = self.popen.stdout
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with contextlib.suppress(ValueError):
                self._log.write(line + "\n")
            if self.echo:
                print("  [%s] %s" % (self.name, line), flush=True)
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        stream.close()
        with self._cond:
            self._cond.notify_all()
        with contextlib.suppress(Exception):
            self._log.close()

    def alive(self):
        return self.popen.poll() is None

    def lines(self):
        with self._cond:
            return list(self._lines)

    def has_line(self, text):
        return any(text in line for line in self.lines())

    def tail(self, count=25):
        return "\n".join("    " + line for line in self.lines()[-count:])

    def wait_for_line(self, text, timeout):
        """Wait until a line containing ``text`` was printed; StackError at ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if any(text in line for line in self._lines):
                    return
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise StackError(
                        "%s exited (rc %s) before printing %r:\n%s"
                        % (self.name, self.popen.returncode, text, self.tail())
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StackError(
                        "%s did not print %r within %.0f s:\n%s"
                        % (self.name, text, timeout, self.tail())
                    )
                self._cond.wait(min(remaining, 0.2))

    def signal(self, signum):
        """Send ``signum`` to this child, by pid, if it is still ours and running."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def wait(self, timeout):
        """Wait for the child to exit; its return code, or None at ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit code."""
        self.signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            self.signal(signal.SIGKILL)
            rc = self.wait(5.0)
        self._reader.join(5.0)
        return rc

    def kill(self):
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        rc = self.wait(10.0)
        self._reader.join(5.0)
        return rc


class ChatStack(object):
    """daphne + ``workers`` runworker processes serving ``tests/project``.

    :param amqp_url: the broker (``AMQP_URL`` of the children), or a list of
        a cluster's nodes, tried in that order (comma-separated in ``AMQP_URL``).
    :param management_url: its management API, or None.
    :param prefix: the layer prefix (``CHAT_LAYER_PREFIX``); use a fresh one
        per stack when several share a broker.
    :param port: daphne's port on ``host``; default a free one.
    :param settings: ``DJANGO_SETTINGS_MODULE`` of the children.
    :param env: extra environment for the children (e.g. ``CHAT_TEST_HOOKS``).
    :param daphne_args: extra daphne arguments (e.g. ``["--force-sync"]``).
    :param python: interpreter for the children (default: this one).
    :param worker_args: extra ``runworker`` arguments (e.g. ``["--threads", "4"]``);
        an attribute, read by each worker started later.
    """

    def __init__(
        self,
        amqp_url,
        management_url=None,
        prefix="chat",
        workers=2,
        port=None,
        host="127.0.0.1",
        settings="chatproject.settings",
        env=None,
        daphne_args=(),
        python=None,
        log_dir=None,
        echo=False,
        verbosity=1,
        worker_args=(),
    ):
        self.amqp_urls = [amqp_url] if isinstance(amqp_url, str) else list(amqp_url)
        self.amqp_url = self.amqp_urls[0]
        self.management_url = management_url
        self.prefix = prefix
        self.n_workers = workers
        self.host = host
        self.port = port or free_port(host)
        self.settings = settings
        self.extra_env = dict(env or {})
        self.daphne_args = list(daphne_args)
        self.python = python or sys.executable
        self.echo = echo
        self.verbosity = verbosity
        self.worker_args = list(worker_args)
        self._own_dir = tempfile.mkdtemp(prefix="chatstack-")
        self.state_dir = os.path.join(self._own_dir, "state")
        self.log_dir = log_dir or os.path.join(self._own_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.daphne = None
        self.workers = []
        self.retired = []  # processes stopped or killed while the stack ran
        self._counter = 0
        self.mode = None

    # -- addresses -----------------------------------------------------------

    @property
    def base_url(self):
        return "http://%s:%d" % (self.host, self.port)

    def ws_url(self, path):
        return "ws://%s:%d%s" % (self.host, self.port, path)

    # -- processes -------------------------------------------------------------

    def environ(self):
        env = dict(os.environ)
        env.update(
            {
                "AMQP_URL": ",".join(self.amqp_urls),
                "CHAT_LAYER_PREFIX": self.prefix,
                "CHAT_STATE_DIR": self.state_dir,
                "DJANGO_SETTINGS_MODULE": self.settings,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    [PROJECT_DIR, REPO_ROOT] + [p for p in [env.get("PYTHONPATH")] if p]
                ),
            }
        )
        if self.management_url:
            env["AMQP_MANAGEMENT_URL"] = self.management_url
        else:
            env.pop("AMQP_MANAGEMENT_URL", None)
        env.update(self.extra_env)
        return env

    def _spawn(self, name, argv):
        return Proc(
            name,
            argv,
            self.environ(),
            PROJECT_DIR,
            os.path.join(self.log_dir, name + ".log"),
            echo=self.echo,
        )

    def start_daphne(self):
        argv = [
            self.python,
            "-c",
            "import sys; sys.argv[0] = 'daphne'; "
            "from daphne.cli import CommandLineInterface; CommandLineInterface.entrypoint()",
            "-b",
            self.host,
            "-p",
            str(self.port),
            "-v",
            str(self.verbosity),
            "--access-log",
            os.path.join(self.log_dir, "daphne-access.log"),
        ]
        argv += self.daphne_args + ["chatproject.asgi:channel_layer"]
        self.daphne = self._spawn("daphne", argv)
        return self.daphne

    def start_worker(self):
        self._counter += 1
        name = "worker-%d" % self._counter
        argv = [
            self.python,
            os.path.join(PROJECT_DIR, "manage.py"),
            "runworker",
            "-v",
            str(self.verbosity),
        ] + list(self.worker_args)
        proc = self._spawn(name, argv)
        self.workers.append(proc)
        return proc

    def start(self, timeout=60.0):
        """Start daphne and the workers and wait until they serve; returns self."""
        deadline = time.monotonic() + timeout
        try:
            self.start_daphne()
            for _ in range(self.n_workers):
                self.start_worker()
            self.wait_daphne(deadline - time.monotonic())
            for worker in self.workers:
                self.wait_worker(worker, deadline - time.monotonic())
            self.wait_http(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        return self

    def wait_daphne(self, timeout):
        deadline = time.monotonic() + timeout
        self.daphne.wait_for_line("Listening on endpoint", max(0.1, timeout))
        while True:
            if self.daphne.has_line(NATIVE_MODE_LINE):
                self.mode = "twisted"
                break
            if self.daphne.has_line(BUSY_LOOP_LINE):
                self.mode = "busy-loop"
                break
            if time.monotonic() > deadline:
                raise StackError("daphne never said which mode it runs in:\n" + self.daphne.tail())
            time.sleep(0.05)
        while not _port_open(self.host, self.port):
            if not self.daphne.alive() or time.monotonic() > deadline:
                raise StackError(
                    "daphne is not listening on %s:%d:\n%s"
                    % (self.host, self.port, self.daphne.tail())
                )
            time.sleep(0.05)

    def wait_worker(self, worker, timeout):
        worker.wait_for_line(WORKER_READY_LINE, max(0.1, timeout))

    def wait_http(self, timeout, path="/hello/"):
        """GET ``path`` until it answers 200 (a worker served it); the decoded JSON."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                status, body = http_get(self.base_url + path, timeout=5.0)
                if status == 200:
                    return json.loads(body.decode("utf-8"))
                last = "HTTP %d" % status
            except (OSError, ValueError) as exc:
                last = repr(exc)
            dead = [proc for proc in self.processes() if not proc.alive()]
            if dead:
                raise StackError(
                    "%s exited (rc %s) while starting:\n%s"
                    % (dead[0].name, dead[0].popen.returncode, dead[0].tail())
                )
            if time.monotonic() > deadline:
                raise StackError(
                    "GET %s never answered 200 (last: %s):\n%s" % (path, last, self.daphne.tail())
                )
            time.sleep(0.2)

    def replace_worker(self, worker, kill=True, timeout=60.0):
        """SIGKILL (or stop) ``worker``, start a new one, wait until it listens."""
        if kill:
            worker.kill()
        else:
            worker.stop()
        self.workers.remove(worker)
        self.retired.append(worker)
        fresh = self.start_worker()
        self.wait_worker(fresh, timeout)
        return fresh

    def processes(self):
        return ([self.daphne] if self.daphne else []) + list(self.workers)

    def stop(self, timeout=15.0):
        """Stop every child (SIGTERM; SIGKILL after ``timeout``); exit codes by name."""
        procs = self.processes()
        for proc in procs:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {}
        for proc in procs:
            rc = proc.wait(max(0.0, deadline - time.monotonic()))
            if rc is None:
                proc.signal(signal.SIGKILL)
                rc = proc.wait(5.0)
                codes[proc.name] = "killed after %.0f s" % timeout
            else:
                codes[proc.name] = rc
        for proc in procs:
            proc._reader.join(5.0)
        return codes

    def flush(self, everything=True):
        """Delete the broker objects under this stack's prefix (needs management).

        ``layer.flush()`` keeps the prefix's shared objects (the dead-letter
        queue and exchange and the group router) for the processes still
        running; with ``everything`` (call it only once the stack has
        stopped) they are deleted too, so a throw-away prefix leaves nothing.
        """
        if not self.management_url:
            return False
        if REPO_ROOT not in sys.path:
            sys.path.insert(0, REPO_ROOT)
        from asgi_amqp import AMQPChannelLayer

        layer = AMQPChannelLayer(
            url=self.amqp_urls,
            management_url=self.management_url,
            prefix=self.prefix,
            dead_letter_worker=False,
        )
        try:
            layer.flush()
            if everything:
                topology = layer.topology
                for name in sorted(topology.infrastructure()):
                    kind = "queues" if name == topology.dead_letter_queue else "exchanges"
                    management_delete(self.management_url, self.amqp_url, kind, name)
        finally:
            layer.close()
        return True

    def cleanup(self, keep_logs=False):
        """Remove the state directory (and the logs unless ``keep_logs``)."""
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if not keep_logs and self.log_dir.startswith(self._own_dir):
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _port_open(host, port):
    with contextlib.suppress(OSError):
        with socket.create_connection((host, port), timeout=0.5):
            return True
    return False


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def management_delete(management_url, amqp_url, kind, name, timeout=10.0):
    """DELETE a queue or exchange (``kind``: "queues" or "exchanges") through the
    management API, on ``amqp_url``'s vhost; a missing one is fine."""
    parts = urllib.parse.urlsplit(management_url)
    vhost = urllib.parse.unquote(urllib.parse.urlsplit(amqp_url).path[1:] or "/") or "/"
    netloc = parts.hostname + (":%d" % parts.port if parts.port else "")
    url = "%s://%s%s/api/%s/%s/%s" % (
        parts.scheme,
        netloc,
        parts.path.rstrip("/"),
        kind,
        urllib.parse.quote(vhost, safe=""),
        urllib.parse.quote(name, safe=""),
    )
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    token = base64.b64encode(("%s:%s" % (user, password)).encode("utf-8")).decode("ascii")
    status, _ = http_get(
        url, timeout=timeout, method="DELETE", headers={"Authorization": "Basic " + token}
    )
    if status not in (200, 201, 204, 404):
        raise StackError("DELETE %s %s answered HTTP %d" % (kind, name, status))


def http_get(url, timeout=10.0, method="GET", data=None, headers=None):
    """(status, body) of a request, without proxies; HTTP errors are returned too."""
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with _NO_PROXY.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
