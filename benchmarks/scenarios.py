"""The layer suite's scenarios and the targets the layer is held to.

A target (``TARGETS``) compares one contestant's figure with another's, or
with a fixed bound; ``harness`` says what a scenario is.

Only msgpack and the harness are imported here: worker processes in other
virtualenvs import this module too.
"""

import msgpack

from .harness import (
    Scenario,
    register_scenario,
    run_sequential,
    run_wakeup,
    threaded_runner,
)

MESSAGE_BYTES = 200
RECEIVE_CHANNELS = 10
GROUP_MEMBERS = 100
MEMBERSHIP_ROOMS = 4
MEMBERSHIP_OPS = 400
MEMBERSHIP_CEILING = "raw-pika-membership"


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
            "message. After each round the channel must hold exactly ops "
            "messages." % MESSAGE_SIZE
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
            "message. raw-pika: basic_get(auto_ack=False) + basic_ack, decoding "
            "the msgpack body."
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
            "calls a non-blocking receive naming all %d ops times. raw-pika-shape: "
            "a basic_get on each queue at once, as the layer's getter asks them."
            % (RECEIVE_CHANNELS, RECEIVE_CHANNELS)
        ),
    )
)

POLL_EMPTY = register_scenario(
    Scenario(
        name="poll-10",
        letter="m",
        title="(m) non-blocking receive over %d empty channels" % RECEIVE_CHANNELS,
        metric="poll/s",
        runner=run_sequential,
        description=(
            "%d channels are emptied (untimed); one thread calls a non-blocking "
            "receive naming all of them ops times, and every call must return "
            "nothing: a worker's poll when there is no work." % RECEIVE_CHANNELS
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

_MEMBERSHIP_COMMON = (
    "Each op is one membership of a fresh process-local channel "
    "(daphne.response.bench!<random>, the reply channel of a WebSocket as daphne "
    "names it) in one of %d groups, round robin. %s is the ceiling: raw pika doing "
    "exactly the layer's broker work for a membership in as few round trips as that "
    "work allows (see Contestants below, and benchmarks/membership.py)."
    % (MEMBERSHIP_ROOMS, MEMBERSHIP_CEILING)
)

GROUP_ADD = register_scenario(
    Scenario(
        name="group-add",
        letter="i",
        title="(i) group_add of a fresh process-local channel, 1 thread",
        metric="group_add/s",
        baseline=MEMBERSHIP_CEILING,
        runner=run_sequential,
        default_ops=MEMBERSHIP_OPS,
        description=(
            "One thread calls group_add ops times. "
            + _MEMBERSHIP_COMMON
            + " Checked after each round (untimed): one send_group to each group must "
            "put exactly ops messages in the channels' shared process-local queue (for "
            "asgi_amqp and the ceiling: one per group, which the process copies to its "
            "members, and a join notice per membership), and for asgi_amqp and the "
            "ceiling every membership must have a binding from its group's exchange with "
            "a live lease stamp and a lease message of that stamp in the lease queue; "
            "then the round's memberships are removed."
        ),
    )
)

GROUP_RENEW = register_scenario(
    Scenario(
        name="group-renew",
        letter="k",
        title="(k) group_add again of memberships this process made, 1 thread",
        metric="group_add/s",
        baseline=MEMBERSHIP_CEILING,
        runner=run_sequential,
        default_ops=MEMBERSHIP_OPS,
        description="ops memberships as in (i) are made and checked (untimed); one thread "
        "then calls group_add on each again within its lease stamp, as an app that "
        "re-adds a socket to its group on every message. Checked as (i).",
    )
)

GROUP_DISCARD = register_scenario(
    Scenario(
        name="group-discard",
        letter="j",
        title="(j) group_discard of those memberships, 1 thread",
        metric="group_discard/s",
        baseline=MEMBERSHIP_CEILING,
        runner=run_sequential,
        default_ops=MEMBERSHIP_OPS,
        description=(
            "ops memberships as in (i), plus one kept member per group in a channel "
            "of another process, are made and checked with one send_group per group "
            "(untimed); one thread then calls group_discard on the ops memberships. "
            + _MEMBERSHIP_COMMON
            + " Checked after each round: one send_group per group must reach the "
            "kept members (one message each) and none of the discarded channels (for "
            "asgi_amqp and the ceiling: a leave notice each), and for asgi_amqp and the "
            "ceiling no binding of a discarded membership may be left on its group's "
            "exchange."
        ),
    )
)


GROUP_DISCARD_THREADS = register_scenario(
    Scenario(
        name="group-discard-8t",
        letter="l",
        title="(l) group_discard of those memberships, 8 threads",
        metric="group_discard/s",
        baseline=MEMBERSHIP_CEILING,
        runner=threaded_runner(8),
        default_ops=MEMBERSHIP_OPS,
        description="(j) with its group_discard calls made from 8 threads of one layer at "
        "once, as a runworker with --threads 8 ends its sockets' memberships.",
    )
)


class Target(object):
    """``subject`` in ``scenario`` against ``other`` (a contestant), or
    against a fixed bound.

    ``stat`` is the statistic compared: ``headline`` (rate median, or latency
    p50), ``deliveries`` (group deliveries/s), ``p50``/``p99`` (ms). ``op``
    is ``>=`` or ``<=``; for a ratio the goal applies to subject/other."""

    def __init__(
        self,
        key,
        scenario,
        stat,
        op,
        goal,
        other=None,
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
        self.bound_unit = bound_unit
        self.subject = subject
        self.text = text

    def describe(self):
        return dict(vars(self))


TARGETS = [
    Target(
        "a",
        "send",
        "headline",
        ">=",
        0.85,
        other="raw-pika",
        text="(a) send/s >= 0.85x raw pika confirmed publish",
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
        "m",
        "poll-10",
        "headline",
        ">=",
        0.5,
        other="asgi-redis",
        text="(m) polls of 10 empty channels/s >= 0.5x asgi_redis",
    ),
    Target(
        "f",
        "group",
        "deliveries",
        ">=",
        20.0,
        other="asgi-redis",
        text="(f) member deliveries/s >= 20x asgi_redis",
    ),
    Target("g1", "wakeup", "p50", "<=", 1.5, bound_unit="ms", text="(g) wake-up p50 <= 1.5 ms"),
    Target("g2", "wakeup", "p99", "<=", 5.0, bound_unit="ms", text="(g) wake-up p99 <= 5 ms"),
    Target(
        "i",
        "group-add",
        "headline",
        ">=",
        0.8,
        other=MEMBERSHIP_CEILING,
        text="(i) group_add/s >= 0.8x the membership ceiling",
    ),
    Target(
        "j",
        "group-discard",
        "headline",
        ">=",
        0.8,
        other=MEMBERSHIP_CEILING,
        text="(j) group_discard/s >= 0.8x the membership ceiling",
    ),
]
