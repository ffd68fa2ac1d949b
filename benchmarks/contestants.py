"""The contestants.

In the harness's process: ``layer`` (asgi_amqp's AMQPChannelLayer),
``inmemory`` (asgiref.inmemory) and three kinds of raw pika doing the same
broker work by hand (``raw-pika``: one confirm per publish, basic_get;
``raw-pika-async``: a publisher pipelining confirms; ``raw-pika-consume``:
basic_consume with prefetch). In a worker process (``remote.py``):
``asgi-redis`` (asgi_redis 1.4.3 on a local redis-server, in its own
virtualenv), and the layer's memory scenario.

The ASGI layers all play the same trials (``asgi_trials.LayerTrials``),
through ``send``/``receive``/``send_group`` only; a ``Keeper`` does their
untimed housekeeping.
"""

import collections
import random
import sys
import time

import msgpack
import pika

from . import asgi_trials, remote
from .asgi_trials import (CAPACITY, EXPIRY, GROUP, GROUP_CHANNELS, MULTI_CHANNELS, MULTI_FULL,
                          RECEIVE_CHANNEL, ROUNDTRIP_CHANNEL, SEND_CHANNEL, WAKEUP_CHANNEL)
from .broker import connection_parameters
from .harness import Contestant, RoundResult, Trial, register_contestant
from .scenarios import MESSAGE

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
        self.trials = asgi_trials.LayerTrials(self.layer, self.make_keeper(env),
                                              blocking=self.blocking)

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


class LayerKeeper(asgi_trials.Keeper):
    """Housekeeping for AMQPChannelLayer on the harness's own connection."""

    def __init__(self, layer, admin):
        super(LayerKeeper, self).__init__(layer)
        self.admin = admin
        self.properties = pika.BasicProperties(delivery_mode=1,
                                               content_type="application/x-msgpack")
        self.body = msgpack.packb(MESSAGE, use_bin_type=True)
        self.counter = 0

    def _queue(self, channel):
        return self.layer.topology.channel_queue(channel)

    def purge(self, channel):
        self.admin.purge(self._queue(channel))

    def depth(self, channel):
        return self.admin.depth(self._queue(channel))

    def wait_depth(self, channel, expected):
        return self.admin.wait_depth(self._queue(channel), expected)

    def fill(self, channel, count):
        """Publish ``count`` messages the way the layer would (msgpack body,
        unique message_id), without confirms: fast and untimed."""
        queue = self._queue(channel)
        self.admin.declare(queue, self.layer.topology.channel_queue_arguments(channel))
        properties = self.properties
        for _ in range(count):
            self.counter += 1
            properties.message_id = "fill.%d" % self.counter
            self.admin.publish(queue, self.body, properties)


@register_contestant
class AMQPLayerContestant(ASGILayerContestant):
    name = "layer"
    description = ("asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options "
                   "(dead-letter worker on); memory scenario in a fresh process"
                   % (CAPACITY, EXPIRY))

    def make_layer(self, env):
        from asgi_amqp import AMQPChannelLayer
        layer = AMQPChannelLayer(url=env.url, prefix=env.prefix, capacity=CAPACITY,
                                 expiry=EXPIRY, management_url=env.management_url)
        topology = layer.topology
        for channel in asgi_trials.ALL_CHANNELS:
            env.admin.track_queue(topology.channel_queue(channel))
            env.admin.track_queue(topology.marker_queue(GROUP, channel))
            env.admin.track_exchange(topology.member_exchange(channel))
        env.admin.track_exchange(topology.group_exchange(GROUP))
        # The layer's shared objects (declared by its dead-letter worker).
        env.admin.track_queue(topology.dead_letter_queue)
        env.admin.track_exchange(topology.dead_letter_exchange)
        env.admin.track_exchange(topology.group_router)
        return layer

    def make_keeper(self, env):
        return LayerKeeper(self.layer, env.admin)

    def versions(self):
        import asgi_amqp
        return {"asgi_amqp": asgi_amqp.__version__, "pika": pika.__version__}

    def scenario_memory(self, env, ops):
        options = env.options

        def run(_ops):
            worker = remote.Worker(sys.executable, "layer memory worker")
            try:
                reply = worker.request({"cmd": "setup", "layer": "amqp", "config": {
                    "url": env.url, "prefix": env.prefix + "-mem",
                    "management_url": env.management_url}})
                for queue in (reply.get("cleanup") or {}).get("queues", []):
                    env.admin.track_queue(queue)
                for exchange in (reply.get("cleanup") or {}).get("exchanges", []):
                    env.admin.track_exchange(exchange)
                reply = worker.request(
                    {"cmd": "round", "scenario": "memory", "ops": options.memory_to,
                     "options": {"to": options.memory_to, "step": options.memory_step}},
                    on_progress=getattr(options, "memory_progress", None))
                return RoundResult.from_dict(reply["result"])
            finally:
                worker.close()

        return Trial(run=run)


@register_contestant
class InMemoryContestant(ASGILayerContestant):
    name = "inmemory"
    description = ("asgiref.inmemory.ChannelLayer(capacity=%d), in this process; its "
                   "receive(block=True) does not wait, so it sits out (g)" % CAPACITY)
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
    description = ("asgi_redis.RedisChannelLayer 1.4.3 (capacity=%d, expiry=%d) on a local "
                   "redis-server, in a worker process of its own virtualenv "
                   "(benchmarks/.venv-redis: redis 2.10.6, msgpack 1.x installed over "
                   "msgpack-python, deserialize with raw=False)" % (CAPACITY, EXPIRY))
    remote = True

    def __init__(self):
        self.worker = None
        self.scenarios = []
        self._versions = {}

    def setup(self, env):
        options = env.options
        if not getattr(options, "redis_url", None):
            raise remote.WorkerError(getattr(options, "redis_reason", None) or "no Redis")
        python = getattr(options, "redis_python", None) or remote.ensure_redis_venv()
        self.worker = remote.Worker(python, "asgi-redis worker")
        reply = self.worker.request({"cmd": "setup", "layer": "redis", "config": {
            "redis_url": options.redis_url, "prefix": env.prefix + ":"}})
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
    description = ("pika BlockingConnection; publish: confirm_delivery() + "
                   "basic_publish(mandatory=True), one confirm per message; "
                   "receive: basic_get(auto_ack=False) + basic_ack; msgpack on both ends; "
                   "group: a confirmed publish to a fanout exchange bound to 100 queues")

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

        return Trial(op, prepare=lambda: env.admin.purge(queue),
                     finish=lambda: _check_sent(env, queue, ops))

    def _get(self, queue):
        method, _properties, body = self.getter.basic_get(queue, auto_ack=False)
        if method is None:
            return False
        msgpack.unpackb(body, raw=False)
        self.getter.basic_ack(method.delivery_tag)
        return True

    def scenario_receive(self, env, ops):
        queue = self.queue(env, RECEIVE_CHANNEL)
        return Trial(lambda _i: self._get(queue), prepare=lambda: self.fill(env, queue, ops),
                     finish=lambda: _check_left(env, queue, ops))

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

        return Trial(op, prepare=lambda: self.fill(env, full, ops),
                     finish=lambda: _check_left(env, full, ops))

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
            return ["%d of %d queues do not hold %d messages" % (len(short), len(queues), ops)
                    ] if short else []

        trial = Trial(op, prepare=prepare, finish=finish)
        return trial


@register_contestant
class RawPikaAsyncContestant(_RawBase):
    """A publisher that keeps up to WINDOW messages unconfirmed: the ceiling."""

    name = "raw-pika-async"
    WINDOW = 256
    description = ("pika BlockingConnection, publisher confirms handled asynchronously "
                   "(Channel.confirm_delivery callback on the underlying channel), up to "
                   "%d unconfirmed messages in flight, one thread; the sample is each "
                   "message's publish-to-ack time" % WINDOW)

    def setup(self, env):
        super(RawPikaAsyncContestant, self).setup(env)
        self.channel = self.connection.channel()
        self.outstanding = collections.OrderedDict()  # tag -> index in the round
        self.ends = None
        self.acked = None
        self.next_tag = 1
        ready = []
        self.channel._impl.confirm_delivery(ack_nack_callback=self._on_confirm,
                                            callback=lambda frame: ready.append(frame))
        while not ready:
            self.connection.process_data_events(time_limit=0.1)

    def _on_confirm(self, frame):
        method = frame.method
        now = time.perf_counter_ns()
        ack = method.NAME == "Basic.Ack"
        if method.multiple:
            tags = [t for t in self.outstanding if t <= method.delivery_tag]
        else:
            tags = [method.delivery_tag] if method.delivery_tag in self.outstanding else []
        for tag in tags:
            index = self.outstanding.pop(tag)
            self.ends[index] = now
            self.acked[index] = ack

    def _run(self, env, queue, ops):
        perf = time.perf_counter_ns
        env.admin.purge(queue)
        starts = [0] * ops
        self.ends = [0] * ops
        self.acked = [False] * ops
        publish = self.channel.basic_publish
        process = self.connection.process_data_events
        window = self.WINDOW
        errors = []
        begin = perf()
        i = 0
        deadline = time.monotonic() + 60
        while i < ops or self.outstanding:
            while i < ops and len(self.outstanding) < window:
                body = msgpack.packb(MESSAGE, use_bin_type=True)
                # Registered before the publish: BlockingChannel.basic_publish
                # may read and dispatch this very message's ack before it returns.
                self.outstanding[self.next_tag] = i
                self.next_tag += 1
                starts[i] = perf()
                publish("", queue, body, PROPERTIES)
                i += 1
            process(time_limit=0)
            if len(self.outstanding) >= window or i >= ops:
                process(time_limit=0.001)
            if time.monotonic() > deadline:
                errors.append("%d confirms missing after 60 s" % len(self.outstanding))
                self.outstanding.clear()
                break
        wall = (perf() - begin) / 1e9
        durations = [max(0, e - s) if e else 0 for s, e in zip(starts, self.ends)]
        result = RoundResult(ops, wall, starts, durations, list(self.acked), errors, None)
        result.problems = _check_sent(env, queue, ops)
        return result

    def scenario_send(self, env, ops):
        queue = self.queue(env, SEND_CHANNEL)
        return Trial(run=lambda ops: self._run(env, queue, ops))

    scenario_send_8t = scenario_send


@register_contestant
class RawPikaConsumeContestant(_RawBase):
    name = "raw-pika-consume"
    PREFETCH = 100
    description = ("pika BlockingConnection, basic_consume (prefetch %d) through the consume() "
                   "generator, one basic_ack per message; round trip: a confirmed publish on "
                   "another channel of the same connection; wake-up: the sender has its own "
                   "connection" % PREFETCH)

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
            env, queue, lambda state: (lambda _i: self._take(state)),
            prepare=lambda: self.fill(env, queue, ops),
            finish=lambda: _check_left(env, queue, ops))

    def scenario_roundtrip(self, env, ops):
        queue = self.queue(env, ROUNDTRIP_CHANNEL)
        publish = self.publisher.basic_publish

        def factory(state):
            def op(_i):
                publish("", queue, msgpack.packb(MESSAGE, use_bin_type=True), PROPERTIES,
                        mandatory=True)
                return self._take(state)
            return op

        return self._consume_trial(env, queue, factory,
                                   prepare=lambda: env.admin.purge(queue))

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

        trial = self._consume_trial(env, queue, lambda state: None,
                                    prepare=lambda: env.admin.purge(queue),
                                    sender_init=sender_init, sender_close=sender_close)
        trial.receive = lambda _i: self._take(trial.state)
        return trial
