"""Real RabbitMQ brokers for the test suite, the demo and the benchmarks.

Standard library only (the ``docker`` SDK is imported lazily and is optional).

* :class:`RabbitNode` runs a private RabbitMQ node (with the management
  plugin) on free loopback ports, with all of its files in its own temporary
  directory: by default from the distribution's ``rabbitmq-server`` package,
  or from a RabbitMQ server directory plus an Erlang installation (see
  below).  It never touches a system broker: it has its own node name,
  ports, data, logs and configuration, and it is only ever stopped by its
  own node name or pid.
* :func:`provide_broker` is a context manager that yields a :class:`Broker`:
  ``$AMQP_URL`` if it is set, else a throw-away container of
  ``$ASGI_AMQP_DOCKER_IMAGE`` (default ``rabbitmq:3-management``) if a Docker
  engine answers, else a private :class:`RabbitNode`.
* Command line::

      python -m devtools.rabbitmq run -- CMD [ARGS...]      # a broker for one command
      python -m devtools.rabbitmq start                      # leave a node running
      python -m devtools.rabbitmq stop NODE_DIR [NODENAME]   # stop such a node
      python -m devtools.rabbitmq unpack --server FILE --erlang FILE --into DIR

How the node is run
-------------------
Debian's ``/usr/sbin/rabbitmq-server`` and ``rabbitmqctl`` are symlinks to
``/usr/lib/rabbitmq/bin/rabbitmq-script-wrapper``, which ``su``s to the
``rabbitmq`` user when run by root (passing the arguments through ``sh -c``,
so ``$`` and backquotes in them are expanded), refuses every other user, and
when run *as* ``rabbitmq`` sends the server's output to the system broker's
``/var/log/rabbitmq/startup_log``.  So this module runs the real scripts that
live next to the wrapper (``/usr/lib/rabbitmq/bin``) itself:

* as root: as the ``rabbitmq`` user (``Popen(user=..., group=...)``) with
  ``HOME`` set to that user's home, exactly like the wrapper does.  The node
  and every ``rabbitmqctl`` call then read the same Erlang cookie,
  ``/var/lib/rabbitmq/.erlang.cookie``, which all nodes share (and which lets
  private nodes form clusters).  The node's directory is chowned to
  ``rabbitmq:rabbitmq``.  Without a ``rabbitmq`` user (e.g. a machine with
  only a generic-unix tarball), as root, with root's home and cookie.
* as any other user: as that user, with the cookie in ``~/.erlang.cookie``.

The node gets its own ``RABBITMQ_CONF_ENV_FILE``, so the machine's
``/etc/rabbitmq/rabbitmq-env.conf`` and ``rabbitmq.conf`` do not apply to it.
All listeners (AMQP, management, Erlang distribution) bind to 127.0.0.1.  The
shared epmd on port 4369 is used as is (Erlang 25's serves Erlang 27 nodes).

Another RabbitMQ: a server directory plus an Erlang
---------------------------------------------------
A RabbitMQ *server directory* is what RabbitMQ's generic-unix tarball
unpacks to, and what Debian's package holds in
``/usr/lib/rabbitmq/lib/rabbitmq_server-VERSION``: its ``sbin/`` scripts run
on whichever Erlang is first on ``PATH``.  So a newer RabbitMQ than the
distribution's runs from two environment variables (or the ``server_dir``
and ``erlang_root`` arguments of :class:`RabbitNode`):

``ASGI_AMQP_RABBITMQ_SERVER_DIR``
    the server directory; the node runs its ``sbin/rabbitmq-server`` and
    ``sbin/rabbitmqctl`` (not Debian's), with ``RABBITMQ_HOME`` set to it.
``ASGI_AMQP_ERLANG_ROOT``
    the Erlang installation's root, the directory that holds ``bin/erl`` and
    ``erts-*`` (for an Erlang built with ``--prefix=P``: ``P/lib/erlang``).
    Its ``bin/`` goes first on the ``PATH`` of the node and of every
    ``rabbitmqctl`` call, and ``ERL_ROOTDIR`` is set to it, which a relocated
    Erlang needs.

Either may be given alone (a server directory on the machine's Erlang,
Debian's scripts on another Erlang).  Everything else is as above: the same
user (``rabbitmq`` when root, so the files must be readable by all, which
unpacked packages are), the same cookie, the same private files.  A node's
state file records both, so ``stop NODE_DIR`` and :meth:`RabbitNode.from_dir`
use the RabbitMQ the node was started with, whatever the environment says.

``unpack`` makes both from a server ``.deb`` (``dpkg -x``, e.g. Debian 13's
``rabbitmq-server_4.0.5-*_all.deb``) or a generic-unix tarball, and an
Erlang tarball with a ``lib/erlang/bin/erl`` inside; it checks each file
against a ``SHA256SUMS`` next to it if there is one, reuses what an earlier
unpack into the same directory left, and prints the two variables::

    S=rabbitmq-server_4.0.5-6+deb13u2_all.deb E=erlang-otp-27.3.4.1-debian12-amd64.tar.gz
    set -a; eval "$(python -m devtools.rabbitmq unpack --server $S --erlang $E --into /tmp/rmq4)"
    set +a; python -m devtools.rabbitmq run -- pytest ...       # on RabbitMQ 4.0.5

Costs (RabbitMQ 3.10.8, Erlang 25, 2 cores): ``start()`` 7-9 s, most of it
the VM and the boot-step scan; a ``rabbitmqctl`` call about 0.4 s;
``stop_app`` and ``stop`` about 5.5 s more than they should, because before
3.13 the management agent waits 5 s when it stops (rabbitmq-server PR
#11070); ``kill()`` about 0.05 s.  RabbitMQ 4.0.5 on Erlang 27 (same
machine): ``start()`` 3.5-4.2 s, ``stop()`` about 1.7 s.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

__all__ = [
    "Broker",
    "RabbitNode",
    "RabbitNodeError",
    "RabbitMQNotInstalled",
    "amqp_ready",
    "find_rabbitmq_scripts",
    "free_port",
    "management_api_ready",
    "provide_broker",
    "unpack_broker",
    "main",
]

RABBITMQ_USER = "rabbitmq"
#: Where distributions put the RabbitMQ scripts, searched after $PATH.
SCRIPT_DIRS = ("/usr/sbin", "/usr/lib/rabbitmq/bin", "/usr/local/sbin", "/opt/rabbitmq/sbin")
NODE_NAME_PREFIX = "asgiamqp"
TEMP_DIR_PREFIX = "asgiamqp-rabbit-"
STATE_FILE = "node.json"
DOCKER_IMAGE = "rabbitmq:3-management"
#: Environment variables: the Docker image of :func:`provide_broker`, and the
#: RabbitMQ server directory and Erlang root a node runs from (module docstring).
DOCKER_IMAGE_VARIABLE = "ASGI_AMQP_DOCKER_IMAGE"
SERVER_DIR_VARIABLE = "ASGI_AMQP_RABBITMQ_SERVER_DIR"
ERLANG_ROOT_VARIABLE = "ASGI_AMQP_ERLANG_ROOT"
#: Set by ``make check``, whose tests need no broker: starting a node is then
#: an error, and no Docker engine is asked (:func:`refuse_if_no_broker`).
NO_BROKER_VARIABLE = "ASGI_AMQP_NO_BROKER"
#: What ``unpack`` leaves in each directory it unpacked (which file, its sha256).
UNPACKED_MARKER = ".devtools-rabbitmq-unpacked.json"
MANAGEMENT_PLUGIN = "rabbitmq_management"

_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"

# RabbitMQ reads each of its settings from RABBITMQ_<NAME> and, when that is
# unset or empty, from plain <NAME> (rabbit_env's get_prefixed_env_var and
# the rabbitmq-env script; rabbitmq-env.conf uses the plain names). So a
# LOGS, LOG or NODENAME that a user's shell exports for something else would
# move a private node's log, log level or name. The node gets none of them.
# HOME stays: it is also the home directory (see ``environ``).
RABBITMQ_UNPREFIXED_VARIABLES = frozenset(
    """
    ADVANCED_CONFIG_FILE ALLOW_INPUT BASE BOOT_MODULE CONFIG_FILE CONFIG_FILES
    CONF_ENV_FILE CTL_DIST_PORT_MAX CTL_DIST_PORT_MIN CTL_ERL_ARGS DBG
    DEFAULT_ALLOC_ARGS DEFAULT_PASS DEFAULT_USER DEFAULT_VHOST DIST_PORT
    DISTRIBUTION_BUFFER_SIZE ENABLED_PLUGINS ENABLED_PLUGINS_FILE ERLANG_COOKIE
    FEATURE_FLAGS FEATURE_FLAGS_FILE IGNORE_SIGINT KEEP_PID_FILE_ON_EXIT LOG
    LOGS LOG_BASE LOG_FF_REGISTRY MAX_NUMBER_OF_ATOMS MAX_NUMBER_OF_PROCESSES
    MNESIA_BASE MNESIA_DIR MOTD_FILE NODENAME NODE_IP_ADDRESS NODE_ONLY
    NODE_PORT PID_FILE PLUGINS_DIR PLUGINS_EXPAND_DIR PRODUCT_NAME
    PRODUCT_VERSION QUORUM_DIR SCHEDULER_BIND_TYPE SCHEDULER_BUSY_WAIT_THRESHOLD
    SERVER_ADDITIONAL_ERL_ARGS SERVER_CODE_PATH SERVER_ERL_ARGS
    SERVER_START_ARGS STREAM_DIR UPGRADE_LOG USE_LONGNAME
    """.split()
)


class RabbitNodeError(RuntimeError):
    """A private node failed to start or stop, or a ``rabbitmqctl`` call failed."""

    def __init__(
        self, message: str, *, returncode: Optional[int] = None, stdout: str = "", stderr: str = ""
    ) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


class RabbitMQNotInstalled(RabbitNodeError):
    """``rabbitmq-server`` is not installed on this machine."""


def no_broker_wanted() -> bool:
    """Whether this run forbids brokers (``$ASGI_AMQP_NO_BROKER``, set by ``make check``)."""
    return os.environ.get(NO_BROKER_VARIABLE, "") not in ("", "0")


def refuse_if_no_broker(what: str) -> None:
    """Raise RabbitNodeError, naming the ``broker`` test marker, if this run forbids brokers."""
    if no_broker_wanted():
        raise RabbitNodeError(
            "%s: this run needs no broker (%s is set, as make check sets it); "
            "a test that needs one is marked broker (conftest.py)" % (what, NO_BROKER_VARIABLE)
        )


# --------------------------------------------------------------------------
# small helpers


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on *host* right now, below the ephemeral range."""
    return _free_ports(1, host)[0]


# Ports other RabbitMQ nodes and tools expect: the defaults, and the range
# rabbitmqctl's own Erlang distribution listens on (35672-35682).
_RESERVED_PORTS = frozenset([4369, 5671, 5672, 15672, 25672, *range(35672, 35683)])

# Ports are picked from here up to the start of the kernel's ephemeral range.
_LOWEST_PORT = 10000
#: ``LOW-HIGH``: the share of that range this process picks from. Test runs
#: side by side get shares that do not meet (devtools.test_brokers), so that
#: one never takes the port of the other's stopped node.
PORTS_VARIABLE = "ASGI_AMQP_PORTS"


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral (client) range; 32768 if unknown."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> Tuple[int, int]:
    """The ports to pick from, [low, high): ``PORTS_VARIABLE``'s share if set."""
    low, high = _LOWEST_PORT, _ephemeral_start()
    share = os.environ.get(PORTS_VARIABLE)
    if share:
        try:
            share_low, share_high = (int(part) for part in share.split("-"))
        except ValueError:
            raise RabbitNodeError("%s must be LOW-HIGH, not %r" % (PORTS_VARIABLE, share))
        low, high = max(low, share_low), min(high, share_high)
    return low, high


def _free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """*count* distinct free ports (all sockets held open while picking).

    The ports come from below the kernel's ephemeral range, never from it.  A
    node that is stopped or killed keeps its ports for its restart, and its
    clients keep reconnecting to them meanwhile.  Linux picks a connecting
    socket's own port from the ephemeral range; when that is the very port the
    client connects to on 127.0.0.1 and nothing listens there, the socket
    connects to itself (TCP simultaneous open) and holds the port.  A 4.0.5
    node then failed to restart with ``eaddrinuse`` on its AMQP port 53079.
    Outside the ephemeral range no client's own port can take the node's.
    """
    low, high = port_range()
    if high - low < 1000:  # an unusual range: let the kernel pick
        return _kernel_picked_ports(count, host)
    pick = random.Random()
    socks = []
    ports: List[int] = []
    try:
        for _ in range(20 * count + 200):
            if len(ports) == count:
                return ports
            port = pick.randrange(low, high)
            if port in _RESERVED_PORTS or port in ports:
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            ports.append(port)
        if len(ports) == count:
            return ports
        raise RabbitNodeError(
            "found only %d of %d free ports in %d-%d on %s"
            % (len(ports), count, low, high - 1, host)
        )
    finally:
        for sock in socks:
            sock.close()


def _kernel_picked_ports(count: int, host: str) -> List[int]:
    """*count* distinct free ports the kernel picks (bind to port 0)."""
    socks = []
    ports: List[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in _RESERVED_PORTS:
                ports.append(port)
        return ports
    finally:
        for sock in socks:
            sock.close()


def find_rabbitmq_scripts() -> "tuple[str, str]":
    """Return the paths of the real ``rabbitmq-server`` and ``rabbitmqctl`` scripts.

    Resolves the Debian/RPM ``rabbitmq-script-wrapper`` symlinks to the scripts
    next to it.  Raises :class:`RabbitMQNotInstalled` if there is none.
    """
    search = os.pathsep.join([os.environ.get("PATH", ""), *SCRIPT_DIRS])
    exe = shutil.which("rabbitmq-server", path=search)
    if exe is None:
        raise RabbitMQNotInstalled(
            "rabbitmq-server is not installed (looked in $PATH and %s). Install it "
            "(as root: `make broker-deps`, i.e. apt-get install rabbitmq-server), "
            "or point AMQP_URL at a broker." % ", ".join(SCRIPT_DIRS)
        )
    real_dir = os.path.dirname(os.path.realpath(exe))
    server = os.path.join(real_dir, "rabbitmq-server")
    ctl = os.path.join(real_dir, "rabbitmqctl")
    if os.access(server, os.X_OK) and os.access(ctl, os.X_OK):
        return server, ctl
    ctl = shutil.which("rabbitmqctl", path=search)
    if ctl is None:
        raise RabbitMQNotInstalled("found %s but no rabbitmqctl" % exe)
    return exe, ctl


def _server_dir_from(server_dir: Optional[str]) -> Optional[str]:
    """The server directory a node runs from: *server_dir*, or when it is None
    ``$ASGI_AMQP_RABBITMQ_SERVER_DIR``; None (Debian's scripts) if that is
    empty.  Raises :class:`RabbitNodeError` if it holds no ``sbin`` scripts."""
    if server_dir is None:
        server_dir = os.environ.get(SERVER_DIR_VARIABLE, "")
    if not server_dir:
        return None
    server_dir = os.path.abspath(server_dir)
    for script in ("rabbitmq-server", "rabbitmqctl"):
        path = os.path.join(server_dir, "sbin", script)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RabbitNodeError(
                "%s (server_dir) %s is not a RabbitMQ server directory: it has no "
                "executable sbin/%s. It is the directory of sbin/, escript/ and plugins/: "
                "the top of RabbitMQ's generic-unix tarball, or "
                "usr/lib/rabbitmq/lib/rabbitmq_server-VERSION in an unpacked .deb "
                "(python -m devtools.rabbitmq unpack makes one)."
                % (SERVER_DIR_VARIABLE, server_dir, script)
            )
    return server_dir


def _erlang_root_from(erlang_root: Optional[str]) -> Optional[str]:
    """The Erlang root a node runs on: *erlang_root*, or when it is None
    ``$ASGI_AMQP_ERLANG_ROOT``; None (the Erlang on ``PATH``) if that is empty.

    It must hold ``bin/erl`` and an ``erts-*`` directory: an installation's
    prefix (``P``, not ``P/lib/erlang``) has a ``bin/erl`` too, but as
    ``ERL_ROOTDIR`` it would make ``erl`` look for ``P/erts-*``, which is not
    there, so it is refused with a pointer to the right directory."""
    if erlang_root is None:
        erlang_root = os.environ.get(ERLANG_ROOT_VARIABLE, "")
    if not erlang_root:
        return None
    erlang_root = os.path.abspath(erlang_root)
    erl = os.path.join(erlang_root, "bin", "erl")
    has_erts = os.path.isdir(erlang_root) and any(
        e.startswith("erts-") for e in os.listdir(erlang_root)
    )
    if os.path.isfile(erl) and os.access(erl, os.X_OK) and has_erts:
        return erlang_root
    hint = ""
    below = os.path.join(erlang_root, "lib", "erlang")
    if os.path.isfile(os.path.join(below, "bin", "erl")):
        hint = " Did you mean %s?" % below
    raise RabbitNodeError(
        "%s (erlang_root) %s is not an Erlang root: it needs an executable bin/erl and "
        "an erts-* directory (for an Erlang installed with --prefix=P it is P/lib/erlang).%s"
        % (ERLANG_ROOT_VARIABLE, erlang_root, hint)
    )


def _server_version_from_path(script: str) -> Optional[str]:
    """RabbitMQ's version from the name of the server directory that holds
    *script* (``rabbitmq_server-4.0.5/sbin/rabbitmqctl``; Debian's
    ``/usr/lib/rabbitmq/bin`` links lead there), or None."""
    home = os.path.basename(os.path.dirname(os.path.dirname(os.path.realpath(script))))
    prefix = "rabbitmq_server-"
    version = home[len(prefix) :] if home.startswith(prefix) else ""
    return version if version[:1].isdigit() else None


def _proc_start_time(pid: int) -> Optional[str]:
    """Start time of *pid* from /proc (None if it is gone, or a zombie)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = data[data.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""


def _pid_alive(pid: Optional[int], start_time: Optional[str] = None) -> bool:
    """Is *pid* running (and, if *start_time* is given, still the same process)?"""
    if not pid:
        return False
    if os.path.isdir("/proc/self"):
        now = _proc_start_time(pid)
        if now is None:
            return False
        return not start_time or not now or now == start_time
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _no_proxy_opener() -> urllib.request.OpenerDirector:
    # Loopback HTTP must not go through $http_proxy.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def management_api_ready(management_url: str, timeout: float = 2.0) -> bool:
    """True if ``GET /api/overview`` answers 200 with the URL's credentials."""
    parts = urllib.parse.urlsplit(management_url)
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    netloc = parts.hostname or "127.0.0.1"
    if parts.port:
        netloc = "%s:%d" % (netloc, parts.port)
    url = urllib.parse.urlunsplit(
        (parts.scheme or "http", netloc, parts.path.rstrip("/") + "/api/overview", "", "")
    )
    req = urllib.request.Request(url)
    token = base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
    req.add_header("Authorization", "Basic " + token)
    try:
        with _no_proxy_opener().open(req, timeout=timeout) as resp:
            resp.read()
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def amqp_ready(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if *host:port* answers the AMQP 0-9-1 header with a Connection.Start frame.

    (A plain TCP connect is not enough behind docker-proxy, which accepts
    connections before the broker listens.)
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_AMQP_HEADER)
            data = sock.recv(7)
            return len(data) >= 1 and data[:1] == b"\x01"
    except OSError:
        return False


# --------------------------------------------------------------------------
# the private node

_LIVE_NODES: "Dict[int, RabbitNode]" = {}
_LIVE_LOCK = threading.Lock()


def _atexit_reap() -> None:
    """Last resort: kill the nodes this process started and never cleaned up."""
    with _LIVE_LOCK:
        nodes = list(_LIVE_NODES.values())
    for node in nodes:
        with contextlib.suppress(Exception):
            node.kill(timeout=5)
        with contextlib.suppress(Exception):
            node._remove_dir()


atexit.register(_atexit_reap)


class RabbitNode:
    """A private RabbitMQ node, by default with the management plugin, on free
    loopback ports.

    ``node = RabbitNode(); node.start()`` ... ``node.cleanup()``, or use it as a
    context manager (``with RabbitNode() as node:`` starts it and cleans up).

    *name* is the node name (``NAME@localhost``; ``@host`` may be given), unique
    by default.  *base_dir* is the directory under which the node's own
    temporary directory is created (default: the system temp dir).  Ports
    that are not given are picked free.  *extra_config* is appended to the
    generated ``rabbitmq.conf`` (a string or lines, e.g. for TLS listeners);
    *advanced_config* is the content of ``advanced.config``; *env* overrides
    environment variables of the ``rabbitmq-server``/``rabbitmqctl`` calls.
    *plugins* are the enabled plugins; without ``rabbitmq_management`` the
    node has no management API (:attr:`management_url` is None) and a
    ``stop_app`` closes its listener for the pause alone, not 5 s more
    (the management agent's wait, see the module's docstring).

    *server_dir* is a RabbitMQ server directory to run the node from instead
    of the distribution's scripts, *erlang_root* the root of the Erlang to run
    it on (see the module's docstring); None means ``$ASGI_AMQP_RABBITMQ_SERVER_DIR``
    / ``$ASGI_AMQP_ERLANG_ROOT``, and "" neither, whatever the environment says.

    A stopped or killed node can be started again: it keeps its name, ports
    and data (durable queues and persistent messages survive).
    """

    def __init__(
        self,
        name: Optional[str] = None,
        base_dir: Optional[str] = None,
        *,
        amqp_port: Optional[int] = None,
        management_port: Optional[int] = None,
        dist_port: Optional[int] = None,
        extra_config: Union[str, Iterable[str], None] = None,
        advanced_config: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        plugins: Sequence[str] = ("rabbitmq_management",),
        server_dir: Optional[str] = None,
        erlang_root: Optional[str] = None,
    ) -> None:
        if name is None:
            name = "%s-%s" % (NODE_NAME_PREFIX, secrets.token_hex(4))
        self._nodename = name if "@" in name else name + "@localhost"
        self._base_dir = base_dir
        self._auto_ports = amqp_port is None and management_port is None and dist_port is None
        self._amqp_port = amqp_port
        self._management_port = management_port
        self._dist_port = dist_port
        if extra_config is None:
            extra_config = ""
        elif not isinstance(extra_config, str):
            extra_config = "\n".join(extra_config)
        self.extra_config = extra_config
        self.advanced_config = advanced_config if advanced_config is not None else "[]."
        self.env_overrides = dict(env or {})
        self.plugins = tuple(plugins)
        self._dir: Optional[str] = None
        self._started_before = False
        self._pid: Optional[int] = None
        self._pid_start: Optional[str] = None
        self._version: Optional[str] = None
        self._server_dir = _server_dir_from(server_dir)
        self._erlang_root = _erlang_root_from(erlang_root)
        if self._server_dir is not None:
            sbin = os.path.join(self._server_dir, "sbin")
            self._server = os.path.join(sbin, "rabbitmq-server")
            self._ctl = os.path.join(sbin, "rabbitmqctl")
        else:
            self._server, self._ctl = find_rabbitmq_scripts()
        self._identity = self._run_identity()
        # As root the node runs as the rabbitmq user: it must be able to run them.
        if self._server_dir is not None:
            self._check_runnable(self._server, SERVER_DIR_VARIABLE)
            self._check_runnable(self._ctl, SERVER_DIR_VARIABLE)
        if self._erlang_root is not None:
            self._check_runnable(
                os.path.join(self._erlang_root, "bin", "erl"), ERLANG_ROOT_VARIABLE
            )

    # ---------------------------------------------------------------- props
    @property
    def nodename(self) -> str:
        return self._nodename

    @property
    def amqp_port(self) -> int:
        self._ensure_ports()
        return self._amqp_port  # type: ignore[return-value]

    @property
    def management_port(self) -> int:
        self._ensure_ports()
        return self._management_port  # type: ignore[return-value]

    @property
    def dist_port(self) -> int:
        self._ensure_ports()
        return self._dist_port  # type: ignore[return-value]

    @property
    def amqp_url(self) -> str:
        return "amqp://guest:guest@127.0.0.1:%d/%%2F" % self.amqp_port

    @property
    def server_dir(self) -> Optional[str]:
        """The RabbitMQ server directory the node runs from (None: the distribution's)."""
        return self._server_dir

    @property
    def erlang_root(self) -> Optional[str]:
        """The root of the Erlang the node runs on (None: the one on ``PATH``)."""
        return self._erlang_root

    def version(self) -> str:
        """RabbitMQ's version ("4.0.5", "3.10.8") of the scripts the node runs.

        Free when the scripts live in a ``rabbitmq_server-VERSION`` directory
        (Debian's, the generic-unix tarball's); else ``rabbitmqctl version``,
        which needs no running node (about 0.5 s, once).
        """
        if self._version is None:
            self._version = _server_version_from_path(self._ctl) or self._ctl_version()
        return self._version

    def _ctl_version(self) -> str:
        """``rabbitmqctl version``: the version of the CLI, i.e. of the server directory."""
        env = self._tool_environ()
        # Not the machine's /etc/rabbitmq/rabbitmq-env.conf (no node dir for ours yet).
        env["RABBITMQ_CONF_ENV_FILE"] = os.devnull
        env.update(self.env_overrides)
        try:
            cp = subprocess.run(
                [self._ctl, "version"],
                env=env,
                cwd=self._dir or "/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
                **self._popen_kwargs(),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RabbitNodeError("rabbitmqctl version failed: %s" % exc) from exc
        lines = cp.stdout.strip().splitlines()
        if cp.returncode != 0 or not lines:
            raise RabbitNodeError(
                "rabbitmqctl version failed (rc %d): %s"
                % (cp.returncode, cp.stderr.strip() or cp.stdout.strip()),
                returncode=cp.returncode,
                stdout=cp.stdout,
                stderr=cp.stderr,
            )
        return lines[-1].strip()

    @property
    def has_management(self) -> bool:
        """True if the node runs the management plugin (and so its HTTP API)."""
        return MANAGEMENT_PLUGIN in self.plugins

    @property
    def management_url(self) -> Optional[str]:
        """The management API, or None for a node without the plugin."""
        if not self.has_management:
            return None
        return "http://guest:guest@127.0.0.1:%d/" % self.management_port

    @property
    def pid(self) -> Optional[int]:
        """The pid of the node's beam process (None before start / after stop)."""
        return self._pid

    @property
    def dir(self) -> Optional[str]:
        """The node's own directory (None until the first start)."""
        return self._dir

    @property
    def pid_file(self) -> str:
        return os.path.join(self._require_dir(), "rabbitmq.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self._require_dir(), "log", self._nodename + ".log")

    def is_running(self) -> bool:
        """True while the node's beam process is alive (even after stop_app)."""
        return _pid_alive(self._pid, self._pid_start)

    def __repr__(self) -> str:
        return "<RabbitNode %s amqp=%s mgmt=%s pid=%s%s>" % (
            self._nodename,
            self._amqp_port,
            self._management_port,
            self._pid,
            " server_dir=%s" % self._server_dir if self._server_dir else "",
        )

    # ------------------------------------------------------------- identity
    @staticmethod
    def _run_identity() -> Optional[Dict[str, Any]]:
        """Whom to run the scripts as: the rabbitmq user when root, else None (ourselves)."""
        if os.geteuid() != 0:
            return None
        import pwd  # noqa: PLC0415  (POSIX only)

        try:
            pw = pwd.getpwnam(RABBITMQ_USER)
        except KeyError:
            return None  # e.g. a generic-unix install run by root: run as root
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
        return {
            "uid": pw.pw_uid,
            "gid": pw.pw_gid,
            "groups": groups,
            "home": pw.pw_dir,
            "name": pw.pw_name,
        }

    def _popen_kwargs(self) -> Dict[str, Any]:
        if self._identity is None:
            return {}
        ident = self._identity
        return {"user": ident["uid"], "group": ident["gid"], "extra_groups": ident["groups"]}

    def _home(self) -> str:
        if self._identity is not None:
            return self._identity["home"]
        return os.environ.get("HOME") or os.path.expanduser("~")

    def _ensure_cookie(self) -> None:
        """Create the shared Erlang cookie if missing (e.g. right after apt-get
        install, whose post-install start may be denied), so that nodes started
        concurrently do not race to create it."""
        home = self._home()
        cookie = os.path.join(home, ".erlang.cookie")
        if os.path.exists(cookie):
            return
        if not os.path.isdir(home):
            raise RabbitNodeError("home directory %s (for the Erlang cookie) does not exist" % home)
        value = "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(20))
        tmp = "%s.%s.tmp" % (cookie, secrets.token_hex(4))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
        if self._identity is not None:
            os.chown(tmp, self._identity["uid"], self._identity["gid"])
        try:
            os.link(tmp, cookie)  # atomic, and never replaces an existing cookie
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)

    # ---------------------------------------------------------------- setup
    def _require_dir(self) -> str:
        if self._dir is None:
            raise RabbitNodeError("node %s has no directory yet (not started)" % self._nodename)
        return self._dir

    def _ensure_ports(self) -> None:
        if None in (self._amqp_port, self._management_port, self._dist_port):
            taken = {p for p in (self._amqp_port, self._management_port, self._dist_port) if p}
            fresh = [p for p in _free_ports(6) if p not in taken]
            if self._amqp_port is None:
                self._amqp_port = fresh.pop()
            if self._management_port is None:
                self._management_port = fresh.pop()
            if self._dist_port is None:
                self._dist_port = fresh.pop()

    def _identity_may(self, path: str, read: bool = False, execute: bool = True) -> bool:
        """May the identity the node runs as read and/or execute (enter) *path*?"""
        assert self._identity is not None
        st = os.stat(path)
        if st.st_uid == self._identity["uid"]:
            bits = (stat.S_IRUSR if read else 0) | (stat.S_IXUSR if execute else 0)
        elif st.st_gid in set(self._identity["groups"]):
            bits = (stat.S_IRGRP if read else 0) | (stat.S_IXGRP if execute else 0)
        else:
            bits = (stat.S_IROTH if read else 0) | (stat.S_IXOTH if execute else 0)
        return st.st_mode & bits == bits

    def _unreachable_parent(self, path: str) -> Optional[str]:
        """The first directory above *path* the identity cannot enter, or None."""
        parent = os.path.dirname(os.path.abspath(path))
        while True:
            if not self._identity_may(parent):
                return parent
            if parent == os.path.dirname(parent):
                return None
            parent = os.path.dirname(parent)

    def _check_traversable(self, path: str) -> None:
        """As root, make sure the rabbitmq user can reach *path*."""
        if self._identity is None:
            return
        parent = self._unreachable_parent(path)
        if parent is not None:
            raise RabbitNodeError(
                "user %s cannot enter %s, so it cannot use a node directory under it; "
                "pass another base_dir" % (self._identity["name"], parent)
            )

    def _check_runnable(self, program: str, variable: str) -> None:
        """As root, make sure the rabbitmq user, which runs the node, can run
        *program* (of the directory *variable* names).  (Unpacked packages are
        readable by all, but e.g. a ``mkdtemp`` directory above them is not.)"""
        if self._identity is None:
            return
        name = self._identity["name"]
        parent = self._unreachable_parent(program)
        if parent is not None:
            raise RabbitNodeError(
                "user %s, which runs the node, cannot enter %s, so it cannot run %s (%s); "
                "make the directories above it readable by all (chmod a+rx) or unpack "
                "elsewhere" % (name, parent, program, variable)
            )
        if not self._identity_may(os.path.realpath(program), read=True, execute=True):
            raise RabbitNodeError(
                "user %s, which runs the node, cannot read and execute %s (%s); "
                "chmod a+rx it" % (name, program, variable)
            )

    def _prepare(self) -> None:
        """Create the node's directory and files (idempotent; rewrites the config)."""
        self._ensure_ports()
        if self._dir is None:
            if self._base_dir is not None:
                os.makedirs(self._base_dir, exist_ok=True)
            self._dir = os.path.abspath(
                tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX, dir=self._base_dir)
            )
            self._check_traversable(self._dir)
        d = self._dir
        for sub in ("mnesia", "log", "plugins-expand"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        files = {
            "rabbitmq.conf": self._config_text(),
            "advanced.config": self.advanced_config + "\n",
            "enabled_plugins": "[%s].\n" % ",".join(self.plugins),
            # Our own (empty) env file: /etc/rabbitmq/rabbitmq-env.conf must not apply.
            "rabbitmq-env.conf": "# private node %s: everything is set in the environment\n"
            % self._nodename,
        }
        for fname, text in files.items():
            with open(os.path.join(d, fname), "w") as f:
                f.write(text)
        self._write_state()
        if self._identity is not None:
            uid, gid = self._identity["uid"], self._identity["gid"]
            for root, _dirs, fnames in os.walk(d):
                os.chown(root, uid, gid)
                for n in fnames:
                    os.chown(os.path.join(root, n), uid, gid)
        self._ensure_cookie()

    def _config_text(self) -> str:
        lines = [
            "# generated by devtools.rabbitmq for %s" % self._nodename,
            "listeners.tcp.local = 127.0.0.1:%d" % self._amqp_port,
        ]
        if self.has_management:
            lines += [
                "management.tcp.port = %d" % self._management_port,
                "management.tcp.ip = 127.0.0.1",
            ]
        lines += [
            "loopback_users.guest = true",
            "log.console = false",
            "log.file.level = info",
        ]
        if self.extra_config.strip():
            lines += ["", "# extra_config", self.extra_config.rstrip("\n")]
        return "\n".join(lines) + "\n"

    def _write_state(self) -> None:
        state = {
            "nodename": self._nodename,
            "amqp_port": self._amqp_port,
            "management_port": self._management_port,
            "dist_port": self._dist_port,
            "extra_config": self.extra_config,
            "advanced_config": self.advanced_config,
            "env": self.env_overrides,
            "plugins": list(self.plugins),
            "server_dir": self._server_dir,
            "erlang_root": self._erlang_root,
            "owner_pid": os.getpid(),
        }
        with open(os.path.join(self._require_dir(), STATE_FILE), "w") as f:
            json.dump(state, f, indent=1)

    @classmethod
    def from_dir(cls, node_dir: str) -> "RabbitNode":
        """Re-attach to a node started elsewhere (e.g. by ``python -m devtools.rabbitmq start``)."""
        with open(os.path.join(node_dir, STATE_FILE)) as f:
            state = json.load(f)
        node = cls(
            state["nodename"],
            amqp_port=state["amqp_port"],
            management_port=state["management_port"],
            dist_port=state["dist_port"],
            extra_config=state.get("extra_config"),
            advanced_config=state.get("advanced_config"),
            env=state.get("env"),
            plugins=state.get("plugins", ("rabbitmq_management",)),
            # What the node was started with ("": none, also for state files
            # written before these were recorded), not what $ASGI_AMQP_* say now.
            server_dir=state.get("server_dir") or "",
            erlang_root=state.get("erlang_root") or "",
        )
        node._dir = os.path.abspath(node_dir)
        node._read_pid()
        return node

    def _tool_environ(self) -> Dict[str, str]:
        """The caller's environment without RabbitMQ's settings, for the identity
        the scripts run as, with the server directory and Erlang (if any) first."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RABBITMQ_") and k not in RABBITMQ_UNPREFIXED_VARIABLES
        }
        if self._identity is not None:
            env.update(
                HOME=self._identity["home"],
                USER=self._identity["name"],
                LOGNAME=self._identity["name"],
            )
        first = []
        if self._erlang_root is not None:
            first.append(os.path.join(self._erlang_root, "bin"))
            env["ERL_ROOTDIR"] = self._erlang_root  # a relocated Erlang's erl needs it
        if self._server_dir is not None:
            first.append(os.path.join(self._server_dir, "sbin"))
            env["RABBITMQ_HOME"] = self._server_dir
        if first:
            env["PATH"] = os.pathsep.join([*first, env.get("PATH", os.defpath)])
        return env

    def environ(self) -> Dict[str, str]:
        """The environment for ``rabbitmq-server`` and ``rabbitmqctl`` of this node."""
        d = self._require_dir()
        env = self._tool_environ()
        loopback_dist = "-kernel inet_dist_use_interface {127,0,0,1}"
        env.update(
            {
                "RABBITMQ_NODENAME": self._nodename,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.amqp_port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_CONF_ENV_FILE": os.path.join(d, "rabbitmq-env.conf"),
                "RABBITMQ_CONFIG_FILE": os.path.join(d, "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(d, "advanced.config"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(d, "enabled_plugins"),
                "RABBITMQ_PLUGINS_EXPAND_DIR": os.path.join(d, "plugins-expand"),
                "RABBITMQ_MNESIA_BASE": os.path.join(d, "mnesia"),
                "RABBITMQ_LOG_BASE": os.path.join(d, "log"),
                "RABBITMQ_PID_FILE": os.path.join(d, "rabbitmq.pid"),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": loopback_dist,
                "RABBITMQ_CTL_ERL_ARGS": loopback_dist,
                "ERL_CRASH_DUMP": os.path.join(d, "log", "erl_crash.dump"),
            }
        )
        env.setdefault("ERL_EPMD_ADDRESS", "127.0.0.1")  # only used if epmd is not running yet
        env.update(self.env_overrides)
        return env

    # ------------------------------------------------------------ rabbitmqctl
    def ctl(self, *args: Any, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS...``; return its stdout.

        Raises :class:`RabbitNodeError` (with the stderr) on failure or timeout.
        """
        cmd = [self._ctl, "-n", self._nodename, *[str(a) for a in args]]
        shown = "rabbitmqctl -n %s %s" % (self._nodename, " ".join(str(a) for a in args))
        try:
            cp = subprocess.run(
                cmd,
                env=self.environ(),
                cwd=self._require_dir(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                **self._popen_kwargs(),
            )
        except subprocess.TimeoutExpired as exc:
            raise RabbitNodeError("%s timed out after %.0f s" % (shown, timeout)) from exc
        if cp.returncode != 0:
            detail = cp.stderr.strip() or cp.stdout.strip()
            raise RabbitNodeError(
                "%s failed (rc %d): %s" % (shown, cp.returncode, detail),
                returncode=cp.returncode,
                stdout=cp.stdout,
                stderr=cp.stderr,
            )
        return cp.stdout

    # ------------------------------------------------------------ lifecycle
    def _is_our_beam(self, pid: int) -> bool:
        """Is *pid* this node's beam (and not, say, a recycled pid)?  Checks the
        environment the node was started with (Linux /proc; elsewhere: yes)."""
        if not os.path.isdir("/proc/self"):
            return _pid_alive(pid)
        try:
            with open("/proc/%d/comm" % pid, "rb") as f:
                if not f.read().startswith(b"beam"):
                    return False
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return False
        return ("RABBITMQ_NODENAME=%s" % self._nodename).encode() in env and (
            "RABBITMQ_PID_FILE=%s" % self.pid_file
        ).encode() in env

    def _read_pid(self) -> Optional[int]:
        """Adopt the pid in the pid file if it is this node's running beam."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError, RabbitNodeError):
            return None
        if not self._is_our_beam(pid):
            return None
        self._pid, self._pid_start = pid, _proc_start_time(pid)
        return pid

    def _find_beam(self) -> Optional[int]:
        """The beam's pid from the pid file, else (a node interrupted early in
        its boot has not written it yet) by looking through /proc."""
        if self._dir is None:
            return None
        pid = self._read_pid()
        if pid is not None:
            return pid
        with contextlib.suppress(OSError):
            for entry in os.listdir("/proc"):
                if entry.isdigit() and self._is_our_beam(int(entry)):
                    pid = int(entry)
                    self._pid, self._pid_start = pid, _proc_start_time(pid)
                    return pid
        return None

    def _diagnostics(self) -> str:
        parts = []
        if self._dir:
            startup = _tail(os.path.join(self._dir, "startup.log"), 15)
            if startup.strip():
                parts.append("--- startup output:\n" + startup)
            log = _tail(self.log_file, 30)
            if log.strip():
                parts.append("--- %s (tail):\n%s" % (self.log_file, log))
        return ("\n" + "\n".join(parts)) if parts else ""

    def _port_clash(self, exc: BaseException) -> bool:
        """Did the failed start fail because a port was taken?"""
        texts = [str(exc)]
        if self._dir:
            for fname in (
                "startup.log",
                os.path.join("log", self._nodename + ".log"),
                os.path.join("log", "erl_crash.dump"),
            ):
                with contextlib.suppress(OSError), open(os.path.join(self._dir, fname), "rb") as f:
                    texts.append(f.read().decode("utf-8", "replace"))
        text = "\n".join(texts).lower()
        return any(m in text for m in ("eaddrinuse", "dist_port_already_used", "duplicate_name"))

    def start(self, timeout: float = 60.0) -> "RabbitNode":
        """Start the node and wait until AMQP and the management API answer.

        With automatically picked ports, a start that fails because a port
        was taken in the meantime is retried on fresh ports.
        """
        if self.is_running():
            return self
        refuse_if_no_broker("a private RabbitMQ node was to start")
        # A node started before keeps its ports: its clients hold URLs with
        # them. Right after a kill -9, epmd may still hold its name for a
        # moment (duplicate_name), which a retry on the same ports outlives.
        restarting = self._started_before
        attempts = 3 if self._auto_ports or restarting else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                self._started_before = True
                return self
            except RabbitNodeError as exc:
                with contextlib.suppress(Exception):
                    self.kill()  # a half-started node (kill() finds it)
                self._unregister()
                if attempt == attempts or not self._port_clash(exc):
                    raise
                if restarting:
                    time.sleep(1.0)
                else:
                    self._amqp_port = self._management_port = self._dist_port = None
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "RabbitNode":
        deadline = time.monotonic() + timeout
        self._prepare()
        for stale in (self.pid_file, self._crash_dump):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        self._pid = self._pid_start = None
        self._register()
        env = self.environ()
        with open(os.path.join(self._dir, "startup.log"), "ab") as out:  # type: ignore[arg-type]
            try:
                proc = subprocess.Popen(
                    [self._server, "-detached"],
                    env=env,
                    cwd=self._dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **self._popen_kwargs(),
                )
            except OSError as exc:
                raise RabbitNodeError("cannot run %s: %s" % (self._server, exc)) from exc
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except BaseException as exc:  # a timeout, or ^C while the script runs
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session (see above)
                proc.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise RabbitNodeError(
                        "rabbitmq-server -detached did not return" + self._diagnostics()
                    ) from None
                raise
        if rc != 0:
            raise RabbitNodeError(
                "rabbitmq-server -detached failed (rc %d)%s" % (rc, self._diagnostics())
            )
        self._wait_booted(deadline)
        if self._read_pid() is None:
            raise RabbitNodeError("node %s started but wrote no pid file" % self._nodename)
        while not self._serving():
            if not self.is_running():
                raise RabbitNodeError(
                    "node %s died during start%s" % (self._nodename, self._diagnostics())
                )
            if time.monotonic() > deadline:
                raise RabbitNodeError(
                    "%s of %s did not answer within %.0f s%s"
                    % (
                        "management API" if self.has_management else "AMQP listener",
                        self._nodename,
                        timeout,
                        self._diagnostics(),
                    )
                )
            time.sleep(0.05)
        return self

    def _serving(self) -> bool:
        """Ready for clients: the management API answers (it starts last), or
        without the plugin the AMQP listener does."""
        if self.management_url is not None:
            return management_api_ready(self.management_url, timeout=2.0)
        return amqp_ready("127.0.0.1", self.amqp_port, timeout=2.0)

    def _wait_booted(self, deadline: float) -> None:
        """Run ``rabbitmqctl wait PIDFILE``: it waits for the pid file, then for
        the rabbit app to boot, and fails early if that pid dies.  A node that
        dies before it writes its pid file (e.g. its distribution port is taken)
        only leaves an erl_crash.dump, so watch for that meanwhile."""
        remaining = max(1, int(deadline - time.monotonic()))
        cmd = [self._ctl, "-n", self._nodename, "wait", self.pid_file, "--timeout", str(remaining)]
        waiter = subprocess.Popen(
            cmd,
            env=self.environ(),
            cwd=self._dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **self._popen_kwargs(),
        )
        problem = None
        try:
            while True:
                try:
                    out, err = waiter.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if os.path.exists(self._crash_dump):
                    time.sleep(0.2)  # let the VM write the dump's head
                    problem = "the Erlang VM crashed: %s" % self._crash_slogan()
                    break
                if time.monotonic() > deadline + 15:
                    problem = "rabbitmqctl wait did not return"
                    break
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.communicate()
        if problem is None and waiter.returncode != 0:
            problem = "rabbitmqctl wait failed (rc %d): %s" % (
                waiter.returncode,
                (err.strip() or out.strip()),
            )
        if problem is not None:
            raise RabbitNodeError(
                "node %s did not start: %s%s" % (self._nodename, problem, self._diagnostics())
            )

    @property
    def _crash_dump(self) -> str:
        return os.path.join(self._require_dir(), "log", "erl_crash.dump")

    def _crash_slogan(self) -> str:
        with contextlib.suppress(OSError), open(self._crash_dump, "rb") as f:
            for line in f.read(8192).decode("utf-8", "replace").splitlines():
                if line.startswith("Slogan:"):
                    return line[len("Slogan:") :].strip()
        return "(see %s)" % self._crash_dump

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.is_running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the node gracefully (``rabbitmqctl stop``) and wait for the beam
        process to exit; SIGKILL it if it does not within *timeout*."""
        if self._pid is None:
            self._find_beam()
        if not self.is_running():
            self._pid = self._pid_start = None
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(RabbitNodeError):
            self.ctl("stop", timeout=max(1.0, deadline - time.monotonic()))
        if not self._wait_gone(max(0.0, deadline - time.monotonic())):
            self.kill()
        self._pid = self._pid_start = None

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the beam process (a broker crash) and wait until it is gone."""
        pid = self._pid if self._pid is not None else self._find_beam()
        if pid is not None and self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not self._wait_gone(timeout):
                raise RabbitNodeError("beam pid %d of %s survived SIGKILL" % (pid, self._nodename))
        self._pid = self._pid_start = None

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (connections drop, the beam keeps running)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the RabbitMQ application again after :meth:`stop_app`."""
        self.ctl("start_app")

    def close_all_connections(self, reason: str = "test") -> None:
        """Make the broker close every client connection (connection.close 320)."""
        self.ctl("close_all_connections", reason)

    def drop_all_connections(self) -> None:
        """Kill every client connection's process in one go, as a crash of
        the broker's network would: no connection.close, and the connections
        go within microseconds of each other (``close_all_connections``
        closes them one by one)."""
        self.ctl("eval", "[exit(P, kill) || P <- rabbit_networking:connections()], ok.")

    def crash_channels(self) -> None:
        """Make every channel on the node crash: the broker closes each
        client connection with 541 INTERNAL_ERROR, as it does when a consume
        races another client's declare of a new quorum queue (3.10)."""
        self.ctl("eval", "[exit(P, crash_for_test) || P <- rabbit_channel:list_local()], ok.")

    def join_cluster(self, other: Union["RabbitNode", str]) -> None:
        """Make this node join *other*'s cluster (stop_app, join_cluster, start_app)."""
        other_name = other.nodename if isinstance(other, RabbitNode) else other
        self.stop_app()
        self.ctl("join_cluster", other_name)
        self.start_app()

    def cleanup(self, graceful: bool = True) -> None:
        """Stop the node if it runs (with *graceful* False: SIGKILL it, which
        saves ~6 s; see :func:`provide_broker`) and remove its directory."""
        try:
            if graceful:
                self.stop()
            else:
                self.kill()
        finally:
            self._remove_dir()
            self._unregister()

    def detach(self) -> None:
        """Let the node outlive this Python process (no kill at exit)."""
        self._unregister()

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _register(self) -> None:
        with _LIVE_LOCK:
            _LIVE_NODES[id(self)] = self

    def _unregister(self) -> None:
        with _LIVE_LOCK:
            _LIVE_NODES.pop(id(self), None)

    def __enter__(self) -> "RabbitNode":
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


# --------------------------------------------------------------------------
# brokers for tests, demos and benchmarks


@dataclasses.dataclass(frozen=True)
class Broker:
    """Where to find a broker. *owner* is the :class:`RabbitNode` if this
    process started a private node, else None (env / docker)."""

    amqp_url: str
    management_url: Optional[str] = None
    owner: Optional[RabbitNode] = None
    kind: str = "env"  # "env", "docker" or "node"
    description: str = ""

    def environ(self) -> Dict[str, str]:
        """``AMQP_URL`` / ``AMQP_MANAGEMENT_URL`` for a child process's environment."""
        env = {"AMQP_URL": self.amqp_url}
        if self.management_url:
            env["AMQP_MANAGEMENT_URL"] = self.management_url
        return env


def _docker_client(timeout: float = 2.0) -> Any:
    """A docker client if a Docker engine answers within *timeout*, else None."""
    if no_broker_wanted():
        return None
    try:
        import docker  # noqa: PLC0415
    except Exception:
        return None
    client = None
    try:
        client = docker.from_env(timeout=max(1, int(round(timeout))))
        if client.ping():
            client.api.timeout = 300  # the short timeout was for the probe only (pulls are slow)
            return client
    except Exception:
        pass
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()
    return None


@contextlib.contextmanager
def _docker_broker(
    client: Any, image: str = DOCKER_IMAGE, timeout: float = 120.0
) -> Iterator[Broker]:
    base_url = str(getattr(getattr(client, "api", None), "base_url", "") or "")
    parts = urllib.parse.urlsplit(base_url)
    remote = parts.scheme in ("http", "https", "tcp") and parts.hostname not in (
        None,
        "localhost",
        "127.0.0.1",
        "::1",
    )
    host = parts.hostname if remote else "127.0.0.1"
    bind: Any = None if remote else ("127.0.0.1", None)  # None host port: docker picks
    name = "%s-%s" % (NODE_NAME_PREFIX, secrets.token_hex(4))
    container = client.containers.run(
        image,
        detach=True,
        name=name,
        labels={"devtools.rabbitmq": "1"},
        ports={"5672/tcp": bind, "15672/tcp": bind},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            container.reload()
            ports = container.attrs.get("NetworkSettings", {}).get("Ports") or {}
            if ports.get("5672/tcp") and ports.get("15672/tcp"):
                break
            if container.status == "exited" or time.monotonic() > deadline:
                raise RabbitNodeError("container %s did not publish its ports" % name)
            time.sleep(0.1)
        amqp_port = int(ports["5672/tcp"][0]["HostPort"])
        mgmt_port = int(ports["15672/tcp"][0]["HostPort"])
        amqp_url = "amqp://guest:guest@%s:%d/%%2F" % (host, amqp_port)
        mgmt_url = "http://guest:guest@%s:%d/" % (host, mgmt_port)
        while not (amqp_ready(host, amqp_port) and management_api_ready(mgmt_url)):
            container.reload()
            if container.status == "exited":
                raise RabbitNodeError(
                    "container %s exited:\n%s"
                    % (name, container.logs(tail=30).decode("utf-8", "replace"))
                )
            if time.monotonic() > deadline:
                raise RabbitNodeError("container %s not ready within %.0f s" % (name, timeout))
            time.sleep(0.2)
        yield Broker(amqp_url, mgmt_url, None, "docker", "docker container %s (%s)" % (name, image))
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)
        with contextlib.suppress(Exception):
            client.close()


@contextlib.contextmanager
def provide_broker(
    *,
    allow_docker: bool = True,
    start_timeout: float = 60.0,
    graceful_stop: bool = False,
    **node_kwargs: Any,
) -> Iterator[Broker]:
    """Yield a :class:`Broker`, and dispose of it afterwards.

    1. ``$AMQP_URL`` if set (management URL from ``$AMQP_MANAGEMENT_URL``, or None);
    2. else, if a Docker engine answers within ~2 s, a container of
       ``$ASGI_AMQP_DOCKER_IMAGE`` (default ``rabbitmq:3-management``; it must
       have the management plugin) on random loopback ports (removed at exit);
    3. else a private :class:`RabbitNode` (*node_kwargs* go to its constructor),
       stopped and deleted at exit.

    The private node is a throw-away: by default it is SIGKILLed at exit
    rather than stopped with ``rabbitmqctl stop``, because RabbitMQ before
    3.13 spends a fixed 5 s stopping its management agent ("Management
    plugin: to stop collect_statistics", rabbitmq-server PR #11070), so a
    graceful stop costs ~6.5 s against ~0.05 s, for a directory that is
    deleted right after.  Pass ``graceful_stop=True`` to stop it gracefully.
    """
    url = os.environ.get("AMQP_URL")
    if url:
        yield Broker(
            url,
            os.environ.get("AMQP_MANAGEMENT_URL") or None,
            None,
            "env",
            "AMQP_URL from the environment",
        )
        return
    client = _docker_client() if allow_docker else None
    if client is not None:
        image = os.environ.get(DOCKER_IMAGE_VARIABLE) or DOCKER_IMAGE
        with _docker_broker(client, image, timeout=max(start_timeout, 120.0)) as broker:
            yield broker
        return
    node = RabbitNode(**node_kwargs)
    try:
        node.start(timeout=start_timeout)
        yield Broker(
            node.amqp_url,
            node.management_url,
            node,
            "node",
            "private RabbitMQ node %s (amqp port %d, management port %d, dir %s)"
            % (node.nodename, node.amqp_port, node.management_port, node.dir),
        )
    finally:
        node.cleanup(graceful=graceful_stop)


# --------------------------------------------------------------------------
# unpacking a RabbitMQ and an Erlang to run nodes from

_TARBALL_SUFFIXES = (".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2", ".tar")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify_checksum(path: str, digest: str, log: Callable[[str], None]) -> None:
    """Check *path*'s *digest* against a ``SHA256SUMS`` in its directory, if
    there is one (``sha256sum`` format).  A mismatch raises; a file the list
    does not name is unpacked with a warning."""
    sums = os.path.join(os.path.dirname(os.path.abspath(path)), "SHA256SUMS")
    if not os.path.isfile(sums):
        return
    name = os.path.basename(path)
    with open(sums) as f:
        for line in f:
            fields = line.strip().split(None, 1)
            if len(fields) != 2:
                continue
            listed = fields[1].lstrip("*")  # "*": sha256sum's binary mode
            if listed.startswith("./"):
                listed = listed[2:]
            if listed != name:
                continue
            if fields[0].lower() != digest:
                raise RabbitNodeError(
                    "%s has sha256 %s, but %s says %s" % (path, digest, sums, fields[0])
                )
            log("%s: sha256 matches %s" % (name, sums))
            return
    log("warning: %s does not list %s; not verified" % (sums, name))


def _archive_stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".deb", *_TARBALL_SUFFIXES):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    raise RabbitNodeError("%s: not a .deb or a tarball (%s)" % (path, ", ".join(_TARBALL_SUFFIXES)))


def _extract(archive: str, into: str) -> None:
    if archive.endswith(".deb"):
        if shutil.which("dpkg") is None:
            raise RabbitNodeError("unpacking %s needs dpkg (dpkg -x)" % archive)
        cmd = ["dpkg", "-x", archive, into]
    else:  # GNU tar finds the compression itself; the files become ours
        cmd = ["tar", "-xf", archive, "-C", into, "--no-same-owner"]
    cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if cp.returncode != 0:
        raise RabbitNodeError(
            "%s failed (rc %d): %s" % (" ".join(cmd), cp.returncode, cp.stderr.strip())
        )


def _find_dir(top: str, matches: Callable[[str], bool]) -> Optional[str]:
    """The first directory under *top* (breadth first, sorted) that *matches*."""
    level = [top]
    while level:
        below = []
        for d in level:
            if matches(d):
                return d
            with contextlib.suppress(OSError):
                for entry in sorted(os.scandir(d), key=lambda e: e.name):
                    if entry.is_dir(follow_symlinks=False):
                        below.append(entry.path)
        level = below
    return None


def _is_server_dir(d: str) -> bool:
    # Not Debian's usr/sbin (a wrapper link), but sbin/ next to plugins/.
    script = os.path.join(d, "sbin", "rabbitmq-server")
    return (
        os.path.isfile(script)
        and not os.path.islink(script)
        and os.path.isdir(os.path.join(d, "plugins"))
    )


def _is_erlang_root(d: str) -> bool:
    # <prefix>/lib/erlang: the prefix's own bin/erl is a link that does not relocate.
    parent = os.path.dirname(d)
    return (
        os.path.basename(d) == "erlang"
        and os.path.basename(parent) == "lib"
        and os.path.isfile(os.path.join(d, "bin", "erl"))
    )


def _unpack_one(
    archive: str,
    into: str,
    matches: Callable[[str], bool],
    what: str,
    log: Callable[[str], None],
) -> str:
    """Unpack *archive* into ``INTO/<its name>`` unless an earlier call did;
    return the directory in it that *matches*."""
    archive = os.path.abspath(archive)
    if not os.path.isfile(archive):
        raise RabbitNodeError("%s: no such file" % archive)
    stem = _archive_stem(archive)
    digest = _sha256(archive)
    _verify_checksum(archive, digest, log)
    target = os.path.join(into, stem)
    if os.path.isdir(target):
        log("reusing %s" % target)
    else:
        # Unpack beside it and rename: a half-unpacked or concurrently
        # unpacked directory is never taken for a finished one.
        tmp = tempfile.mkdtemp(prefix=".%s." % stem, dir=into)
        try:
            os.chmod(tmp, 0o755)  # the rabbitmq user runs what is in it
            log("unpacking %s into %s" % (os.path.basename(archive), target))
            _extract(archive, tmp)
            os.chmod(tmp, 0o755)  # (dpkg -x sets it from the package)
            with open(os.path.join(tmp, UNPACKED_MARKER), "w") as f:
                json.dump({"archive": os.path.basename(archive), "sha256": digest}, f)
            try:
                os.rename(tmp, target)
            except OSError:
                if not os.path.isdir(target):  # else another unpack won the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        with open(os.path.join(target, UNPACKED_MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        marker = {}
    if marker.get("sha256") != digest:
        raise RabbitNodeError(
            "%s exists but is not an unpacking of %s (sha256 %s); remove it or "
            "unpack into another directory" % (target, archive, digest)
        )
    found = _find_dir(target, matches)
    if found is None:
        raise RabbitNodeError("%s holds no %s (unpacked in %s)" % (archive, what, target))
    return found


def unpack_broker(
    server: str,
    erlang: str,
    into: str,
    log: Optional[Callable[[str], None]] = None,
) -> Dict[str, str]:
    """Unpack a RabbitMQ server and an Erlang to run nodes from; return
    ``{"ASGI_AMQP_RABBITMQ_SERVER_DIR": ..., "ASGI_AMQP_ERLANG_ROOT": ...}``.

    *server* is a RabbitMQ ``.deb`` (unpacked with ``dpkg -x``; nothing is
    installed) or a generic-unix tarball, *erlang* a tarball with a
    ``lib/erlang/bin/erl`` in it.  Each goes into ``INTO/<file name without
    extension>``, world-readable (as root the node runs as the rabbitmq user);
    when that exists already and was unpacked from the same file (its sha256),
    it is reused.  Each file is first checked against a ``SHA256SUMS`` beside
    it, if there is one.  *log* gets a line for each step.
    """
    say = log or (lambda _msg: None)
    into = os.path.abspath(into)
    os.makedirs(into, exist_ok=True)
    server_dir = _unpack_one(server, into, _is_server_dir, "RabbitMQ server directory", say)
    erlang_root = _unpack_one(erlang, into, _is_erlang_root, "lib/erlang/bin/erl", say)
    return {
        SERVER_DIR_VARIABLE: _server_dir_from(server_dir) or server_dir,
        ERLANG_ROOT_VARIABLE: _erlang_root_from(erlang_root) or erlang_root,
    }


# --------------------------------------------------------------------------
# command line

_SI_KERNEL = 0x80  # si_code of signals the kernel sends, e.g. the tty's ^C


def _exit_status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _run_child(cmd: Sequence[str], env: Mapping[str, str]) -> int:
    """Run *cmd*; forward SIGINT/SIGTERM/SIGHUP to it; return its exit status."""
    forwarded = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if not hasattr(signal, "sigtimedwait"):  # not Linux: plain handlers
        proc = subprocess.Popen(list(cmd), env=dict(env))

        def forward(signum: int, _frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in forwarded}
        try:
            return _exit_status(proc.wait())
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    watched = forwarded | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        proc = subprocess.Popen(
            list(cmd),
            env=dict(env),
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old_mask),
        )
        while True:
            info = signal.sigtimedwait(watched, 0.5)
            rc = proc.poll()
            if rc is not None:
                return _exit_status(rc)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            # A ^C from the terminal already reached the child (it is in our
            # process group); forward only what was sent to us alone.
            if info.si_code == _SI_KERNEL and os.getpgid(proc.pid) == os.getpgrp():
                continue
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(info.si_signo)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


class _Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise _Interrupted(signum)


def _say(msg: str) -> None:
    print("devtools.rabbitmq: " + msg, file=sys.stderr, flush=True)


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        _say("run: no command given (usage: run -- CMD [ARGS...])")
        return 2
    # SIGTERM/SIGHUP while the broker starts or stops: unwind and clean up.
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_interrupt)
    rc = 130
    try:
        with provide_broker(allow_docker=not args.no_docker) as broker:
            _say("using %s" % broker.description)
            env = dict(os.environ)
            env.update(broker.environ())
            if not broker.management_url:
                env.pop("AMQP_MANAGEMENT_URL", None)
            rc = _run_child(cmd, env)
            if broker.owner is not None:
                _say("stopping %s" % broker.owner.nodename)
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if isinstance(exc, _Interrupted) and exc.args else signal.SIGINT
        _say("interrupted; broker cleaned up")
        return 128 + int(signum)
    return rc


def _cmd_start(args: argparse.Namespace) -> int:
    node = RabbitNode(name=args.name, base_dir=args.base_dir)
    try:
        node.start(timeout=args.timeout)
    except BaseException:
        node.cleanup()
        raise
    node.detach()
    print("AMQP_URL=%s" % node.amqp_url)
    print("AMQP_MANAGEMENT_URL=%s" % node.management_url)
    print(
        "# node %s (RabbitMQ %s), pid %s, files in %s"
        % (node.nodename, node.version(), node.pid, node.dir)
    )
    # From any directory: the checkout that holds devtools goes on PYTHONPATH.
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(
        "# stop it with: PYTHONPATH=%s %s -m devtools.rabbitmq stop %s"
        % (shlex.quote(checkout), sys.executable or "python3", node.dir)
    )
    print('# (in a shell: set -a; eval "$(python3 -m devtools.rabbitmq start)"; set +a)')
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    node = RabbitNode.from_dir(args.node_dir)
    if args.nodename and args.nodename not in (node.nodename, node.nodename.split("@")[0]):
        _say("%s holds node %s, not %s" % (args.node_dir, node.nodename, args.nodename))
        return 2
    node.cleanup()
    _say("stopped %s and removed %s" % (node.nodename, args.node_dir))
    return 0


def _cmd_unpack(args: argparse.Namespace) -> int:
    found = unpack_broker(args.server, args.erlang, args.into, log=_say)
    for name, value in found.items():
        print("%s=%s" % (name, shlex.quote(value)))
    print("# nodes of `start` and `run` (and the test suite's) run from these when they are set")
    print('# (in a shell: set -a; eval "$(python3 -m devtools.rabbitmq unpack ...)"; set +a)')
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.rabbitmq", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="provide a broker for CMD (AMQP_URL, AMQP_MANAGEMENT_URL)")
    p_run.add_argument(
        "--no-docker", action="store_true", help="do not use a Docker engine even if one answers"
    )
    p_run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p_run.set_defaults(func=_cmd_run)
    p_start = sub.add_parser("start", help="start a private node and leave it running")
    p_start.add_argument("--name", default=None, help="node name (default: unique)")
    p_start.add_argument("--base-dir", default=None, help="parent of the node's directory")
    p_start.add_argument("--timeout", type=float, default=60.0)
    p_start.set_defaults(func=_cmd_start)
    p_stop = sub.add_parser("stop", help="stop a node started with `start` and remove its files")
    p_stop.add_argument("node_dir", help="the node's directory (printed by `start`)")
    p_stop.add_argument(
        "nodename",
        nargs="?",
        default=None,
        help="optional: check that the directory holds this node",
    )
    p_stop.set_defaults(func=_cmd_stop)
    p_unpack = sub.add_parser(
        "unpack",
        help="unpack a RabbitMQ and an Erlang to run nodes from; print %s and %s"
        % (SERVER_DIR_VARIABLE, ERLANG_ROOT_VARIABLE),
    )
    p_unpack.add_argument(
        "--server",
        required=True,
        metavar="FILE",
        help="a rabbitmq-server .deb or a RabbitMQ generic-unix tarball (.tar.xz, .tar.gz)",
    )
    p_unpack.add_argument(
        "--erlang", required=True, metavar="FILE", help="an Erlang tarball with lib/erlang/bin/erl"
    )
    p_unpack.add_argument(
        "--into", required=True, metavar="DIR", help="where to unpack (reused when run again)"
    )
    p_unpack.set_defaults(func=_cmd_unpack)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RabbitNodeError as exc:
        _say("error: %s" % exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
