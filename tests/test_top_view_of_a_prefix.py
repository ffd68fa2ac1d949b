"""``asgi-amqp top`` shows one prefix as the layer sees it, from the broker's own figures.

A module fixture puts known traffic on a prefix of its own (normal,
single-reader and process-local channels, two groups, a consumed message,
a membership whose lease ended through the dead-letter queue) and waits until the
management API's sample shows it (every 5 s by default). The tests then read
it through ``top --once --json`` and ``--once`` text, check sorting and the
filter, run the live view for a bounded number of refreshes under a real
terminal (a pty), and point it at an HTTP server that is not RabbitMQ.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pika
import pytest
from click.testing import CliRunner

from asgi_amqp.tools import cli
from helpers import NotRabbitMQ, wait_until
from pty_terminal import Terminal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPACITY = 50
SENT = {"top.deep": 12, "top.shallow": 3, "top.reply?abc": 2, "top.proc!": 4}
RECEIVED = {"top.shallow": 1}
# The join notices of the process-local members, queued for their process.
NOTICES = {"top.proc!": 2}


def _runner():
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.fixture(scope="module")
def prefix():
    return "top-%s" % uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def env(broker):
    return {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": broker.management_url}


def top(env, prefix, *args):
    """``asgi-amqp --prefix PREFIX top ARGS`` in-process: the click Result."""
    return _runner().invoke(cli.cli, ["--prefix", prefix, "top"] + list(args), env=env)


def top_json(env, prefix, *args):
    result = top(env, prefix, "--once", "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _taken_in(name):
    return SENT[name] + NOTICES.get(name, 0)


def _expected_sample(body):
    """Whether a snapshot shows the fixture's traffic (the broker's sample caught up)."""
    channels = {c["name"]: c for c in body["channels"]}
    held = {name: _taken_in(name) - RECEIVED.get(name, 0) for name in SENT}
    return (
        all(name in channels and channels[name]["depth"] == n for name, n in held.items())
        and all(channels[name]["taken_in"] == _taken_in(name) for name in SENT)
        # Deliveries are counted by another timer than depths: until both
        # are sampled, a delivered message looks like one that expired.
        and all(channels[name]["expired"] == 0 for name in SENT)
        # The head message's timestamp comes with another of the broker's timers.
        and all(channels[name]["oldest_age"] is not None for name in SENT)
        and body["dead_letters"]["taken_in"] >= 1
        # The brief membership's group went with its lease.
        and len(body["groups"]) == 2
        and all(group["lapsed"] == 0 for group in body["groups"])
    )


@pytest.fixture(scope="module")
def traffic(broker, module_layer, env, prefix):
    """The traffic, and the first snapshot that shows all of it."""
    layer = module_layer(
        broker, flush=True, prefix=prefix, capacity=CAPACITY, expiry=120, receive_timeout=1
    )
    for channel, count in SENT.items():
        target = channel + "local" if channel.endswith("!") else channel
        for i in range(count):
            layer.send(target, {"i": i})
    for channel, count in RECEIVED.items():
        for _ in range(count):
            assert layer.receive([channel])[0] == channel
    layer.group_add("top-room", "top.deep")
    layer.group_add("top-room", "top.proc!a")
    layer.group_add("top-room", "top.proc!b")
    layer.group_add("top-lobby", "top.shallow")
    layer.group_add("top-lobby", "top.shallow")  # a renewal
    # A membership whose lease ends within a second and a quarter, through
    # the dead-letter queue.
    brief = module_layer(
        broker, prefix=prefix, capacity=CAPACITY, expiry=120, group_expiry=1, receive_timeout=1
    )
    brief.group_add("top-brief", "top.deep")

    def sampled():
        body = top_json(env, prefix)
        return body if _expected_sample(body) else None

    body = wait_until(
        sampled,
        timeout=30,
        interval=0.5,
        message="top showing the traffic",
    )
    return layer, body


def test_channels_by_kind_with_depth_capacity_and_count(traffic):
    _, body = traffic
    channels = {c["name"]: c for c in body["channels"]}
    assert set(channels) == set(SENT)
    assert {n: c["kind"] for n, c in channels.items()} == {
        "top.deep": "normal",
        "top.shallow": "normal",
        "top.reply?abc": "single-reader",
        "top.proc!": "process-local",
    }
    for name, channel in channels.items():
        assert channel["capacity"] == CAPACITY
        assert channel["taken_in"] == _taken_in(name)
        assert channel["expired"] == 0
        assert channel["unacked"] == 0
    assert channels["top.deep"]["fill"] == pytest.approx(12 / CAPACITY)
    assert channels["top.shallow"]["depth"] == 2
    assert channels["top.proc!"]["local_members"] == 2
    assert channels["top.deep"]["local_members"] == 0


def test_oldest_message_age_comes_from_the_message_timestamps(traffic):
    _, body = traffic
    for channel in body["channels"]:
        assert 0 <= channel["oldest_age"] < 120, channel
    assert body["taken_at"] == pytest.approx(time.time(), abs=120)


def test_groups_with_their_member_counts(traffic):
    _, body = traffic
    groups = {g["name"]: g for g in body["groups"]}
    assert groups == {
        "top-room": {"name": "top-room", "members": 3, "lapsed": 0},
        "top-lobby": {"name": "top-lobby", "members": 1, "lapsed": 0},
    }


def test_dead_letter_queue_and_its_workers(traffic):
    layer, body = traffic
    dead = body["dead_letters"]
    assert dead["exists"] is True
    assert dead["taken_in"] >= 1  # the brief membership's lease
    assert dead["workers"] >= 1  # this layer's dead-letter worker
    assert dead["expired_messages"] == 0
    assert dead["lapsed_memberships"] == 0


def test_json_names_the_api_without_credentials(traffic, broker, env, prefix):
    result = top(env, prefix, "--once", "--json")
    userinfo = broker.management_url.split("//", 1)[1].split("@")[0]
    assert json.loads(result.stdout)["management_url"].startswith("http://127.0.0.1:")
    assert userinfo + "@" not in result.stdout


@pytest.mark.parametrize("sort", ["depth", "name", "age", "rate"])
def test_sort_keys(traffic, env, prefix, sort):
    body = top_json(env, prefix, "--sort", sort)
    names = [c["name"] for c in body["channels"]]
    assert body["sort"] == sort
    assert sorted(names) == sorted(SENT)
    if sort == "depth":
        depths = [c["depth"] for c in body["channels"]]
        assert depths == sorted(depths, reverse=True) and names[0] == "top.deep"
    elif sort == "name":
        assert names == sorted(names)
    elif sort == "age":
        ages = [c["oldest_age"] for c in body["channels"]]
        assert ages == sorted(ages, reverse=True)
    else:
        rates = [c["in_rate"] + c["out_rate"] for c in body["channels"]]
        assert rates == sorted(rates, reverse=True)


def test_filter_keeps_matching_channels_and_groups(traffic, env, prefix):
    body = top_json(env, prefix, "--filter", "top.proc*")
    assert [c["name"] for c in body["channels"]] == ["top.proc!"]
    assert body["groups"] == []
    body = top_json(env, prefix, "--filter", "top-r*")
    assert body["channels"] == [] and [g["name"] for g in body["groups"]] == ["top-room"]


def test_once_prints_plain_text_sections(traffic, env, prefix):
    result = top(env, prefix, "--once", "--sort", "name")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "\x1b[" not in text  # no terminal codes when stdout is not a terminal
    assert all(line == line.rstrip() for line in text.splitlines())
    for title in (
        "normal channels: 2",
        "single-reader channels (?): 1",
        "process-local channels (!), one queue per process: 1",
        "groups: 2",
        "dead letters",
    ):
        assert title in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(" top")}
    assert rows["top.deep"][1:3] == ["##........", "12/%d" % CAPACITY]
    assert rows["top.shallow"][2] == "2/%d" % CAPACITY
    assert rows["top.proc!"][-1] == "2"  # its channels in groups
    assert rows["top-room"] == ["top-room", "3", "0"]


def test_json_needs_once(env, prefix):
    result = top(env, prefix, "--json")
    assert result.exit_code == 2
    assert "--json needs --once" in result.stderr


@pytest.mark.parametrize("answer", ["404", "html"])
def test_not_rabbitmq_exits_2_with_one_line(env, prefix, answer):
    with NotRabbitMQ(answer) as server:
        for args in (["--once"], ["--once", "--json"], ["--iterations", "2"]):
            result = top(
                dict(env, AMQP_MANAGEMENT_URL=server.management_url("pw-s3cret")), prefix, *args
            )
            assert result.exit_code == 2, args
            assert result.stdout == ""
            assert result.stderr.count("\n") == 1
            assert "is not a RabbitMQ management API" in result.stderr
            assert "pw-s3cret" not in result.stderr


def test_live_view_refreshes_and_stops(traffic, env, prefix):
    args = ["--prefix", prefix, "top", "--iterations", "3", "--interval", "0.3"]
    with Terminal(args, env) as terminal:
        status = terminal.wait(timeout=30)
    output = terminal.output
    assert status == 0, output
    assert output.count("asgi-amqp top: prefix %r" % prefix) >= 3  # drawn three times
    assert "\x1b[" in output  # a terminal: drawn in place, in colour
    assert "top.deep" in output and "top-room" in output
    assert "Traceback" not in output


def test_live_view_ends_cleanly_on_ctrl_c(traffic, env, prefix):
    header = "asgi-amqp top: prefix %r" % prefix
    with Terminal(["--prefix", prefix, "top", "--interval", "0.2"], env) as terminal:
        terminal.read_until(lambda output: output.count(header) >= 2, timeout=30)
        assert terminal.output.count(header) >= 2, terminal.output
        terminal.process.send_signal(signal.SIGINT)
        status = terminal.wait(timeout=10)
    assert status == 0, terminal.output
    assert "Traceback" not in terminal.output
    assert terminal.output.rstrip().endswith("\x1b[?25h")  # the cursor shown again


def test_to_a_file_each_snapshot_is_ascii_and_kept_through_sigterm(traffic, env, prefix, tmp_path):
    """Written to a file, the live view left it empty on SIGTERM (rich's Live
    prints only when it stops), and its text used Unicode box lines."""
    header = "asgi-amqp top: prefix %r" % prefix
    output = tmp_path / "top.txt"
    environ = dict(os.environ, **env)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, environ.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "asgi_amqp", "--prefix", prefix, "top", "--interval", "0.3"]
    with open(output, "wb") as out:
        process = subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: output.read_text().count(header) >= 2 or process.poll() is not None,
            timeout=30,
            message="two snapshots in the file",
        )
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    text = output.read_bytes().decode("utf-8")
    assert text.count(header) >= 2, text
    assert text.isascii(), [c for c in text if not c.isascii()][:5]
    assert "top.deep" in text and "\x1b[" not in text


@pytest.mark.slow
def test_rates_show_traffic_in_and_out(broker, new_layer, env):
    """Steady traffic through one channel: in and out rates above 0 once sampled twice."""
    layer = new_layer(broker, flush=True, capacity=1000, receive_timeout=1)
    prefix = layer.topology.prefix

    def flowing():
        for i in range(5):
            layer.send("top.flow", {"i": i})
        for _ in range(5):
            layer.receive(["top.flow"])
        body = top_json(env, prefix)
        channel = {c["name"]: c for c in body["channels"]}.get("top.flow")
        # The rates and the count come from different samples of the broker:
        # wait for both.
        if channel and channel["in_rate"] > 0 and channel["out_rate"] > 0:
            return channel if channel["taken_in"] >= 5 else None
        return None

    channel = wait_until(flowing, timeout=40, interval=0.1, message="in and out rates above 0")
    assert channel["taken_in"] >= 5


@pytest.mark.slow
def test_expired_messages_are_counted(broker, new_layer, env):
    """Messages nobody reads expire (and are dead-lettered): top counts them per channel."""
    layer = new_layer(broker, flush=True, expiry=1.5)
    prefix = layer.topology.prefix
    for i in range(3):
        layer.send("top.stale", {"i": i})
    queue = layer.topology.channel_queue("top.stale")
    arguments = layer.topology.channel_queue_arguments("top.stale")
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()

        def counted():
            # Declaring the queue again keeps it from expiring (x-expires) while we wait.
            channel.queue_declare(queue, durable=True, arguments=arguments)
            body = top_json(env, prefix)
            stale = {c["name"]: c for c in body["channels"]}.get("top.stale")
            # The dead-letter queue's figures come from another sample (on
            # RabbitMQ 4.0 they lagged the channel's in one run): both.
            taken = body["dead_letters"]["taken_in"]
            done = stale and stale["expired"] == 3 and stale["depth"] == 0 and taken >= 3
            return body if done else None

        body = wait_until(counted, timeout=30, interval=0.5, message="3 expired messages")
    finally:
        connection.close()
    assert body["dead_letters"]["expired_messages"] == 3
    assert body["dead_letters"]["taken_in"] >= 3
