"""Acks of held messages taken in a caller's thread go in batches (engine/consumers/acks.py).

What a batch must never do: ack a message nobody took (one ``multiple`` ack
covers every unsettled delivery up to its tag on the channel), or leave a
taken message unacked when the layer closes (the broker would deliver it
again). The first two tests hold the rules on their own; the others hold
them against a real broker, with a new layer reading what the first left.
"""

import pika
import pytest

from asgi_amqp.engine.consumers.acks import ACK_BATCH, TakenAcks, Unsettled
from helpers import drain, queue_counts, wait_until


def test_a_multiple_ack_covers_only_a_run_of_taken_messages_from_the_oldest():
    unsettled = Unsettled()
    for tag in range(1, 7):
        unsettled.pushed(tag)
    assert unsettled.multiple_upto([1, 2, 3, 5]) == 3  # 4 was not taken: the run ends there
    assert unsettled.multiple_upto([2, 3]) is None  # 1, the oldest, was not taken
    assert unsettled.multiple_upto([1]) is None  # one ack needs no multiple
    unsettled.settled_upto(3)
    unsettled.settled(5)
    assert unsettled.multiple_upto([4, 6]) == 6  # 5 is settled: 4 and 6 are a run
    unsettled.clear()
    assert unsettled.multiple_upto([7, 8]) is None


def test_an_ack_waits_only_while_more_of_its_process_local_queue_is_held():
    taken = TakenAcks()
    held = object()
    assert taken.add("p:q:daphne.response.x!", held, more_held=False)  # nothing left: now
    assert taken.add("p:q:websocket.receive", held, more_held=True)  # read by others: now
    taken.take_all()
    for _ in range(ACK_BATCH - 1):
        assert not taken.add("p:q:daphne.response.x!", held, more_held=True)
    assert taken.add("p:q:daphne.response.x!", held, more_held=True)  # the batch is full
    assert len(taken.take_all()) == ACK_BATCH and len(taken) == 0


@pytest.fixture
def layer(broker, new_layer):
    return new_layer(broker, expiry=60, capacity=10000, receive_timeout=1)


def _count_acks(monkeypatch):
    """Count the layer's ``basic_ack`` calls, single and multiple (a spy on
    pika's public method; the call itself goes through unchanged)."""
    calls = {"single": 0, "multiple": 0}
    original = pika.channel.Channel.basic_ack

    def basic_ack(self, delivery_tag=0, multiple=False):
        calls["multiple" if multiple else "single"] += 1
        return original(self, delivery_tag, multiple)

    monkeypatch.setattr(pika.channel.Channel, "basic_ack", basic_ack)
    return calls


def test_batched_acks_never_cover_a_message_nobody_took(broker, layer, new_layer, monkeypatch):
    """Two process-local queues on one consumers' channel, their deliveries'
    tags interleaved; only one queue's messages are taken. Every one taken is
    acked (a new layer gets none of them again), and none of the other
    queue's is (the new layer gets all of them)."""
    calls = _count_acks(monkeypatch)
    taken_channel, left_channel = "acked!a", "left!a"
    taken_queue, left_queue = "acked!", "left!"  # what a receive names
    per_channel = 3 * ACK_BATCH
    # Consumers on both queues first, so that both are pushed as they fill.
    assert layer.receive([taken_queue, left_queue], block=True) == (None, None)
    # One queue's messages first: its deliveries get the channel's first
    # tags, so its run of taken messages is covered by multiple acks, up to
    # where the other queue's begin.
    for channel in (taken_channel, left_channel):
        for n in range(per_channel):
            layer.send(channel, {"n": n})
    for channel in (taken_channel, left_channel):
        queue = layer.topology.channel_queue(channel)
        wait_until(
            lambda queue=queue: queue_counts(broker, queue).message_count <= per_channel - 16,
            10,
            message="the prefetch window of %s pushed" % channel,
        )
    seen = []
    while len(seen) < per_channel:
        channel, message = layer.receive([taken_queue], block=True)
        assert channel == taken_channel, "no message on %s" % taken_channel
        seen.append(message["n"])
    assert seen == list(range(per_channel))
    layer.close()  # sends what waits; the unacked go back to their queue

    assert calls["multiple"] >= 1, calls
    reader = new_layer(
        broker, prefix=layer.topology.prefix, expiry=60, capacity=10000, receive_timeout=1
    )
    left = wait_until(
        lambda: (
            queue_counts(broker, layer.topology.channel_queue(left_channel)).message_count
            == per_channel
        ),
        10,
        message="every message of %s back in its queue" % left_channel,
    )
    assert left
    assert [m["n"] for _, m in drain(reader, [left_queue])] == list(range(per_channel))
    assert drain(reader, [taken_queue]) == []


def test_a_drain_of_held_messages_acks_in_batches_and_loses_nothing(
    broker, layer, new_layer, monkeypatch
):
    """A daphne-like reader: one process-local queue, taken as fast as it is
    pushed. Everything arrives once, in order; the batches show as
    ``multiple`` acks once the consumer holds more than a batch; and after
    the reader closes, nothing is left to be delivered again."""
    channel, readable = "drained!x", "drained!"
    queue = layer.topology.channel_queue(channel)
    total = 200
    assert layer.receive([readable], block=True) == (None, None)  # the consumer starts
    for n in range(total):
        layer.send(channel, {"n": n})
    calls = _count_acks(monkeypatch)
    first_channel, first = layer.receive([readable], block=True)
    assert first_channel == channel and first["n"] == 0
    # The consumer's whole prefetch window (16) is pushed, the first taken.
    wait_until(
        lambda: queue_counts(broker, queue).message_count <= total - 16,
        10,
        message="the prefetch window pushed",
    )
    seen = [0]
    while len(seen) < total:
        received, message = layer.receive([readable], block=True)
        assert received == channel, "message %d never came" % len(seen)
        seen.append(message["n"])
    assert seen == list(range(total))
    layer.close()
    assert calls["multiple"] >= 1, calls
    assert calls["single"] + calls["multiple"] < total, calls
    reader = new_layer(
        broker, prefix=layer.topology.prefix, expiry=60, capacity=10000, receive_timeout=1
    )
    assert queue_counts(broker, queue).message_count == 0
    assert drain(reader, [readable]) == []
