"""A 3-node private RabbitMQ cluster: what survives the loss of a node.

The cluster (three RabbitNodes, nodes 2 and 3 joined to node 1) is started
once for the module. The layer is given all three URLs; it connects to the
first (node 1), so stopping node 1 (``stop_app``) takes its connections
away and it must carry on through node 2 or 3.

What a queue keeps while its node is down depends on its type (measured on
RabbitMQ 3.10.8 by ``test_traffic_through_the_loss_of_a_node`` below):

* a **classic** queue lives on the node that declared it. While that node is
  down the queue cannot be declared, read or consumed through any other node
  (404 ``home node ... of durable queue ... is down or inaccessible``), a
  mandatory publish to it comes back unroutable, and when the node returns
  its transient messages are gone;
* a classic queue **mirrored** by a policy (``ha-mode: all``, 3.x only) is
  promoted on another node and keeps the confirmed messages, except a few
  confirmed in the very moment its node finishes stopping;
* a **quorum** queue keeps every confirmed message (transient ones too) and
  stays available while a majority of its members are up. The layer declares
  quorum queues today only through a vhost whose default queue type is
  quorum (``rabbitmqctl add_vhost NAME --default-queue-type quorum``).

``test_quorum_queue_arguments`` records which of the layer's queue
arguments quorum queues accept and how they behave, for a ``queue_type``
option of the layer.
"""

import collections
import time
import uuid

import pika
import pika.exceptions
import pytest

from asgi_amqp import BrokerConnectionError, naming
from asgi_amqp.errors import BrokerOperationError
from devtools.rabbitmq import RabbitNodeError
from helpers import (
    Management,
    Traffic,
    at_moment,
    cluster_url,
    drain,
    start_cluster,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.heavy]

OPERATION_TIMEOUT = 3.0
RECEIVE_TIMEOUT = 1.0
RESUME_WITHIN = 10.0
QUORUM_VHOST = "quorum-default"


@pytest.fixture(scope="module")
def cluster():
    nodes = start_cluster(3, name="asgiamqp-cl", quorum_vhost=QUORUM_VHOST)
    try:
        yield nodes
    finally:
        for node in nodes:
            node.cleanup(graceful=False)


def _raw_channel(node, vhost="/"):
    connection = pika.BlockingConnection(
        pika.URLParameters(cluster_url(node, vhost) + "?socket_timeout=5")
    )
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def _connections_by_node(node):
    """{nodename: number of asgi_amqp connections} from node's management API."""
    found = collections.Counter()
    for connection in Management(node, timeout=5).connections():
        props = connection.get("client_properties") or {}
        if props.get("connection_name") == "asgi_amqp":
            found[connection.get("node")] += 1
    return found


def _layer(new_layer, urls, prefix, **config):
    return new_layer(
        urls,
        prefix=prefix,
        expiry=60,
        capacity=100000,
        operation_timeout=OPERATION_TIMEOUT,
        receive_timeout=RECEIVE_TIMEOUT,
        **config,
    )


def test_traffic_through_the_loss_of_a_node(cluster, new_layer):
    """Stop node 1 (where the layers are connected) under traffic on four channels.

    * ``survivor``: a classic queue that lives on node 2 (declared there first);
    * ``mirrored``: a classic queue on node 1, mirrored by an ``ha-mode: all`` policy;
    * ``quorum``: a quorum queue (vhost with default queue type quorum), leader on node 1;
    * ``option``: a quorum queue from the layer's ``queue_type="quorum"``, leader on node 1;
    * ``classic``: a classic queue on node 1: unavailable while node 1 is down.
    """
    n1, n2, n3 = cluster
    prefix = "cl-%s" % uuid.uuid4().hex[:6]
    urls = [n1.amqp_url, n2.amqp_url, n3.amqp_url]
    policy = (
        "set_policy",
        "%s-ha" % prefix,
        "^%s:q:mirrored$" % prefix,
        '{"ha-mode":"all","ha-sync-mode":"automatic"}',
        "--apply-to",
        "queues",
    )
    # Classic queue mirroring is RabbitMQ 3.x only: 4.0 refuses the policy,
    # and there the operations guide's answer is quorum queues alone.
    mirroring = n1.version().startswith("3.")
    if mirroring:
        n1.ctl(*policy)
    else:
        with pytest.raises(RabbitNodeError, match="Validation failed"):
            n1.ctl(*policy)
    layer = _layer(new_layer, urls, prefix, management_url=n2.management_url)
    quorum_layer = _layer(
        new_layer,
        [cluster_url(n, QUORUM_VHOST) for n in cluster],
        prefix,
        management_url=n2.management_url,
    )
    option_layer = _layer(
        new_layer, urls, prefix + "-qq", management_url=n2.management_url, queue_type="quorum"
    )
    # The survivor's queue lives on node 2 (the shared dead-letter queue, declared by
    # the dead-letter worker through the first URL, lives on node 1).
    connection, raw = _raw_channel(n2)
    topology = layer.topology
    raw.queue_declare(
        topology.channel_queue("survivor"),
        durable=True,
        arguments=topology.channel_queue_arguments("survivor"),
    )
    connection.close()
    try:
        for lay, channel in (
            [(layer, "classic")]
            + ([(layer, "mirrored")] if mirroring else [])
            + [(quorum_layer, "quorum"), (option_layer, "option")]
        ):
            lay.send(channel, {"n": 0})  # declared through node 1: homed / led there
            assert lay.receive([channel], block=True) == (channel, {"n": 0})
        wait_until(
            lambda: _connections_by_node(n2).get(n1.nodename, 0) >= 3,
            timeout=10,
            message="the layers' connections listed on node 1",
        )
        assert not (set(_connections_by_node(n2)) - {n1.nodename}), "a layer is not on node 1"
        queues = {q["name"]: q for q in Management(n2).queues(prefix + ":q:")}
        assert queues[topology.channel_queue("classic")]["node"] == n1.nodename
        assert queues[topology.channel_queue("survivor")]["node"] == n2.nodename

        traffic = {
            "survivor": Traffic(layer, ["survivor"], blocking_receivers=1, polling_receivers=1),
            "quorum": Traffic(quorum_layer, ["quorum"], blocking_receivers=1),
            "option": Traffic(option_layer, ["option"], blocking_receivers=1, polling_receivers=1),
            "classic": Traffic(layer, ["classic"], blocking_receivers=1, polling_receivers=1),
        }
        if mirroring:
            traffic["mirrored"] = Traffic(
                layer, ["mirrored"], blocking_receivers=0, polling_receivers=1
            )
        for t in traffic.values():
            t.start()
        wait_until(
            lambda: all(len(t.received) >= 20 for t in traffic.values()),
            timeout=20,
            message="traffic on every channel",
        )
        stopping = time.monotonic()
        n1.stop_app()
        stopped = time.monotonic()
        # A process that starts while node 1 is down.
        fresh = _layer(
            new_layer,
            urls[1:] + urls[:1],
            prefix,
            management_url=n2.management_url,
            dead_letter_worker=False,
        )
        try:
            fresh_outcomes = {}
            for what, call in (
                ("send", lambda: fresh.send("survivor", {"n": -1})),
                ("group_add", lambda: fresh.group_add("grp", "survivor")),
                ("send_group", lambda: fresh.send_group("grp", {"n": -2})),
            ):
                try:
                    call()
                    fresh_outcomes[what] = "ok"
                except Exception as exc:  # measured, reported below
                    fresh_outcomes[what] = "%s: %s" % (type(exc).__name__, exc)
        finally:
            fresh.close()
        wait_until(
            lambda: any(when > stopped for when in traffic["survivor"].confirmed.values()),
            timeout=RESUME_WITHIN,
            message="survivor sends confirmed after stop_app",
        )
        # Traffic through nodes 2 and 3 only (the threads keep working): 20
        # messages on every channel that does not live on node 1, and a send
        # to the one that does refused.
        survivors = [t for name, t in traffic.items() if name != "classic"]

        def refused_on_node_1():
            with traffic["classic"].lock:
                raised = list(traffic["classic"].raised_at)
            return any(what == "send" and when > stopped for when, _, what in raised)

        wait_until(
            lambda: all(t.received_after(stopped) >= 20 for t in survivors) and refused_on_node_1(),
            timeout=RESUME_WITHIN + 5,
            message="traffic through nodes 2 and 3, a refused send to node 1",
        )
        worker_ready_while_down = layer._engine._worker.ready.is_set()
        starting = time.monotonic()
        n1.start_app()
        started = time.monotonic()
        wait_until(
            lambda: any(when > started for when in traffic["classic"].confirmed.values()),
            timeout=RESUME_WITHIN + 5,
            raise_on_timeout=False,
        )
        wait_until(
            lambda: all(t.received_after(started) >= 20 for t in traffic.values()),
            timeout=RESUME_WITHIN + 5,
            raise_on_timeout=False,  # the checks below say what did not resume
        )
        for t in traffic.values():
            t.finish(
                sender_join=OPERATION_TIMEOUT * 6 + 5,
                receiver_join=RECEIVE_TIMEOUT + OPERATION_TIMEOUT + 5,
                timeout=20.0,
                settle=3.0,
            )
    finally:
        if mirroring:
            n1.ctl("clear_policy", "%s-ha" % prefix)
        if not n1.is_running():
            n1.start()
        try:
            n1.start_app()
        except Exception:
            pass

    print(
        "\ncluster: stop_app of node 1 took %.1f s, start_app %.1f s (began %.1f s after)"
        % (stopped - stopping, started - starting, starting - stopping)
    )
    print("cluster: a process started while node 1 was down: %s" % fresh_outcomes)
    print(
        "cluster: dead-letter worker connected while node 1 was down: %s" % worker_ready_while_down
    )
    for name, t in traffic.items():
        counts = t.counts()
        send_gap = t.longest_gap(t.confirmed.values(), stopping, starting)
        counts["longest send gap while node 1 down"] = round(send_gap, 2)
        counts["longest send gap after start_app"] = round(
            t.longest_gap(t.confirmed.values(), starting, starting + RESUME_WITHIN), 2
        )
        print("cluster: %-9s %s" % (name, counts))
        errors = collections.defaultdict(list)
        for when, exc, what in t.raised_at:
            errors["%s %s: %s" % (what, type(exc).__name__, str(exc)[:120])].append(when - stopping)
        for text, times in sorted(errors.items(), key=lambda item: -len(item[1]))[:4]:
            print(
                "cluster: %-9s   %4d x (%.1f..%.1f s after stop_app began) %s"
                % ("", len(times), min(times), max(times), text)
            )

    bound = RECEIVE_TIMEOUT + OPERATION_TIMEOUT + 1.0
    for name, t in traffic.items():
        counts = t.counts()
        assert counts["duplicates"] == 0, (name, counts)
        assert t.longest_call() <= bound, (name, counts)
        assert counts["confirmed"] > 0 and counts["received"] > 0, (name, counts)
    for name in ("survivor", "mirrored", "quorum", "option"):
        if name not in traffic:
            continue  # mirrored: 3.x only
        t = traffic[name]
        if name != "mirrored":  # see below
            assert not set(t.confirmed) - set(t.received), (name, t.counts())
        assert t.longest_gap(t.confirmed.values(), stopping, starting) < RESUME_WITHIN, name
    # A classic mirrored queue (RabbitMQ 3.10.8) drops a few messages that
    # the broker confirmed in the moment node 1 finished stopping and a
    # mirror was promoted, while the layer's connection (to node 2 or 3 for
    # five seconds by then) was untouched: they were never delivered and are
    # not in the queue later. Measured: 1-3 messages in 8 of 19 runs,
    # confirmed within 0.7 s of stop_app returning. A loss outside that
    # moment, or a bigger one, is the layer's.
    if mirroring:
        mirrored = traffic["mirrored"]
        lost = {
            n: mirrored.confirmed[n] - stopped
            for n in set(mirrored.confirmed) - set(mirrored.received)
        }
        print("cluster: mirrored lost %s (s after stop_app returned)" % lost)
        assert len(lost) <= 10 and all(-2.0 <= when <= 1.5 for when in lost.values()), (
            "mirrored",
            lost,
            mirrored.counts(),
        )

    classic = traffic["classic"]
    # While its node is down, a classic queue's sends fail at once with the
    # broker's 404, never hang; they succeed again after start_app.
    down = [
        exc for when, exc, what in classic.raised_at if what == "send" and stopped < when < starting
    ]
    assert down, classic.counts()
    assert all(isinstance(exc, BrokerOperationError) and exc.reply_code == 404 for exc in down), (
        down[:3]
    )
    assert (
        classic.longest_gap(classic.confirmed.values(), started, started + RESUME_WITHIN)
        < RESUME_WITHIN
    )
    # Its transient messages do not come back with the node: whatever was lost
    # had been confirmed before node 1 stopped.
    lost = set(classic.confirmed) - set(classic.received)
    assert all(classic.confirmed[n] < stopped for n in lost), sorted(lost)[:10]
    # Every error is a connection or broker error: a channel that is not full
    # must not raise ChannelFull (capacity is 100000 here).
    for name, t in traffic.items():
        unexpected = [
            exc
            for _, exc, _ in t.raised_at
            if not isinstance(exc, (BrokerConnectionError, BrokerOperationError))
        ]
        assert not unexpected, (name, unexpected[:3])


def test_blocking_receive_over_a_down_queue_and_a_live_one(cluster, new_layer):
    """A worker's blocking receive names a channel whose classic queue's node is
    down and one that is fine: the live channel's messages must still arrive."""
    n1, n2, n3 = cluster
    prefix = "cb-%s" % uuid.uuid4().hex[:6]
    layer = _layer(new_layer, [n2.amqp_url, n3.amqp_url], prefix, management_url=n2.management_url)
    connection, raw = _raw_channel(n3)
    raw.queue_declare(
        layer.topology.channel_queue("down"),
        durable=True,
        arguments=layer.topology.channel_queue_arguments("down"),
    )
    connection.close()
    layer.send("down", {"n": 0})
    for i in range(20):
        layer.send("live", {"n": i})
    n3.stop_app()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerOperationError) as caught:
            layer.send("down", {"n": 1})
        assert caught.value.reply_code == 404
        assert time.monotonic() - started < OPERATION_TIMEOUT + 1
        assert layer.receive(["down"]) == (None, None)
        # Non-blocking: the down queue counts as empty, the live one is read.
        polled = [layer.receive(["down", "live"]) for _ in range(10)]
        assert sorted(m["n"] for c, m in polled if c == "live") == list(range(10)), polled
        # Blocking: the live channel's other ten messages must arrive too.
        got, calls, longest = [], 0, 0.0
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            started = time.monotonic()
            channel, message = layer.receive(["down", "live"], block=True)
            longest = max(longest, time.monotonic() - started)
            calls += 1
            if channel is not None:
                got.append(message["n"])
        print(
            "\ncluster: blocking receive over [down, live]: %d of 10 live messages "
            "in %d calls, longest call %.2f s" % (len(got), calls, longest)
        )
        assert longest <= RECEIVE_TIMEOUT + OPERATION_TIMEOUT + 1
        assert sorted(got) == list(range(10, 20))
        # A worker whose channels are all fine but one must not spin: an
        # empty blocking receive waits about receive_timeout.
        assert calls <= 10 + 10 / RECEIVE_TIMEOUT + 5, calls
    finally:
        n3.start_app()
    wait_until(
        lambda: _sends(layer, "down"),
        timeout=RESUME_WITHIN,
        interval=0.2,
        message="down channel usable after start_app",
    )
    # The transient message that waited in the queue is gone.
    assert [m for c, m in drain(layer, ["down"])] == [{"n": "again"}]


def _sends(layer, channel):
    try:
        layer.send(channel, {"n": "again"})
        return True
    except (BrokerConnectionError, BrokerOperationError):
        return False


# -- quorum queues: the argument matrix --------------------------------------------

_LAYER = naming.Topology("qq", expiry=60, group_expiry=86400, capacity_for=lambda c: 100)
QUORUM = {"x-queue-type": "quorum"}

# (label, arguments, queue_declare keywords, expected: "accepted" or a refusal text)
DECLARE_MATRIX = [
    ("channel queue (all five arguments)", _LAYER.channel_queue_arguments("c"), {}, "accepted"),
    (
        "x-max-length + x-overflow reject-publish",
        {"x-max-length": 3, "x-overflow": "reject-publish"},
        {},
        "accepted",
    ),
    (
        "x-overflow reject-publish-dlx",
        {"x-max-length": 3, "x-overflow": "reject-publish-dlx"},
        {},
        "accepted",
    ),
    ("x-overflow drop-head", {"x-max-length": 3, "x-overflow": "drop-head"}, {}, "accepted"),
    ("x-message-ttl", {"x-message-ttl": 2000}, {}, "accepted"),
    ("x-expires", {"x-expires": 120000}, {}, "accepted"),
    ("x-dead-letter-exchange", {"x-dead-letter-exchange": "qq:dlx"}, {}, "accepted"),
    (
        "zero-length queue (max-length 0, DLX '', DLRK, x-expires)",
        {
            "x-max-length": 0,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "qq:q:c!",
            "x-expires": 3000,
        },
        {},
        "accepted",
    ),
    ("lease queue (DLX)", _LAYER.lease_queue_arguments(), {}, "accepted"),
    ("x-delivery-limit", {"x-delivery-limit": 5}, {}, "accepted"),
    (
        "x-dead-letter-strategy at-least-once",
        {
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-dead-letter-exchange": "qq:dlx",
        },
        {},
        "accepted",
    ),
    ("x-queue-mode lazy", {"x-queue-mode": "lazy"}, {}, "invalid arg 'x-queue-mode'"),
    ("x-max-priority", {"x-max-priority": 5}, {}, "invalid arg 'x-max-priority'"),
    ("durable=False", {}, {"durable": False}, "invalid property 'non-durable'"),
    ("exclusive=True", {}, {"exclusive": True}, "invalid property 'exclusive-owner'"),
    ("auto_delete=True", {}, {"auto_delete": True}, "invalid property 'auto-delete'"),
]


@pytest.fixture(scope="module")
def raw(cluster):
    connection, channel = _raw_channel(cluster[1])
    channel.exchange_declare("qq:dlx", "fanout", durable=True)
    channel.queue_declare("qq:dlq", durable=True)
    channel.queue_bind("qq:dlq", "qq:dlx")
    holder = {"channel": channel, "connection": connection}
    yield holder
    connection.close()


def _fresh(raw):
    if not raw["channel"].is_open:
        raw["channel"] = raw["connection"].channel()
        raw["channel"].confirm_delivery()
    return raw["channel"]


@pytest.mark.parametrize(
    "label,arguments,keywords,expected", DECLARE_MATRIX, ids=[row[0] for row in DECLARE_MATRIX]
)
def test_quorum_queue_arguments(raw, label, arguments, keywords, expected):
    channel = _fresh(raw)
    name = "qq:matrix:%s" % uuid.uuid4().hex[:8]
    kwargs = dict({"durable": True}, **keywords)
    try:
        channel.queue_declare(name, arguments=dict(QUORUM, **arguments), **kwargs)
        outcome = "accepted"
        channel.queue_delete(name)
    except pika.exceptions.ChannelClosedByBroker as exc:
        outcome = "%s %s" % (exc.reply_code, exc.reply_text)
        _fresh(raw)
    print("\nquorum declare: %-55s %s" % (label, outcome))
    assert expected in outcome


def _publish(channel, queue, body=b"x", **properties):
    try:
        channel.basic_publish(
            "", queue, body, pika.BasicProperties(delivery_mode=1, **properties), mandatory=True
        )
        return "ack"
    except pika.exceptions.NackError:
        return "nack"
    except pika.exceptions.UnroutableError:
        return "returned"


def _dead_letter(channel, timeout):
    """(body, reason) of the next dead letter, or None if there is none within ``timeout`` s."""

    def get():
        method, properties, body = channel.basic_get("qq:dlq", auto_ack=True)
        if method is not None:
            return body, (properties.headers or {})["x-death"][0]["reason"]
        return None

    return wait_until(get, timeout, interval=0.02, raise_on_timeout=False)


def test_quorum_queue_behaviour(raw):
    """What the layer relies on, on a quorum queue (see the module docstring)."""
    channel = _fresh(raw)
    channel.queue_purge("qq:dlq")
    results = {}
    names = []

    def declare(arguments):
        name = "qq:behaviour:%s" % uuid.uuid4().hex[:8]
        channel.queue_declare(name, durable=True, arguments=dict(QUORUM, **arguments))
        names.append(name)
        return name

    try:
        # reject-publish admits one message more than x-max-length (classic: exactly N).
        for capacity in (1, 3):
            q = declare({"x-max-length": capacity, "x-overflow": "reject-publish"})
            outcomes = [_publish(channel, q) for _ in range(capacity + 3)]
            results["reject-publish x-max-length=%d: acked" % capacity] = outcomes.count("ack")
        assert results["reject-publish x-max-length=1: acked"] == 2
        assert results["reject-publish x-max-length=3: acked"] == 4
        # x-max-length 0 + reject-publish still takes one: capacity C needs x-max-length C-1.
        q = declare({"x-max-length": 0, "x-overflow": "reject-publish"})
        results["reject-publish x-max-length=0: acked"] = [
            _publish(channel, q) for _ in range(3)
        ].count("ack")
        assert results["reject-publish x-max-length=0: acked"] == 1
        # reject-publish-dlx is accepted but never nacks: not a ChannelFull signal.
        q = declare(
            {
                "x-max-length": 1,
                "x-overflow": "reject-publish-dlx",
                "x-dead-letter-exchange": "qq:dlx",
            }
        )
        outcomes = [_publish(channel, q) for _ in range(3)]
        results["reject-publish-dlx x-max-length=1: outcomes"] = outcomes
        assert outcomes == ["ack"] * 3
        channel.queue_purge("qq:dlq")
        # Queue TTL dead-letters with reason "expired".
        q = declare({"x-message-ttl": 300, "x-dead-letter-exchange": "qq:dlx"})
        _publish(channel, q, b"ttl")
        results["x-message-ttl 300 ms -> dead letter"] = _dead_letter(channel, 10)
        assert results["x-message-ttl 300 ms -> dead letter"] == (b"ttl", "expired")
        # Per-message expiration works too.
        q = declare({"x-dead-letter-exchange": "qq:dlx"})
        _publish(channel, q, b"msg-ttl", expiration="200")
        results["expiration 200 ms -> dead letter"] = _dead_letter(channel, 10)
        assert results["expiration 200 ms -> dead letter"] == (b"msg-ttl", "expired")
        # nack + requeue counts deliveries (RabbitMQ 4 drops a message after 20 by default).
        q = declare({})
        _publish(channel, q, b"again")
        for _ in range(3):
            method, _, _ = channel.basic_get(q, auto_ack=False)
            channel.basic_nack(method.delivery_tag, requeue=True)
        method, properties, _ = channel.basic_get(q, auto_ack=True)
        results["after 3 requeues: x-delivery-count"] = (properties.headers or {}).get(
            "x-delivery-count"
        )
        assert results["after 3 requeues: x-delivery-count"] == 3
        # A classic queue cannot be re-declared as quorum (or the other way round).
        classic = "qq:classic:%s" % uuid.uuid4().hex[:8]
        channel.queue_declare(classic, durable=True)
        names.append(classic)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare(classic, durable=True, arguments=QUORUM)
        results["classic re-declared as quorum"] = "%s %s" % (
            caught.value.reply_code,
            caught.value.reply_text.split(" - ")[0],
        )
        assert caught.value.reply_code == 406
        channel = _fresh(raw)
    finally:
        channel = _fresh(raw)
        for name in names:
            channel.queue_delete(name)
    for key, value in results.items():
        print("quorum behaviour: %-45s %s" % (key, value))


def test_quorum_queue_lease_is_not_renewed_by_a_redeclare(raw):
    """x-expires on a quorum queue: a re-declare does not renew the lease; a get does.

    A quorum queue's leader checks its lease on a timer tick (about every 5 s),
    so both queues are used for 7 s. A re-declare of a deleted queue creates it
    again, so the re-declared queue holds a canary message: a re-declare that
    reports 0 messages found a new queue.
    """
    channel = _fresh(raw)
    arguments = dict(QUORUM, **{"x-expires": 1000})
    redeclared = "qq:lease:redeclare:%s" % uuid.uuid4().hex[:6]
    polled = "qq:lease:get:%s" % uuid.uuid4().hex[:6]
    for name in (redeclared, polled):
        channel.queue_declare(name, durable=True, arguments=arguments)
    assert _publish(channel, redeclared, b"canary") == "ack"
    started = time.monotonic()
    gone = {"redeclare": None, "basic_get": None}
    uses = 0
    while time.monotonic() - started < 7.0:
        if gone["redeclare"] is None:
            count = channel.queue_declare(
                redeclared, durable=True, arguments=arguments
            ).method.message_count
            if count == 0:
                gone["redeclare"] = round(time.monotonic() - started, 1)
        if gone["basic_get"] is None:
            try:
                channel.basic_get(polled, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:
                gone["basic_get"] = round(time.monotonic() - started, 1)
                channel = _fresh(raw)
        uses += 1  # the queues are used every 0.3 s
        at_moment(started, 0.3 * uses, sleep=raw["connection"].sleep)
    for name in (redeclared, polled):
        channel.queue_delete(name)
    print("\nquorum lease (x-expires 1 s, used every 0.3 s for 7 s): deleted after %s" % gone)
    assert gone["redeclare"] is not None, "a re-declare renewed the lease"
    assert gone["basic_get"] is None, "basic.get did not renew the lease"
