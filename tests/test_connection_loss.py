"""Calls ride through a lost connection: nothing raises for an outage shorter
than ``operation_timeout``, nothing is lost or handed out twice.

Channels 1.x's worker loop calls ``receive_many(block=True)`` outside any
``try``, and sends ``consumer_finished`` (whose handler calls ``send`` and
``send_group``) from a ``finally``: whatever those raise ends the runworker
process. So every call here is made bare, the way Channels makes it, while
the broker closes every connection under it (a private node of this
module's own).
"""

import collections
import logging
import threading
import time

import pika
import pytest

from asgi_amqp import OperationTimeout
from asgi_amqp.naming import REPUBLISHED_HEADER
from helpers import Management, Traffic, wait_until

OPERATION_TIMEOUT = 4.0


def _layer(new_layer, node, **config):
    config.setdefault("capacity", 100000)
    config.setdefault("operation_timeout", OPERATION_TIMEOUT)
    return new_layer(node, **config)


def _consumers(node, layer, channel):
    record = Management(node).queue(layer.topology.channel_queue(channel))
    return (record or {}).get("consumers", 0)


class Errors(object):
    """Exceptions raised by bare calls, by kind (none are expected)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = collections.Counter()

    def call(self, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            with self.lock:
                self.seen["%s: %s" % (type(exc).__name__, str(exc)[:120])] += 1
            return None


@pytest.mark.faults
@pytest.mark.slow
def test_blocking_receive_in_flight_rides_through_a_kill(node, new_layer):
    """The README's promise: the receive in flight at the kill raises nothing
    and still gets a message sent after the reconnect, within its own limit."""
    layer = _layer(new_layer, node, receive_timeout=20.0)
    layer.send("loss.warm", {"w": 1})  # connected before the receive starts
    result = {}

    def receive():
        started = time.monotonic()
        try:
            result["value"] = layer.receive(["loss.in-flight"], block=True)
        except Exception as exc:  # what Channels would die of
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=receive)
    thread.start()
    wait_until(
        lambda: _consumers(node, layer, "loss.in-flight") > 0,
        10,
        message="the blocking receive's consumer",
    )
    node.close_all_connections("in-flight receive test")
    wait_until(
        lambda: layer.connection_statistics()["connection_losses"] >= 1,
        10,
        message="the layer saw the loss",
    )
    sender = _layer(new_layer, node, prefix=layer.topology.prefix, dead_letter_worker=False)
    sender.send("loss.in-flight", {"after": "the kill"})
    thread.join(25)
    assert not thread.is_alive()
    assert "error" not in result, result
    assert result["value"] == ("loss.in-flight", {"after": "the kill"})
    assert result["took"] < 20.0


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_sends_and_receives_ride_through_repeated_kills(node, queue_type, new_layer):
    """Numbered messages through four kills: no call raises, none is lost,
    none is received twice; the copies of publishes whose confirm was lost
    are dropped by the receiving process."""
    sender = _layer(new_layer, node, queue_type=queue_type)
    reader = _layer(
        new_layer, node, queue_type=queue_type, prefix=sender.topology.prefix, receive_timeout=0.5
    )
    traffic = Traffic(
        sender,
        ["loss.a", "loss.b!x"],
        senders=3,
        blocking_receivers=1,
        polling_receivers=1,
        reader=reader,
        receive_from=["loss.a", "loss.b!"],
        backoff=0,
        poll_pause=0,
        drain_on_stop=True,
    )
    confirmed = traffic.confirmed
    try:
        traffic.start()
        for kill in range(4):
            floor = len(confirmed) + 300
            wait_until(lambda floor=floor: len(confirmed) >= floor, 30, message="300 more sends")
            node.close_all_connections("kill %d" % kill)
        floor = len(confirmed) + 300
        wait_until(lambda: len(confirmed) >= floor, 30, message="sends after the last kill")
        traffic.stop_sending(OPERATION_TIMEOUT + 5)
        wait_until(lambda: not traffic.missing(), 30, message="everything received")
        traffic.stop_receiving(OPERATION_TIMEOUT + 5)
        counts = traffic.counts()
        lost = traffic.missing()
        stats = sender.connection_statistics()
        print(
            "\n%s: sent=%d received=%d lost=%d duplicates=%d losses=%d retried=%d "
            "republished=%d"
            % (
                queue_type,
                counts["confirmed"],
                counts["received"],
                len(lost),
                counts["duplicates"],
                stats["connection_losses"],
                stats["retried_operations"],
                stats["republished"],
            )
        )
        assert not traffic.errors, traffic.errors
        assert stats["connection_losses"] >= 4 and stats["connected"]
        # One reading process: it tells every copy, on both kinds of channel.
        assert counts["duplicates"] == 0
        assert not lost, sorted(lost)[:10]
    finally:
        traffic.stop_sending(10)
        traffic.stop_receiving(10)


@pytest.mark.faults
@pytest.mark.slow
def test_group_calls_ride_through_kills(node, new_layer):
    """group_add, send_group and group_discard, as Channels' consumers and
    its consumer_finished handler make them, raise nothing through kills."""
    layer = _layer(new_layer, node)
    errors = Errors()
    done = collections.Counter()
    stop = threading.Event()

    def churn(index):
        while not stop.is_set():
            member = "loss.member-%d!m%d" % (index, done[index] % 5)
            group = "loss-room-%d" % index
            errors.call(layer.group_add, group, member)
            errors.call(layer.send_group, group, {"i": index})
            errors.call(layer.group_discard, group, member)
            done[index] += 1

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for kill in range(3):
            floor = sum(done.values()) + 20
            wait_until(
                lambda floor=floor: sum(done.values()) >= floor, 30, message="20 more rounds"
            )
            node.close_all_connections("group kill %d" % kill)
        floor = sum(done.values()) + 20
        wait_until(lambda: sum(done.values()) >= floor, 30, message="rounds after the kills")
    finally:
        stop.set()
        for thread in threads:
            thread.join(OPERATION_TIMEOUT * 3)
        layer.close()  # a call still running now raises, and is counted
    assert not errors.seen, errors.seen
    assert layer.connection_statistics()["connection_losses"] >= 3


def _on_another_thread(call, *args):
    """``call(*args)``'s result, called on a new thread (not a worker's)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call(*args)))
    thread.start()
    thread.join(30)
    return result[0]


@pytest.mark.faults
@pytest.mark.slow
def test_an_outage_longer_than_operation_timeout_raises_from_sends_only(node, new_layer, caplog):
    """A send names the outage once it outlasts ``operation_timeout``;
    receives return nothing however long it lasts (an exception from a
    Channels worker's receive ends the process), and say so once, in the log."""
    layer = _layer(new_layer, node, operation_timeout=2.0, receive_timeout=1.0)
    layer.send("loss.outage", {"before": 1})
    node.stop_app()
    try:
        wait_until(
            lambda: not layer.connection_statistics()["connected"],
            10,
            message="the layer saw the loss",
        )
        started = time.monotonic()
        with pytest.raises(OperationTimeout) as raised:
            layer.send("loss.outage", {"during": 1})
        assert time.monotonic() - started <= 2.0 + 1.0
        assert "unreachable" in str(raised.value)
        assert "guest" not in str(raised.value)
        # Now the outage is older than operation_timeout: receives still
        # return nothing, a blocking one after receive_timeout, a poll at once
        # (one of a thread that made no blocking receive: a worker thread's
        # poll waits for the broker, test_full_queues_and_long_outages).
        caplog.set_level(logging.WARNING, logger="asgi_amqp")
        for _ in range(3):
            started = time.monotonic()
            assert layer.receive(["loss.outage"], block=True) == (None, None)
            assert time.monotonic() - started <= 1.0 + 0.5
            started = time.monotonic()
            assert _on_another_thread(layer.receive, ["loss.outage"]) == (None, None)
            assert time.monotonic() - started <= 0.2
        told = [r for r in caplog.records if "blocking receives return nothing" in r.getMessage()]
        assert len(told) == 1, [r.getMessage() for r in caplog.records]
        assert "unreachable for" in told[0].getMessage()
        assert "guest" not in told[0].getMessage()
    finally:
        node.start_app()
    wait_until(lambda: layer.connection_statistics()["connected"], 20, message="reconnected")
    layer.send("loss.outage", {"after": 1})
    # The call that raised was abandoned: it is not sent late.
    wait_until(
        lambda: layer.receive(["loss.outage"])[1] == {"after": 1}, 10, message="served again"
    )
    assert layer.receive(["loss.outage"]) == (None, None)


@pytest.mark.faults
@pytest.mark.slow
def test_group_fan_out_to_quorum_queues_survives_a_broker_restart(node, new_layer):
    """Local members get every confirmed group message across a restart.

    The broker fans a group message out to process-local members by
    dead-lettering it into their quorum queue, at most once; right after
    the node comes back it drops what it dead-letters into a queue whose
    leader is still being elected. The layer holds group sends for a while
    after an outage in which the broker refused connections.
    """
    members = ["loss.local!m%d" % i for i in range(30)]
    sender = _layer(new_layer, node, queue_type="quorum", operation_timeout=60.0)
    receiver = _layer(
        new_layer, node, prefix=sender.topology.prefix, queue_type="quorum", operation_timeout=60.0
    )
    errors = Errors()
    confirmed = []
    stop = threading.Event()

    def send():
        number = 0
        while not stop.is_set():
            if errors.call(sender.send_group, "loss-room", {"n": number}) is None:
                confirmed.append(number)
            number += 1

    thread = threading.Thread(target=send)
    try:
        for member in members:
            receiver.group_add("loss-room", member)
        thread.start()
        wait_until(lambda: len(confirmed) >= 50, 30, message="sends before the restart")
        node.stop_app()
        try:
            wait_until(
                lambda: not sender.connection_statistics()["connected"],
                10,
                message="the sender saw the loss",
            )
        finally:
            node.start_app()
        wait_until(lambda: sender.connection_statistics()["connected"], 30, message="reconnected")
        floor = len(confirmed) + 100
        wait_until(lambda: len(confirmed) >= floor, 30, message="sends after the restart")
        stop.set()
        thread.join(70)
        received = collections.defaultdict(list)

        def drained():
            channel, message = receiver.receive(["loss.local!"])
            while channel is not None:
                received[channel].append(message["n"])
                channel, message = receiver.receive(["loss.local!"])
            return all(len(received[m]) >= len(confirmed) for m in members)

        try:
            wait_until(drained, 30, message="every member got every confirmed message")
        except AssertionError:
            pass  # the assertions below say what is missing
    finally:
        stop.set()
        thread.join(70)
        sender.close()  # a call still running now raises, and is counted
        receiver.close()
    assert not errors.seen, errors.seen
    for member in members:
        got = received[member]
        assert len(got) == len(set(got)), "%s got copies" % member
        assert set(confirmed) <= set(got), "%s lost %s" % (
            member,
            sorted(set(confirmed) - set(got))[:10],
        )


# -- the guard against copies (no faults needed) -----------------------------


def _publish_copy(broker, layer, channel, original_id, message, headers=None, marked=True):
    """What the sender does after losing a confirm: the same message again,
    marked (``marked=False``: the original, with the same id)."""
    body = layer._serializer.dumps(message)
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        all_headers = {REPUBLISHED_HEADER: 1} if marked else {}
        all_headers.update(headers or {})
        connection.channel().basic_publish(
            "",
            layer.topology.channel_queue(channel),
            body,
            pika.BasicProperties(message_id=original_id, headers=all_headers, delivery_mode=1),
        )
    finally:
        connection.close()


def _spy_ids(layer):
    """Record the message id of every delivery the layer decodes."""
    ids = []
    decode = layer.receiver._decode

    def spy(delivery):
        ids.append(delivery.message_id)
        return decode(delivery)

    layer.receiver._decode = spy
    return ids


@pytest.mark.parametrize("block", [False, True])
def test_a_marked_copy_of_a_message_already_handed_out_is_dropped(broker, block, new_layer):
    layer = new_layer(broker, receive_timeout=0.5)
    ids = _spy_ids(layer)
    for channel, receive_as in [
        ("copy.normal", "copy.normal"),
        ("copy.local!a", "copy.local!"),
    ]:
        layer.send(channel, {"n": 1})
        assert layer.receive([receive_as], block=block) == (channel, {"n": 1})
        headers = {"asgi-channel": channel} if "!" in channel else None
        _publish_copy(broker, layer, channel, ids[-1], {"n": 1}, headers)
        layer.send(channel, {"n": 2})
        assert layer.receive([receive_as], block=block) == (channel, {"n": 2})
        assert layer.receive([receive_as]) == (None, None)


@pytest.mark.parametrize("block", [False, True])
def test_an_original_that_comes_after_its_marked_copy_is_dropped(broker, block, new_layer):
    """The broker may still route the original from the sender's closed
    connection after the copy came through its next one: whichever comes
    first is handed out, the other is dropped."""
    layer = new_layer(broker, receive_timeout=0.5)
    for channel, receive_as in [
        ("late.normal", "late.normal"),
        ("late.local!a", "late.local!"),
    ]:
        assert layer.receive([receive_as]) == (None, None)  # declares the queue
        headers = {"asgi-channel": channel} if "!" in channel else None
        message_id = "late-original.%s" % channel
        _publish_copy(broker, layer, channel, message_id, {"n": 1}, headers)
        _publish_copy(broker, layer, channel, message_id, {"n": 1}, headers, marked=False)
        assert layer.receive([receive_as], block=block) == (channel, {"n": 1})
        layer.send(channel, {"n": 2})  # the next message still comes, once
        assert layer.receive([receive_as], block=block) == (channel, {"n": 2})
        assert layer.receive([receive_as]) == (None, None)


def test_a_marked_copy_of_a_message_this_process_never_had_is_delivered(broker, new_layer):
    layer = new_layer(broker)
    assert layer.receive(["copy.first"]) == (None, None)  # declares the queue
    _publish_copy(broker, layer, "copy.first", "never-seen.1", {"n": 1})
    assert layer.receive(["copy.first"]) == ("copy.first", {"n": 1})


def test_one_group_message_reaches_two_local_members_of_one_process(broker, new_layer):
    """The guard tells deliveries apart by channel too, so a message fanned
    out to two members in one process is not taken for a copy, even when a
    marked copy of it arrives."""
    layer = new_layer(broker)
    layer.group_add("copies", "copy.member!one")
    layer.group_add("copies", "copy.member!two")
    layer.send_group("copies", {"g": 1})
    got = set()
    wait_until(
        lambda: got.add(layer.receive(["copy.member!"])[0]) or len(got - {None}) == 2,
        10,
        message="both members' copies",
    )
    assert got - {None} == {"copy.member!one", "copy.member!two"}
