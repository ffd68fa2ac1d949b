"""The contestants.

In the harness's process: ``layer`` (asgi_amqp's AMQPChannelLayer),
``inmemory`` (asgiref.inmemory) and three kinds of raw pika doing the same
broker work by hand (``raw-pika``: one confirm per publish, basic_get;
``raw-pika-async``: the pipelined-confirm ceiling, a SelectConnection on an
I/O thread of its own with up to 1000 confirms outstanding;
``raw-pika-consume``: basic_consume with prefetch; ``raw-pika-membership``:
the ceiling of group membership, the layer's broker work for a membership
in as few round trips as it allows, see ``membership``; ``raw-pika-one-unbind``:
the floor of a discard, one binding removed). In a worker process
(``common.Worker``): ``asgi-redis`` (asgi_redis 1.4.3 on a redis-server, in
its own virtualenv), the layer's memory scenario, and with
``--baseline-src`` the layer imported from two source trees,
``layer@baseline`` and ``layer@current``.

The ASGI layers all play the same trials (``asgi_trials.LayerTrials``),
through ``send``/``receive``/``send_group`` only; a ``Keeper`` does their
untimed housekeeping.
"""

import collections
import queue as queue_module
import random
import sys
import threading
import time

import msgpack
import pika

from . import asgi_trials, common, membership
from .asgi_trials import (
    CAPACITY,
    EXPIRY,
    GROUP,
    GROUP_CHANNELS,
    KEEP_BASE,
    MULTI_CHANNELS,
    MULTI_FULL,
    RECEIVE_CHANNEL,
    REPLY_BASE,
    ROOMS,
    ROUNDTRIP_CHANNEL,
    SEND_CHANNEL,
    WAKEUP_CHANNEL,
)
from .broker import (
    IOThreadConnection,
    LayerKeeper,
    MembershipKeeping,
    connection_parameters,
    layer_objects,
)
from .harness import Contestant, RoundResult, Trial, register_contestant
from .scenarios import (
    DISCARD_FLOOR,
    MEMBERSHIP_ASYNC_CEILING,
    MEMBERSHIP_CEILING,
    MESSAGE,
    SEND_THREADS,
)

# -- ASGI layers -------------------------------------------------------------------------


class ASGILayerContestant(Contestant):
    """Any asgiref 1.x BaseChannelLayer in this process; subclasses provide
    ``make_layer`` and ``make_keeper``."""

    blocking = True

    def make_layer(self, env):
        raise NotImplementedError

    def make_keeper(self, env):
        return asgi_trials.Keeper(self.layer)

    def setup(self, env):
        self.layer = self.make_layer(env)
        self.trials = asgi_trials.LayerTrials(
            self.layer, self.make_keeper(env), blocking=self.blocking
        )

    def teardown(self, env):
        close = getattr(self.layer, "close", None)
        if close is not None:
            close()

    def takes_part(self, scenario):
        if scenario.name == "memory":
            return getattr(self, "scenario_memory", None) is not None
        return self.trials.has(scenario.name) if hasattr(self, "trials") else True

    def trial(self, scenario, env, ops):
        method = getattr(self, scenario.method_name, None)
        if method is not None:
            return method(env, ops)
        return self.trials.trial(scenario.name, ops)


def _track(env, queues, exchanges):
    for queue in queues:
        env.admin.track_queue(queue)
    for exchange in exchanges:
        env.admin.track_exchange(exchange)


def _memory_trial(env, prefix, python=None, worker_env=None, name="layer memory worker"):
    """The memory scenario: the layer alone in a fresh worker process."""
    options = env.options

    def run(_ops):
        worker = common.Worker(python or sys.executable, name, env=worker_env)
        try:
            reply = worker.request(
                {
                    "cmd": "setup",
                    "layer": "amqp",
                    "config": {
                        "url": env.url,
                        "prefix": prefix,
                        "management_url": env.management_url,
                    },
                }
            )
            cleanup = reply.get("cleanup") or {}
            _track(env, cleanup.get("queues", []), cleanup.get("exchanges", []))
            reply = worker.request(
                {
                    "cmd": "round",
                    "scenario": "memory",
                    "ops": options.memory_to,
                    "options": {"to": options.memory_to, "step": options.memory_step},
                },
                on_progress=getattr(options, "memory_progress", None),
            )
            return RoundResult.from_dict(reply["result"])
        finally:
            worker.close()

    return Trial(run=run)


@register_contestant
class AMQPLayerContestant(ASGILayerContestant):
    name = "layer"
    description = (
        "asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options "
        "(dead-letter worker on), in this process; memory scenario in a fresh "
        "process" % (CAPACITY, EXPIRY)
    )

    def make_layer(self, env):
        from asgi_amqp import AMQPChannelLayer

        layer = AMQPChannelLayer(
            url=env.url,
            prefix=env.prefix,
            capacity=CAPACITY,
            expiry=EXPIRY,
            management_url=env.management_url,
        )
        _track(env, *layer_objects(layer.topology, asgi_trials.ALL_CHANNELS, GROUP))
        return layer

    def make_keeper(self, env):
        return LayerKeeper(self.layer, env.admin)

    def versions(self):
        import asgi_amqp

        return {
            "asgi_amqp": asgi_amqp.__version__,
            "pika": pika.__version__,
            "source": common.ROOT,
            "git": common.git_revision(common.ROOT),
        }

    def scenario_memory(self, env, ops):
        return _memory_trial(env, env.prefix + "-mem")


class RemoteLayerContestant(Contestant):
    """AMQPChannelLayer imported from a given source tree, in a worker process
    (``common.LayerSource``); the memory scenario in a second, fresh one."""

    remote = True

    def __init__(self, name, source, tag):
        self.name = name
        self.source = source
        self.tag = tag  # appended to the run's prefix: each contestant has its own objects
        self.description = (
            "asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options, imported "
            "from %s, in a worker process of its own (this Python, PYTHONPATH=that tree); "
            "memory scenario in a fresh one" % (CAPACITY, EXPIRY, source.describe())
        )
        self.worker = None
        self.scenarios = []
        self._versions = {}

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

    def teardown(self, env):
        if self.worker is not None:
            self.worker.close()

    def versions(self):
        return self._versions

    def takes_part(self, scenario):
        return scenario.name in self.scenarios

    def trial(self, scenario, env, ops):
        if scenario.name == "memory":
            return _memory_trial(
                env,
                env.prefix + self.tag + "m",
                worker_env=self.source.environ(),
                name="%s memory worker" % self.name,
            )

        def run(ops):
            reply = self.worker.request({"cmd": "round", "scenario": scenario.name, "ops": ops})
            return RoundResult.from_dict(reply["result"])

        return Trial(run=run)


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
    under the same conditions. Returns their names."""
    current = common.LayerSource(common.ROOT, "current")
    made = []
    for name, source, tag in (("layer@baseline", baseline, "-b"), ("layer@current", current, "-c")):
        probe = RemoteLayerContestant(name, source, tag)
        register_contestant(
            _Factory(
                name,
                probe.description,
                lambda n=name, s=source, t=tag: RemoteLayerContestant(n, s, t),
            )
        )
        made.append(name)
    return made


@register_contestant
class InMemoryContestant(ASGILayerContestant):
    name = "inmemory"
    description = (
        "asgiref.inmemory.ChannelLayer(capacity=%d), in this process; its "
        "receive(block=True) does not wait, so it sits out (g)" % CAPACITY
    )
    blocking = False

    def make_layer(self, env):
        from asgiref.inmemory import ChannelLayer

        return ChannelLayer(capacity=CAPACITY, expiry=EXPIRY)

    def make_keeper(self, env):
        from .worker import InMemoryKeeper

        return InMemoryKeeper(self.layer)

    def versions(self):
        from importlib import metadata

        return {"asgiref": metadata.version("asgiref")}


@register_contestant
class RedisContestant(Contestant):
    """asgi_redis 1.4.3 in a worker process of its own virtualenv."""

    name = "asgi-redis"
    description = (
        "asgi_redis.RedisChannelLayer 1.4.3 (capacity=%d, expiry=%d) on a "
        "redis-server, in a worker process of its own virtualenv (.venv-redis: "
        "redis 2.10.6 and msgpack 1.x, deserialize with raw=False)" % (CAPACITY, EXPIRY)
    )
    remote = True

    def __init__(self):
        self.worker = None
        self.scenarios = []
        self._versions = {}

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
        self.scenarios = [s for s in reply["scenarios"] if s != "memory"]
        self._versions = reply["versions"]
        self._versions["python"] = reply.get("python")

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
        queue = self.queue(env, RECEIVE_CHANNEL)
        return Trial(
            lambda _i: self._get(queue),
            prepare=lambda: self.fill(env, queue, ops),
            finish=lambda: _check_left(env, queue, ops),
        )

    def scenario_receive_10(self, env, ops):
        queues = [self.queue(env, channel) for channel in MULTI_CHANNELS]
        full = self.queue(env, MULTI_FULL)

        def op(_i):
            order = list(queues)
            random.shuffle(order)
            for queue in order:
                if self._get(queue):
                    return True
            return False

        return Trial(
            op,
            prepare=lambda: self.fill(env, full, ops),
            finish=lambda: _check_left(env, full, ops),
        )

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


class PipelinedPublisher(IOThreadConnection):
    """Confirmed publishing as fast as pika goes: a ``SelectConnection`` owned
    by an I/O thread of its own, publisher confirms on, up to ``window``
    publishes unconfirmed.

    ``publish(routing_key, count)`` packs the msgpack bodies in this thread,
    in chunks of ``chunk``, and hands each chunk to the I/O thread with
    ``add_callback_threadsafe`` (the only pika call another thread may make).
    The I/O thread publishes while fewer than ``window`` are unconfirmed and
    publishes more from the confirm callback. A ``Basic.Ack``/``Basic.Nack``
    with ``multiple=True`` settles every unconfirmed tag up to and including
    its own; unconfirmed tags are kept in a set in publish order (acks may
    come out of order), never counted by subtracting tags. The caller waits
    for the last confirm. Publishes are ``mandatory``, like the layer's: a
    returned message is counted.
    """

    def __init__(self, url, window=1000, chunk=1000, timeout=10.0):
        self.window = window
        self.chunk = chunk
        self.channel = None
        self.next_tag = 0
        self.unconfirmed = collections.OrderedDict()  # delivery tag -> message index
        self.pending = collections.deque()  # (index, body) handed over, not yet published
        self.routing_key = None
        self.starts = self.ends = self.acked = None
        self.expected = self.settled = self.returned = 0
        self.properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack"
        )
        self.open(url, "raw-pika-async-io", timeout)

    # -- the I/O thread ----------------------------------------------------------------

    def _on_open(self, connection):
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel):
        self.channel = channel
        channel.add_on_close_callback(lambda _ch, exc: self._fail("channel closed: %r" % (exc,)))
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: self.ready.set()
        )

    def _on_return(self, _channel, _method, _properties, _body):
        self.returned += 1

    def _on_confirm(self, frame):
        method = frame.method
        now = time.perf_counter_ns()
        ack = method.NAME == "Basic.Ack"
        tag = method.delivery_tag
        unconfirmed = self.unconfirmed
        if method.multiple:
            settled = []
            while unconfirmed:
                first = next(iter(unconfirmed))
                if first > tag:
                    break
                settled.append(unconfirmed.popitem(last=False)[1])
        else:
            index = unconfirmed.pop(tag, None)
            settled = [] if index is None else [index]
        ends, acked = self.ends, self.acked
        for index in settled:
            ends[index] = now
            acked[index] = ack
        self.settled += len(settled)
        self._pump()
        if self.settled >= self.expected:
            self.done.set()

    def _submit(self, chunk):
        self.pending.extend(chunk)
        self._pump()

    def _pump(self):
        pending, unconfirmed = self.pending, self.unconfirmed
        if not pending or len(unconfirmed) >= self.window:
            return
        publish, perf = self.channel.basic_publish, time.perf_counter_ns
        starts, routing_key, properties = self.starts, self.routing_key, self.properties
        while pending and len(unconfirmed) < self.window:
            index, body = pending.popleft()
            self.next_tag += 1
            unconfirmed[self.next_tag] = index
            starts[index] = perf()
            publish("", routing_key, body, properties, mandatory=True)

    # -- the caller's thread ------------------------------------------------------------

    def publish(self, routing_key, count, timeout=60.0):
        """Publish ``count`` messages to ``routing_key`` (default exchange);
        returns (starts, ends, acked, returned, errors), one per message."""
        if self.error:
            raise RuntimeError(self.error)
        self.routing_key = routing_key
        self.starts, self.ends, self.acked = [0] * count, [0] * count, [False] * count
        self.expected, self.settled, self.returned = count, 0, 0
        self.done.clear()
        handover = self.connection.ioloop.add_callback_threadsafe
        packb, message, chunk = msgpack.packb, MESSAGE, self.chunk
        for first in range(0, count, chunk):
            bodies = [
                (i, packb(message, use_bin_type=True))
                for i in range(first, min(count, first + chunk))
            ]
            handover(lambda bodies=bodies: self._submit(bodies))
        errors = []
        if not self.done.wait(timeout):
            errors.append(
                "%d of %d confirms missing after %.0f s" % (count - self.settled, count, timeout)
            )
        if self.error:
            errors.append(self.error)
        return self.starts, self.ends, self.acked, self.returned, errors


@register_contestant
class RawPikaAsyncContestant(_RawBase):
    """The ceiling of confirmed publishing: pipelined confirms on an I/O thread."""

    name = "raw-pika-async"
    WINDOW = 1000
    CHUNK = 1000
    MIN_OPS = 20000
    description = (
        "the pipelined-confirm ceiling: a pika SelectConnection on an I/O thread of its own, "
        "publisher confirms on, up to %d publishes (mandatory) unconfirmed, settled in the "
        "confirm callback (multiple=True settles every tag up to its own); this thread packs "
        "the msgpack bodies in chunks of %d and hands each over with "
        "add_callback_threadsafe, then waits for the last ack; at least %d messages a round, "
        "every one acked and counted in the queue afterwards; the sample is each message's "
        "publish-to-ack time" % (WINDOW, CHUNK, MIN_OPS)
    )

    def setup(self, env):
        super(RawPikaAsyncContestant, self).setup(env)
        self.publisher = PipelinedPublisher(env.url, window=self.WINDOW, chunk=self.CHUNK)

    def teardown(self, env):
        publisher = getattr(self, "publisher", None)
        if publisher is not None:
            publisher.close()
        super(RawPikaAsyncContestant, self).teardown(env)

    def versions(self):
        return {"pika": pika.__version__, "window": self.WINDOW}

    def _run(self, env, queue, ops):
        # A round of 3000 confirmed messages lasts a tenth of a second here:
        # the ceiling plays longer rounds so that its rate means something.
        ops = max(ops, self.MIN_OPS)
        env.admin.purge(queue)
        begin = time.perf_counter_ns()
        starts, ends, acked, returned, errors = self.publisher.publish(queue, ops)
        wall = (time.perf_counter_ns() - begin) / 1e9
        durations = [max(0, e - s) if e else 0 for s, e in zip(starts, ends)]
        result = RoundResult(ops, wall, list(starts), durations, list(acked), errors, None)
        nacked = sum(1 for e, a in zip(ends, acked) if e and not a)
        result.problems = _check_sent(env, queue, ops - nacked)
        if nacked:
            result.problems.append("%d of %d messages nacked" % (nacked, ops))
        if returned:
            result.problems.append("%d of %d messages returned unroutable" % (returned, ops))
        return result

    def scenario_send(self, env, ops):
        queue = self.queue(env, SEND_CHANNEL)
        return Trial(run=lambda ops: self._run(env, queue, ops))

    scenario_send_8t = scenario_send


@register_contestant
class RawPikaConsumeContestant(_RawBase):
    name = "raw-pika-consume"
    PREFETCH = 100
    description = (
        "pika BlockingConnection, basic_consume (prefetch %d) through the consume() "
        "generator, one basic_ack per message; round trip: a confirmed publish on "
        "another channel of the same connection; wake-up: the sender has its own "
        "connection" % PREFETCH
    )

    def setup(self, env):
        super(RawPikaConsumeContestant, self).setup(env)
        self.consumer = self.connection.channel()
        self.consumer.basic_qos(prefetch_count=self.PREFETCH)
        self.publisher = self.connection.channel()
        self.publisher.confirm_delivery()

    def _consume_trial(self, env, queue, op_factory, prepare=None, finish=None, **extra):
        state = {}

        def start():
            if prepare:
                prepare()
            state["gen"] = self.consumer.consume(queue, auto_ack=False, inactivity_timeout=10)

        def stop():
            self.consumer.cancel()
            return finish() if finish else []

        trial = Trial(op_factory(state), prepare=start, finish=stop, **extra)
        trial.state = state
        return trial

    def _take(self, state):
        method, _properties, body = next(state["gen"])
        if method is None:
            return False
        msgpack.unpackb(body, raw=False)
        self.consumer.basic_ack(method.delivery_tag)
        return True

    def scenario_receive(self, env, ops):
        queue = self.queue(env, RECEIVE_CHANNEL)
        return self._consume_trial(
            env,
            queue,
            lambda state: lambda _i: self._take(state),
            prepare=lambda: self.fill(env, queue, ops),
            finish=lambda: _check_left(env, queue, ops),
        )

    def scenario_roundtrip(self, env, ops):
        queue = self.queue(env, ROUNDTRIP_CHANNEL)
        publish = self.publisher.basic_publish

        def factory(state):
            def op(_i):
                publish(
                    "", queue, msgpack.packb(MESSAGE, use_bin_type=True), PROPERTIES, mandatory=True
                )
                return self._take(state)

            return op

        return self._consume_trial(env, queue, factory, prepare=lambda: env.admin.purge(queue))

    def scenario_wakeup(self, env, ops):
        queue = self.queue(env, WAKEUP_CHANNEL)
        senders = {}

        def sender_init():
            connection = pika.BlockingConnection(connection_parameters(env.url))
            channel = connection.channel()
            channel.confirm_delivery()
            senders["connection"] = connection
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            return lambda _i: channel.basic_publish("", queue, body, PROPERTIES, mandatory=True)

        def sender_close():
            connection = senders.pop("connection", None)
            if connection is not None and connection.is_open:
                connection.close()

        trial = self._consume_trial(
            env,
            queue,
            lambda state: None,
            prepare=lambda: env.admin.purge(queue),
            sender_init=sender_init,
            sender_close=sender_close,
        )
        trial.receive = lambda _i: self._take(trial.state)
        return trial


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
        "group_expiry %d); group_add in two round trips: the lease message (persistent, "
        "mandatory, into the lease queue, its expiration the lease's end; once per stamp "
        "and membership, as the layer) and the join notice (mandatory, into the process's "
        "queue) published together and both confirms waited for; then exchange.declare of "
        "the group exchange (fanout, auto-delete) and exchange.bind of it from the group "
        "router, the process's member exchange (m:foo!) and its binding to the "
        "process's queue, the exchange.bind of that member exchange from the group "
        "exchange with the stamp's arguments, all with nowait, and the queue.declare of "
        "the process's queue, answered (it renews the queue's x-expires). group_discard "
        "in one: exchange.unbind of every live stamp's binding, with nowait, the last "
        "answered, and beside them on a second channel the leave notice, confirmed, "
        "both waited for together (the layer's two connections). "
        "1-thread scenarios: one connection; %d-thread ones: a connection per "
        "thread. The same checks as the layer (deliveries and notices through the "
        "process's queue, the group exchanges' bindings, the lease messages)"
        % (EXPIRY, GROUP_EXPIRY, SEND_THREADS)
    )

    def setup(self, env):
        from asgi_amqp import naming

        self.topology = naming.Topology(
            env.prefix + "-rm",
            EXPIRY,
            self.GROUP_EXPIRY,
            lambda _channel: CAPACITY,
        )
        self.connections = []
        self.channels = []
        self.leases_sent = {}  # (group, channel) -> stamp, as the layer's _leases_sent
        self.made = set()  # member exchanges made lately, as the layer's MemberExchanges
        for _ in range(SEND_THREADS):
            connection = pika.BlockingConnection(connection_parameters(env.url))
            self.connections.append(connection)
            self.channels.append(membership.PipelinedChannel(connection))
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
        for connection in getattr(self, "connections", []):
            if connection.is_open:
                connection.close()

    def versions(self):
        return {"pika": pika.__version__}

    # -- one membership ------------------------------------------------------------

    def _add_phases(self, group, member):
        """``(stamp, phases)`` of ``group_add(group, member)``: the lease only
        if this contestant did not send that stamp's, as the layer."""
        stamp = self.topology.lease_stamp()
        lease = self.leases_sent.get((group, member)) != stamp
        return stamp, membership.add_phases(
            self.topology, group, member, stamp, lease=lease, made=self.made
        )

    def _discard_runs(self, group, member):
        """``(unbinds, notices)`` of ``group_discard(group, member)``, what
        this contestant remembers of the membership forgotten."""
        self.leases_sent.pop((group, member), None)
        self.made.discard((group, member))
        return membership.discard_runs(self.topology, group, member)

    def add(self, channel, group, member):
        """``group_add(group, member)`` on ``channel`` (a ``PipelinedChannel``)."""
        key = (group, member)
        stamp, phases = self._add_phases(group, member)
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

    def discard(self, channel, group, member):
        channel.run_beside(*self._discard_runs(group, member))

    def send_group(self, group, message):
        body = msgpack.packb(message, use_bin_type=True)
        properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack", headers={"asgi-group": group}
        )
        self.channels[0].publish(self.topology.group_router, group, body, properties)

    # -- trials --------------------------------------------------------------------

    def _trial(self, ops, discard, threads):
        pairs = asgi_trials.memberships(asgi_trials.local_channels(REPLY_BASE, ops))
        kept = asgi_trials.memberships(asgi_trials.local_channels(KEEP_BASE, len(ROOMS)))
        kept = kept if discard else []
        keeper, work = self.keeper, (self.discard if discard else self.add)
        pool = queue_module.Queue()
        local = threading.local()
        single = self.channels[0]

        def prepare():
            keeper.purge(REPLY_BASE)
            keeper.purge(KEEP_BASE)
            for channel in self.channels[:threads]:
                pool.put(channel)
            if discard:
                for group, member in pairs + kept:
                    self.add(single, group, member)
                problems = asgi_trials.check_membership_round(
                    self.send_group, keeper, pairs, kept, True
                )
                if problems:
                    raise RuntimeError("the memberships to discard: " + "; ".join(problems))

        if threads == 1:

            def op(i):
                group, member = pairs[i]
                work(single, group, member)

        else:

            def op(i):
                channel = getattr(local, "channel", None)
                if channel is None:
                    channel = local.channel = pool.get_nowait()
                group, member = pairs[i]
                work(channel, group, member)

        def finish():
            try:
                return asgi_trials.check_membership_round(
                    self.send_group, keeper, pairs, kept, not discard
                )
            finally:
                keeper.forget(pairs + kept)

        return Trial(op, prepare=prepare, finish=finish, pairs=pairs)

    def scenario_group_add(self, env, ops):
        return self._trial(ops, False, 1)

    def scenario_group_discard(self, env, ops):
        return self._trial(ops, True, 1)

    def scenario_group_add_8t(self, env, ops):
        return self._trial(ops, False, SEND_THREADS)

    def scenario_group_discard_8t(self, env, ops):
        return self._trial(ops, True, SEND_THREADS)


@register_contestant
class RawOneUnbindContestant(RawMembershipContestant):
    """The floor of ``group_discard`` in the layer's design: the ceiling's
    discard, less every unbind but the one binding that exists.

    A discard must remove the membership's binding, answered (a
    ``send_group`` that follows it must not reach the channel), and tell a
    process-local channel's process (the leave notice, confirmed). The
    floor knows the one stamp its own ``group_add`` bound; the layer's
    ``group_discard``, often called by another process than the one that
    made the membership (a runworker each for a WebSocket's connect and
    disconnect), cannot, and unbinds every stamp that may have bound. So
    no discard of this design can beat this one; the memberships are made
    as the ceiling makes them."""

    name = DISCARD_FLOOR
    description = (
        "the floor of group_discard: raw pika as raw-pika-membership, but a discard "
        "removes only the one binding that the membership's own group_add made (its "
        "stamp known here, as no layer process can know it of a membership another "
        "process made): exchange.unbind of that binding, answered, and beside it on "
        "a second channel the leave notice, confirmed: one round trip, one binding "
        "removed. Only in "
        "the discard scenarios; the same checks as the layer"
    )

    scenario_group_add = None
    scenario_group_add_8t = None

    def _discard_runs(self, group, member):
        stamp = self.leases_sent.pop((group, member))
        self.made.discard((group, member))
        return membership.discard_runs(self.topology, group, member, [stamp])


@register_contestant
class RawMembershipAsyncContestant(RawMembershipContestant):
    """The threaded membership scenarios' ceiling in the layer's own shape:
    one connection, one I/O thread, 8 memberships in flight
    (``membership.AsyncMemberships``), doing the ceiling's broker work."""

    name = MEMBERSHIP_ASYNC_CEILING
    description = (
        "the group-membership ceiling of (k) and (l) in the layer's shape: the broker "
        "work of raw-pika-membership, but on one pika SelectConnection driven by an I/O "
        "thread of its own, %d memberships in flight, each on an admin channel of its "
        "own, every publish on one confirming channel; a membership's phases as "
        "raw-pika-membership's (its calls built when it starts), each sent together and "
        "waited for together in callbacks, no thread hand-off; timed from the first "
        "membership's start to the last one's end. The same checks" % SEND_THREADS
    )

    scenario_group_add = None
    scenario_group_discard = None

    def setup(self, env):
        super(RawMembershipAsyncContestant, self).setup(env)
        self.driver = membership.AsyncMemberships(env.url, SEND_THREADS)

    def teardown(self, env):
        driver = getattr(self, "driver", None)
        if driver is not None:
            driver.close()
        super(RawMembershipAsyncContestant, self).teardown(env)

    def _phases(self, group, member, discard):
        if discard:
            unbinds, notices = self._discard_runs(group, member)
            return [unbinds + notices]
        stamp, phases = self._add_phases(group, member)
        self.leases_sent[(group, member)] = stamp
        return phases

    def _async_trial(self, ops, discard):
        blocking = self._trial(ops, discard, 1)  # its prepare and finish, and their pairs
        pairs = blocking.pairs

        def run(ops):
            # The process's queue exists, as daphne's does (the driver sends
            # a returned notice nowhere: it is an error there).
            self.channels[0].run(
                [
                    membership.queue_declare(
                        self.topology.channel_queue(base),
                        self.topology.channel_queue_arguments(base),
                    )
                    for base in (REPLY_BASE, KEEP_BASE)
                ]
            )
            blocking.prepare()
            begin = time.perf_counter_ns()
            try:
                starts, ends = self.driver.run(
                    len(pairs), lambda i: self._phases(pairs[i][0], pairs[i][1], discard)
                )
                errors = []
            except RuntimeError as exc:
                starts, ends, errors = [begin] * len(pairs), [0] * len(pairs), [str(exc)]
            wall = (time.perf_counter_ns() - begin) / 1e9
            durations = [max(0, end - start) if end else 0 for start, end in zip(starts, ends)]
            result = RoundResult(
                len(pairs), wall, list(starts), durations, [bool(end) for end in ends], errors, None
            )
            result.problems = list(blocking.finish() or [])
            return result

        return Trial(run=run)

    def scenario_group_add_8t(self, env, ops):
        return self._async_trial(ops, False)

    def scenario_group_discard_8t(self, env, ops):
        return self._async_trial(ops, True)


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
