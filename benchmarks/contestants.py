"""The contestants (each says what it is in ``description``): in the
harness's process the layer and raw pika doing its broker work by hand; in
worker processes (``common.Worker``) asgi_redis 1.4.3 and, with
``--baseline-src``, the layer of two source trees.

The ASGI layers all play the same trials (``asgi_trials.LayerTrials``),
through ``send``/``receive``/``send_group`` only; a ``Keeper`` does their
untimed housekeeping.
"""

import random
import sys
import threading
import time

import msgpack
import pika

from . import asgi_trials, common, membership
from .asgi_trials import (
    CAPACITY,
    EMPTY_CHANNELS,
    EXPIRY,
    GROUP,
    GROUP_CHANNELS,
    KEEP_BASE,
    MULTI_CHANNELS,
    MULTI_FULL,
    RECEIVE_CHANNEL,
    REPLY_BASE,
    ROOMS,
    SEND_CHANNEL,
    WAKEUP_CHANNEL,
)
from .broker import (
    LayerKeeper,
    MembershipKeeping,
    connection_parameters,
    layer_objects,
)
from .harness import Contestant, RoundResult, Trial, register_contestant
from .scenarios import MEMBERSHIP_CEILING, MESSAGE

# -- ASGI layers -------------------------------------------------------------------------


def _track(env, queues, exchanges):
    for queue in queues:
        env.admin.track_queue(queue)
    for exchange in exchanges:
        env.admin.track_exchange(exchange)


@register_contestant
class AMQPLayerContestant(Contestant):
    """The layer in this process, playing ``asgi_trials.LayerTrials``."""

    name = "layer"
    description = (
        "asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options "
        "(dead-letter worker on), in this process" % (CAPACITY, EXPIRY)
    )

    def setup(self, env):
        from asgi_amqp import AMQPChannelLayer

        self.layer = AMQPChannelLayer(
            url=env.url,
            prefix=env.prefix,
            capacity=CAPACITY,
            expiry=EXPIRY,
            management_url=env.management_url,
        )
        _track(env, *layer_objects(self.layer.topology, asgi_trials.ALL_CHANNELS, GROUP))
        self.trials = asgi_trials.LayerTrials(self.layer, LayerKeeper(self.layer, env.admin))

    def teardown(self, env):
        self.layer.close()

    def takes_part(self, scenario):
        return self.trials.has(scenario.name) if hasattr(self, "trials") else True

    def trial(self, scenario, env, ops):
        return self.trials.trial(scenario.name, ops)

    def versions(self):
        import asgi_amqp

        return {
            "asgi_amqp": asgi_amqp.__version__,
            "pika": pika.__version__,
            "source": common.ROOT,
            "git": common.git_revision(common.ROOT),
        }


class _WorkerContestant(Contestant):
    """A layer in a worker process (``common.Worker``, ``worker.py``), which
    plays whole rounds and sends back their samples; ``setup`` starts it."""

    def __init__(self):
        self.worker = None
        self.scenarios = []
        self._versions = {}

    def teardown(self, env):
        if self.worker is not None:
            self.worker.close()

    def versions(self):
        return self._versions

    def takes_part(self, scenario):
        return scenario.name in self.scenarios

    def trial(self, scenario, env, ops):
        def run(ops):
            reply = self.worker.request({"cmd": "round", "scenario": scenario.name, "ops": ops})
            return RoundResult.from_dict(reply["result"])

        return Trial(run=run)


class RemoteLayerContestant(_WorkerContestant):
    """AMQPChannelLayer imported from a given source tree, in a worker process
    (``common.LayerSource``)."""

    def __init__(self, name, source, tag):
        super(RemoteLayerContestant, self).__init__()
        self.name = name
        self.source = source
        self.tag = tag  # appended to the run's prefix: each contestant has its own objects
        self.description = (
            "asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options, imported "
            "from %s, in a worker process of its own (this Python, PYTHONPATH=that tree)"
            % (CAPACITY, EXPIRY, source.describe())
        )

    def setup(self, env):
        self.worker = common.Worker(
            sys.executable, "%s worker" % self.name, env=self.source.environ()
        )
        reply = self.worker.request(
            {
                "cmd": "setup",
                "layer": "amqp",
                "config": {
                    "url": env.url,
                    "prefix": env.prefix + self.tag,
                    "management_url": env.management_url,
                },
            }
        )
        cleanup = reply.get("cleanup") or {}
        _track(env, cleanup.get("queues", []), cleanup.get("exchanges", []))
        self.scenarios = reply["scenarios"]
        self._versions = dict(reply["versions"])
        self._versions["git"] = self.source.revision


class _Factory(object):
    """A zero-argument factory with the ``name`` and ``description`` the registry wants."""

    def __init__(self, name, description, make):
        self.name = name
        self.description = description
        self._make = make

    def __call__(self):
        return self._make()


def register_layer_sources(baseline):
    """Register ``layer@baseline`` (the layer from ``baseline``, a
    ``common.LayerSource``) and ``layer@current`` (from this tree), both in
    worker processes of the same shape, so that the two versions are compared
    under the same conditions."""
    current = common.LayerSource(common.ROOT, "current")
    for name, source, tag in (("layer@baseline", baseline, "-b"), ("layer@current", current, "-c")):
        probe = RemoteLayerContestant(name, source, tag)
        register_contestant(
            _Factory(
                name,
                probe.description,
                lambda n=name, s=source, t=tag: RemoteLayerContestant(n, s, t),
            )
        )


@register_contestant
class RedisContestant(_WorkerContestant):
    """asgi_redis 1.4.3 in a worker process of its own virtualenv."""

    name = "asgi-redis"
    description = (
        "asgi_redis.RedisChannelLayer 1.4.3 (capacity=%d, expiry=%d) on a "
        "redis-server, in a worker process of its own virtualenv (.venv-redis: "
        "redis 2.10.6 and msgpack 1.x, deserialize with raw=False)" % (CAPACITY, EXPIRY)
    )

    def setup(self, env):
        options = env.options
        if not getattr(options, "redis_url", None):
            raise common.WorkerError(getattr(options, "redis_reason", None) or "no Redis")
        if not getattr(options, "redis_python", None):
            raise common.WorkerError(
                getattr(options, "redis_python_reason", None) or "no virtualenv with asgi_redis"
            )
        self.worker = common.Worker(options.redis_python, "asgi-redis worker")
        reply = self.worker.request(
            {
                "cmd": "setup",
                "layer": "redis",
                "config": {"redis_url": options.redis_url, "prefix": env.prefix + ":"},
            }
        )
        self.scenarios = reply["scenarios"]
        self._versions = reply["versions"]
        self._versions["python"] = reply.get("python")


# -- raw pika ------------------------------------------------------------------------------

QUEUE_ARGUMENTS = {
    "x-max-length": CAPACITY,
    "x-overflow": "reject-publish",
    "x-message-ttl": EXPIRY * 1000,
    "x-expires": 2 * EXPIRY * 1000,
}
PROPERTIES = pika.BasicProperties(delivery_mode=1, content_type="application/x-msgpack")


class _RawBase(Contestant):
    def setup(self, env):
        self.connection = pika.BlockingConnection(connection_parameters(env.url))
        self.queues = {}

    def queue(self, env, channel):
        queue = self.queues.get(channel)
        if queue is None:
            # Same arguments as the layer's channel queues, minus dead-lettering.
            queue = self.queues[channel] = "%s:%s:%s" % (env.prefix, self.name, channel)
            env.admin.declare(queue, QUEUE_ARGUMENTS)
        return queue

    def teardown(self, env):
        if self.connection.is_open:
            self.connection.close()

    def versions(self):
        return {"pika": pika.__version__}

    def fill(self, env, queue, ops):
        env.admin.purge(queue)
        body = msgpack.packb(MESSAGE, use_bin_type=True)
        for _ in range(ops):
            env.admin.publish(queue, body, PROPERTIES)
        seen = env.admin.wait_depth(queue, ops)
        if seen != ops:
            raise RuntimeError("filled %s with %d messages, it holds %s" % (queue, ops, seen))


def _check_left(env, queue, ops):
    left = env.admin.depth(queue)
    if left:
        env.admin.purge(queue)
        return ["%d messages left after %d receives" % (left, ops)]
    return []


def _check_sent(env, queue, ops):
    seen = env.admin.wait_depth(queue, ops)
    env.admin.purge(queue)
    return [] if seen == ops else ["%d messages confirmed but %s in the queue" % (ops, seen)]


def _receive_trial(contestant, env, ops):
    """(c) for a raw contestant whose ``_get(queue)`` takes one message."""
    queue = contestant.queue(env, RECEIVE_CHANNEL)
    return Trial(
        lambda _i: contestant._get(queue),
        prepare=lambda: contestant.fill(env, queue, ops),
        finish=lambda: _check_left(env, queue, ops),
    )


@register_contestant
class RawPikaContestant(_RawBase):
    """The floor: pika's BlockingConnection doing the same broker work by hand."""

    name = "raw-pika"
    description = (
        "pika BlockingConnection; publish: confirm_delivery() + "
        "basic_publish(mandatory=True), one confirm per message; "
        "receive: basic_get(auto_ack=False) + basic_ack; msgpack on both ends; "
        "group: a confirmed publish to a fanout exchange bound to 100 queues"
    )

    def setup(self, env):
        super(RawPikaContestant, self).setup(env)
        self.publisher = self.connection.channel()
        self.publisher.confirm_delivery()
        self.getter = self.connection.channel()

    def scenario_send(self, env, ops):
        queue = self.queue(env, SEND_CHANNEL)
        publish = self.publisher.basic_publish

        def op(_i):
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            publish("", queue, body, PROPERTIES, mandatory=True)

        return Trial(
            op, prepare=lambda: env.admin.purge(queue), finish=lambda: _check_sent(env, queue, ops)
        )

    def _get(self, queue):
        method, _properties, body = self.getter.basic_get(queue, auto_ack=False)
        if method is None:
            return False
        msgpack.unpackb(body, raw=False)
        self.getter.basic_ack(method.delivery_tag)
        return True

    def scenario_receive(self, env, ops):
        return _receive_trial(self, env, ops)

    def scenario_group(self, env, ops):
        exchange = "%s:%s:fanout" % (env.prefix, self.name)
        queues = [self.queue(env, channel) for channel in GROUP_CHANNELS]
        publish = self.publisher.basic_publish

        def prepare():
            if not getattr(self, "_bound", False):
                env.admin.exchange_declare(exchange, "fanout")
                for queue in queues:
                    env.admin.bind(queue, exchange)
                self._bound = True
            for queue in queues:
                env.admin.purge(queue)

        def op(_i):
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            publish(exchange, "", body, PROPERTIES)

        def finish():
            depths = [env.admin.wait_depth(queue, ops) for queue in queues]
            for queue in queues:
                env.admin.purge(queue)
            trial.delivered = sum(d or 0 for d in depths)
            short = [d for d in depths if d != ops]
            return (
                ["%d of %d queues do not hold %d messages" % (len(short), len(queues), ops)]
                if short
                else []
            )

        trial = Trial(op, prepare=prepare, finish=finish)
        return trial


@register_contestant
class RawPikaConsumeContestant(_RawBase):
    name = "raw-pika-consume"
    PREFETCH = 100
    description = (
        "pika BlockingConnection, basic_consume (prefetch %d) through the consume() "
        "generator, one basic_ack per message; the sender has its own connection" % PREFETCH
    )

    def setup(self, env):
        super(RawPikaConsumeContestant, self).setup(env)
        self.consumer = self.connection.channel()
        self.consumer.basic_qos(prefetch_count=self.PREFETCH)

    def _take(self, deliveries):
        method, _properties, body = next(deliveries)
        if method is None:
            return False
        msgpack.unpackb(body, raw=False)
        self.consumer.basic_ack(method.delivery_tag)
        return True

    def scenario_wakeup(self, env, ops):
        queue = self.queue(env, WAKEUP_CHANNEL)
        state = {}

        def prepare():
            env.admin.purge(queue)
            state["gen"] = self.consumer.consume(queue, auto_ack=False, inactivity_timeout=10)

        def finish():
            self.consumer.cancel()
            return []

        def sender_init():
            connection = pika.BlockingConnection(connection_parameters(env.url))
            channel = connection.channel()
            channel.confirm_delivery()
            state["connection"] = connection
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            return lambda _i: channel.basic_publish("", queue, body, PROPERTIES, mandatory=True)

        def sender_close():
            connection = state.pop("connection", None)
            if connection is not None and connection.is_open:
                connection.close()

        return Trial(
            prepare=prepare,
            finish=finish,
            receive=lambda _i: self._take(state["gen"]),
            sender_init=sender_init,
            sender_close=sender_close,
        )


@register_contestant
class RawPikaShapeContestant(_RawBase):
    """The ceiling of (a), (c), (d) and (m) in the layer's thread shape: raw pika
    with an I/O thread of its own, and nothing else the layer does."""

    name = "raw-pika-shape"
    description = (
        "an I/O thread owns a pika SelectConnection with confirms on; the caller hands "
        "each basic_publish (mandatory) over with add_callback_threadsafe and waits "
        "for its confirm (bulk_bench.PipelinedPublisher, one message at a time); "
        "receive: a basic_get(auto_ack=False) on each queue at once, one channel each, "
        "handed over the same way; queues found empty in the last 10 ms are asked after "
        "the others (as the layer's getter); the first message in the caller's random "
        "order is acked there and any other nacked back; the caller waits for the body"
    )

    def setup(self, env):
        from .bulk_bench import PipelinedPublisher

        super(RawPikaShapeContestant, self).setup(env)
        self.publisher = PipelinedPublisher(env.url, window=1, chunk=1)
        self.lanes = []  # a basic_get channel per queue of (c), (d), (m): the I/O thread's
        self.on_empty = {}  # lane's channel number -> what its next GetEmpty calls: the same
        self.empty_at = {}  # queue -> when it last answered empty: the same
        opened = threading.Semaphore(0)

        def open_lanes():
            for _ in MULTI_CHANNELS:
                self.publisher.connection.channel(on_open_callback=lambda ch: opened_lane(ch))

        def opened_lane(channel):
            number = channel.channel_number
            channel.add_callback(
                lambda _frame: self.on_empty[number](), [pika.spec.Basic.GetEmpty], one_shot=False
            )
            self.lanes.append(channel)
            opened.release()

        self.publisher.connection.ioloop.add_callback_threadsafe(open_lanes)
        for _ in MULTI_CHANNELS:
            if not opened.acquire(timeout=10):
                raise RuntimeError("raw-pika-shape: a basic_get channel did not open in 10 s")

    def teardown(self, env):
        self.publisher.close()
        super(RawPikaShapeContestant, self).teardown(env)

    def scenario_send(self, env, ops):
        queue = self.queue(env, SEND_CHANNEL)

        def op(_i):
            acked, returned, errors = self.publisher.publish(queue, 1, timeout=10)
            if errors or returned or not acked[0]:
                raise RuntimeError("raw-pika-shape: %s" % (errors or "returned or nacked"))

        return Trial(
            op, prepare=lambda: env.admin.purge(queue), finish=lambda: _check_sent(env, queue, ops)
        )

    def _get(self, queue):
        return self._poll([queue])

    def scenario_receive(self, env, ops):
        return _receive_trial(self, env, ops)

    def _poll(self, queues):
        """True if one of ``queues`` (in random order) gave a message, False if none did."""
        lock, answer = threading.Lock(), []
        lock.acquire()
        order = list(queues)
        if len(order) > 1:
            random.shuffle(order)

        def ask(wave, rest):
            answers = {}

            def on_answer(queue, channel, method, body):
                answers[queue] = (channel, method, body)
                if method is None:
                    self.empty_at[queue] = time.monotonic()
                else:
                    self.empty_at.pop(queue, None)
                if len(answers) < len(wave):
                    return
                taken = [answers[q] for q in wave if answers[q][1] is not None]
                for channel, method, _body in taken[1:]:
                    channel.basic_nack(method.delivery_tag, requeue=True)
                if taken:
                    taken[0][0].basic_ack(taken[0][1].delivery_tag)
                    answer.append(taken[0][2])
                elif rest:
                    return ask(rest, [])
                lock.release()

            for lane, queue in zip(self.lanes, wave):
                self.on_empty[lane.channel_number] = lambda q=queue: on_answer(q, None, None, None)
                lane.basic_get(
                    queue,
                    lambda ch, method, _p, body, q=queue: on_answer(q, ch, method, body),
                    auto_ack=False,
                )

        def start():
            now = time.monotonic()
            quiet = [q for q in order if now - self.empty_at.get(q, 0.0) < 0.01]
            fresh = [q for q in order if q not in quiet]
            ask(fresh, quiet) if fresh else ask(quiet, [])

        self.publisher.connection.ioloop.add_callback_threadsafe(start)
        if not lock.acquire(timeout=10):
            raise RuntimeError("raw-pika-shape: no answer to a poll in 10 s")
        if not answer:
            return False
        msgpack.unpackb(answer[0], raw=False)
        return True

    def scenario_receive_10(self, env, ops):
        queues = [self.queue(env, channel) for channel in MULTI_CHANNELS]
        full = self.queue(env, MULTI_FULL)
        return Trial(
            lambda _i: self._poll(queues),
            prepare=lambda: self.fill(env, full, ops),
            finish=lambda: _check_left(env, full, ops),
        )

    def scenario_poll_10(self, env, ops):
        queues = [self.queue(env, channel) for channel in EMPTY_CHANNELS]
        for queue in queues:
            env.admin.purge(queue)
        return Trial(lambda _i: not self._poll(queues))


@register_contestant
class RawMembershipContestant(Contestant):
    """The ceiling of group membership: the layer's broker work for one
    ``group_add``/``group_discard``, done by hand with raw pika, as few round
    trips as that work allows (``membership``: what can be pipelined and why)."""

    name = MEMBERSHIP_CEILING
    GROUP_EXPIRY = 86400  # the layer's default
    description = (
        "the group-membership ceiling: raw pika (BlockingConnection, publisher confirms "
        "kept by hand so that several are waited for together) doing exactly the broker "
        "work of AMQPChannelLayer.group_add and group_discard for a process-local channel, "
        "with the names, flags and arguments of asgi_amqp.naming.Topology (expiry %d, "
        "group_expiry %d); group_add in two round trips: the lease message and the join "
        "notice, both confirms waited for together, then the group exchange, its router "
        "binding, the member exchange (m:foo!) and its bindings, all with nowait, and the "
        "process queue's declare, answered (it renews the queue's x-expires); "
        "group_discard in one: the unbinds of every live stamp's binding, nowait but the "
        "last, beside the leave notice, confirmed, on a second channel; "
        "benchmarks/membership.py says why each step is there. The same checks as the "
        "layer (deliveries and notices through the process's queue, the group exchanges' "
        "bindings, the lease messages)" % (EXPIRY, GROUP_EXPIRY)
    )

    def setup(self, env):
        from asgi_amqp import naming

        self.topology = naming.Topology(
            env.prefix + "-rm",
            EXPIRY,
            self.GROUP_EXPIRY,
            lambda _channel: CAPACITY,
        )
        self.leases_sent = {}  # (group, channel) -> stamp, as the layer's _leases_sent
        self.made = set()  # member exchanges made lately, as the layer's MemberExchanges
        self.connection = pika.BlockingConnection(connection_parameters(env.url))
        self.channel = membership.PipelinedChannel(self.connection)
        topology = self.topology
        admin = env.admin
        # The shared objects, as the layer declares them once per process.
        admin.exchange_declare(topology.dead_letter_exchange, "fanout")
        admin.exchange_declare(topology.group_router, "direct")
        admin.declare(topology.dead_letter_queue, topology.dead_letter_queue_arguments())
        admin.bind(topology.dead_letter_queue, topology.dead_letter_exchange)
        admin.declare(topology.lease_queue, topology.lease_queue_arguments())
        for base in (REPLY_BASE, KEEP_BASE):
            admin.track_queue(topology.channel_queue(base))
        for room in ROOMS:
            admin.track_exchange(topology.group_exchange(room))
        self.keeper = _RawMembershipKeeper(admin, topology)

    def teardown(self, env):
        connection = getattr(self, "connection", None)
        if connection is not None and connection.is_open:
            connection.close()

    def versions(self):
        return {"pika": pika.__version__}

    # -- one membership ------------------------------------------------------------

    def add(self, group, member):
        """``group_add(group, member)``: the lease only if this contestant did
        not send that stamp's, as the layer."""
        channel = self.channel
        key = (group, member)
        stamp = self.topology.lease_stamp()
        lease = self.leases_sent.get(key) != stamp
        phases = membership.add_phases(
            self.topology, group, member, stamp, lease=lease, made=self.made
        )
        try:
            for phase in phases:
                channel.run(phase)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            # Made lately, gone since (flushed, discarded elsewhere): all
            # again, as the layer.
            self.made.discard(self.topology.membership_binding(member, stamp)[0])
            self.made.discard(key)
            for phase in membership.add_phases(self.topology, group, member, stamp)[1:]:
                channel.run(phase)
        self.leases_sent[key] = stamp

    def discard(self, group, member):
        """``group_discard(group, member)``, what this contestant remembers of
        the membership forgotten."""
        self.leases_sent.pop((group, member), None)
        self.made.discard((group, member))
        self.channel.run_beside(*membership.discard_runs(self.topology, group, member))

    def send_group(self, group, message):
        body = msgpack.packb(message, use_bin_type=True)
        properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack", headers={"asgi-group": group}
        )
        self.channel.publish(self.topology.group_router, group, body, properties)

    # -- trials --------------------------------------------------------------------

    def _trial(self, ops, discard):
        pairs = asgi_trials.memberships(asgi_trials.local_channels(REPLY_BASE, ops))
        kept = asgi_trials.memberships(asgi_trials.local_channels(KEEP_BASE, len(ROOMS)))
        kept = kept if discard else []
        keeper, work = self.keeper, (self.discard if discard else self.add)

        def prepare():
            keeper.purge(REPLY_BASE)
            keeper.purge(KEEP_BASE)
            if discard:
                for group, member in pairs + kept:
                    self.add(group, member)
                problems = asgi_trials.check_membership_round(
                    self.send_group, keeper, pairs, kept, True
                )
                if problems:
                    raise RuntimeError("the memberships to discard: " + "; ".join(problems))

        def op(i):
            group, member = pairs[i]
            work(group, member)

        def finish():
            try:
                return asgi_trials.check_membership_round(
                    self.send_group, keeper, pairs, kept, not discard
                )
            finally:
                keeper.forget(pairs + kept)

        return Trial(op, prepare=prepare, finish=finish)

    def scenario_group_add(self, env, ops):
        return self._trial(ops, False)

    def scenario_group_discard(self, env, ops):
        return self._trial(ops, True)


class _RawMembershipKeeper(MembershipKeeping, asgi_trials.Keeper):
    """The ceiling's housekeeping and checks, the same as the layer's (``LayerKeeper``)."""

    def __init__(self, admin, topology):
        super(_RawMembershipKeeper, self).__init__(None)
        self.admin = admin
        self.topology = topology

    def purge(self, channel):
        self.admin.purge(self.topology.channel_queue(channel))

    def depth(self, channel):
        return self.admin.depth(self.topology.channel_queue(channel))

    def wait_depth(self, channel, expected):
        return self.admin.wait_depth(self.topology.channel_queue(channel), expected)
