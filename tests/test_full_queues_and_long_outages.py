"""Under overload and long outages the layer slows its callers down, and never
stalls daphne or ends a worker.

* A refused publish whose queue is full raises ``ChannelFull`` at once, for
  classic and quorum queues alike. A full quorum queue keeps refusing until
  it is down to 80 % of its length limit; from daphne's reactor thread that
  is ``ChannelFull`` within one broker round trip, not a retry loop that
  sleeps on the reactor.
* daphne's reactor thread never waits for the broker through an outage: a
  send it makes then is parked, returns at once, and is delivered in order
  once the broker is back; beyond the parked sends' bound it raises
  ``BrokerUnreachable`` (a ``ChannelFull``) at once.
* A worker thread (one that makes blocking receives: a Channels runworker's)
  rides out an outage of any length: its receives return nothing, and its
  sends wait for the broker to come back instead of raising, because
  Channels catches nothing around either. Other threads still get
  ``OperationTimeout`` after ``operation_timeout``.

The reactor half runs in a child interpreter with a real Twisted reactor
(a reactor cannot be restarted in one process; see ``test_twisted``).
"""

import contextlib
import logging
import textwrap
import threading
import time

import pytest
from test_twisted import run_child

from asgi_amqp import BrokerUnreachable, ChannelFull, OperationTimeout
from helpers import as_reactor_thread, wait_until

FULL_ON_THE_REACTOR = textwrap.dedent("""
    import json, sys, time
    from twisted.internet import reactor, threads
    from asgi_amqp import AMQPChannelLayer
    from asgi_amqp.callers import on_reactor_thread

    url, management_url, prefix, queue_type = sys.argv[1:5]
    layer = AMQPChannelLayer(url=url, management_url=management_url or None, prefix=prefix,
                             capacity=10, queue_type=queue_type, operation_timeout=10,
                             ordered_channels=["storm.frames"])
    layer.sender.parked_sends.messages_limit = 20
    results = {"sends": []}

    def timed_send(channel, message):
        started = time.monotonic()
        try:
            layer.send(channel, message)
            outcome = "sent"
        except layer.ChannelFull:
            outcome = "full"
        except Exception as exc:
            outcome = repr(exc)
        return [outcome, time.monotonic() - started]

    def read_all():
        got = {"storm.full": [], "storm.frames": []}
        while True:
            channel, message = layer.receive(list(got), block=True)
            if channel is None:
                return got
            got[channel].append(message["n"])

    def start():
        results["on_reactor_thread"] = on_reactor_thread()
        results["sends"] = [timed_send("storm.full", {"n": n}) for n in range(25)]
        socket = {"reply_channel": "daphne.response.a!c"}
        results["frames"] = [
            timed_send("storm.frames", dict(socket, n=n, order=n)) for n in range(30)
        ]
        results["parked"] = layer.sender.parked_sends.messages
        threads.deferToThread(read_all).addBoth(finish)

    def finish(got):
        try:
            results["received"] = got if isinstance(got, dict) else repr(got)
            results["parked_after"] = layer.sender.parked_sends.messages
            results["delivered"] = layer.sender.parked_sends.delivered
        finally:
            layer.flush()
            layer.close()
            reactor.stop()

    reactor.callWhenRunning(start)
    reactor.callLater(60, reactor.stop)
    reactor.run()
    print(json.dumps(results))
""")

# One broker round trip, with room for a loaded machine: a refusal that
# slept or retried took operation_timeout (10 s) before.
PROMPT = 1.0


@pytest.mark.slow
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_full_channel_refuses_the_reactor_and_a_full_shard_parks_its_frames(broker, queue_type):
    """The reactor never waits. Sends into a full channel wait for room, 10
    at most (``parked_sends.SHORT_LINE``), then ``ChannelFull`` at once
    (daphne answers 503: a storm's backpressure); a socket's frames into a
    full shard wait for room, in order, and ``ChannelFull`` comes only when
    the parked sends fill their bound."""
    results = run_child(FULL_ON_THE_REACTOR, broker, queue_type)
    assert results["on_reactor_thread"] is True
    # 10 fill the channel (a quorum queue's x-max-length is capacity - 1, and
    # it admits one past it), 10 are parked, the rest are refused.
    assert [outcome for outcome, _ in results["sends"]] == ["sent"] * 20 + ["full"] * 5
    # 10 fill the shard, 10 are parked, and the bound refuses the rest.
    frames = [outcome for outcome, _ in results["frames"]]
    assert frames == ["sent"] * 20 + ["full"] * 10, results
    every = results["sends"] + results["frames"]
    assert max(seconds for _, seconds in every) < PROMPT, results
    assert results["parked"] == 20
    assert results["received"] == {
        "storm.full": list(range(20)),
        "storm.frames": list(range(20)),
    }, results
    assert (results["parked_after"], results["delivered"]) == (0, 20)


@pytest.mark.slow
def test_a_quorum_queue_admits_again_at_its_readmission_mark(broker, new_layer):
    """Off the reactor too: ``ChannelFull`` while the queue is at or above
    ``Topology.refusing_depth``, and sent as soon as a reader took it below."""
    layer = new_layer(broker, flush=True, capacity=20, queue_type="quorum", expiry=60)
    mark = layer.topology.refusing_depth("q.mark")
    assert mark == int(0.8 * 19) + 1 == 16
    sent = 0
    while True:
        try:
            layer.send("q.mark", {"n": sent})
        except layer.ChannelFull:
            break
        sent += 1
    assert sent == 20
    depth = sent
    while depth > mark:
        assert layer.receive(["q.mark"])[0] == "q.mark"
        depth -= 1
        started = time.monotonic()
        with pytest.raises(layer.ChannelFull):
            layer.send("q.mark", {"full": depth})
        assert time.monotonic() - started < PROMPT
    assert layer.receive(["q.mark"])[0] == "q.mark"  # depth mark - 1: below the mark
    layer.send("q.mark", {"admitted": True})


@contextlib.contextmanager
def _broker_stopped(node, layer):
    """The broker's app stopped for the block, once ``layer`` has seen the loss."""
    node.stop_app()
    try:
        wait_until(
            lambda: not layer.connection_statistics()["connected"], 10, message="the loss seen"
        )
        yield
    finally:
        node.start_app()


@pytest.mark.faults
@pytest.mark.slow
def test_a_worker_thread_rides_out_an_outage_longer_than_operation_timeout(node, new_layer, caplog):
    operation_timeout = 1.5
    layer = new_layer(node, expiry=60, operation_timeout=operation_timeout, receive_timeout=0.5)
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    outcome = {}
    go, done = threading.Event(), threading.Event()

    def worker():
        # A Channels worker: a blocking receive, then the replies it queued.
        outcome["received"] = layer.receive(["ride.in"], block=True)
        go.wait(30)
        started = time.monotonic()
        try:
            layer.send("ride.out", {"reply": 1})
            outcome["sent"] = True
        except Exception as exc:  # reported below
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started
        done.set()

    layer.send("ride.in", {"job": 1})
    thread = threading.Thread(target=worker, name="ride-out-worker", daemon=True)
    thread.start()
    wait_until(lambda: "received" in outcome, 10, message="the worker's receive")
    assert outcome["received"] == ("ride.in", {"job": 1})
    with _broker_stopped(node, layer):
        go.set()
        # Any other thread: OperationTimeout after operation_timeout, as before.
        started = time.monotonic()
        with pytest.raises(OperationTimeout, match="unreachable"):
            layer.send("ride.out", {"other": 1})
        assert time.monotonic() - started <= operation_timeout + 1.0
        # The worker's send waits on, well past operation_timeout.
        assert not done.wait(3 * operation_timeout), outcome
    assert done.wait(30), "the worker's send did not finish after the broker came back"
    assert outcome.get("sent") is True, outcome
    assert outcome["seconds"] > 3 * operation_timeout
    assert layer.receive(["ride.out"], block=True) == ("ride.out", {"reply": 1})
    told = [r for r in caplog.records if "waits for it" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    thread.join(10)


@pytest.mark.faults
@pytest.mark.slow
def test_a_worker_threads_poll_waits_through_an_outage(node, new_layer):
    """Channels' enforce_ordering moves a socket's early frames back from its
    wait channel with a worker's non-blocking receive: one that answered
    nothing in an outage left a frame there, and the socket stalled for good."""
    layer = new_layer(node, expiry=60, operation_timeout=1.5, receive_timeout=0.5, persistent=True)
    outcome = {}
    go, done = threading.Event(), threading.Event()

    def worker():
        outcome["received"] = layer.receive(["poll.in"], block=True)
        go.wait(30)
        outcome["polled"] = layer.receive(["poll.wait"])
        done.set()

    layer.send("poll.in", {"job": 1})
    layer.send("poll.wait", {"frame": 1})  # persistent: it outlives the restart
    thread = threading.Thread(target=worker, name="poll-worker", daemon=True)
    thread.start()
    wait_until(lambda: "received" in outcome, 10, message="the worker's receive")
    with _broker_stopped(node, layer):
        go.set()
        # Any other thread's poll answers nothing at once.
        started = time.monotonic()
        assert layer.receive(["poll.wait"]) == (None, None)
        assert time.monotonic() - started < 1.0
        assert not done.wait(3.0), outcome
    assert done.wait(60), "the worker's poll did not end after the broker came back"
    assert outcome["polled"] == ("poll.wait", {"frame": 1})
    thread.join(10)


@pytest.mark.faults
@pytest.mark.slow
def test_the_reactor_thread_parks_its_sends_through_an_outage(node, new_layer):
    """Before, each of these sends froze the reactor for operation_timeout and
    then raised OperationTimeout out of daphne's onMessage, which resets the
    client's connection."""
    layer = new_layer(node, expiry=60, operation_timeout=5, receive_timeout=0.5)
    parked = layer.sender.parked_sends
    parked.messages_limit = 5
    layer.send("park.in", {"n": "before"})
    assert layer.receive(["park.in"], block=True) == ("park.in", {"n": "before"})
    node.stop_app()
    try:
        wait_until(
            lambda: not layer.connection_statistics()["connected"], 10, message="the loss seen"
        )

        def frames():
            outcomes = []
            for n in range(8):
                started = time.monotonic()
                try:
                    layer.send("park.in", {"n": n})
                    outcome = "sent"
                except BrokerUnreachable as exc:
                    assert isinstance(exc, ChannelFull) and "unreachable" in str(exc)
                    outcome = "refused"
                outcomes.append((outcome, time.monotonic() - started))
            return outcomes

        outcomes = as_reactor_thread(frames)
        assert [o for o, _ in outcomes] == ["sent"] * 5 + ["refused"] * 3, outcomes
        assert max(seconds for _, seconds in outcomes) < PROMPT, outcomes
        assert parked.messages == 5
    finally:
        node.start_app()
    received = []
    wait_until(
        lambda: received.extend(drain_once(layer, "park.in")) or len(received) >= 5,
        30,
        message="the parked sends delivered",
    )
    assert [m["n"] for _, m in received] == [0, 1, 2, 3, 4]
    wait_until(lambda: parked.messages == 0, 10, message="the parked sends ended")
    assert parked.lost == 0
    assert layer.receive(["park.in"]) == (None, None)  # each once


def drain_once(layer, channel):
    channel_got, message = layer.receive([channel], block=True)
    return [] if channel_got is None else [(channel_got, message)]
