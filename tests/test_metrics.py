"""``asgi-amqp metrics`` serves a prefix to Prometheus, named by ASGI channel, and asks
the management API at most every ``--refresh`` seconds however often it is scraped.

A module fixture puts known traffic on a prefix of its own: a normal channel,
an ordered channel whose messages go to several shard queues, a process-local
queue with members in groups, two groups. Each test runs the command as a
subprocess on a free port (``--listen 127.0.0.1:0``; it prints the address),
its management API behind a counting proxy, scrapes it over HTTP and parses
the text with ``prometheus_client``'s own parser. The broker samples queue
figures every 5 s: the tests wait for them with deadlines.
"""

import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from asgi_amqp import tools
from asgi_amqp.tools import cli
from asgi_amqp.tools.cli import metrics as metrics_command
from devtools.rabbitmq import free_port
from helpers import NotRabbitMQ, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPACITY = 50
REFRESH = 3.0  # the least --refresh
DEEP = 7  # messages sent to mx.deep
# An ordered channel's messages, each with its own socket: they go to shards.
SOCKETS = ["daphne.response.s%d!c%d" % (n, n) for n in range(6)]
LOCAL_SENT = 2  # messages sent to mx.proc!a
LOCAL_NOTICES = 2  # join notices of mx.proc!a and mx.proc!b, queued for their process


def _runner():
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


# -- a counting proxy in front of the management API -------------------------------------------


class CountingProxy(object):
    """A real HTTP server on 127.0.0.1 that forwards every GET to the management
    API at ``target`` (credentials and all) and records the paths asked."""

    def __init__(self, target):
        parts = urlsplit(target)
        self.userinfo = parts.netloc.rpartition("@")[0]
        base = "%s://%s" % (parts.scheme, parts.netloc.rpartition("@")[2])
        self.paths = []
        paths = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                paths.append(self.path)
                request = urllib.request.Request(
                    base + self.path, headers={"Authorization": self.headers["Authorization"]}
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        status, body = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self._server.server_address[1]
        # Polled every 50 ms, so that shutdown() returns at once (the default is 0.5 s).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def management_url(self):
        return "http://%s@127.0.0.1:%d/" % (self.userinfo, self.port)

    def looks(self):
        """Requests for the prefix's queues: one per look at the broker."""
        return sum(1 for path in list(self.paths) if path.startswith("/api/queues/"))

    def __enter__(self):
        self._thread.start()
        return self

    def close(self):
        """Stop answering: the port refuses connections from now on."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __exit__(self, *exc):
        self.close()


# -- the command as a subprocess ---------------------------------------------------------------


class Exporter(object):
    """``asgi-amqp --prefix PREFIX metrics --listen 127.0.0.1:0 ARGS`` in a subprocess."""

    ADDRESS = re.compile(r"on http://(127\.0\.0\.1:\d+)/metrics")

    def __init__(self, env, prefix, *args):
        environ = dict(os.environ, **env)
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in [ROOT, environ.get("PYTHONPATH", "")] if p
        )
        command = [sys.executable, "-m", "asgi_amqp", "--prefix", prefix, "metrics"]
        command += ["--listen", "127.0.0.1:0"] + list(args)
        self.process = subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.address = None

    def _read(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def wait_serving(self, timeout=30):
        def serving():
            for line in list(self.stderr):
                found = self.ADDRESS.search(line)
                if found:
                    return found.group(1)
            if self.process.poll() is not None:
                raise AssertionError("the command ended: %s" % "".join(self.stderr))
            return None

        self.address = wait_until(serving, timeout, interval=0.05, message="the address line")
        return self

    def scrape(self):
        """The served families, parsed: {(sample name, sorted labels): value}."""
        url = "http://%s/metrics" % self.address
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode("utf8")
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples, text

    def stop(self, signum=signal.SIGTERM, timeout=10):
        """Send ``signum``; the exit status, stdout and stderr once it ended."""
        self.process.send_signal(signum)
        status = self.process.wait(timeout)
        stdout = self.process.stdout.read()
        self._reader.join(5)
        return status, stdout, "".join(self.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process.stdout.close()
        self.process.stderr.close()


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def channel(samples, name, channel_name, kind="normal", prefix=None):
    return value(samples, name, channel=channel_name, kind=kind, prefix=prefix)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefix():
    return "mx-%s" % uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def proxy(broker):
    with CountingProxy(broker.management_url) as counting:
        yield counting


@pytest.fixture(scope="module")
def env(broker, proxy):
    return {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": proxy.management_url}


@pytest.fixture(scope="module")
def traffic(broker, module_layer, prefix):
    """The layer that made the traffic, and the shard queues it used."""
    layer = module_layer(broker, flush=True, prefix=prefix, capacity=CAPACITY, expiry=120)
    for i in range(DEEP):
        layer.send("mx.deep", {"i": i})
    for socket in SOCKETS:
        layer.send("websocket.receive", {"reply_channel": socket, "order": 1, "path": "/"})
    for i in range(LOCAL_SENT):
        layer.send("mx.proc!a", {"i": i})
    layer.group_add("mx-room", "mx.deep")
    layer.group_add("mx-room", "mx.proc!a")
    layer.group_add("mx-room", "mx.proc!b")
    layer.group_add("mx-lobby", "mx.deep")
    shards = {layer.topology.shard_queue("websocket.receive", s) for s in SOCKETS}
    assert len(shards) >= 2, shards  # the test needs messages in several shards
    return layer, shards


def _sampled(samples, prefix):
    """Whether a scrape shows the fixture's traffic (the broker's sample caught up)."""
    return (
        channel(samples, "asgi_amqp_channel_messages", "mx.deep", prefix=prefix) == DEEP
        and channel(samples, "asgi_amqp_channel_messages", "websocket.receive", prefix=prefix)
        == len(SOCKETS)
        and channel(
            samples, "asgi_amqp_channel_messages", "mx.proc!", "process-local", prefix=prefix
        )
        == LOCAL_SENT + LOCAL_NOTICES
        # The dead-letter worker's consumer comes with another of the broker's samples.
        and (value(samples, "asgi_amqp_dead_letters_workers", prefix=prefix) or 0) >= 1
    )


# -- the figures -------------------------------------------------------------------------------


def test_a_scrape_shows_channels_groups_and_dead_letters(traffic, env, prefix, proxy):
    layer, shards = traffic
    with Exporter(env, prefix, "--refresh", str(REFRESH)) as exporter:
        exporter.wait_serving()

        def sampled():
            samples, text = exporter.scrape()
            return (samples, text) if _sampled(samples, prefix) else None

        samples, text = wait_until(sampled, 40, interval=0.5, message="the traffic, scraped")
        status, _, stderr = exporter.stop()
    assert status == 0, stderr

    def figure(name, channel_name, kind="normal"):
        return channel(samples, name, channel_name, kind, prefix)

    # Named by ASGI channel, the ordered channel's shards summed into it.
    names = {dict(labels).get("channel") for _, labels in samples} - {None}
    assert names == {"mx.deep", "websocket.receive", "mx.proc!"}
    values = [v for _, labels in samples for _, v in labels]
    assert not [v for v in values if "#" in v or ":q:" in v]  # no queue's name
    assert figure("asgi_amqp_channel_queues", "websocket.receive") >= len(shards)
    assert figure("asgi_amqp_channel_queues", "mx.deep") == 1
    for name, kind in (("mx.deep", "normal"), ("websocket.receive", "normal")):
        assert figure("asgi_amqp_channel_capacity", name, kind) == CAPACITY
        assert figure("asgi_amqp_channel_consumers", name, kind) == 0
        assert figure("asgi_amqp_channel_messages_unacked", name, kind) == 0
        assert figure("asgi_amqp_channel_oldest_message_age_seconds", name, kind) >= 0
        assert figure("asgi_amqp_channel_publish_rate", name, kind) >= 0
        assert figure("asgi_amqp_channel_deliver_rate", name, kind) == 0
    assert figure("asgi_amqp_channel_fill_ratio", "mx.deep") == pytest.approx(DEEP / CAPACITY)
    # The fullest shard, not the sum of all over one queue's capacity.
    assert figure("asgi_amqp_channel_fill_ratio", "websocket.receive") < len(SOCKETS) / CAPACITY
    # The process-local queue: its members in groups, counted as one process.
    assert figure("asgi_amqp_process_local_group_members", "mx.proc!", "process-local") == 2
    assert value(samples, "asgi_amqp_channels", kind="process-local", prefix=prefix) == 1
    assert value(samples, "asgi_amqp_channels", kind="normal", prefix=prefix) == 2
    # Groups and their members.
    assert value(samples, "asgi_amqp_groups", prefix=prefix) == 2
    assert value(samples, "asgi_amqp_group_members", group="mx-room", prefix=prefix) == 3
    assert value(samples, "asgi_amqp_group_members", group="mx-lobby", prefix=prefix) == 1
    assert value(samples, "asgi_amqp_group_members_lapsed", group="mx-room", prefix=prefix) == 0
    assert value(samples, "asgi_amqp_group_memberships", prefix=prefix) == 4
    # The dead-letter queue (made by the first group_add) and its worker.
    assert value(samples, "asgi_amqp_dead_letters_queue_exists", prefix=prefix) == 1
    assert value(samples, "asgi_amqp_dead_letters_messages", prefix=prefix) == 0
    assert value(samples, "asgi_amqp_dead_letters_workers", prefix=prefix) >= 1
    # No alarm, and the exporter's own figures.
    assert value(samples, "asgi_amqp_broker_alarms") == 0
    assert value(samples, "asgi_amqp_up") == 1
    assert value(samples, "asgi_amqp_collection_errors_total") == 0
    assert value(samples, "asgi_amqp_refresh_interval_seconds") == REFRESH
    assert 0 <= value(samples, "asgi_amqp_snapshot_age_seconds") < REFRESH + 10
    # The management API's password is in neither the output nor the scrape.
    assert proxy.userinfo + "@" not in stderr + text


def test_the_filter_keeps_matching_channels_and_groups(traffic, env, prefix):
    with Exporter(env, prefix, "--filter", "mx.*") as exporter:
        exporter.wait_serving()
        samples, _ = exporter.scrape()
    names = {dict(labels).get("channel") for _, labels in samples} - {None}
    assert names <= {"mx.deep", "mx.proc!"} and "mx.deep" in names
    assert value(samples, "asgi_amqp_groups", prefix=prefix) == 0


# -- the refresh bound -------------------------------------------------------------------------


def test_scrapes_within_the_refresh_interval_share_one_look(traffic, env, prefix, proxy):
    before = proxy.looks()
    with Exporter(env, prefix, "--refresh", "60") as exporter:
        exporter.wait_serving()
        scrapes = [exporter.scrape()[0] for _ in range(5)]
        assert proxy.looks() - before == 1  # the look before it served, none since
        assert [value(s, "asgi_amqp_collections_total") for s in scrapes] == [1.0] * 5
        ages = [value(s, "asgi_amqp_snapshot_age_seconds") for s in scrapes]
        assert ages == sorted(ages)  # one reading, growing older
        assert exporter.stop()[0] == 0


def test_frequent_scrapes_look_at_most_once_per_refresh(traffic, env, prefix, proxy):
    before = proxy.looks()
    with Exporter(env, prefix, "--refresh", str(REFRESH)) as exporter:
        exporter.wait_serving()
        started = time.monotonic()
        scrapes = []

        def third_look():
            samples, _ = exporter.scrape()
            scrapes.append(samples)
            return value(samples, "asgi_amqp_collections_total") >= 3

        wait_until(third_look, 30, interval=0.1, message="a third look")
        elapsed = time.monotonic() - started
        looks = proxy.looks() - before
        assert exporter.stop()[0] == 0
    assert looks == 3  # the command's count is the API's
    assert len(scrapes) >= 2 * (REFRESH / 0.5)  # scraped far more often than it looked
    # Two refreshes after the first look, each at least REFRESH apart.
    assert elapsed >= 2 * REFRESH - 0.5


# -- stopping, and what goes wrong -------------------------------------------------------------


def test_ctrl_c_stops_it_cleanly(traffic, env, prefix):
    with Exporter(env, prefix) as exporter:
        exporter.wait_serving()
        exporter.scrape()
        status, stdout, stderr = exporter.stop(signal.SIGINT)
    assert status == 0, stderr
    assert stdout == ""
    assert "Traceback" not in stderr


def test_an_api_that_goes_away_is_served_as_down_and_asked_no_more_often(broker, prefix):
    with CountingProxy(broker.management_url) as going:
        env = {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": going.management_url}
        with Exporter(env, prefix) as exporter:  # --refresh 5, the default
            exporter.wait_serving()
            going.close()  # the API stops answering

            def down():
                samples, _ = exporter.scrape()
                return samples if value(samples, "asgi_amqp_up") == 0 else None

            samples = wait_until(down, 30, interval=0.2, message="asgi_amqp_up 0")
            assert value(samples, "asgi_amqp_collection_errors_total") == 1
            assert not any(name.startswith("asgi_amqp_channel") for name, _ in samples)
            again, _ = exporter.scrape()  # within the refresh: the failure is kept
            assert value(again, "asgi_amqp_collection_errors_total") == 1
            status, _, stderr = exporter.stop()
    assert status == 0, stderr
    assert stderr.count("cannot read the broker's figures") == 1
    assert going.userinfo + "@" not in stderr


@pytest.mark.parametrize("answer", ["404", "html"])
def test_not_rabbitmq_exits_2_with_one_line(prefix, answer):
    with NotRabbitMQ(answer) as server:
        env = {"AMQP_MANAGEMENT_URL": server.management_url("pw-s3cret")}
        result = _runner().invoke(
            cli.cli, ["--prefix", prefix, "metrics", "--listen", "127.0.0.1:0"], env=env
        )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "is not a RabbitMQ management API" in result.stderr
    assert "pw-s3cret" not in result.stderr


@pytest.mark.parametrize(
    "args, error",
    [
        (["--listen", "9650"], "is not HOST:PORT"),
        (["--listen", "localhost:http"], "is not HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "is not HOST:PORT"),
        (["--refresh", "1"], "--refresh"),
    ],
)
def test_bad_options_are_usage_errors(args, error):
    result = _runner().invoke(cli.cli, ["metrics"] + args)
    assert result.exit_code == 2
    assert error in result.stderr and result.stderr.count("\n") == 1


def test_listen_accepts_ipv6_in_brackets():
    address = metrics_command._Address()
    assert address.convert("[::1]:9650", None, None) == ("::1", 9650)
    assert address.convert("0.0.0.0:0", None, None) == ("0.0.0.0", 0)


def test_without_prometheus_client_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    monkeypatch.delitem(sys.modules, "asgi_amqp.tools.metrics", raising=False)
    monkeypatch.delattr(tools, "metrics", raising=False)
    result = _runner().invoke(cli.cli, ["metrics"], env={"AMQP_URL": "amqp://127.0.0.1:1/"})
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "pip install 'asgi-amqp-layer[metrics]'" in result.stderr


def test_a_port_in_use_is_one_line(env, prefix):
    with NotRabbitMQ("404") as taken:
        result = _runner().invoke(
            cli.cli,
            ["--prefix", prefix, "metrics", "--listen", "127.0.0.1:%d" % taken.port],
            env=env,
        )
    assert result.exit_code == 2
    assert "cannot listen on 127.0.0.1:%d" % taken.port in result.stderr
    assert result.stderr.count("\n") == 1


# -- the broker's alarms -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.faults
def test_a_resource_alarm_is_served_while_it_lasts(node, prefix):
    env = {"AMQP_URL": node.amqp_url, "AMQP_MANAGEMENT_URL": node.management_url}
    with Exporter(env, prefix, "--refresh", str(REFRESH)) as exporter:
        exporter.wait_serving()

        def alarms(count):
            def served():
                samples, _ = exporter.scrape()
                return samples if value(samples, "asgi_amqp_broker_alarms") == count else None

            return served

        node.ctl("set_disk_free_limit", "100000GB")
        try:
            samples = wait_until(alarms(1), 40, interval=0.5, message="the disk alarm served")
        finally:
            node.ctl("set_disk_free_limit", "50MB")
        alarmed = [dict(labels) for name, labels in samples if name == "asgi_amqp_broker_alarm"]
        assert [a["resource"] for a in alarmed] == ["disk space"]
        assert alarmed[0]["node"]
        wait_until(alarms(0), 40, interval=0.5, message="the alarm cleared")
        assert exporter.stop()[0] == 0
