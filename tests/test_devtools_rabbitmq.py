"""Tests of the broker tooling in devtools/rabbitmq.py.

The slow tests start real private RabbitMQ nodes (about 8 s each on a
2-core machine); they never touch the session broker or a system broker.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

import pika  # noqa: E402
import pytest

from devtools import rabbitmq as rmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rabbitmq_installed():
    try:
        rmq.find_rabbitmq_scripts()
    except rmq.RabbitMQNotInstalled:
        return False
    return True


needs_rabbitmq = pytest.mark.skipif(
    not _rabbitmq_installed(), reason="rabbitmq-server is not installed"
)


def _api_get(node, path):
    req = urllib.request.Request("http://127.0.0.1:%d/api/%s" % (node.management_port, path))
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read().decode())


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
