"""The harness's side of ``worker.py``, the Redis server, and asgi_redis's virtualenv.

asgi_redis 1.4.3 needs ``msgpack-python`` (< 1.0), whose files overwrite
msgpack 1.x's, and calls ``unpackb(encoding=...)``, which msgpack 1.x
rejects. So it runs in a virtualenv of its own (``benchmarks/.venv-redis``,
made on first use) in a worker process. In that virtualenv msgpack 1.x is
installed over msgpack-python, and the worker decodes with ``raw=False``, so
asgi_redis serializes at C speed like the other contestants (with
msgpack-python alone it would run msgpack's pure-Python fallback on 3.11).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REDIS_VENV = os.path.join(HERE, ".venv-redis")
# ``make bench-channels``'s virtualenv (asgi_redis 1.4.3 with msgpack 1.x and
# Channels 1.x) serves as well: used when it is there and ready.
SHARED_REDIS_VENV = os.path.join(ROOT, ".venv-redis")
REDIS_REQUIREMENTS = ["asgi_redis==1.4.3"]  # pulls redis 2.10.6, msgpack-python 0.5.6, asgiref 1.1.2
REDIS_MSGPACK = "msgpack>=1.0,<2"


class WorkerError(RuntimeError):
    pass


class Worker(object):
    """A ``benchmarks.worker`` subprocess speaking JSON lines."""

    def __init__(self, python, name="worker"):
        self.name = name
        self.process = subprocess.Popen(
            [python, "-u", "-m", "benchmarks.worker"], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def request(self, obj, on_progress=None, timeout=None):
        if self.process.poll() is not None:
            raise WorkerError("%s exited with %s" % (self.name, self.process.returncode))
        self.process.stdin.write(json.dumps(obj) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise WorkerError("%s exited (status %s) during %s" % (
                    self.name, self.process.wait(), obj.get("cmd")))
            reply = json.loads(line)
            if "progress" in reply:
                if on_progress is not None:
                    on_progress(*reply["progress"])
                continue
            if not reply.get("ok"):
                raise WorkerError("%s: %s" % (self.name, reply.get("error")))
            return reply

    def close(self, flush=True):
        if self.process.poll() is None:
            try:
                self.request({"cmd": "teardown", "flush": flush})
            except (WorkerError, OSError, ValueError) as exc:
                sys.stderr.write("%s teardown: %s\n" % (self.name, exc))
            try:
                self.process.stdin.close()
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- asgi_redis's virtualenv ---------------------------------------------------------


def _venv_python(venv):
    return os.path.join(venv, "bin", "python")


def _venv_ready(python):
    if not os.path.exists(python):
        return False
    check = ("import asgi_redis, msgpack, redis, sys; "
             "sys.exit(0 if msgpack.version >= (1,) else 3)")
    return subprocess.run([python, "-c", check], capture_output=True).returncode == 0


def ensure_redis_venv(venv=REDIS_VENV, log=print):
    """The Python of a virtualenv with asgi_redis 1.4.3: ``$BENCH_REDIS_PYTHON``,
    else the repository's ``.venv-redis`` when ready, else ``venv`` (made if
    missing)."""
    if os.environ.get("BENCH_REDIS_PYTHON"):
        return os.environ["BENCH_REDIS_PYTHON"]
    if _venv_ready(_venv_python(SHARED_REDIS_VENV)):
        return _venv_python(SHARED_REDIS_VENV)
    python = _venv_python(venv)
    if _venv_ready(python):
        return python
    log("making %s for asgi_redis 1.4.3 (once)" % os.path.relpath(venv, ROOT))
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + REDIS_REQUIREMENTS, check=True)
    # msgpack 1.x over msgpack-python's files (see the module docstring).
    subprocess.run(pip + ["--force-reinstall", "--no-deps", REDIS_MSGPACK], check=True)
    if not _venv_ready(python):
        raise WorkerError("%s was made but cannot import asgi_redis with msgpack 1.x" % venv)
    return python


# -- the Redis server ------------------------------------------------------------------


def redis_ping(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer(object):
    """``url`` of a Redis to use: ``$BENCH_REDIS_URL`` or ``$REDIS_URL``, else one answering on
    127.0.0.1:6379, else a private ``redis-server`` on a free port (no
    persistence, in a temporary directory, stopped by ``stop``). ``url`` is
    None with ``reason`` set when there is none (no redis-server installed:
    ``make bench`` installs it with apt-get when run as root)."""

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
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
        if binary is None:
            self.reason = ("no Redis answers on 127.0.0.1:6379 and redis-server is not "
                           "installed (apt-get install redis-server, or make bench as root)")
            return
        port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="bench-redis-")
        self._process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
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
