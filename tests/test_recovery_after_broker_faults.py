"""Faults injected into a private node of our own: connections closed, the app
stopped and started, the node killed. Calls must succeed or raise a
BrokerConnectionError within their timeout, never hang, and the layer must
serve again within seconds of the broker's return without a restart."""

import time

import pytest

from asgi_amqp import BrokerConnectionError
from helpers import Traffic, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

OPERATION_TIMEOUT = 3.0


@pytest.fixture
def layer(node, new_layer):
    return new_layer(
        node, expiry=30, capacity=100000, receive_timeout=1, operation_timeout=OPERATION_TIMEOUT
    )


def _serving(layer):
    try:
        layer.send("probe", {"p": 1})
        return layer.receive(["probe"]) == ("probe", {"p": 1})
    except BrokerConnectionError:
        return False


def test_reconnects_after_connections_are_closed(node, layer):
    assert _serving(layer)
    node.close_all_connections("fault test")
    started = time.monotonic()
    wait_until(lambda: _serving(layer), timeout=10, interval=0.1, message="serving again")
    assert time.monotonic() - started < 10
    # The dead-letter worker reconnected too.
    wait_until(lambda: layer._engine._worker.ready.is_set(), timeout=10, message="worker ready")


def test_calls_fail_fast_while_the_broker_is_down_and_recover(node, layer):
    assert _serving(layer)
    node.stop_app()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerConnectionError):
            layer.send("down", {"d": 1})
        assert time.monotonic() - started <= OPERATION_TIMEOUT + 1.0
        # The outage is older than operation_timeout by now: a blocking
        # receive still returns nothing after its own limit, never raises.
        started = time.monotonic()
        assert layer.receive(["down"], block=True) == (None, None)
        assert time.monotonic() - started <= 1 + 1.0
    finally:
        node.start_app()
    started = time.monotonic()
    wait_until(lambda: _serving(layer), timeout=10, interval=0.1, message="serving again")
    assert time.monotonic() - started < 10


def test_persistent_messages_survive_a_restart_in_classic_queues(node, new_layer):
    """With ``persistent=True`` a classic queue keeps what waits in it
    through a restart of the broker's application: sends, process-local
    sends and group messages. The same messages sent transient are gone."""
    options = dict(receive_timeout=1, operation_timeout=OPERATION_TIMEOUT, expiry=60)
    kept = new_layer(node, persistent=True, **options)
    dropped = new_layer(node, prefix=kept.topology.prefix, **options)
    local = "local!a"  # the prefix is the test's own
    kept.group_add("room", "member")
    for layer, tag in ((kept, "kept"), (dropped, "dropped")):
        layer.send(tag, {"n": 1})
        layer.send(local, {"tag": tag})
        layer.send_group("room", {"tag": tag})
    node.stop_app()
    node.start_app()
    wait_until(lambda: _serving(kept), timeout=15, interval=0.1, message="serving again")
    assert kept.receive(["kept"]) == ("kept", {"n": 1})
    assert kept.receive(["local!"]) == (local, {"tag": "kept"})
    assert kept.receive(["member"]) == ("member", {"tag": "kept"})
    assert kept.receive(["dropped", "member", "local!"]) == (None, None)


def test_numbered_messages_survive_connection_churn(node, layer):
    """Senders and receivers run while connections are closed under them.

    Counts: a send that returned was confirmed and must be received exactly
    once; a send that raised may or may not have been delivered.
    """
    traffic = Traffic(
        layer, ["churn"], senders=2, blocking_receivers=2, backoff=0, drain_on_stop=True
    ).start()
    # Each kill comes once the traffic carries messages again (30 since the
    # last one), and the senders stop once it does after the last.
    for _ in range(3):
        traffic.wait_flowing(30, timeout=30)
        node.close_all_connections("churn")
    traffic.wait_flowing(30, timeout=30)
    traffic.stop_sending(30)
    traffic.stop_receiving(30)
    assert not any(thread.is_alive() for thread in traffic.threads)
    counts = traffic.counts()
    lost = traffic.missing()
    print(
        "\nchurn: confirmed=%d raised=%s received=%d duplicates=%d lost=%d longest call=%.2fs"
        % (
            counts["confirmed"],
            counts["raised"],
            counts["received"],
            counts["duplicates"],
            len(lost),
            traffic.longest_call(),
        )
    )
    assert counts["confirmed"], "no send succeeded"
    assert counts["duplicates"] == 0
    assert not lost, sorted(lost)[:20]
    assert traffic.longest_call() <= 1 + OPERATION_TIMEOUT + 1.0
