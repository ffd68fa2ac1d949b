"""A process started before its broker waits for it, within ``first_connect_timeout``.

In a container deployment daphne and the runworkers often start before
RabbitMQ accepts connections. A layer that had never connected failed its
first call at once, so a runworker exited. A node that refuses the
connection is now an outage like any other, until ``first_connect_timeout``;
settings no retry can fix (credentials, vhost) still fail at once.
"""

import logging
import threading
import time
from urllib.parse import urlsplit

import pytest

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from helpers import at_moment, free_port, make_layer, run_cli, wait_until

PREFIX = "t-first-connect"
RECEIVE_TIMEOUT = 1.0


class ReceiveLoop(object):
    """A blocking receive in a loop on a thread of its own, as a runworker's."""

    def __init__(self, layer, channel):
        self.layer = layer
        self.channel = channel
        self.nothing = 0  # receives that returned (None, None)
        self.received = []
        self.error = None
        self.thread = threading.Thread(target=self._run, name="receive-loop", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while not self.received:
                channel, message = self.layer.receive([self.channel], block=True)
                if channel is None:
                    self.nothing += 1
                else:
                    self.received.append((channel, message))
        except Exception as exc:  # the test reads it
            self.error = exc
            self.error_at = time.monotonic()


def _warnings(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("asgi_amqp") and r.levelno >= logging.WARNING
    ]


@pytest.mark.slow
@pytest.mark.faults
def test_a_receive_loop_started_before_the_broker_is_served_once_it_starts(caplog):
    from devtools.rabbitmq import RabbitNode

    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    node = RabbitNode()  # its ports are chosen now: the URL is known before it starts
    where = "127.0.0.1:%d" % node.amqp_port
    layer = None
    try:
        layer = make_layer(
            node.amqp_url,
            prefix=PREFIX,
            receive_timeout=RECEIVE_TIMEOUT,
            operation_timeout=2,
            management_url=node.management_url,
        )
        start = time.monotonic()
        loop = ReceiveLoop(layer, "first.connect")
        # The loop's receives return nothing, and one WARNING says what they wait for.
        wait_until(lambda: loop.nothing >= 2 or loop.error, 10, message="two empty receives")
        assert loop.error is None, loop.error
        told = [w for w in _warnings(caplog) if "blocking receives return nothing" in w]
        assert len(told) == 1, _warnings(caplog)
        assert where in told[0] and "ConnectionRefusedError" in told[0], told
        assert "guest" not in "\n".join(_warnings(caplog))
        # A send from another thread waits operation_timeout, as in any outage,
        # and then names the outage and its cause.
        sent = time.monotonic()
        with pytest.raises(asgi_amqp.OperationTimeout) as info:
            layer.send("first.elsewhere", {"n": 0})
        assert 2.0 <= time.monotonic() - sent < 2.0 + 3.0
        assert "unreachable" in str(info.value) and where in str(info.value)
        assert "ConnectionRefusedError" in str(info.value)
        assert layer.connection_statistics()["outage_seconds"] > 0
        # The broker starts 5 s after the first receive.
        at_moment(start, 5.0)
        node.start()
        sender = make_layer(node.amqp_url, prefix=PREFIX, dead_letter_worker=False)
        try:
            sender.send("first.connect", {"n": 1})
        finally:
            sender.close()
        wait_until(lambda: loop.received or loop.error, 30, message="the loop's message")
        assert loop.error is None, loop.error
        assert loop.received == [("first.connect", {"n": 1})]
        assert layer.connection_statistics()["connected"] is True
        layer.send("first.connect", {"n": 2})  # and the layer works as usual
        assert layer.receive(["first.connect"], block=True) == ("first.connect", {"n": 2})
    finally:
        if layer is not None:
            layer.close()
        node.cleanup(graceful=False)


def test_the_first_connect_bound_ends_the_wait_with_its_cause_and_time(caplog):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    port = free_port()
    layer = make_layer(
        "amqp://guest:s3cr3t-pw@127.0.0.1:%d/%%2F" % port,
        prefix=PREFIX,
        receive_timeout=0.25,
        first_connect_timeout=1,
        dead_letter_worker=False,
    )
    try:
        start = time.monotonic()
        loop = ReceiveLoop(layer, "first.never")
        loop.thread.join(1 + 5)
        assert not loop.thread.is_alive(), "the receive loop still waits"
        assert loop.nothing >= 2  # it waited, receiving nothing
        waited = loop.error_at - start
        assert 1.0 <= waited < 1.0 + 2.0, waited
        error = loop.error
        assert isinstance(error, asgi_amqp.BrokerConnectionError)
        assert not isinstance(error, asgi_amqp.OperationTimeout)
        text = str(error)
        assert "first_connect_timeout is 1 s" in text, text
        assert "127.0.0.1:%d" % port in text and "ConnectionRefusedError" in text, text
        # Every later call fails at once, with the same cause.
        for call in (
            lambda: layer.send("first.never", {}),
            lambda: layer.receive(["first.never"], block=True),
        ):
            began = time.monotonic()
            with pytest.raises(asgi_amqp.BrokerConnectionError, match="first_connect_timeout"):
                call()
            assert time.monotonic() - began < 1.0
    finally:
        layer.close()
    assert "s3cr3t-pw" not in caplog.text and "s3cr3t-pw" not in repr(error)


def test_first_connect_timeout_zero_fails_at_once():
    layer = make_layer(
        "amqp://guest:guest@127.0.0.1:%d/%%2F" % free_port(),
        prefix=PREFIX,
        first_connect_timeout=0,
        dead_letter_worker=False,
    )
    try:
        began = time.monotonic()
        with pytest.raises(asgi_amqp.BrokerConnectionError, match="ConnectionRefusedError"):
            layer.receive(["first.never"], block=True)
        assert time.monotonic() - began < 2.0
    finally:
        layer.close()


def test_the_command_fails_at_once_unless_told_to_wait(tmp_path, monkeypatch):
    """An operator's command says at once that the broker is down; the
    option (or its variable, a config file, Django settings) makes it wait."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    env = {
        "AMQP_URL": "amqp://guest:guest@127.0.0.1:%d/%%2F" % port,
        "AMQP_MANAGEMENT_URL": "http://127.0.0.1:%d/" % free_port(),
        "ASGI_AMQP_FIRST_CONNECT_TIMEOUT": None,
    }
    for options, least, most in (([], 0.0, 3.0), (["--first-connect-timeout", "1"], 1.0, 4.0)):
        began = time.monotonic()
        result = run_cli(options + ["send", "first.cli", "{}"], env=env)
        took = time.monotonic() - began
        assert result.exit_code == 2, result.stderr
        assert "127.0.0.1:%d" % port in result.stderr and "ConnectionRefused" in result.stderr
        assert least <= took < most, (options, took, result.stderr)
    assert "first_connect_timeout is 1 s" in result.stderr, result.stderr


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "60", True, None])
def test_first_connect_timeout_must_be_a_finite_number(value):
    with pytest.raises(ValueError, match="first_connect_timeout"):
        AMQPChannelLayer(first_connect_timeout=value)


def _with(url, **parts):
    split = urlsplit(url)
    netloc = "%s:%s@%s:%d" % (
        parts.get("user", split.username),
        parts.get("password", split.password),
        split.hostname,
        split.port,
    )
    return split._replace(netloc=netloc, path=parts.get("path", split.path)).geturl()


@pytest.mark.parametrize(
    "change", [{"password": "wrong-pw"}, {"path": "/no-such-vhost"}], ids=["password", "vhost"]
)
def test_settings_no_retry_fixes_still_fail_at_once(broker, change):
    """Against a running broker, with the default first_connect_timeout."""
    layer = make_layer(_with(broker.amqp_url, **change), prefix=PREFIX, dead_letter_worker=False)
    try:
        for call in (
            lambda: layer.receive(["first.auth"], block=True),
            lambda: layer.send("first.auth", {}),
            lambda: layer.receive(["first.auth"]),
        ):
            began = time.monotonic()
            with pytest.raises(asgi_amqp.AuthenticationError):
                call()
            assert time.monotonic() - began < 5.0
    finally:
        layer.close()
