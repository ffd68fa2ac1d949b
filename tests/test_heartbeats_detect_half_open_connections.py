"""A half-open connection: the broker stops answering but the socket stays up.

A proxy between the layer and the broker stops forwarding on the connections
it has (as a dead peer behind a NAT or a pulled cable would look), while new
connections go through. Heartbeats (``heartbeat=2`` in the URL, overriding
the layer's default) must detect it, calls meanwhile must fail within their
timeout, and the layer must serve again on a new connection.
"""

import select
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from asgi_amqp import BrokerConnectionError
from helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]


class FreezingProxy(object):
    """Forwards TCP to ``target``; ``freeze()`` silences the connections open now."""

    def __init__(self, target):
        self._target = target
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._pairs = []
        self._frozen = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def freeze(self):
        with self._lock:
            self._frozen.update(id(pair) for pair in self._pairs)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        for a, b in self._pairs:
            a.close()
            b.close()
        self._listener.close()

    def _run(self):
        while not self._stop.is_set():
            with self._lock:
                live = [p for p in self._pairs if id(p) not in self._frozen]
            sockets = [self._listener] + [s for pair in live for s in pair]
            readable, _, _ = select.select(sockets, [], [], 0.05)
            for sock in readable:
                if sock is self._listener:
                    client, _ = self._listener.accept()
                    upstream = socket.create_connection(self._target)
                    with self._lock:
                        self._pairs.append((client, upstream))
                    continue
                pair = next(p for p in live if sock in p)
                other = pair[1] if sock is pair[0] else pair[0]
                try:
                    data = sock.recv(65536)
                    if data:
                        other.sendall(data)
                        continue
                except OSError:
                    pass
                with self._lock:  # closed by one side: close both
                    self._pairs.remove(pair)
                pair[0].close()
                pair[1].close()


@pytest.fixture
def proxy(broker):
    parts = urlsplit(broker.amqp_url)
    proxy = FreezingProxy((parts.hostname, parts.port))
    yield proxy
    proxy.close()


def test_heartbeats_detect_a_half_open_connection(broker, proxy, new_layer):
    parts = urlsplit(broker.amqp_url)
    url = "amqp://%s@127.0.0.1:%d%s?heartbeat=2" % (
        parts.netloc.rpartition("@")[0],
        proxy.port,
        parts.path,
    )
    layer = new_layer(
        url,
        flush=True,
        management_url=broker.management_url,
        operation_timeout=2,
        receive_timeout=1,
    )
    layer.send("ho", {"n": 1})
    assert layer.receive(["ho"]) == ("ho", {"n": 1})
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError):
        layer.send("ho", {"n": 2})
    assert time.monotonic() - started < 2 + 1

    def serving():
        try:
            layer.send("ho", {"n": 3})
            return True
        except BrokerConnectionError:
            return False

    # pika checks for received traffic every heartbeat + 5 s, so a dead
    # peer is noticed within 2 x 7 s here; then a reconnect through the proxy.
    wait_until(serving, timeout=2 * 7 + 5, interval=0.2, message="serving on a new connection")
    recovered = time.monotonic() - started
    print("\nhalf-open connection detected and replaced after %.1f s" % recovered)
    got = [layer.receive(["ho"], block=True) for _ in range(2)]
    assert ("ho", {"n": 3}) in got
