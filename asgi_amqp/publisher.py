"""Confirmed, mandatory publishing, pipelined across all callers.

Every publish is confirmed by the broker; many callers' publishes are in
flight at once on one channel, so throughput is bounded by the broker and
not by one round trip per caller. The outcome handed back is one of:

``ACKED``
    the broker has the message;
``NACKED``
    a queue refused it (``x-overflow: reject-publish`` on a full queue);
``RETURNED``
    it was unroutable: for a channel send this means the queue does not
    exist (yet, or any more), and the caller declares it and publishes again.

The broker sends basic.return before the ack of the same message, matched
here through the ``message_id`` property the layer gives each message.
"""

import collections
import logging

from .channels import ChannelUser
from .errors import BrokerConnectionError

logger = logging.getLogger(__name__)

ACKED, NACKED, RETURNED = "acked", "nacked", "returned"

Publish = collections.namedtuple(
    "Publish", "pending exchange routing_key body properties mandatory"
)


class Publisher(ChannelUser):
    name = "publish"

    def __init__(self, connection):
        self._queue = collections.deque()
        self._outstanding = collections.OrderedDict()  # delivery tag -> Publish
        self._returned_ids = set()
        self._next_tag = 1
        super(Publisher, self).__init__(connection)

    def setup(self, channel, done):
        self._next_tag = 1
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=done)

    def on_ready(self):
        while self._queue and self.ready:
            self._send(self._queue.popleft())

    def publish(self, request):
        if self.ready:
            self._send(request)
        else:
            self._queue.append(request)

    def _send(self, request):
        if not request.pending.wanted:
            return
        self.channel.basic_publish(
            request.exchange,
            request.routing_key,
            request.body,
            request.properties,
            mandatory=request.mandatory,
        )
        self._outstanding[self._next_tag] = request
        self._next_tag += 1

    def _on_return(self, _channel, _method, properties, _body):
        if properties.message_id:
            self._returned_ids.add(properties.message_id)

    def _on_confirm(self, frame):
        method = frame.method
        acked = method.NAME == "Basic.Ack"
        for tag in self._settled_tags(method.delivery_tag, method.multiple):
            request = self._outstanding.pop(tag)
            outcome = ACKED if acked else NACKED
            message_id = request.properties.message_id
            if message_id in self._returned_ids:
                self._returned_ids.discard(message_id)
                outcome = RETURNED
            request.pending.resolve(outcome)

    def _settled_tags(self, delivery_tag, multiple):
        if not multiple:
            return [delivery_tag] if delivery_tag in self._outstanding else []
        tags = []
        for tag in self._outstanding:  # ascending: tags are issued in order
            if tag > delivery_tag:
                break
            tags.append(tag)
        return tags

    def on_lost(self, reply_code, reply_text):
        error = BrokerConnectionError(
            "the publishing channel closed (%s %s) before the broker confirmed; "
            "the message may or may not have been delivered" % (reply_code, reply_text)
        )
        for request in self._outstanding.values():
            request.pending.fail(error)
        self._outstanding.clear()
        self._returned_ids.clear()

    def fail_all(self, error):
        for request in list(self._outstanding.values()) + list(self._queue):
            request.pending.fail(error)
        self._outstanding.clear()
        self._queue.clear()
