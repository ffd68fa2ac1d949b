"""Non-blocking receives over many channels (asgi_amqp.engine.getter.waves.Getter).

One receive asks several queues at once and keeps one message; the others it
took go back to the head of their queues. These tests pin down what that
must never cost: a message, a duplicate, per-channel order, or a None while
some named channel holds a message.
"""

import time

import pytest

from asgi_amqp.engine import getter
from helpers import drain


@pytest.fixture
def layer(broker, new_layer):
    return new_layer(broker, flush=True, expiry=30, capacity=10000, receive_timeout=1)


def test_a_message_beyond_one_wave_is_found(layer):
    channels = ["many.%d" % i for i in range(getter.LANES * 2 + 3)]
    for channel in channels:  # every queue exists and is empty
        assert layer.receive([channel]) == (None, None)
    layer.send(channels[-1], {"last": True})
    assert layer.receive(channels) == (channels[-1], {"last": True})
    assert layer.receive(channels) == (None, None)


def test_messages_taken_and_put_back_keep_their_order(layer):
    channels = ["order.%d" % i for i in range(6)]
    per_channel = 25
    for n in range(per_channel):
        for channel in channels:
            layer.send(channel, {"n": n})
    seen = {channel: [] for channel in channels}
    for channel, message in drain(layer, channels):
        seen[channel].append(message["n"])
    for channel in channels:
        # each wave takes up to six messages and keeps one: the rest go back
        # and must come out again, once, in their place
        assert seen[channel] == list(range(per_channel)), channel


def test_none_only_after_every_channel_was_asked(layer):
    quiet = ["quiet.%d" % i for i in range(5)]
    assert layer.receive(quiet) == (None, None)  # all of them just answered empty
    layer.send(quiet[2], {"late": 1})
    # Asked again at once, every queue is "recently empty"; the message must
    # still be found by this very call.
    assert layer.receive(quiet) == (quiet[2], {"late": 1})


def test_a_quiet_channel_is_served_while_another_stays_busy(layer):
    busy, quiet = "busy.one", "quiet.one"
    for n in range(400):
        layer.send(busy, {"n": n})
    assert layer.receive([quiet]) == (None, None)
    layer.send(quiet, {"wake": 1})
    sent_at = time.monotonic()
    for _ in range(400):
        channel, _message = layer.receive([busy, quiet])
        if channel == quiet:
            break
    else:
        pytest.fail("the quiet channel's message was never returned")
    # RECHECK_EMPTY bounds the extra wait, plus a few round trips on a loaded machine.
    assert time.monotonic() - sent_at < getter.RECHECK_EMPTY + 1.0


def test_messages_taken_in_the_callers_thread_are_acked_once(broker, new_layer):
    """A message a consumer was pushed is taken without the I/O thread; its ack
    must still reach the broker, or closing the connection would bring it back."""
    layer = new_layer(broker, expiry=30, receive_timeout=0.3)
    prefix = layer.topology.prefix
    assert layer.receive(["pushed"], block=True) == (None, None)  # starts a consumer
    for n in range(20):
        layer.send("pushed", {"n": n})
    seen = [m["n"] for _, m in drain(layer, ["pushed"], block=True)]
    assert seen == list(range(20))
    layer.close()
    # Unacked messages would be back in the queue now that the connection is gone.
    again = new_layer(broker, flush=True, expiry=30, prefix=prefix)
    assert again.receive(["pushed"]) == (None, None)
