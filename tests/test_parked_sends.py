"""Parked sends go out in order, wait for room, and end delivered or expired (no broker).

``parked_sends`` publishes one parked send at a time on the I/O thread:
here the engine's non-waiting calls are recorded by a stand-in and
answered by the test, as the I/O thread would answer them.
``test_full_queues_and_long_outages`` runs it against a real broker.
"""

import logging

import pika
import pytest

from asgi_amqp import parked_sends
from asgi_amqp.engine import ACKED, NACKED, RETURNED
from asgi_amqp.errors import BrokerUnreachable, ChannelFull, LayerClosed
from asgi_amqp.parked_sends import ParkedSends


class Submitted(object):
    """The engine's ``submit_*`` calls: recorded, answered by the test."""

    def __init__(self, closed=False, away=False):
        self.calls = []
        self.closed = closed
        self.away = away

    def broker_away(self):
        return self.away

    def submit_declare(self, steps, what, on_done):
        self._submit(("declare", what, on_done))

    def submit_publish(self, exchange, routing_key, body, properties, what, on_done, marked=False):
        self._submit(("publish", body, on_done, marked))

    def submit_pause(self, seconds, on_done):
        self._submit(("pause", seconds, on_done))

    def _submit(self, call):
        if self.closed:
            raise LayerClosed("the layer is closed")
        self.calls.append(call)

    def answer(self, *result):
        """Answer the last call, as the I/O thread would."""
        self.calls[-1][2](*result)


def parked(engine, messages=10, size=1000, expiry=60.0):
    return ParkedSends(engine, lambda channel, queue: ("declare", queue), expiry, messages, size)


QUEUE = "p:q:websocket.receive"


def park(sends, body, queue=QUEUE, **kw):
    sends.park("websocket.receive", queue, body, pika.BasicProperties(), **kw)


def test_parked_sends_go_one_at_a_time_in_order():
    engine = Submitted()
    sends = parked(engine)
    for body in (b"0", b"1", b"2"):
        park(sends, body)
    assert sends.waiting(QUEUE) and sends.messages == 3
    assert [c[1] for c in engine.calls] == [b"0"]  # only the head is in flight
    for expected in (b"0", b"1", b"2"):
        assert engine.calls[-1][:2] == ("publish", expected)
        engine.answer(ACKED, None)
    assert not sends.waiting(QUEUE) and (sends.delivered, sends.lost, sends.expired) == (3, 0, 0)
    park(sends, b"3")  # nothing moving: it goes at once
    assert engine.calls[-1][:2] == ("publish", b"3")


def test_the_lines_of_two_queues_move_side_by_side():
    engine = Submitted()
    sends = parked(engine)
    park(sends, b"r0")
    park(sends, b"r1")
    park(sends, b"h0", queue="p:q:http.request")
    assert [c[1] for c in engine.calls] == [b"r0", b"h0"]  # one head per line
    assert sends.waiting(QUEUE) and sends.waiting("p:q:http.request")
    engine.calls[1][2](ACKED, None)  # the request's line is done, however full the other
    assert not sends.waiting("p:q:http.request") and sends.messages == 2


def test_a_refused_send_waits_for_room_and_keeps_its_place(caplog):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    engine = Submitted()
    sends = parked(engine)
    park(sends, b"0")
    park(sends, b"1")
    pauses = []
    for _ in range(8):  # the channel stays full a while: each refusal pauses longer
        engine.answer(NACKED, None)
        kind, seconds, _ = engine.calls[-1]
        assert kind == "pause"
        pauses.append(seconds)
        engine.answer(None, None)
        assert engine.calls[-1][:2] == ("publish", b"0")  # the same head again
    assert pauses == sorted(pauses) and pauses[0] < pauses[-1] <= 0.25
    engine.answer(ACKED, None)
    assert engine.calls[-1][:2] == ("publish", b"1")
    engine.answer(ACKED, None)
    assert (sends.delivered, sends.lost, sends.expired) == (2, 0, 0)
    assert not caplog.records  # nothing dropped, nothing to say


def test_a_returned_send_declares_its_queue_and_goes_again():
    engine = Submitted()
    sends = parked(engine)
    park(sends, b"0")
    engine.answer(RETURNED, None)
    kind, what, _ = engine.calls[-1]
    assert kind == "declare" and "p:q:websocket.receive" in what
    engine.answer(object(), None)
    assert engine.calls[-1][:2] == ("publish", b"0")
    engine.answer(ACKED, None)
    assert sends.delivered == 1


class Clock(object):
    now = 1000.0

    def monotonic(self):
        return self.now


def test_a_send_parked_longer_than_expiry_expires_and_says_so(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    clock = Clock()
    monkeypatch.setattr(parked_sends, "time", clock)
    engine = Submitted()
    sends = parked(engine, expiry=60)
    park(sends, b"0")
    park(sends, b"1")
    clock.now += 61
    engine.answer(NACKED, None)
    engine.calls[-1][2](None, None)  # the pause ends: both are older than expiry
    assert not sends.waiting(QUEUE) and (sends.delivered, sends.expired) == (0, 2)
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2
    assert "expired" in caplog.records[0].getMessage()


def test_the_bound_counts_messages_and_bytes():
    sends = parked(Submitted(), messages=2, size=10)
    park(sends, b"12345")
    park(sends, b"12345")
    with pytest.raises(ChannelFull, match="fill their limit"):
        park(sends, b"1")  # 2 messages parked
    away = parked(Submitted(away=True), size=10)
    with pytest.raises(BrokerUnreachable, match="unreachable"):
        park(away, b"x" * 11)  # larger than the bytes bound alone
    park(away, b"x" * 11, marked=True)  # on its way already: parked whatever the bound


def test_a_closed_layer_loses_every_parked_send_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    engine = Submitted()
    sends = parked(engine)
    park(sends, b"0")
    park(sends, b"1")
    engine.answer(None, LayerClosed("the layer is closed"))
    assert not sends.waiting(QUEUE) and sends.lost == 2
    (record,) = caplog.records
    assert "2 sends" in record.getMessage() and "closed" in record.getMessage()
    closed = Submitted(closed=True)
    sends = parked(closed)
    park(sends, b"0")
    assert sends.lost == 1


def test_a_copy_of_a_publish_that_may_have_arrived_goes_marked():
    engine = Submitted()
    sends = parked(engine)
    park(sends, b"0", marked=True)
    assert engine.calls[-1][3] is True
