"""The scenarios (a)-(h) and the targets the layer is held to.

Each scenario is a registry entry; contestants implement it with a
``scenario_<name>`` method (``-`` becomes ``_``). To add one, register a
``Scenario`` here with a runner from ``harness`` and give the contestants
that should take part the method. A target (``TARGETS``) compares one
contestant's figure with another's, or with a fixed bound.

Only msgpack and the harness are imported here: worker processes in other
virtualenvs import this module too.
"""

import msgpack

from .harness import (
    Scenario,
    register_scenario,
    run_custom,
    run_sequential,
    run_wakeup,
    threaded_runner,
)

MESSAGE_BYTES = 200
SEND_THREADS = 8
RECEIVE_CHANNELS = 10
GROUP_MEMBERS = 100


def _message(size=MESSAGE_BYTES):
    """A Channels-like http.request dict whose msgpack encoding is ``size`` bytes."""
    message = {
        "reply_channel": "daphne.response.kT3xQ9bLpW!Vd2sZr8YmNcA",
        "http_version": "1.1",
        "method": "POST",
        "path": "/chat/lobby/",
        "query_string": b"",
        "headers": [[b"host", b"localhost:8000"], [b"content-type", b"application/json"]],
        "order": 0,
        "body": b"",
    }
    base = len(msgpack.packb(message, use_bin_type=True))
    body = b"x" * max(0, size - base)
    message["body"] = body
    # bin8/bin16 headers differ in length: trim until the size is exact.
    while len(msgpack.packb(message, use_bin_type=True)) > size and body:
        body = body[:-1]
        message["body"] = body
    return message


MESSAGE = _message()
MESSAGE_SIZE = len(msgpack.packb(MESSAGE, use_bin_type=True))

SEND = register_scenario(
    Scenario(
        name="send",
        letter="a",
        title="(a) send, 1 thread, %d-byte dict, broker-confirmed" % MESSAGE_SIZE,
        metric="send/s",
        runner=run_sequential,
        description=(
            "One thread sends the same %d-byte msgpack-able dict ops times to one "
            "channel; each call returns once the broker (RabbitMQ, or Redis for "
            "asgi_redis) has the message. raw-pika: BlockingConnection, "
            "confirm_delivery(), basic_publish(mandatory=True), one confirm per "
            "message. raw-pika-async: the pipelined-confirm ceiling, a "
            "SelectConnection on an I/O thread of its own with up to 1000 "
            "confirms outstanding (at least 20,000 messages a round). After each "
            "round the channel must hold exactly ops messages." % MESSAGE_SIZE
        ),
    )
)

SEND_THREADED = register_scenario(
    Scenario(
        name="send-8t",
        letter="b",
        title="(b) send, %d threads through one layer instance" % SEND_THREADS,
        metric="send/s",
        runner=threaded_runner(SEND_THREADS),
        description=(
            "ops sends split over %d threads that share one layer instance, all "
            "released together; the rate is all sends over the wall time. "
            "raw-pika-async is the same pipelined publisher as in (a), fed from "
            "one thread (pika connections are not thread-safe). The channel must "
            "hold exactly ops messages afterwards." % SEND_THREADS
        ),
    )
)

RECEIVE = register_scenario(
    Scenario(
        name="receive",
        letter="c",
        title="(c) non-blocking receive, 1 full channel",
        metric="recv/s",
        runner=run_sequential,
        description=(
            "The channel is filled with ops messages (untimed), then one thread "
            "calls a non-blocking receive ops times; every call must return a "
            "message. raw-pika: basic_get(auto_ack=False) + basic_ack. "
            "raw-pika-consume: basic_consume with prefetch 100, one ack per "
            "message. Both decode the msgpack body."
        ),
    )
)

RECEIVE_MANY = register_scenario(
    Scenario(
        name="receive-10",
        letter="d",
        title="(d) non-blocking receive over %d channels, only one has messages" % RECEIVE_CHANNELS,
        metric="recv/s",
        runner=run_sequential,
        description=(
            "One of %d channels is filled with ops messages (untimed); one thread "
            "calls a non-blocking receive naming all %d ops times. raw-pika: "
            "basic_get on the queues in random order until one answers."
            % (RECEIVE_CHANNELS, RECEIVE_CHANNELS)
        ),
    )
)

ROUNDTRIP = register_scenario(
    Scenario(
        name="roundtrip",
        letter="e",
        title="(e) send -> blocking receive round trip, 1 thread",
        metric="round trip",
        kind="latency",
        baseline="raw-pika-consume",
        runner=run_sequential,
        description=(
            "One thread sends a message to a channel and then calls a blocking "
            "receive on it; the sample is the whole round trip. "
            "raw-pika-consume: a confirmed publish, then the delivery of a "
            "basic_consume (prefetch 100) on another channel of the same "
            "connection, acked."
        ),
    )
)

GROUP = register_scenario(
    Scenario(
        name="group",
        letter="f",
        title="(f) send_group to %d members" % GROUP_MEMBERS,
        metric="send_group/s",
        baseline="raw-pika",
        fanout=GROUP_MEMBERS,
        runner=run_sequential,
        default_ops=200,
        description=(
            "A group of %d channels (joined once, untimed); one thread calls "
            "send_group ops times. Deliveries are counted afterwards in the "
            "members' channels (the count must be ops x %d): member deliveries/s "
            "is that count over the round's wall time. raw-pika: a confirmed "
            "publish to a fanout exchange bound to %d queues."
            % (GROUP_MEMBERS, GROUP_MEMBERS, GROUP_MEMBERS)
        ),
    )
)

WAKEUP = register_scenario(
    Scenario(
        name="wakeup",
        letter="g",
        title="(g) wake-up of a blocking receive, message sent 50 ms after it started",
        metric="wake-up",
        kind="latency",
        baseline="raw-pika-consume",
        runner=run_wakeup,
        default_ops=60,
        description=(
            "One thread starts a blocking receive; 50 ms later another thread "
            "sends it a message (through the same layer instance). The sample is "
            "the time from the start of that send to the return of the receive: "
            "the wake-up latency plus the send's own round trip (an upper bound). "
            "raw-pika-consume: a consumer waiting in BlockingConnection's consume "
            "generator; the sender has a connection of its own."
        ),
    )
)

MEMORY = register_scenario(
    Scenario(
        name="memory",
        letter="h",
        title="(h) resident memory of the layer's process while messages flow",
        metric="RSS growth",
        kind="memory",
        baseline=None,
        runner=run_custom,
        default_rounds=1,
        description=(
            "A fresh process holding only the layer sends and receives messages "
            "(4 sending threads, 2 threads in blocking receives over 4 channels, at "
            "most 2000 messages in flight) and reads its RSS from /proc every 10k "
            "messages received. The figure is the growth of RSS from the "
            "checkpoint at --memory-from messages to the one at --memory-to "
            "(--full: 1M)."
        ),
    )
)


class Target(object):
    """``subject`` in ``scenario`` against ``other`` (a contestant, or the
    subject in ``other_scenario``), or against a fixed bound.

    ``stat`` is the statistic compared: ``headline`` (rate median, or latency
    p50), ``deliveries`` (group deliveries/s), ``p50``/``p99`` (ms),
    ``growth`` (memory, %). ``op`` is ``>=`` or ``<=``; for a ratio the goal
    applies to subject/other."""

    def __init__(
        self,
        key,
        scenario,
        stat,
        op,
        goal,
        other=None,
        other_scenario=None,
        bound_unit=None,
        subject="layer",
        text="",
    ):
        self.key = key
        self.scenario = scenario
        self.stat = stat
        self.op = op
        self.goal = goal
        self.other = other
        self.other_scenario = other_scenario
        self.bound_unit = bound_unit
        self.subject = subject
        self.text = text

    def describe(self):
        return dict(vars(self))


TARGETS = [
    Target(
        "a1",
        "send",
        "headline",
        ">=",
        1.0,
        other="asgi-redis",
        text="(a) send/s >= 1.0x asgi_redis",
    ),
    Target(
        "a2",
        "send",
        "headline",
        ">=",
        0.8,
        other="raw-pika",
        text="(a) send/s >= 0.8x raw pika confirmed publish",
    ),
    Target(
        "b",
        "send-8t",
        "headline",
        ">=",
        3.0,
        other="layer",
        other_scenario="send",
        text="(b) 8-thread send/s >= 3x the layer's own (a)",
    ),
    Target(
        "c",
        "receive",
        "headline",
        ">=",
        1.0,
        other="asgi-redis",
        text="(c) receive/s >= 1.0x asgi_redis",
    ),
    Target(
        "d",
        "receive-10",
        "headline",
        ">=",
        1.0,
        other="asgi-redis",
        text="(d) receive/s over 10 channels >= 1.0x asgi_redis",
    ),
    Target(
        "e1",
        "roundtrip",
        "p50",
        "<=",
        2.0,
        other="raw-pika-consume",
        text="(e) round trip p50 <= 2x raw pika publish->consume",
    ),
    Target("e2", "roundtrip", "p99", "<=", 2.0, bound_unit="ms", text="(e) round trip p99 <= 2 ms"),
    Target(
        "f",
        "group",
        "deliveries",
        ">=",
        20.0,
        other="asgi-redis",
        text="(f) member deliveries/s >= 20x asgi_redis",
    ),
    Target("g1", "wakeup", "p50", "<=", 5.0, bound_unit="ms", text="(g) wake-up p50 <= 5 ms"),
    Target("g2", "wakeup", "p99", "<=", 5.0, bound_unit="ms", text="(g) wake-up p99 <= 5 ms"),
    Target("h", "memory", "growth", "<=", 10.0, bound_unit="%", text="(h) RSS growth <= 10%"),
]
