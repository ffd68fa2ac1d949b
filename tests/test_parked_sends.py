"""A parked send is seen to its end, and nothing in it is lost unsaid (no broker).

``parked_sends`` ends on the I/O thread what daphne's reactor thread sent
while the broker was away: here its outcomes come from a stand-in for the
engine's two non-waiting calls, and ``Pending.hand_over`` is checked for
its one promise, that the outcome reaches the parking exactly once.
``test_full_queues_and_long_outages`` runs it through a real outage.
"""

import logging
import threading

import pika
import pytest

from asgi_amqp.engine import ACKED, NACKED, RETURNED
from asgi_amqp.engine.futures import Pending
from asgi_amqp.errors import LayerClosed
from asgi_amqp.parked_sends import ParkedSends


class Submitted(object):
    """The engine's ``submit_declare`` and ``submit_publish``: recorded, answered by the test."""

    def __init__(self, closed=False):
        self.calls = []
        self.closed = closed

    def submit_declare(self, steps, what, on_done):
        self._submit(("declare", what, on_done))

    def submit_publish(self, exchange, routing_key, body, properties, what, on_done):
        self._submit(("publish", routing_key, on_done))

    def _submit(self, call):
        if self.closed:
            raise LayerClosed("the layer is closed")
        self.calls.append(call)


def parked_send(engine, body=b"frame"):
    sends = ParkedSends(engine, lambda channel: ("declare", channel), messages=2, size=10)
    send = sends.parking("websocket.receive", "p:q:websocket.receive", body, pika.BasicProperties())
    return sends, send


def test_a_confirmed_parked_send_ends_delivered():
    sends, send = parked_send(Submitted())
    assert send.has_room()
    on_done = send.park()
    assert sends.messages == 1
    on_done(ACKED, None)
    assert (sends.messages, sends.lost) == (0, 0)


def test_a_returned_parked_send_declares_its_queue_and_goes_again(caplog):
    engine = Submitted()
    sends, send = parked_send(engine)
    on_done = send.park()
    on_done(RETURNED, None)
    ((kind, what, declared),) = engine.calls
    assert kind == "declare" and "p:q:websocket.receive" in what
    declared(object(), None)
    kind, queue, published = engine.calls[1]
    assert (kind, queue) == ("publish", "p:q:websocket.receive")
    published(ACKED, None)
    assert (sends.messages, sends.lost) == (0, 0)
    assert not caplog.records


@pytest.mark.parametrize(
    "answer, why",
    [
        ((NACKED, None), "the channel is full"),
        ((None, LayerClosed("the layer is closed")), "the layer is closed"),
    ],
)
def test_a_parked_send_that_is_lost_says_so(caplog, answer, why):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    sends, send = parked_send(Submitted())
    send.park()(*answer)
    assert (sends.messages, sends.lost) == (0, 1)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "websocket.receive" in record.getMessage() and why in record.getMessage()


def test_a_second_return_or_a_closed_layer_ends_it_lost(caplog):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    engine = Submitted()
    sends, send = parked_send(engine)
    send.park()(RETURNED, None)
    engine.calls[0][2](object(), None)
    engine.calls[1][2](RETURNED, None)
    assert (sends.messages, sends.lost) == (0, 1)
    assert "disappears" in caplog.records[-1].getMessage()
    closed = Submitted(closed=True)
    sends, send = parked_send(closed)
    send.park()(RETURNED, None)
    assert (sends.messages, sends.lost) == (0, 1)
    assert "closed" in caplog.records[-1].getMessage()


def test_the_bound_counts_messages_and_bytes():
    sends, send = parked_send(Submitted(), body=b"12345")
    send.park()
    assert send.has_room()  # 2 messages, 10 bytes: one more of 5 fits
    send.park()
    assert not send.has_room()  # 2 messages parked
    sends, big = parked_send(Submitted(), body=b"x" * 11)
    assert not big.has_room()  # larger than the bytes bound alone


def test_hand_over_reaches_the_parking_once_whoever_comes_first():
    # Handed over first: the resolving thread calls it.
    pending, seen = Pending("send"), []
    pending.hand_over(lambda value, error: seen.append((value, error)))
    assert pending.resolve(ACKED)
    assert seen == [(ACKED, None)]
    # Resolved first: hand_over calls it at once.
    pending, seen = Pending("send"), []
    error = LayerClosed("closed")
    pending.fail(error)
    pending.hand_over(lambda value, error: seen.append((value, error)))
    assert seen == [(None, error)]
    # A race, many times: exactly once each.
    for _ in range(200):
        pending, seen = Pending("send"), []
        resolver = threading.Thread(target=pending.resolve, args=(ACKED,))
        resolver.start()
        pending.hand_over(lambda value, error, seen=seen: seen.append(value))
        resolver.join(5)
        assert seen == [ACKED]
