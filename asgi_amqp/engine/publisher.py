"""Confirmed, mandatory publishing, pipelined across all callers on one channel.

Many callers' publishes are in flight at once, so throughput is bounded by
the broker, not by one round trip per caller. The outcome is ``ACKED``,
``NACKED`` (a full queue) or ``RETURNED`` (unroutable: for a channel send,
its queue does not exist, so the caller declares it and publishes again).

A publish in doubt when its connection drops is sent again on the next,
marked with ``REPUBLISHED_HEADER``: under ``enforce_ordering`` a lost
``websocket.receive`` frame stalls its socket for good, and a reader drops
a copy of what it has (``deliveries.HandedOff``). That is exact for a
channel with one reader; with competing readers a copy can be received
twice (the docs' "Broker outages" weigh it). While an alarm lasts,
``block`` fails every publish at once with ``BrokerBlocked``.

* a ``basic.return`` comes before the ack of its message, matched by ``message_id``
  (test_statistics.py::test_messages_count_is_what_the_queue_took_in);
* a full queue with ``x-overflow: reject-publish`` nacks
  (test_send_many.py::test_a_full_channel_is_channel_full_for_its_items_only);
* a publish in doubt may or may not be in its queue: the broker routes what it
  read before the close (test_no_loss_through_broker_faults.py::test_connection_churn);
* a refused publish (403) closes the channel
  (test_least_privilege.py::test_monitoring_reads_statistics_and_nothing_else);
* so does one over the broker's size limit (406), undelivered
  (test_bad_input.py::test_a_raised_limit_carries_twenty_megabytes).
"""

import collections
import logging
import re
from typing import TYPE_CHECKING, Any, Deque, List, Optional, Set

import pika
import pika.channel

from ..errors import (
    ACCESS_REFUSED,
    BrokerBlocked,
    BrokerConnectionError,
    BrokerOperationError,
    MessageTooLarge,
)
from ..naming import REPUBLISHED_HEADER
from .futures import Pending
from .reopening_channel import ReopeningChannel
from .work import Work

if TYPE_CHECKING:
    from .session import Session

logger = logging.getLogger(__name__)

ACKED, NACKED, RETURNED = "acked", "nacked", "returned"


class Publish(Work):
    """One publish a caller waits for, run by the I/O thread with ``publish(session)``.

    ``maybe_delivered``: in doubt, so the next connection sends a marked copy.
    ``written`` is set just before the I/O thread checks ``wanted``: a caller
    that gave up and reads False knows the broker never got it.
    """

    __slots__ = (
        "exchange",
        "routing_key",
        "body",
        "properties",
        "mandatory",
        "maybe_delivered",
        "written",
    )

    def __init__(
        self,
        pending: Pending,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        mandatory: bool,
    ) -> None:
        super().__init__(pending)
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.properties = properties
        self.mandatory = mandatory
        self.maybe_delivered = False
        self.written = False

    def __call__(self, session: "Session") -> None:
        session.publisher.publish(self)

    def marked_properties(self) -> pika.BasicProperties:
        """The properties of a copy: the same message id, plus the republished mark."""
        original = self.properties
        headers = dict(original.headers or {})
        headers[REPUBLISHED_HEADER] = 1
        return pika.BasicProperties(
            delivery_mode=original.delivery_mode,
            content_type=original.content_type,
            message_id=original.message_id,
            headers=headers,
            timestamp=original.timestamp,
            expiration=original.expiration,
        )


class Publisher(object):
    """The publishing connection's one channel, in confirm mode (I/O thread only)."""

    def __init__(self, connection: pika.SelectConnection) -> None:
        self._queue: Deque[Publish] = collections.deque()  # waiting for the channel
        # delivery tag -> Publish, in tag order
        self._outstanding: "collections.OrderedDict[int, Publish]" = collections.OrderedDict()
        self._returned_ids: Set[str] = set()
        self._next_tag = 1
        self._blocked: Optional[str] = None  # the broker's reason while it blocks publishing
        self._channel = ReopeningChannel(
            connection, "publish", self._setup, self._on_ready, self._on_lost
        )
        self._channel.open()

    def _setup(self, channel: pika.channel.Channel, done: Any) -> None:
        self._next_tag = 1
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=done)

    def _on_ready(self) -> None:
        while self._queue and self._channel.ready:
            self._send(self._queue.popleft())

    def block(self, reason: str) -> None:
        """The broker blocks publishing: fail what waits and, until ``unblock``, what comes."""
        self._blocked = reason
        waiting = list(self._outstanding.values()) + list(self._queue)
        self._queue.clear()  # the confirms of the outstanding ones stay expected
        for request in waiting:
            request.pending.fail(
                _blocked_error(
                    reason,
                    "%s was already on its way when the broker announced the block, "
                    "and may still be delivered once the alarm clears"
                    % request.pending.description,
                )
            )

    def unblock(self) -> None:
        self._blocked = None

    def publish(self, request: Publish) -> None:
        if self._blocked is not None:
            request.pending.fail(
                _blocked_error(self._blocked, "%s was not sent" % request.pending.description)
            )
        elif self._channel.ready:
            self._send(request)
        else:
            self._queue.append(request)

    def _send(self, request: Publish) -> None:
        request.written = True  # before ``wanted``: see ``Publish.written``
        if not request.pending.wanted:
            return
        properties = request.properties
        if request.maybe_delivered:
            properties = request.properties = request.marked_properties()
        channel = self._channel.current
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: publishes run only once it is ready")
        channel.basic_publish(
            request.exchange,
            request.routing_key,
            request.body,
            properties,
            mandatory=request.mandatory,
        )
        self._outstanding[self._next_tag] = request
        self._next_tag += 1

    def _on_return(
        self, _channel: Any, _method: Any, properties: pika.BasicProperties, _body: bytes
    ) -> None:
        if properties.message_id:
            self._returned_ids.add(properties.message_id)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = method.NAME == "Basic.Ack"
        for tag in self._confirmed_tags(method.delivery_tag, method.multiple):
            request = self._outstanding.pop(tag)
            outcome = ACKED if acked else NACKED
            message_id = request.properties.message_id
            if message_id in self._returned_ids:
                self._returned_ids.discard(message_id)
                outcome = RETURNED
            request.pending.resolve(outcome)

    def _confirmed_tags(self, delivery_tag: int, multiple: bool) -> List[int]:
        """The outstanding tags one confirm answers."""
        if not multiple:
            return [delivery_tag] if delivery_tag in self._outstanding else []
        tags = []
        for tag in self._outstanding:  # ascending: tags are issued in order
            if tag > delivery_tag:
                break
            tags.append(tag)
        return tags

    def _on_lost(self, reply_code: Optional[int], reply_text: Optional[str]) -> None:
        if reply_code == ACCESS_REFUSED:
            # A 403: the broker was reached, and refused the message.
            error: Exception = BrokerOperationError(
                reply_code, reply_text, operation="basic_publish"
            )
        else:
            error = BrokerConnectionError(
                "the publishing channel closed (%s %s) before the broker confirmed; "
                "the message may or may not have been delivered" % (reply_code, reply_text)
            )
        too_large = _broker_size_limit(reply_code, reply_text)
        for request in self._outstanding.values():
            if too_large is not None and len(request.body) > too_large:
                request.pending.fail(
                    MessageTooLarge(
                        "the broker refused a message of %d bytes: its own limit "
                        "(max_message_size in rabbitmq.conf; 16 MiB by default since "
                        "RabbitMQ 4.0) is %d bytes. It was not delivered; raise the "
                        "broker's limit or lower the layer's max_message_size"
                        % (len(request.body), too_large)
                    )
                )
            else:
                request.pending.fail(error)
        self._outstanding.clear()
        self._returned_ids.clear()

    def shutdown(self) -> None:
        """Stop reopening the channel and listening on it."""
        self._channel.shutdown()

    def forget(self) -> None:
        """The connection dropped: what awaited a confirm is in doubt."""
        for request in self._outstanding.values():
            request.maybe_delivered = True
        self._outstanding.clear()
        self._returned_ids.clear()
        self._queue.clear()

    def fail_all(self, error: BaseException) -> None:
        for request in list(self._outstanding.values()) + list(self._queue):
            request.pending.fail(error)
        self._outstanding.clear()
        self._queue.clear()


PRECONDITION_FAILED = 406
_SIZE_REFUSAL = re.compile(r"message size \d+ is larger than configured max size (\d+)")


def _broker_size_limit(reply_code: Optional[int], reply_text: Optional[str]) -> Optional[int]:
    """The broker's message size limit if it closed the channel over it, else None."""
    if reply_code != PRECONDITION_FAILED:
        return None
    found = _SIZE_REFUSAL.search(reply_text or "")
    return int(found.group(1)) if found else None


def _blocked_error(reason: str, what: str) -> BrokerBlocked:
    return BrokerBlocked(
        "the broker blocks publishing because of a resource alarm (%s): %s. Receives "
        "still work; sends work again once the broker's alarm clears" % (reason, what),
        reason,
    )
