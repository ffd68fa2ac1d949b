"""Non-blocking receives take what a consumer of this process was pushed.

A poll starts no consumer of its own (but a shard's); where a blocking
receive left one, the next polls take what it was pushed, without a
``basic.get`` each (asgi_amqp.engine.consumers.polls). These tests hold what
that must never cost: order, a message, a duplicate, expiry, or a bound on
consumers. The consumer counts come from the broker itself (a passive declare).
"""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import drain, queue_counts, wait_until


def consumers_on(broker, queue):
    """The broker's own count of consumers on ``queue``."""
    return queue_counts(broker, queue).consumer_count


def consume(layer, broker, channel):
    """Leave a consumer of ``channel``'s queue: a blocking receive that finds nothing."""
    queue = layer.topology.channel_queue(channel)
    wait_until(
        lambda: (
            layer.receive([channel], block=True) == (None, None)
            and consumers_on(broker, queue) == 1
        ),
        10,
        message="a consumer on %s" % queue,
    )


@pytest.fixture
def layer(broker, new_layer):
    return new_layer(broker, expiry=30, capacity=10000, receive_timeout=1)


def test_a_polled_channel_keeps_its_order_and_loses_nothing(layer, broker):
    channels = ["polled%d!reply" % i for i in range(3)]
    readable = ["polled%d!" % i for i in range(3)]
    for name in readable:
        consume(layer, broker, name)
    per_channel = 400  # many windows' worth: each refill races the next poll
    for n in range(per_channel):
        for channel in channels:
            layer.send(channel, {"n": n})
    seen = {channel: [] for channel in channels}
    for channel, message in drain(layer, readable):
        seen[channel].append(message["n"])
    for channel in channels:
        # A None before the end would stop the drain short: no poll may say
        # "nothing" while the broker still holds messages for it.
        assert seen[channel] == list(range(per_channel)), channel


def test_a_message_sent_is_found_by_the_next_poll(layer, broker):
    consume(layer, broker, "next!")
    for n in range(50):
        layer.send("next!x", {"n": n})
        assert layer.receive(["next!"]) == ("next!x", {"n": n})
        assert layer.receive(["next!"]) == (None, None)


@pytest.mark.parametrize(
    "channel",
    ["shared.polled", "__wait__.daphne.response.abc?def", "local.polled!"],
    ids=["normal", "channels-wait-channel", "process-local"],
)
def test_a_poll_starts_no_consumer_of_its_own(layer, broker, channel):
    """Channels 1.x's enforce_ordering parks messages in ``__wait__...?...``
    channels that every worker process polls: a consumer in one worker would
    keep them from the others."""
    for _ in range(10):
        assert layer.receive([channel]) == (None, None)
    assert consumers_on(broker, layer.topology.channel_queue(channel)) == 0
    layer.send(channel + ("x" if channel.endswith("!") else ""), {"n": 1})
    assert layer.receive([channel])[1] == {"n": 1}


def test_a_frame_parked_after_a_poll_in_one_worker_is_found_by_the_next_in_another(
    broker, new_layer
):
    """enforce_ordering: worker A polls a socket's wait channel and finds nothing,
    then parks an early frame there; worker B, handling the frame before it,
    polls the wait channel once. Had A's poll left a consumer, the broker would
    push the parked frame to A and B's one poll would miss it: the socket stalls
    until its client sends again. This is why polls use ``basic.get``."""
    channel = "__wait__.daphne.response.abc?def"
    a = new_layer(broker, expiry=30, flush=True)
    b = new_layer(broker, expiry=30, prefix=a.topology.prefix)
    for n in range(20):
        for _ in range(3):
            assert a.receive([channel]) == (None, None)
        a.send(channel, {"n": n})
        assert b.receive([channel]) == (channel, {"n": n})


def test_consumers_per_process_stay_bounded(broker, new_layer):
    layer = new_layer(broker, expiry=30, max_consumers=3, receive_timeout=0.1)
    channels = ["bounded%d!" % i for i in range(8)]
    for channel in channels:
        assert layer.receive([channel], block=True) == (None, None)
    queues = [layer.topology.channel_queue(channel) for channel in channels]
    total = wait_until(
        lambda: (lambda n: n if 1 <= n <= 3 else 0)(sum(consumers_on(broker, q) for q in queues)),
        10,
        message="at most 3 consumers",
    )
    assert 1 <= total <= 3
    # An evicted channel is still served, by basic.get or a consumer again.
    layer.send("bounded0!x", {"n": 1})
    assert layer.receive([channels[0]]) == ("bounded0!x", {"n": 1})


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_poller_that_pauses_gets_its_messages_in_order(broker, new_layer, queue_type):
    """daphne's reactor may not poll for a moment. Given back after
    ``linger``, its held replies would go behind the later ones in a quorum
    queue, and its clients would get them out of order; only this process
    reads its queue, so they wait for its next poll
    (``consumers.sweep.PROCESS_LOCAL_HOLD``)."""
    layer = new_layer(broker, expiry=30, linger=0.25, queue_type=queue_type, receive_timeout=0.5)
    channel = "pause!x"
    consume(layer, broker, "pause!")
    for n in range(20):
        layer.send(channel, {"n": n})
    got = [m["n"] for _, m in [layer.receive(["pause!"], block=True) for _ in range(3)]]
    queue = layer.topology.channel_queue(channel)
    wait_until(lambda: queue_counts(broker, queue).message_count <= 4, 10, message="pushed")
    time.sleep(1.0)  # the poller's pause is what is tested: four lingers without a poll
    for n in range(20, 25):
        layer.send(channel, {"n": n})
    got += [m["n"] for _, m in drain(layer, ["pause!"], block=True)]
    assert got == list(range(25))


def test_a_consumer_nobody_reads_gives_its_messages_back(broker, new_layer):
    reader = new_layer(broker, expiry=30, linger=0.2, consumer_idle_timeout=1.0)
    channel = "handover!x"
    consume(reader, broker, "handover!")
    for n in range(5):
        reader.send(channel, {"n": n})
    # Pushed to the reader's consumer, then given back once nobody reads:
    # a second layer reading the same queue gets every message, in order.
    other = new_layer(broker, prefix=reader.topology.prefix, expiry=30)
    queue = reader.topology.channel_queue(channel)
    wait_until(lambda: consumers_on(broker, queue) == 0, 20, message="the consumer cancelled")
    assert [m["n"] for _, m in drain(other, ["handover!"])] == [0, 1, 2, 3, 4]


_DYING_READER = textwrap.dedent(
    """
    import json, os, sys
    from asgi_amqp import AMQPChannelLayer
    url, prefix, channel = sys.argv[1:4]
    layer = AMQPChannelLayer(url=url, prefix=prefix, expiry=30, capacity=10000)
    taken = []
    while len(taken) < 3:
        got, message = layer.receive([channel.partition("!")[0] + "!"])
        if got is not None:
            taken.append(message["n"])
    print(json.dumps(taken), flush=True)
    os._exit(0)  # no close: what its consumer was pushed is still unacked
    """
)


@pytest.mark.slow
def test_a_process_that_dies_holding_pushed_messages_loses_none(layer, broker):
    channel = "dying!reply"
    for n in range(100):
        layer.send(channel, {"n": n})
    child = subprocess.run(
        [sys.executable, "-c", _DYING_READER, broker.amqp_url, layer.topology.prefix, channel],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    taken = json.loads(child.stdout)
    left = [message["n"] for _, message in drain(layer, ["dying!"], block=True)]
    # The child's acks may not have left before it died: those come back too.
    assert sorted(set(taken) | set(left)) == list(range(100))
    assert len(left) == len(set(left))
    assert left == sorted(left)


@pytest.mark.slow
def test_an_unread_message_of_a_consumed_channel_still_expires_and_drops_its_groups(
    broker, new_layer
):
    layer = new_layer(broker, expiry=1, group_expiry=60, linger=0.2, consumer_idle_timeout=1.0)
    channel = "member!x"
    layer.group_add("consumed-group", channel)
    consume(layer, broker, "member!")
    layer.send_group("consumed-group", {"n": 1})
    # Nobody reads any more: the consumer gives the message back, it expires
    # in its queue and the dead-letter worker drops the membership.
    wait_until(
        lambda: channel not in layer.group_channels("consumed-group"),
        30,
        message="membership dropped",
    )
    assert layer.receive(["member!"]) == (None, None)
