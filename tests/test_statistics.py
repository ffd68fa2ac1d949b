"""The ASGI ``statistics`` extension (asgi_amqp/statistics.py).

The broker's figures come from the management API, which refreshes them
every collect_statistics_interval (5 s by default). All traffic is therefore
sent once, by a module fixture, which then waits for the figures to show it;
each test checks its own part.
"""

import socket
import threading
import time
import uuid

import pika
import pytest

from asgi_amqp import AMQPChannelLayer, ChannelFull, ManagementAPIError, statistics
from helpers import Management, wait_until

CAPACITY = 20
SENT = {"st.a": 7, "st.b": 3, "st.local!": 4}  # per queue
FULL = 5  # ChannelFull provoked on st.full
AGED = 30  # seconds: the head message of st.aged has this timestamp age


# -- Counters (no broker) ------------------------------------------------------------------


class Clock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_counters_count_per_channel_and_in_total():
    counters = statistics.Counters(clock=Clock())
    for _ in range(3):
        counters.count_full("a")
    counters.count_full("b")
    assert counters.full_count("a") == 3
    assert counters.full_count("b") == 1
    assert counters.full_count("never") == 0
    assert counters.full_count() == 4
    assert sorted(counters.channels()) == ["a", "b"]


def test_counters_count_process_local_channels_by_their_queue():
    counters = statistics.Counters(clock=Clock())
    counters.count_full("x!one")
    counters.count_full("x!two")
    assert counters.full_count("x!") == 2
    assert counters.full_count("x!three") == 2


def test_counters_rate_is_a_sliding_window():
    clock = Clock()
    counters = statistics.Counters(window=1.0, buckets=10, clock=clock)
    for _ in range(4):
        counters.count_full("a")
    clock.now += 0.55
    counters.count_full("a")
    assert counters.full_rate("a") == 5.0
    assert counters.full_rate() == 5.0
    clock.now += 0.5  # the first four are now 1.05 s old
    assert counters.full_rate("a") == 1.0
    clock.now += 0.6
    assert counters.full_rate("a") == 0.0
    assert counters.full_count("a") == 5
    assert counters.full_rate("never") == 0.0


def test_counters_rate_over_a_longer_window():
    clock = Clock()
    counters = statistics.Counters(window=10.0, clock=clock)
    for _ in range(20):
        counters.count_full("a")
        clock.now += 0.25
    assert counters.full_rate("a") == pytest.approx(2.0)


def test_counters_forget_least_recent_channels_but_keep_totals():
    counters = statistics.Counters(max_channels=2, clock=Clock())
    counters.count_full("a")
    counters.count_full("b")
    counters.count_full("a")
    counters.count_full("c")  # evicts b, the least recently counted
    assert sorted(counters.channels()) == ["a", "c"]
    assert counters.full_count("b") == 0
    assert counters.full_count() == 4


def test_counters_are_thread_safe():
    counters = statistics.Counters()
    threads = [
        threading.Thread(target=lambda: [counters.count_full("t%d" % (i % 7)) for i in range(2000)])
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counters.full_count() == 16000
    assert sum(counters.full_count("t%d" % i) for i in range(7)) == 16000


def test_counters_reject_nonsense():
    with pytest.raises(ValueError):
        statistics.Counters(window=0)


# -- against the broker ------------------------------------------------------------------------


def _publish_aged(broker, queue, arguments):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True, arguments=arguments)
        channel.basic_publish(
            "",
            queue,
            b"\x80",  # an empty msgpack map: {}
            pika.BasicProperties(timestamp=int(time.time()) - AGED),
        )
    finally:
        connection.close()


@pytest.fixture(scope="module")
def traffic(broker, module_layer):
    """A layer after known traffic, once the management API shows all of it."""
    layer = module_layer(
        broker, flush=True, prefix="st-%s" % uuid.uuid4().hex[:10], capacity=CAPACITY, expiry=120
    )
    for i in range(SENT["st.a"]):
        layer.send("st.a", {"i": i})
    for i in range(SENT["st.b"]):
        layer.send("st.b", {"i": i})
    for i in range(SENT["st.local!"]):
        layer.send("st.local!%d" % (i % 2), {"i": i})
    for i in range(CAPACITY):
        layer.send("st.full", {"i": i})
    for _ in range(FULL):
        with pytest.raises(ChannelFull):
            layer.send("st.full", {"i": -1})
    _publish_aged(
        broker,
        layer.topology.channel_queue("st.aged"),
        layer.topology.channel_queue_arguments("st.aged"),
    )
    expected = dict(SENT, **{"st.full": CAPACITY, "st.aged": 1})

    def visible():
        found = statistics.all_channel_statistics(layer)
        # Depth and head timestamp are refreshed by separate timers.
        # Publish counts come from yet another (channel) stats event.
        return (
            all(c in found and found[c]["messages_pending"] == n for c, n in expected.items())
            and all(found[c]["messages_count"] >= n for c, n in SENT.items())
            and found["st.aged"]["messages_max_age"] > 0
        )

    wait_until(visible, timeout=20, interval=0.25, message="statistics showing the traffic")
    return layer


def test_channel_statistics_has_the_spec_keys(traffic):
    figures = statistics.channel_statistics(traffic, "st.a")
    assert set(figures) == set(statistics.KEYS)
    assert isinstance(figures["messages_count_per_second"], float)
    assert isinstance(figures["channel_full_count_per_second"], float)


def test_channel_pending_equals_messages_sent(traffic):
    for channel, count in SENT.items():
        figures = statistics.channel_statistics(traffic, channel)
        assert figures["messages_pending"] == count, channel
        # Exact: not the first send, which came back unroutable and was sent again.
        assert figures["messages_count"] == count, channel
        assert figures["messages_count_per_second"] >= 0


def test_messages_count_is_what_the_queue_took_in(broker, new_layer):
    """Equal to the broker's own count of messages routed into the queue.

    The broker's publish count is higher: the layer's first send to a new
    queue comes back unroutable (counted against the queue's name) and is
    sent again once the queue is declared, and a full queue refuses a publish.
    """
    layer = new_layer(broker, flush=True, capacity=3, receive_timeout=1)
    for i in range(3):
        layer.send("st.exact", {"i": i})
    with pytest.raises(ChannelFull):
        layer.send("st.exact", {"i": 3})
    assert layer.receive(["st.exact"]) == ("st.exact", {"i": 0})
    management = Management(broker)
    queue = layer.topology.channel_queue("st.exact")

    def sampled():
        # A sample that has every publish the broker counted (3 taken, 1
        # refused, and on 3.x the 1 returned) and the delivery.
        record = management.queue(queue) or {}
        stats = record.get("message_stats") or {}
        done = record.get("messages") == 2 and stats.get("publish", 0) >= 4
        return record if done and stats.get("deliver_get") == 1 else None

    record = wait_until(sampled, timeout=30, interval=0.25, message="a sample of st.exact")
    routed = record["messages"] + record["message_stats"]["deliver_get"]
    assert routed == 3
    assert statistics.channel_statistics(layer, "st.exact")["messages_count"] == routed
    assert statistics.all_channel_statistics(layer)["st.exact"]["messages_count"] == routed


def test_messages_count_ignores_a_queue_sample_older_than_the_depth():
    """The management API keeps a classic queue's depth and its full
    statistics apart and updates them at other moments: a test under load
    read ``next_seq_id`` 0, the declaration's, right after a depth of 2."""
    stale = {
        "type": "classic",
        "messages": 2,
        "messages_ready": 2,
        "message_stats": {"publish": 5, "deliver_get": 1},
        "backing_queue_status": {"len": 0, "next_seq_id": 0},
    }
    assert statistics.messages_taken_in(stale) == 3  # held + delivered
    current = dict(stale, backing_queue_status={"len": 2, "next_seq_id": 3})
    assert statistics.messages_taken_in(current) == 3
    # A message delivered and not acked is in messages but not in len.
    unacked = dict(
        current,
        messages=3,
        messages_ready=2,
        message_stats={"publish": 3, "deliver_get": 1},
        backing_queue_status={"len": 2, "next_seq_id": 3},
    )
    assert statistics.messages_taken_in(unacked) == 3


def test_process_local_channel_reports_its_queue(traffic):
    assert statistics.channel_statistics(traffic, "st.local!0")["messages_pending"] == 4
    assert statistics.channel_statistics(traffic, "st.local!")["messages_pending"] == 4


def test_global_statistics_include_every_channel(traffic):
    figures = statistics.global_statistics(traffic)
    assert set(figures) == set(statistics.KEYS)
    assert figures["messages_pending"] == sum(SENT.values()) + CAPACITY + 1
    assert figures["messages_count"] >= figures["messages_pending"]
    assert figures["channel_full_count"] == FULL
    assert figures["messages_max_age"] >= AGED - 1


def _rate_fell(figures):
    """``figures`` once their ChannelFull rate per second is 0, else None."""
    return figures if figures["channel_full_count_per_second"] == 0.0 else None


def test_channel_full_count_matches_channel_full_raised(traffic):
    figures = statistics.channel_statistics(traffic, "st.full")
    assert figures["channel_full_count"] == FULL
    assert figures["messages_pending"] == CAPACITY
    # The count stays; the per-second rate falls to 0 once a second has passed.
    figures = wait_until(
        lambda: _rate_fell(statistics.channel_statistics(traffic, "st.full")),
        timeout=2,
        message="channel_full_count_per_second back to 0",
    )
    assert figures["channel_full_count"] == FULL
    assert figures["channel_full_count_per_second"] == 0.0
    assert statistics.channel_statistics(traffic, "st.a")["channel_full_count"] == 0


def test_channel_full_rate_in_the_last_second(broker, new_layer):
    layer = new_layer(broker, flush=True, capacity=1)
    layer.send("st.r", {})
    for _ in range(3):
        with pytest.raises(ChannelFull):
            layer.send("st.r", {})
    figures = statistics.channel_statistics(layer, "st.r")
    assert figures["channel_full_count"] == 3
    assert figures["channel_full_count_per_second"] == 3.0


def test_messages_max_age_from_the_head_message_timestamp(traffic):
    age = statistics.channel_statistics(traffic, "st.aged")["messages_max_age"]
    assert AGED - 1 <= age <= AGED + 30
    # Messages the layer sends carry no timestamp unless the layer sets one:
    # then 0, else their real age, which is far below AGED here.
    assert statistics.channel_statistics(traffic, "st.a")["messages_max_age"] < AGED - 1


def test_channel_without_a_queue_is_all_zero(traffic):
    figures = statistics.channel_statistics(traffic, "st.never")
    assert figures == {
        "messages_count": 0,
        "messages_count_per_second": 0.0,
        "messages_pending": 0,
        "messages_max_age": 0,
        "channel_full_count": 0,
        "channel_full_count_per_second": 0.0,
    }


def test_invalid_channel_name_raises_type_error(traffic):
    with pytest.raises(TypeError):
        statistics.channel_statistics(traffic, "bad name")
    with pytest.raises(TypeError):
        statistics.channel_statistics(traffic, b"bytes")


def test_extensions_are_listed_without_asking_the_broker():
    """``layer.extensions`` comes from the configuration: on a layer whose
    management API is a closed port, or a port that never answers, it lists
    ``statistics`` at once and opens no connection (no thread, nothing
    accepted on the silent port)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.setblocking(False)
        for management_url in (
            "http://127.0.0.1:1/",
            "http://127.0.0.1:%d/" % silent.getsockname()[1],
        ):
            layer = AMQPChannelLayer(url="amqp://127.0.0.1:1/", management_url=management_url)
            try:
                started = time.monotonic()
                extensions = layer.extensions
                elapsed = time.monotonic() - started
                assert {"groups", "flush", "send_many", "statistics"} <= set(extensions)
                assert elapsed < 0.1, elapsed
                assert layer.threads() == []
            finally:
                layer.close()
        with pytest.raises(BlockingIOError):
            silent.accept()  # nobody connected


def test_statistics_raise_when_the_management_api_does_not_answer():
    layer = AMQPChannelLayer(url="amqp://127.0.0.1:1/", management_url="http://127.0.0.1:1/")
    try:
        for call in (lambda: layer.channel_statistics("st.c"), layer.global_statistics):
            with pytest.raises(ManagementAPIError, match="not reachable at http://127.0.0.1:1"):
                call()
    finally:
        layer.close()


def test_layer_integration(broker, new_layer):
    """Runs once the layer has the statistics methods and lists the extension."""
    layer = new_layer(broker, flush=True, capacity=1)
    assert "statistics" in layer.extensions
    layer.send("st.i", {})
    with pytest.raises(ChannelFull):
        layer.send("st.i", {})
    assert layer.channel_statistics("st.i")["channel_full_count"] == 1
    assert layer.global_statistics()["channel_full_count"] == 1
