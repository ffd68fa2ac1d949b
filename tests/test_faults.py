"""Faults injected into a private node of our own: connections closed, the app
stopped and started, the node killed. Calls must succeed or raise a
BrokerConnectionError within their timeout, never hang, and the layer must
serve again within seconds of the broker's return without a restart."""

import threading
import time

import pytest

from asgi_amqp import AMQPChannelLayer, BrokerConnectionError
from devtools.rabbitmq import RabbitNode
from helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

OPERATION_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def node():
    node = RabbitNode()
    node.start()
    yield node
    node.cleanup()


@pytest.fixture
def layer(node):
    layer = AMQPChannelLayer(
        url=node.amqp_url,
        management_url=node.management_url,
        prefix="faults",
        expiry=30,
        capacity=100000,
        receive_timeout=1,
        operation_timeout=OPERATION_TIMEOUT,
    )
    yield layer
    layer.close()


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
        # receive says so after its own limit instead of returning nothing.
        started = time.monotonic()
        with pytest.raises(BrokerConnectionError, match="unreachable"):
            layer.receive(["down"], block=True)
        assert time.monotonic() - started <= 1 + 1.0
    finally:
        node.start_app()
    started = time.monotonic()
    wait_until(lambda: _serving(layer), timeout=10, interval=0.1, message="serving again")
    assert time.monotonic() - started < 10


def test_numbered_messages_survive_connection_churn(node, layer):
    """Senders and receivers run while connections are closed under them.

    Counts: a send that returned was confirmed and must be received exactly
    once; a send that raised may or may not have been delivered.
    """
    stop = threading.Event()
    confirmed, failed, received, blocked = set(), [], [], []
    lock = threading.Lock()

    def sender(offset):
        n = offset
        while not stop.is_set():
            started = time.monotonic()
            try:
                layer.send("churn", {"n": n})
                with lock:
                    confirmed.add(n)
            except BrokerConnectionError as exc:
                with lock:
                    failed.append((n, type(exc).__name__))
            blocked.append(time.monotonic() - started)
            n += 2

    def receiver():
        while not stop.is_set() or True:
            started = time.monotonic()
            try:
                channel, message = layer.receive(["churn"], block=True)
            except BrokerConnectionError:
                channel = None
            blocked.append(time.monotonic() - started)
            if channel is not None:
                with lock:
                    received.append(message["n"])
            elif stop.is_set():
                return

    senders = [threading.Thread(target=sender, args=(i,)) for i in range(2)]
    receivers = [threading.Thread(target=receiver) for _ in range(2)]
    for thread in senders + receivers:
        thread.start()
    for _ in range(3):
        time.sleep(1.5)
        node.close_all_connections("churn")
    time.sleep(1.5)
    stop.set()
    for thread in senders + receivers:
        thread.join(30)
        assert not thread.is_alive()
    duplicates = len(received) - len(set(received))
    lost = confirmed - set(received)
    print(
        "\nchurn: confirmed=%d raised=%d received=%d duplicates=%d lost=%d longest call=%.2fs"
        % (len(confirmed), len(failed), len(received), duplicates, len(lost), max(blocked))
    )
    assert confirmed, "no send succeeded"
    assert duplicates == 0
    assert not lost, sorted(lost)[:20]
    assert max(blocked) <= 1 + OPERATION_TIMEOUT + 1.0
