"""A small pika helper for the benchmark's untimed housekeeping.

Purging, counting and deleting queues happens on this connection, never on a
contestant's own, so housekeeping cannot disturb what is measured. Every
queue or exchange a contestant creates is registered with ``track_*`` and
deleted by ``delete_tracked`` at the end of the run, whatever happened.
``LayerKeeper`` does an AMQPChannelLayer's housekeeping on such a
connection, in the harness's process and in worker processes alike.
"""

import logging
import threading
import time

import msgpack
import pika
import pika.exceptions

from .asgi_trials import ROOMS, Keeper
from .scenarios import MESSAGE


class _QuietWhileBusy(logging.Filter):
    """Drop pika's "Channel.Close (404)" warnings caused by our own passive
    declares and purges (only on the thread doing housekeeping, only while it
    does); the layer's own warnings, on its own threads, still show."""

    def __init__(self):
        super(_QuietWhileBusy, self).__init__()
        self.busy_thread = None

    def filter(self, record):
        return not (record.thread == self.busy_thread and "NOT_FOUND" in record.getMessage())


_QUIET = _QuietWhileBusy()
logging.getLogger("pika.channel").addFilter(_QUIET)


def connection_parameters(url):
    """pika parameters for the benchmark's own connections. Heartbeats are off:
    these connections sit idle while other contestants run, and a blocking
    connection only answers heartbeats when it is called."""
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 5
    parameters.heartbeat = 0
    return parameters


class Admin(object):
    def __init__(self, url):
        self.connection = pika.BlockingConnection(connection_parameters(url))
        self._channel = self.connection.channel()
        self.queues = []
        self.exchanges = []

    # -- facts ------------------------------------------------------------------

    @property
    def server_properties(self):
        return dict(self.connection._impl.server_properties or {})

    def server_version(self):
        props = self.server_properties
        return "%s %s" % (_text(props.get("product", "RabbitMQ")), _text(props.get("version", "?")))

    # -- queues -------------------------------------------------------------------

    def _run(self, method, *args, **kwargs):
        """Run one RPC; a channel-level error (404) reopens the channel and returns None."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        _QUIET.busy_thread = threading.get_ident()
        try:
            return getattr(self._channel, method)(*args, **kwargs)
        except pika.exceptions.ChannelClosedByBroker:
            self._channel = self.connection.channel()
            return None
        finally:
            _QUIET.busy_thread = None

    def depth(self, queue):
        """Ready messages in ``queue``, or None if it does not exist."""
        frame = self._run("queue_declare", queue, passive=True)
        return None if frame is None else frame.method.message_count

    def wait_depth(self, queue, expected, timeout=10.0):
        """Poll until ``queue`` holds ``expected`` ready messages; the last depth seen."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.depth(queue)
            if seen == expected or time.monotonic() > deadline:
                return seen
            self.connection.sleep(0.01)

    def purge(self, queue):
        self._run("queue_purge", queue)

    def declare(self, queue, arguments):
        self._run("queue_declare", queue, durable=True, arguments=arguments)
        self.track_queue(queue)

    def publish(self, queue, body, properties):
        """An unconfirmed publish to ``queue`` (for untimed fills)."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        self._channel.basic_publish("", queue, body, properties)

    def exchange_declare(self, exchange, exchange_type):
        self._run("exchange_declare", exchange, exchange_type=exchange_type, durable=True)
        self.track_exchange(exchange)

    def bind(self, queue, exchange, routing_key=""):
        self._run("queue_bind", queue, exchange, routing_key=routing_key)

    def depths(self, queues):
        """Ready messages in each of ``queues`` (None for one that does not exist)."""
        return [self.depth(queue) for queue in queues]

    def delete_many(self, queues=(), exchanges=()):
        """Delete ``queues`` and ``exchanges`` (gone already is fine), pipelined:
        every delete sent with nowait, then one synchronous call. True if the
        channel stayed open."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        impl = self._channel._impl  # pika: callback=None sends nowait=True
        for queue in queues:
            impl.queue_delete(queue, callback=None)
        for exchange in exchanges:
            impl.exchange_delete(exchange, callback=None)
        return self._run("basic_qos", prefetch_count=0) is not None

    # -- clean-up -------------------------------------------------------------------

    def track_queue(self, name):
        if name not in self.queues:
            self.queues.append(name)

    def track_exchange(self, name):
        if name not in self.exchanges:
            self.exchanges.append(name)

    def delete_tracked(self):
        """Delete every tracked object; returns (queues deleted, exchanges deleted)."""
        queues = exchanges = 0
        for queue in self.queues:
            if self._run("queue_delete", queue) is not None:
                queues += 1
        for exchange in self.exchanges:
            if self._run("exchange_delete", exchange) is not None:
                exchanges += 1
        self.queues, self.exchanges = [], []
        return queues, exchanges

    def close(self):
        if self.connection.is_open:
            self.connection.close()


class LayerKeeper(Keeper):
    """Housekeeping for an AMQPChannelLayer on a housekeeping connection
    (``Admin``): queue names from the layer's ``topology``, passive declares
    for counts, ``queue.purge``, unconfirmed publishes for fills.
    ``admin`` is an ``Admin``, or a URL for one opened at first use (so that
    the memory scenario's process holds nothing but the layer)."""

    def __init__(self, layer, admin):
        super(LayerKeeper, self).__init__(layer)
        self._admin = admin
        self.properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack"
        )
        self.body = msgpack.packb(MESSAGE, use_bin_type=True)
        self.counter = 0

    @property
    def admin(self):
        if isinstance(self._admin, str):
            self._admin = Admin(self._admin)
        return self._admin

    def close(self):
        if not isinstance(self._admin, str):
            self._admin.close()

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
        # A process-local channel's messages name it (one queue per process).
        properties.headers = {"asgi-channel": channel} if "!" in channel else None
        for _ in range(count):
            self.counter += 1
            properties.message_id = "fill.%d" % self.counter
            self.admin.publish(queue, self.body, properties)

    def check_memberships(self, pairs, present):
        return check_markers(self.admin, self.layer.topology, pairs, present)

    def forget(self, pairs):
        forget_memberships(self.admin, self.layer.topology, pairs)


def check_markers(admin, topology, pairs, present):
    """Each membership's marker queue (``topology.marker_queue``) must hold its
    one marker if ``present``, and must not exist otherwise."""
    depths = admin.depths([topology.marker_queue(group, channel) for group, channel in pairs])
    if present:
        wrong = sum(1 for depth in depths if depth != 1)
        what = "have no marker queue holding one marker"
    else:
        wrong = sum(1 for depth in depths if depth is not None)
        what = "still have a marker queue"
    return ["%d of %d memberships %s" % (wrong, len(pairs), what)] if wrong else []


def forget_memberships(admin, topology, pairs):
    """Delete what ``pairs`` (group, process-local channel) made: marker queues,
    member queues and member exchanges (the group exchanges are auto-delete)."""
    channels = sorted({channel for _group, channel in pairs})
    admin.delete_many(
        [topology.marker_queue(group, channel) for group, channel in pairs]
        + [topology.local_member_queue(channel) for channel in channels],
        [topology.member_exchange(channel) for channel in channels],
    )


def layer_objects(topology, channels, group):
    """(queues, exchanges) an AMQPChannelLayer with ``topology`` creates for
    the benchmark's ``channels`` and ``group``, its shared objects included."""
    queues = [topology.channel_queue(c) for c in channels]
    queues += [topology.marker_queue(group, c) for c in channels]
    queues.append(topology.dead_letter_queue)
    exchanges = [topology.member_exchange(c) for c in channels]
    exchanges += [
        topology.group_exchange(group),
        topology.dead_letter_exchange,
        topology.group_router,
    ]
    exchanges += [topology.group_exchange(room) for room in ROOMS]
    return queues, exchanges


def _text(value):
    return value.decode("utf8", "replace") if isinstance(value, bytes) else str(value)
