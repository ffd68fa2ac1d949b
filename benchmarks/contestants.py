"""The contestants: asgi_amqp's AMQPChannelLayer and raw pika.

``ASGILayerContestant`` works for any asgiref 1.x channel layer (asgi_redis,
asgiref.inmemory): it only calls ``send`` and ``receive``. A subclass says
how to empty a channel and count what it holds, untimed, for the checks.
"""

import msgpack
import pika

from .broker import connection_parameters
from .harness import Contestant, Trial, register_contestant
from .scenarios import MESSAGE

SEND_CHANNEL = "bench.send"
RECEIVE_CHANNEL = "bench.receive"
CAPACITY = 1000000
EXPIRY = 60


class ASGILayerContestant(Contestant):
    """Any asgiref 1.x BaseChannelLayer; subclasses provide ``make_layer``."""

    def make_layer(self, env):
        raise NotImplementedError

    def setup(self, env):
        self.layer = self.make_layer(env)

    def teardown(self, env):
        close = getattr(self.layer, "close", None)
        if close is not None:
            close()

    # -- untimed housekeeping; override for a precise count -------------------

    def purge(self, env, channel):
        """Empty ``channel`` (default: receive until nothing comes back)."""
        while self.layer.receive([channel], block=False)[0] is not None:
            pass

    def depth(self, env, channel):
        """Messages waiting in ``channel``, or None if this contestant cannot tell."""
        return None

    def wait_depth(self, env, channel, expected):
        return self.depth(env, channel)

    # -- scenarios ----------------------------------------------------------------

    def scenario_send(self, env, ops):
        layer, channel = self.layer, SEND_CHANNEL

        def op(_i):
            layer.send(channel, MESSAGE)

        def finish():
            seen = self.wait_depth(env, channel, ops)
            self.purge(env, channel)
            if seen is not None and seen != ops:
                return ["%d messages confirmed but %s in the channel" % (ops, seen)]
            return []

        return Trial(op, prepare=lambda: self.purge(env, channel), finish=finish)

    def scenario_receive(self, env, ops):
        layer, channel = self.layer, RECEIVE_CHANNEL

        def prepare():
            self.purge(env, channel)
            for _ in range(ops):
                layer.send(channel, MESSAGE)
            seen = self.wait_depth(env, channel, ops)
            if seen is not None and seen != ops:
                raise RuntimeError("filled %s with %d messages, it holds %s" % (channel, ops, seen))

        def op(_i):
            got, message = layer.receive([channel], block=False)
            return got == channel and message is not None

        def finish():
            left = self.depth(env, channel)
            return ["%d messages left after %d receives" % (left, ops)] if left else []

        return Trial(op, prepare=prepare, finish=finish)


@register_contestant
class AMQPLayerContestant(ASGILayerContestant):
    name = "layer"
    description = ("asgi_amqp.AMQPChannelLayer(capacity=%d, expiry=%d), default options "
                   "(dead-letter worker on)" % (CAPACITY, EXPIRY))

    def make_layer(self, env):
        from asgi_amqp import AMQPChannelLayer
        layer = AMQPChannelLayer(url=env.url, prefix=env.prefix, capacity=CAPACITY,
                                 expiry=EXPIRY, management_url=env.management_url)
        topology = layer.topology
        for channel in (SEND_CHANNEL, RECEIVE_CHANNEL):
            env.admin.track_queue(topology.channel_queue(channel))
        # The layer's shared objects (declared by its dead-letter worker).
        env.admin.track_queue(topology.dead_letter_queue)
        env.admin.track_exchange(topology.dead_letter_exchange)
        env.admin.track_exchange(topology.group_router)
        return layer

    def versions(self):
        import asgi_amqp
        return {"asgi_amqp": asgi_amqp.__version__}

    def _queue(self, channel):
        return self.layer.topology.channel_queue(channel)

    def purge(self, env, channel):
        env.admin.purge(self._queue(channel))

    def depth(self, env, channel):
        return env.admin.depth(self._queue(channel))

    def wait_depth(self, env, channel, expected):
        return env.admin.wait_depth(self._queue(channel), expected)


@register_contestant
class RawPikaContestant(Contestant):
    """The floor: pika's BlockingConnection doing the same broker work by hand."""

    name = "raw-pika"
    description = ("pika BlockingConnection; publish: confirm_delivery() + "
                   "basic_publish(mandatory=True), one confirm per message; "
                   "receive: basic_get(auto_ack=False) + basic_ack; msgpack on both ends")

    def setup(self, env):
        self.connection = pika.BlockingConnection(connection_parameters(env.url))
        self.publisher = self.connection.channel()
        self.publisher.confirm_delivery()
        self.getter = self.connection.channel()
        self.filler = self.connection.channel()  # no confirms: untimed fills
        # Same arguments as the layer's channel queues, minus dead-lettering.
        self.arguments = {
            "x-max-length": CAPACITY,
            "x-overflow": "reject-publish",
            "x-message-ttl": EXPIRY * 1000,
            "x-expires": 2 * EXPIRY * 1000,
        }
        self.properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack")
        self.queues = {}
        for channel in (SEND_CHANNEL, RECEIVE_CHANNEL):
            queue = self.queues[channel] = "%s:raw:%s" % (env.prefix, channel)
            env.admin.declare(queue, self.arguments)

    def teardown(self, env):
        if self.connection.is_open:
            self.connection.close()

    def versions(self):
        return {"pika": pika.__version__}

    def scenario_send(self, env, ops):
        queue = self.queues[SEND_CHANNEL]
        publish, properties = self.publisher.basic_publish, self.properties

        def op(_i):
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            publish("", queue, body, properties, mandatory=True)

        def finish():
            seen = env.admin.wait_depth(queue, ops)
            env.admin.purge(queue)
            return [] if seen == ops else ["%d messages confirmed but %s in the queue" % (ops, seen)]

        return Trial(op, prepare=lambda: env.admin.purge(queue), finish=finish)

    def scenario_receive(self, env, ops):
        queue = self.queues[RECEIVE_CHANNEL]
        get, ack = self.getter.basic_get, self.getter.basic_ack

        def prepare():
            env.admin.purge(queue)
            body = msgpack.packb(MESSAGE, use_bin_type=True)
            for _ in range(ops):
                self.filler.basic_publish("", queue, body, self.properties)
            seen = env.admin.wait_depth(queue, ops)
            if seen != ops:
                raise RuntimeError("filled %s with %d messages, it holds %s" % (queue, ops, seen))

        def op(_i):
            method, _properties, body = get(queue, auto_ack=False)
            if method is None:
                return False
            msgpack.unpackb(body, raw=False)
            ack(method.delivery_tag)
            return True

        def finish():
            left = env.admin.depth(queue)
            return ["%d messages left after %d receives" % (left, ops)] if left else []

        return Trial(op, prepare=prepare, finish=finish)
