"""send_many and send_group_many: pipelined sends with one outcome per item.

Each item gets what ``send`` promises: reported sent only once the broker
confirmed it, its own exception otherwise, and nothing invalid published.
Messages to one channel arrive in order, and the pipeline reads its input
as it goes, so a generator of any length needs memory for the window only.
"""

import pytest

from asgi_amqp import BrokerOperationError, ChannelFull, MessageTooLarge
from helpers import drain, wait_until


def test_every_message_arrives_in_order_per_channel(broker, new_layer):
    layer = new_layer(broker, capacity=100000)
    channels = ["many.c%d" % i for i in range(7)]
    count = 9000  # more than the window: outcomes are collected as it goes
    outcomes = layer.send_many((channels[i % 7], {"i": i, "pad": "x" * 100}) for i in range(count))
    assert outcomes == [None] * count
    for index, channel in enumerate(channels):
        got = [message["i"] for _, message in drain(layer, [channel])]
        assert got == list(range(index, count, 7)), channel


def test_each_item_gets_its_own_error_and_invalid_ones_are_never_sent(broker, new_layer):
    layer = new_layer(broker, max_message_size=1000)
    outcomes = layer.send_many(
        [
            ("many.ok", {"n": 1}),
            ("not a name!", {"n": 2}),
            ("many.ok", {"n": object()}),
            ("many.ok", {"n": "x" * 5000}),
            "not a pair",
            ("many.ok", {"n": 3}),
        ]
    )
    assert outcomes[0] is None and outcomes[5] is None
    assert isinstance(outcomes[1], TypeError)
    assert isinstance(outcomes[2], TypeError)
    assert isinstance(outcomes[3], MessageTooLarge)
    assert isinstance(outcomes[4], TypeError) and "pairs" in str(outcomes[4])
    assert drain(layer, ["many.ok"]) == [("many.ok", {"n": 1}), ("many.ok", {"n": 3})]


def test_a_full_channel_is_channel_full_for_its_items_only(broker, new_layer):
    layer = new_layer(broker, capacity=3)
    items = [("many.small", {"i": i}) for i in range(5)] + [("many.other", {"i": 9})]
    outcomes = layer.send_many(items)
    assert outcomes[:3] == [None, None, None]
    assert all(isinstance(o, ChannelFull) for o in outcomes[3:5])
    assert outcomes[5] is None
    assert [m["i"] for _, m in drain(layer, ["many.small"])] == [0, 1, 2]


def test_a_queue_with_other_arguments_fails_only_its_own_items(broker, new_layer):
    prefix = new_layer(broker).topology.prefix
    new_layer(broker, prefix=prefix, capacity=5).send("many.mismatch", {"first": 1})
    layer = new_layer(broker, prefix=prefix, capacity=7, flush=True)
    outcomes = layer.send_many([("many.mismatch", {"a": 1}), ("many.fine", {"b": 2})])
    assert isinstance(outcomes[0], BrokerOperationError)
    assert outcomes[1] is None
    assert drain(layer, ["many.fine"]) == [("many.fine", {"b": 2})]


def test_the_input_is_read_no_further_ahead_than_the_window(broker, new_layer):
    layer = new_layer(broker, capacity=100000)
    outcomes = []
    pipeline = layer.send_pipeline(
        lambda tag, error, in_doubt: outcomes.append(error), chunk=50, window=200
    )
    furthest_ahead = 0
    for i in range(3000):
        furthest_ahead = max(furthest_ahead, i - len(outcomes))
        pipeline.put("channel", "many.window", {"i": i}, i)
    pipeline.flush()
    assert outcomes == [None] * 3000
    assert furthest_ahead <= 200 + 1
    assert len(drain(layer, ["many.window"])) == 3000


def test_send_group_many_reaches_every_member(broker, new_layer):
    layer = new_layer(broker, capacity=1000)
    layer.group_add("many-room", "many.member")
    layer.group_add("many-room", "many.local!one")
    layer.group_add("many-room", "many.local!two")
    outcomes = layer.send_group_many([("many-room", {"i": i}) for i in range(300)])
    assert outcomes == [None] * 300
    assert [m["i"] for _, m in drain(layer, ["many.member"])] == list(range(300))
    local = drain(layer, ["many.local!"])
    for member in ("many.local!one", "many.local!two"):
        assert [m["i"] for c, m in local if c == member] == list(range(300))


def test_send_many_is_an_extension():
    from asgi_amqp import AMQPChannelLayer

    assert "send_many" in AMQPChannelLayer.extensions


@pytest.mark.faults
@pytest.mark.slow
def test_send_many_rides_through_connection_kills(node, new_layer):
    """Every item reported sent arrives exactly once, through three kills."""
    layer = new_layer(node, capacity=1000000, operation_timeout=30)
    reader = new_layer(node, prefix=layer.topology.prefix, capacity=1000000, receive_timeout=1)
    kills = []
    count = 60000

    def items():
        for i in range(count):
            if i and i % 15000 == 0:
                node.close_all_connections("send_many kill")
                kills.append(i)
            yield ("many.kill%d" % (i % 3), {"i": i})

    outcomes = layer.send_many(items())
    assert kills == [15000, 30000, 45000]
    assert outcomes == [None] * count
    got = {}

    def drained():
        # Blocking receives: consumers with a prefetch window read 60k messages
        # far faster than one basic.get each, on a loaded machine too.
        for channel, message in drain(reader, ["many.kill0", "many.kill1", "many.kill2"], True):
            got.setdefault(channel, []).append(message["i"])
        return sum(len(v) for v in got.values()) >= count

    wait_until(drained, 60, message="every message read back")
    for index in range(3):
        numbers = got["many.kill%d" % index]
        assert len(numbers) == len(set(numbers)), "a copy was delivered"
        assert sorted(numbers) == list(range(index, count, 3))
    assert layer.connection_statistics()["connection_losses"] >= 3
