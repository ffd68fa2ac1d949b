"""Tests of the broker tooling in devtools/rabbitmq.py.

The slow tests start real private RabbitMQ nodes (about 8 s each on a
2-core machine); they never touch the session broker or a system broker.
"""

import base64
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import urllib.request

import pika  # noqa: E402
import pytest

from devtools import rabbitmq as rmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rabbitmq_installed():
    if os.environ.get(rmq.SERVER_DIR_VARIABLE):
        return True  # nodes run from that server directory
    try:
        rmq.find_rabbitmq_scripts()
    except rmq.RabbitMQNotInstalled:
        return False
    return True


def _debian_rabbitmq_installed():
    try:
        rmq.find_rabbitmq_scripts()
    except rmq.RabbitMQNotInstalled:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(
    not _rabbitmq_installed(), reason="rabbitmq-server is not installed"
)
needs_debian_rabbitmq = pytest.mark.skipif(
    not _debian_rabbitmq_installed(), reason="the rabbitmq-server package is not installed"
)

#: The RabbitMQ server directory and Erlang this run was given (make test's
#: server-dir pass, see devtools/test_brokers.py), read before any test's
#: fixture clears them.
GIVEN_SERVER_DIR = os.environ.get(rmq.SERVER_DIR_VARIABLE) or None
GIVEN_ERLANG_ROOT = os.environ.get(rmq.ERLANG_ROOT_VARIABLE) or None


def _api_get(node, path):
    req = urllib.request.Request("http://127.0.0.1:%d/api/%s" % (node.management_port, path))
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read().decode())


@pytest.mark.broker
@pytest.mark.slow
@needs_rabbitmq
def test_private_node_lifecycle():
    # (pytest's tmp_path is not reachable by the rabbitmq user: mode 0700)
    base = tempfile.mkdtemp(prefix="devtools-test-")
    os.chmod(base, 0o755)
    node = rmq.RabbitNode(base_dir=base)
    try:
        node.start()
        pid = node.pid
        assert node.is_running() and pid
        assert node.nodename.startswith("asgiamqp-") and node.nodename.endswith("@localhost")
        assert os.path.dirname(node.dir) == base
        ports = (node.amqp_port, node.management_port, node.dist_port)
        assert len(set(ports)) == 3 and not set(ports) & {5672, 15672, 25672}
        assert node.amqp_url == "amqp://guest:guest@127.0.0.1:%d/%%2F" % node.amqp_port
        assert node.management_url == "http://guest:guest@127.0.0.1:%d/" % node.management_port

        # AMQP works, and the management API (guest from loopback) sees it.
        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
        ch = conn.channel()
        ch.queue_declare("devtools-q", durable=True)
        ch.basic_publish("", "devtools-q", b"kept", pika.BasicProperties(delivery_mode=2))
        overview = _api_get(node, "overview")
        assert overview["node"] == node.nodename
        assert _api_get(node, "queues/%2F/devtools-q")["name"] == "devtools-q"
        assert node.nodename in node.ctl("-q", "eval", "node().")

        # close_all_connections: the client gets connection.close 320.
        node.close_all_connections("devtools test")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.process_data_events(time_limit=5)
        assert info.value.reply_code == 320

        # stop_app: AMQP goes away, the beam stays; start_app brings it back.
        node.stop_app()
        assert node.is_running() and node.pid == pid
        assert not rmq.amqp_ready("127.0.0.1", node.amqp_port, timeout=1)
        node.start_app()
        assert rmq.amqp_ready("127.0.0.1", node.amqp_port, timeout=5)

        # kill: the beam is gone at once; start() again keeps ports and data.
        node.kill()
        assert node.pid is None and not node.is_running()
        assert not rmq._pid_alive(pid)
        assert not rmq.amqp_ready("127.0.0.1", ports[0], timeout=1)
        node.start()
        assert node.pid != pid
        assert (node.amqp_port, node.management_port, node.dist_port) == ports
        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
        method, _props, body = conn.channel().basic_get("devtools-q", auto_ack=True)
        assert body == b"kept"
        conn.close()

        # cleanup: graceful stop, the beam exits, the directory goes.
        pid, node_dir = node.pid, node.dir
        node.cleanup()
        assert not rmq._pid_alive(pid)
        assert not os.path.exists(node_dir)
        assert not rmq.amqp_ready("127.0.0.1", ports[0], timeout=1)
    finally:
        node.cleanup(graceful=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.broker
@pytest.mark.slow
@needs_rabbitmq
def test_private_node_ignores_the_unprefixed_settings_of_the_callers_shell(monkeypatch):
    # RabbitMQ falls back from RABBITMQ_LOGS to LOGS, from RABBITMQ_NODENAME
    # to NODENAME, and so on: names a user's shell may export for other tools.
    base = tempfile.mkdtemp(prefix="devtools-test-")
    os.chmod(base, 0o755)
    elsewhere = os.path.join(base, "elsewhere.log")
    monkeypatch.setenv("LOGS", elsewhere)
    monkeypatch.setenv("NODENAME", "not-this-node@localhost")
    monkeypatch.setenv("MNESIA_DIR", os.path.join(base, "not-this-mnesia"))
    node = rmq.RabbitNode(base_dir=base)
    try:
        node.start()
        assert not {"LOGS", "NODENAME", "MNESIA_DIR"} & set(node.environ())
        assert node.nodename.startswith("asgiamqp-")
        assert node.nodename in node.ctl("-q", "eval", "node().")
        assert os.path.exists(node.log_file)
        assert not os.path.exists(elsewhere)
        assert not os.path.exists(os.path.join(base, "not-this-mnesia"))
    finally:
        node.cleanup(graceful=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.broker
@pytest.mark.slow
@needs_rabbitmq
def test_a_node_without_the_management_plugin_stops_its_app_without_the_agents_wait():
    # The stack fault test restarts such a node: with the plugin, RabbitMQ
    # before 3.13 keeps the listener closed 5 s longer (stop_app 5.4 s
    # against 0.4-0.6 s measured), and the "5 s pause" would mean
    # 10.8 s without the broker.
    base = tempfile.mkdtemp(prefix="devtools-test-")
    os.chmod(base, 0o755)
    node = rmq.RabbitNode(base_dir=base, plugins=())
    try:
        node.start()
        assert not node.has_management and node.management_url is None
        with open(os.path.join(node.dir, "rabbitmq.conf")) as conf:
            assert "management." not in conf.read()
        assert not rmq.management_api_ready(
            "http://guest:guest@127.0.0.1:%d/" % node.management_port, timeout=1
        )
        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
        conn.channel().queue_declare("devtools-plain", durable=True)
        conn.close()
        began = time.monotonic()
        node.stop_app()
        assert time.monotonic() - began < 4.0
        assert not rmq.amqp_ready("127.0.0.1", node.amqp_port, timeout=1)
        node.start_app()
        assert rmq.amqp_ready("127.0.0.1", node.amqp_port, timeout=5)
    finally:
        node.cleanup(graceful=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.broker
@needs_rabbitmq
@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the node to another user")
def test_node_dir_must_be_reachable_by_the_rabbitmq_user(tmp_path):
    os.chmod(tmp_path, 0o700)
    node = rmq.RabbitNode(base_dir=str(tmp_path))
    if node._identity is None:
        pytest.skip("no rabbitmq user: the node runs as root")
    with pytest.raises(rmq.RabbitNodeError, match="cannot enter"):
        node.start()
    node.cleanup()
    assert os.listdir(tmp_path) == []


@pytest.mark.broker
@pytest.mark.slow
@needs_rabbitmq
def test_run_command_gets_a_broker_and_its_exit_code(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, pika
        url = os.environ["AMQP_URL"]
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.close()
        print("URL", url)
        print("MGMT", os.environ["AMQP_MANAGEMENT_URL"])
        sys.exit(7)
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMQP_")}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools.rabbitmq",
            "run",
            "--no-docker",
            "--",
            sys.executable,
            str(script),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 7, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["URL"].startswith("amqp://guest:guest@127.0.0.1:")
    assert lines["MGMT"].startswith("http://guest:guest@127.0.0.1:")
    assert "private RabbitMQ node asgiamqp-" in proc.stderr
    port = int(lines["URL"].rsplit(":", 1)[1].split("/")[0])
    assert not rmq.amqp_ready("127.0.0.1", port, timeout=1)  # broker gone afterwards


def test_provide_broker_uses_amqp_url(monkeypatch):
    monkeypatch.setenv("AMQP_URL", "amqp://u:p@broker.example:5673/vh")
    monkeypatch.delenv("AMQP_MANAGEMENT_URL", raising=False)
    monkeypatch.setattr(rmq, "_docker_client", lambda: pytest.fail("docker probed"))
    with rmq.provide_broker() as broker:
        assert broker.amqp_url == "amqp://u:p@broker.example:5673/vh"
        assert broker.management_url is None and broker.owner is None
        assert broker.kind == "env"
        assert broker.environ() == {"AMQP_URL": "amqp://u:p@broker.example:5673/vh"}
    monkeypatch.setenv("AMQP_MANAGEMENT_URL", "http://u:p@broker.example:15673/")
    with rmq.provide_broker() as broker:
        assert broker.management_url == "http://u:p@broker.example:15673/"


class _FakeContainer:
    def __init__(self):
        self.status = "running"
        self.removed = False
        self.attrs = {
            "NetworkSettings": {
                "Ports": {
                    "5672/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32770"}],
                    "15672/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32771"}],
                }
            }
        }

    def reload(self):
        pass

    def remove(self, force=False):
        self.removed = force


class _FakeDocker:
    def __init__(self):
        self.container = _FakeContainer()
        self.run_args = None
        self.closed = False
        self.containers = self
        self.api = type("Api", (), {"base_url": "http+docker://localhost"})()

    def run(self, image, **kwargs):
        self.run_args = (image, kwargs)
        return self.container

    def close(self):
        self.closed = True


def test_provide_broker_docker_path(monkeypatch):
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.delenv(rmq.DOCKER_IMAGE_VARIABLE, raising=False)
    fake = _FakeDocker()
    monkeypatch.setattr(rmq, "_docker_client", lambda: fake)
    monkeypatch.setattr(rmq, "amqp_ready", lambda host, port, timeout=2.0: True)
    monkeypatch.setattr(rmq, "management_api_ready", lambda url, timeout=2.0: True)
    monkeypatch.setattr(rmq, "RabbitNode", lambda **kw: pytest.fail("node started"))
    with rmq.provide_broker() as broker:
        assert broker.kind == "docker" and broker.owner is None
        assert broker.amqp_url == "amqp://guest:guest@127.0.0.1:32770/%2F"
        assert broker.management_url == "http://guest:guest@127.0.0.1:32771/"
        image, kwargs = fake.run_args
        assert image == "rabbitmq:3-management"
        assert kwargs["ports"] == {
            "5672/tcp": ("127.0.0.1", None),
            "15672/tcp": ("127.0.0.1", None),
        }
        assert not fake.container.removed
    assert fake.container.removed and fake.closed


def test_docker_client_is_none_without_an_engine(monkeypatch):
    class NoEngine:
        @staticmethod
        def from_env(**kwargs):
            raise RuntimeError("Cannot connect to the Docker daemon")

    monkeypatch.setitem(sys.modules, "docker", NoEngine)
    assert rmq._docker_client() is None
    monkeypatch.setitem(sys.modules, "docker", None)  # SDK not installed
    assert rmq._docker_client() is None


def test_free_ports_are_distinct_and_unreserved():
    ports = rmq._free_ports(6)
    assert len(set(ports)) == 6
    assert not set(ports) & rmq._RESERVED_PORTS


def test_free_ports_lie_below_the_ephemeral_range():
    # A client's own port comes from the ephemeral range; a node's port there
    # can be taken by a client connecting to itself while the node restarts.
    start = rmq._ephemeral_start()
    ports = rmq._free_ports(6) + [rmq.free_port()]
    assert all(rmq._LOWEST_PORT <= port < start for port in ports), (ports, start)


def test_provide_broker_docker_image_from_the_environment(monkeypatch):
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.setenv(rmq.DOCKER_IMAGE_VARIABLE, "rabbitmq:4.0-management")
    fake = _FakeDocker()
    monkeypatch.setattr(rmq, "_docker_client", lambda: fake)
    monkeypatch.setattr(rmq, "amqp_ready", lambda host, port, timeout=2.0: True)
    monkeypatch.setattr(rmq, "management_api_ready", lambda url, timeout=2.0: True)
    with rmq.provide_broker() as broker:
        assert broker.kind == "docker"
        assert fake.run_args[0] == "rabbitmq:4.0-management"
        assert "rabbitmq:4.0-management" in broker.description
    assert fake.container.removed


# --------------------------------------------------------------------------
# a node from a RabbitMQ server directory plus an Erlang


def _shared_dir(prefix="devtools-test-"):
    """A directory under /tmp that the rabbitmq user can enter (unlike tmp_path)."""
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def shared_dir():
    path = _shared_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _executable(path, text="#!/bin/sh\nexit 0\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def _fake_server_dir(parent, version="4.0.5"):
    """The shape of a server directory: sbin/ scripts, plugins/ (never run here)."""
    server_dir = os.path.join(parent, "rabbitmq_server-%s" % version)
    for script in ("rabbitmq-server", "rabbitmqctl"):
        _executable(os.path.join(server_dir, "sbin", script))
    os.makedirs(os.path.join(server_dir, "plugins"), exist_ok=True)
    return server_dir


def _fake_erlang_root(parent):
    """The shape of an installed Erlang: PREFIX/bin/erl links to PREFIX/lib/erlang."""
    root = os.path.join(parent, "erlang-27.3.4.1", "lib", "erlang")
    _executable(os.path.join(root, "bin", "erl"))
    os.makedirs(os.path.join(root, "erts-15.2.7", "bin"), exist_ok=True)
    os.makedirs(os.path.join(parent, "erlang-27.3.4.1", "bin"))
    os.symlink("../lib/erlang/bin/erl", os.path.join(parent, "erlang-27.3.4.1", "bin", "erl"))
    return root


@pytest.fixture
def no_broker_variables(monkeypatch):
    for name in (rmq.SERVER_DIR_VARIABLE, rmq.ERLANG_ROOT_VARIABLE):
        monkeypatch.delenv(name, raising=False)


def test_server_dir_node_environment(monkeypatch, shared_dir, no_broker_variables):
    server_dir = _fake_server_dir(shared_dir)
    erlang_root = _fake_erlang_root(shared_dir)
    monkeypatch.setenv(rmq.SERVER_DIR_VARIABLE, server_dir)
    monkeypatch.setenv(rmq.ERLANG_ROOT_VARIABLE, erlang_root)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    # The caller's RabbitMQ settings still do not reach the node.
    monkeypatch.setenv("RABBITMQ_HOME", "/somewhere/else")
    monkeypatch.setenv("RABBITMQ_LOGS", "/somewhere/else.log")
    monkeypatch.setenv("NODENAME", "not-this-node@localhost")
    node = rmq.RabbitNode()
    assert node.server_dir == server_dir and node.erlang_root == erlang_root
    assert node._server == os.path.join(server_dir, "sbin", "rabbitmq-server")
    assert node._ctl == os.path.join(server_dir, "sbin", "rabbitmqctl")
    node._dir = os.path.join(shared_dir, "node")  # environ() needs no more than its name
    env = node.environ()
    assert env["PATH"] == "%s/bin:%s/sbin:/usr/bin:/bin" % (erlang_root, server_dir)
    assert env["ERL_ROOTDIR"] == erlang_root
    assert env["RABBITMQ_HOME"] == server_dir
    assert env["RABBITMQ_NODENAME"] == node.nodename
    assert env["RABBITMQ_CONF_ENV_FILE"] == os.path.join(node._dir, "rabbitmq-env.conf")
    assert "RABBITMQ_LOGS" not in env and "NODENAME" not in env
    assert node.version() == "4.0.5"  # from the directory's name, no rabbitmqctl call
    # Arguments win over the variables; "" means none.
    other = _fake_server_dir(shared_dir, "4.1.0")
    node = rmq.RabbitNode(server_dir=other, erlang_root="")
    node._dir = os.path.join(shared_dir, "node")
    env = node.environ()
    assert node.erlang_root is None and "ERL_ROOTDIR" not in env
    assert env["PATH"] == "%s/sbin:/usr/bin:/bin" % other
    assert node.version() == "4.1.0"


@needs_debian_rabbitmq
def test_server_dir_unset_means_the_distributions_scripts(monkeypatch, no_broker_variables):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    node = rmq.RabbitNode()
    assert node.server_dir is None and node.erlang_root is None
    assert (node._server, node._ctl) == rmq.find_rabbitmq_scripts()
    node._dir = "/nonexistent/node"
    env = node.environ()
    assert env["PATH"] == "/usr/bin:/bin"
    assert "RABBITMQ_HOME" not in env
    assert node.version()[:1].isdigit()  # e.g. 3.10.8, from rabbitmq_server-3.10.8/


@needs_debian_rabbitmq
def test_server_dir_empty_string_ignores_the_variables(monkeypatch, shared_dir):
    monkeypatch.setenv(rmq.SERVER_DIR_VARIABLE, _fake_server_dir(shared_dir))
    monkeypatch.setenv(rmq.ERLANG_ROOT_VARIABLE, _fake_erlang_root(shared_dir))
    node = rmq.RabbitNode(server_dir="", erlang_root="")
    assert node.server_dir is None and node.erlang_root is None
    assert (node._server, node._ctl) == rmq.find_rabbitmq_scripts()


def test_server_dir_and_erlang_root_errors_name_the_variable_and_path(
    monkeypatch, shared_dir, no_broker_variables
):
    empty = os.path.join(shared_dir, "empty")
    os.makedirs(empty)
    monkeypatch.setenv(rmq.SERVER_DIR_VARIABLE, empty)
    with pytest.raises(rmq.RabbitNodeError, match="ASGI_AMQP_RABBITMQ_SERVER_DIR") as info:
        rmq.RabbitNode()
    assert empty in str(info.value) and "sbin/rabbitmq-server" in str(info.value)
    monkeypatch.delenv(rmq.SERVER_DIR_VARIABLE)
    server_dir = _fake_server_dir(shared_dir)
    os.chmod(os.path.join(server_dir, "sbin", "rabbitmqctl"), 0o644)
    with pytest.raises(rmq.RabbitNodeError, match="sbin/rabbitmqctl"):
        rmq.RabbitNode(server_dir=server_dir, erlang_root="")

    monkeypatch.setenv(rmq.ERLANG_ROOT_VARIABLE, empty)
    with pytest.raises(rmq.RabbitNodeError, match="ASGI_AMQP_ERLANG_ROOT") as info:
        rmq.RabbitNode(server_dir=_fake_server_dir(shared_dir, "4.0.6"))
    assert empty in str(info.value) and "bin/erl" in str(info.value)
    # The installation's prefix has a bin/erl too, but is not the root.
    root = _fake_erlang_root(shared_dir)
    prefix = os.path.dirname(os.path.dirname(root))
    with pytest.raises(rmq.RabbitNodeError, match="Did you mean %s" % root):
        rmq.RabbitNode(server_dir=_fake_server_dir(shared_dir, "4.0.7"), erlang_root=prefix)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the node to another user")
def test_server_dir_must_be_runnable_by_the_rabbitmq_user(no_broker_variables):
    if rmq.RabbitNode._run_identity() is None:
        pytest.skip("no rabbitmq user: the node runs as root")
    private = tempfile.mkdtemp(prefix="devtools-test-")  # mode 0700, as unpack's caller may
    try:
        server_dir = _fake_server_dir(private)
        with pytest.raises(rmq.RabbitNodeError, match="cannot enter %s" % private) as info:
            rmq.RabbitNode(server_dir=server_dir, erlang_root="")
        assert "ASGI_AMQP_RABBITMQ_SERVER_DIR" in str(info.value)
        os.chmod(private, 0o755)
        rmq.RabbitNode(server_dir=server_dir, erlang_root="")
        os.chmod(os.path.join(server_dir, "sbin", "rabbitmq-server"), 0o700)
        with pytest.raises(rmq.RabbitNodeError, match="cannot read and execute"):
            rmq.RabbitNode(server_dir=server_dir, erlang_root="")
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_server_dir_state_file_round_trip(monkeypatch, shared_dir, no_broker_variables):
    server_dir = _fake_server_dir(shared_dir)
    erlang_root = _fake_erlang_root(shared_dir)
    node = rmq.RabbitNode(server_dir=server_dir, erlang_root=erlang_root)
    node._ensure_ports()
    node._dir = os.path.join(shared_dir, "node")
    os.makedirs(node._dir)
    node._write_state()
    # Re-attached (e.g. by `stop NODE_DIR`) without the variables, or with others.
    monkeypatch.setenv(rmq.SERVER_DIR_VARIABLE, _fake_server_dir(shared_dir, "9.9.9"))
    again = rmq.RabbitNode.from_dir(node._dir)
    assert (again.server_dir, again.erlang_root) == (server_dir, erlang_root)
    assert (again._server, again._ctl) == (node._server, node._ctl)
    assert again.nodename == node.nodename and again.amqp_port == node.amqp_port
    assert again.environ()["ERL_ROOTDIR"] == erlang_root
    assert again.pid is None  # nothing runs


@needs_debian_rabbitmq
def test_server_dir_state_file_of_a_distribution_node(monkeypatch, shared_dir, no_broker_variables):
    # Written by a node on the distribution's scripts (or before server_dir
    # existed): the variables set now do not apply to it.
    node = rmq.RabbitNode()
    node._ensure_ports()
    node._dir = os.path.join(shared_dir, "node")
    os.makedirs(node._dir)
    node._write_state()
    state_file = os.path.join(node._dir, rmq.STATE_FILE)
    with open(state_file) as f:
        state = json.load(f)
    assert state["server_dir"] is None and state["erlang_root"] is None
    monkeypatch.setenv(rmq.SERVER_DIR_VARIABLE, _fake_server_dir(shared_dir))
    monkeypatch.setenv(rmq.ERLANG_ROOT_VARIABLE, _fake_erlang_root(shared_dir))
    assert rmq.RabbitNode.from_dir(node._dir).server_dir is None
    del state["server_dir"], state["erlang_root"]
    with open(state_file, "w") as f:
        json.dump(state, f)
    again = rmq.RabbitNode.from_dir(node._dir)
    assert again.server_dir is None and again.erlang_root is None
    assert again._ctl == node._ctl


# ---------------------------------------------------------------- unpack


def _add_tree(tar, files):
    """*files*: {path: text, or ("link", target), or ("dir",)} into *tar*."""
    for path, content in files.items():
        info = tarfile.TarInfo(path)
        if content == ("dir",):
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        elif isinstance(content, tuple):
            info.type, info.linkname = tarfile.SYMTYPE, content[1]
            tar.addfile(info)
        else:
            data = content.encode()
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))


def _tarball(path, files):
    mode = "w:xz" if path.endswith(".tar.xz") else "w:gz"
    with tarfile.open(path, mode) as tar:
        _add_tree(tar, files)
    return path


_SCRIPT = "#!/bin/sh\nexit 0\n"


def _fake_generic_unix_tarball(path, version="4.0.5"):
    top = "rabbitmq_server-%s" % version
    return _tarball(
        path,
        {
            top: ("dir",),
            top + "/sbin/rabbitmq-server": _SCRIPT,
            top + "/sbin/rabbitmqctl": _SCRIPT,
            top + "/plugins/rabbit-%s/ebin/rabbit.app" % version: "{}.",
        },
    )


def _fake_erlang_tarball(path):
    return _tarball(
        path,
        {
            "erlang-27.3.4.1/bin/erl": ("link", "../lib/erlang/bin/erl"),
            "erlang-27.3.4.1/lib/erlang/bin/erl": _SCRIPT,
            "erlang-27.3.4.1/lib/erlang/erts-15.2.7/bin/erlexec": _SCRIPT,
        },
    )


def stat_mode(path):
    return os.stat(path).st_mode & 0o777


def _write_sums(directory, *paths):
    with open(os.path.join(directory, "SHA256SUMS"), "w") as f:
        for path in paths:
            with open(path, "rb") as data:
                digest = hashlib.sha256(data.read()).hexdigest()
            f.write("%s  %s\n" % (digest, os.path.basename(path)))


def test_unpack_a_generic_unix_tarball_and_an_erlang(shared_dir, no_broker_variables):
    files = os.path.join(shared_dir, "files")
    os.makedirs(files)
    server = _fake_generic_unix_tarball(
        os.path.join(files, "rabbitmq-server-generic-unix-4.0.5.tar.xz")
    )
    erlang = _fake_erlang_tarball(os.path.join(files, "erlang-27.tar.gz"))
    _write_sums(files, server, erlang)
    into = os.path.join(shared_dir, "unpacked")
    said = []
    found = rmq.unpack_broker(server, erlang, into, log=said.append)
    server_dir = found[rmq.SERVER_DIR_VARIABLE]
    erlang_root = found[rmq.ERLANG_ROOT_VARIABLE]
    assert server_dir == os.path.join(
        into, "rabbitmq-server-generic-unix-4.0.5", "rabbitmq_server-4.0.5"
    )
    assert erlang_root == os.path.join(into, "erlang-27", "erlang-27.3.4.1", "lib", "erlang")
    assert sum("sha256 matches" in line for line in said) == 2
    assert stat_mode(os.path.dirname(server_dir)) == 0o755  # the rabbitmq user gets in
    node = rmq.RabbitNode(server_dir=server_dir, erlang_root=erlang_root)
    assert node.version() == "4.0.5"

    # Again: what is there is reused, not unpacked anew.
    marker = os.path.join(into, "erlang-27", rmq.UNPACKED_MARKER)
    before = os.stat(marker).st_mtime_ns
    said.clear()
    assert rmq.unpack_broker(server, erlang, into, log=said.append) == found
    assert os.stat(marker).st_mtime_ns == before
    assert sum(line.startswith("reusing ") for line in said) == 2
    assert sorted(os.listdir(into)) == ["erlang-27", "rabbitmq-server-generic-unix-4.0.5"]

    # Another file of the same name is not taken for the one unpacked there.
    _fake_generic_unix_tarball(server, "4.0.6")
    os.unlink(os.path.join(files, "SHA256SUMS"))
    with pytest.raises(rmq.RabbitNodeError, match="not an unpacking of"):
        rmq.unpack_broker(server, erlang, into)


def test_unpack_refuses_a_file_its_sha256sums_contradicts(shared_dir):
    server = _fake_generic_unix_tarball(os.path.join(shared_dir, "rabbitmq-4.0.5.tar.xz"))
    erlang = _fake_erlang_tarball(os.path.join(shared_dir, "erlang-27.tar.gz"))
    with open(os.path.join(shared_dir, "SHA256SUMS"), "w") as f:
        f.write("%s *rabbitmq-4.0.5.tar.xz\n" % ("0" * 64))
    into = os.path.join(shared_dir, "unpacked")
    with pytest.raises(rmq.RabbitNodeError, match="rabbitmq-4.0.5.tar.xz has sha256 .* says 0000"):
        rmq.unpack_broker(server, erlang, into)
    assert os.listdir(into) == []
    # A file the list does not name is unpacked, with a warning.
    _write_sums(shared_dir, server)
    said = []
    rmq.unpack_broker(server, erlang, into, log=said.append)
    assert any("does not list erlang-27.tar.gz" in line for line in said)


def test_unpack_finds_nothing_to_run_in_a_wrong_file(shared_dir):
    wrong = _tarball(os.path.join(shared_dir, "wrong.tar.gz"), {"README": "no server here"})
    erlang = _fake_erlang_tarball(os.path.join(shared_dir, "erlang-27.tar.gz"))
    into = os.path.join(shared_dir, "unpacked")
    with pytest.raises(rmq.RabbitNodeError, match="holds no RabbitMQ server directory"):
        rmq.unpack_broker(wrong, erlang, into)
    server = _fake_generic_unix_tarball(os.path.join(shared_dir, "rabbitmq-4.0.5.tar.xz"))
    with pytest.raises(rmq.RabbitNodeError, match="holds no lib/erlang/bin/erl"):
        rmq.unpack_broker(server, wrong, into)
    zipped = os.path.join(shared_dir, "rabbitmq-server-4.0.5.zip")
    with open(zipped, "wb") as f:
        f.write(b"PK")
    with pytest.raises(rmq.RabbitNodeError, match="not a .deb or a tarball"):
        rmq.unpack_broker(zipped, erlang, into)
    with pytest.raises(rmq.RabbitNodeError, match="no such file"):
        rmq.unpack_broker(zipped + ".missing.deb", erlang, into)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_unpack_a_server_deb_on_the_command_line(shared_dir, capsys, no_broker_variables):
    # A .deb shaped like Debian's: the wrapper's link in usr/sbin, the server
    # directory in usr/lib/rabbitmq/lib.
    tree = os.path.join(shared_dir, "tree")
    lib = os.path.join(tree, "usr", "lib", "rabbitmq")
    server = os.path.join(lib, "lib", "rabbitmq_server-4.0.5")
    for script in ("rabbitmq-server", "rabbitmqctl"):
        _executable(os.path.join(server, "sbin", script))
    os.makedirs(os.path.join(server, "plugins"))
    _executable(os.path.join(lib, "bin", "rabbitmq-script-wrapper"))
    os.makedirs(os.path.join(tree, "usr", "sbin"))
    os.symlink(
        "../lib/rabbitmq/bin/rabbitmq-script-wrapper",
        os.path.join(tree, "usr", "sbin", "rabbitmq-server"),
    )
    os.makedirs(os.path.join(tree, "DEBIAN"))
    with open(os.path.join(tree, "DEBIAN", "control"), "w") as f:
        f.write(
            "Package: rabbitmq-server\nVersion: 4.0.5-1\nArchitecture: all\n"
            "Maintainer: test <test@example.org>\nDescription: test\n"
        )
    deb = os.path.join(shared_dir, "rabbitmq-server_4.0.5-1_all.deb")
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", tree, deb],
        check=True,
        capture_output=True,
    )
    erlang = _fake_erlang_tarball(os.path.join(shared_dir, "erlang-27.tar.gz"))
    into = os.path.join(shared_dir, "unpacked")
    argv = ["unpack", "--server", deb, "--erlang", erlang, "--into", into]
    assert rmq.main(argv) == 0
    out = capsys.readouterr().out
    assigned = dict(
        word.split("=", 1)
        for line in out.splitlines()
        if not line.startswith("#")
        for word in shlex.split(line)
    )
    assert assigned == {
        rmq.SERVER_DIR_VARIABLE: os.path.join(
            into, "rabbitmq-server_4.0.5-1_all", "usr/lib/rabbitmq/lib/rabbitmq_server-4.0.5"
        ),
        rmq.ERLANG_ROOT_VARIABLE: os.path.join(into, "erlang-27/erlang-27.3.4.1/lib/erlang"),
    }
    assert rmq.main(argv) == 0  # again: reused
    assert capsys.readouterr().out == out


def _server_dir_and_erlang_for_a_4x_node():
    """The server directory and Erlang root this run was given, if a 4.x one."""
    if not GIVEN_SERVER_DIR:
        pytest.skip(
            "no RabbitMQ server directory given (%s): make test's pass on one runs this "
            "(devtools/test_brokers.py; devtools/rabbitmq.py: unpack)" % rmq.SERVER_DIR_VARIABLE
        )
    version = rmq.RabbitNode(server_dir=GIVEN_SERVER_DIR, erlang_root=GIVEN_ERLANG_ROOT).version()
    if not version.startswith("4."):
        pytest.skip("the server directory given is RabbitMQ %s, not 4.x" % version)
    return GIVEN_SERVER_DIR, GIVEN_ERLANG_ROOT


@pytest.mark.broker
@pytest.mark.slow
def test_server_dir_node_runs_rabbitmq_4(shared_dir, no_broker_variables):
    server_dir, erlang_root = _server_dir_and_erlang_for_a_4x_node()
    node = rmq.RabbitNode(base_dir=shared_dir, server_dir=server_dir, erlang_root=erlang_root)
    try:
        assert node.version().startswith("4."), node.version()
        assert node._ctl_version() == node.version()  # what `rabbitmqctl version` says
        began = time.monotonic()
        node.start()
        print("RabbitMQ %s started in %.1f s" % (node.version(), time.monotonic() - began))
        pid, pid_start = node.pid, rmq._proc_start_time(node.pid)
        assert node.is_running() and pid
        with open("/proc/%d/environ" % pid, "rb") as f:
            beam_env = f.read().split(b"\0")
        assert ("RABBITMQ_HOME=%s" % server_dir).encode() in beam_env
        if erlang_root:
            assert ("ERL_ROOTDIR=%s" % erlang_root).encode() in beam_env
            root_dir = node.ctl("-q", "eval", "code:root_dir().").strip().strip('"')
            assert os.path.realpath(root_dir) == os.path.realpath(erlang_root)
        assert node.ctl("-q", "eval", "rabbit_misc:version().").strip() == '"%s"' % (node.version())

        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
        ch = conn.channel()
        ch.queue_declare("devtools-4x-q", durable=True)
        ch.basic_publish("", "devtools-4x-q", b"four")
        assert _api_get(node, "queues/%2F/devtools-4x-q")["name"] == "devtools-4x-q"
        conn.close()

        # Stopped by `stop NODE_DIR` from a shell without the variables: the
        # state file says which RabbitMQ the node runs.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASGI_AMQP_")}
        env["PYTHONPATH"] = ROOT
        node_dir = node.dir
        proc = subprocess.run(
            [sys.executable, "-m", "devtools.rabbitmq", "stop", node_dir, node.nodename],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert not rmq._pid_alive(pid, pid_start)
        assert not os.path.exists(node_dir)
        assert not rmq.amqp_ready("127.0.0.1", node.amqp_port, timeout=1)
    finally:
        node.cleanup(graceful=False)
