"""Taking messages off the broker: ``basic_get`` for non-blocking receives.

A receive names several queues. Each queue is declared first if this
connection has not used it within half its ``x-expires`` lease (a declare,
a get or a consume renews the lease, so a queue used that recently still
exists), which keeps a 404 from closing the channel in the common case; a
404 that happens anyway (the queue was flushed) counts as empty.

Messages are acknowledged only once the caller has taken them (see
``futures.Pending``); one the caller abandoned is put back with a nack.
"""

import collections
import logging
import time

from pika import spec

from .admin import broker_call_error
from .channels import ChannelUser
from .errors import BrokerConnectionError, BrokerOperationError

logger = logging.getLogger(__name__)

NOT_FOUND = 404


class Delivery(collections.namedtuple("Delivery", "queue headers body redelivered message_id")):
    """A message as it came off the broker, decoded later by the caller."""


class HandedOff(object):
    """Ids of messages recently handed to callers of this process.

    An ack is fire-and-forget: if the connection drops right after a message
    was handed over, the ack may never reach the broker, which then
    redelivers the message (flagged ``redelivered``) on the next connection.
    Checking redelivered messages against this log keeps such a message
    from being handed over twice. Other processes cannot see this log; see
    the README's delivery guarantees. Only acks in flight when a connection
    drops can come back, so a few thousand recent ids are plenty; a larger
    log only costs memory.
    """

    def __init__(self, size=10000):
        self._size = size
        self._ids = collections.OrderedDict()

    def add(self, message_id):
        if message_id:
            self._ids[message_id] = None
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)

    def is_duplicate(self, method, properties):
        return method.redelivered and properties.message_id in self._ids


class Liveness(object):
    """Which queues this connection knows to exist, from its own recent use."""

    def __init__(self):
        self._until = {}

    def alive(self, queue):
        return self._until.get(queue, 0) > time.monotonic()

    def touch(self, queue, arguments):
        lease_ms = (arguments or {}).get("x-expires")
        if lease_ms:
            self._until[queue] = time.monotonic() + lease_ms / 2000.0

    def forget(self, queue=None):
        if queue is None:
            self._until.clear()
        else:
            self._until.pop(queue, None)


class _GetRequest(object):
    __slots__ = ("pending", "queues", "index")

    def __init__(self, pending, queues):
        self.pending = pending
        self.queues = queues  # list of (queue, arguments), in the order to try
        self.index = 0


class Getter(ChannelUser):
    """Serves non-blocking receives, one request at a time."""

    name = "get"

    def __init__(self, connection, liveness, handed_off, consumers):
        self._liveness = liveness
        self._handed_off = handed_off
        self._consumers = consumers
        self._queue = collections.deque()
        self._current = None
        super(Getter, self).__init__(connection)

    def setup(self, channel, done):
        channel.add_callback(self._on_empty, [spec.Basic.GetEmpty], one_shot=False)
        done()

    def get(self, pending, queues):
        self._queue.append(_GetRequest(pending, queues))
        self._next()

    def on_ready(self):
        self._next()

    def _next(self):
        while self._current is None and self.ready and self._queue:
            request = self._queue.popleft()
            if not request.pending.wanted:
                continue
            # A consumer of an earlier blocking receive may hold one already.
            if self._consumers.take_held(request.pending, [q for q, _ in request.queues]):
                continue
            self._current = request
            self._try_queue()

    def _try_queue(self):
        request = self._current
        if request.index >= len(request.queues):
            self._consumers.settle([q for q, _ in request.queues], self._after_settle)
            return
        queue, arguments = request.queues[request.index]
        try:
            if self._liveness.alive(queue):
                self.channel.basic_get(queue, self._on_message, auto_ack=False)
            else:
                self.channel.queue_declare(
                    queue, durable=True, arguments=arguments, callback=self._on_declared
                )
        except Exception as exc:  # connection gone, or a name pika cannot encode
            logger.debug("receive from %s failed", queue, exc_info=True)
            self._current = None
            request.pending.fail(broker_call_error(exc, "receive"))
            self._next()

    def _after_settle(self):
        """Nothing was in the queues; a consumer may have been pushed one meanwhile."""
        request, self._current = self._current, None
        if not self._consumers.take_held(request.pending, [q for q, _ in request.queues]):
            request.pending.resolve(None)
        self._next()

    def _on_declared(self, frame):
        queue, arguments = self._current.queues[self._current.index]
        self._liveness.touch(queue, arguments)
        if frame.method.message_count == 0:
            self._on_empty(frame)
        else:
            self.channel.basic_get(queue, self._on_message, auto_ack=False)

    def _on_empty(self, _frame):
        request = self._current
        queue, arguments = request.queues[request.index]
        self._liveness.touch(queue, arguments)
        request.index += 1
        self._try_queue()

    def _on_message(self, channel, method, properties, body):
        request = self._current
        queue, arguments = request.queues[request.index]
        self._liveness.touch(queue, arguments)
        if self._handed_off.is_duplicate(method, properties):
            channel.basic_ack(method.delivery_tag)
            self._try_queue()  # same queue again
            return
        delivery = Delivery(queue, properties.headers or {}, body, method.redelivered,
                            properties.message_id)
        if request.pending.resolve(delivery):
            self._handed_off.add(properties.message_id)
            channel.basic_ack(method.delivery_tag)
        else:
            channel.basic_nack(method.delivery_tag, requeue=True)
        self._current = None
        self._next()

    def on_lost(self, reply_code, reply_text):
        request = self._current
        if request is None:
            return
        self._current = None
        if reply_code == NOT_FOUND:
            # The queue was deleted under us (e.g. flushed): it is empty.
            self._liveness.forget(request.queues[request.index][0])
            request.index += 1
            self._queue.appendleft(request)
        elif reply_code is None or reply_code >= 500 or reply_code == 320:
            request.pending.fail(BrokerConnectionError(
                "connection lost during receive (%s %s)" % (reply_code, reply_text)))
        else:
            # e.g. 406: the queue exists with other arguments (another expiry).
            request.pending.fail(BrokerOperationError(reply_code, reply_text))

    def fail_all(self, error):
        for request in ([self._current] if self._current else []) + list(self._queue):
            request.pending.fail(error)
        self._current = None
        self._queue.clear()
