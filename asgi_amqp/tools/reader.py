"""Reading a prefix's channel queues with manual acks, for the command line.

The layer's own ``receive`` takes a message off its queue before it decodes
it, and drops a body it cannot decrypt: right for a worker, wrong for an
operator's tool, which must never lose what it cannot read. ``QueueReader``
uses its own pika ``BlockingConnection`` and takes each message with
``basic.get`` unacked, so the caller decides: ``ack`` once a message was
decoded and printed, ``requeue`` to put it back where it was. Messages left
unacked when the reader closes go back too, in their order.

Names and decoding are the layer's own (``naming.Topology``,
``serialization.Serializer``), so a process-local channel's messages carry
their full channel name, and encrypted messages are read with the same keys.
The reader never declares a channel queue to read it: a queue that does not
exist is simply empty, and one that exists is read whatever its arguments.
"""

import logging
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, cast

import pika
import pika.connection
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from .. import channel_names, naming
from ..errors import BrokerConnectionError, BrokerOperationError, ChannelFull
from ..serialization import Serializer, UndecodableMessage
from ..urls import describe_parameters

logger = logging.getLogger(__name__)

NOT_FOUND = 404
FERNET_TOKEN_START = b"gAAAAA"  # version byte 0x80 and a timestamp, in URL-safe base64

__all__ = ["Fetched", "QueueReader", "UndecodableMessage"]


class Fetched(object):
    """One message taken unacked from ``queue``."""

    __slots__ = ("queue", "tag", "properties", "body")

    def __init__(
        self, queue: str, tag: int, properties: pika.spec.BasicProperties, body: bytes
    ) -> None:
        self.queue = queue
        self.tag = tag
        self.properties = properties
        self.body = body

    @property
    def headers(self) -> Dict[str, Any]:
        return dict(self.properties.headers or {})

    @property
    def republished(self) -> bool:
        """A copy the layer sent again after a lost confirm: its original may exist too."""
        return naming.REPUBLISHED_HEADER in self.headers


class QueueReader(object):
    """A connection of its own with confirms, reading and moving channel messages."""

    def __init__(
        self,
        parameters: Sequence[pika.connection.Parameters],
        topology: naming.Topology,
        serializer: Serializer,
        encrypted: bool = False,
    ) -> None:
        self.topology = topology
        self._serializer = serializer
        self._encrypted = encrypted
        self._connection = self._connect(list(parameters))
        # Messages are taken, acked and published on one channel; a probe
        # that fails (404, 406) closes its channel, so probes have their own,
        # where the tags of the messages taken are never lost with it.
        self._channel = self._open_channel()
        self._control = self._connection.channel()
        self._known: Set[str] = set()  # queues known to exist

    # -- connection --------------------------------------------------------------

    @staticmethod
    def _connect(parameters: List[pika.connection.Parameters]) -> pika.BlockingConnection:
        where = ", ".join(describe_parameters(p) for p in parameters)
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.ProbableAuthenticationError:
            from ..errors import AuthenticationError

            raise AuthenticationError("the broker at %s refused the credentials" % where) from None
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise BrokerConnectionError("%s: %s" % (where, type(exc).__name__)) from None

    def _open_channel(self) -> BlockingChannel:
        channel = self._connection.channel()
        channel.confirm_delivery()
        return channel

    def _reopen(self) -> None:
        """A channel error (404, 406) closes the AMQP channel: carry on on a new one."""
        if not self._channel.is_open:
            self._channel = self._open_channel()
        if not self._control.is_open:
            self._control = self._connection.channel()

    def close(self) -> None:
        """Close the connection; the broker puts every unacked message back."""
        try:
            if self._connection.is_open:
                self._connection.close()
        except pika.exceptions.AMQPError:
            pass

    def __enter__(self) -> "QueueReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def sleep(self, seconds: float) -> None:
        """Wait, servicing heartbeats."""
        self._connection.sleep(seconds)

    # -- reading -----------------------------------------------------------------

    def queue_of(self, channel: str) -> str:
        """The queue behind a receive name (``foo!`` for a process-local queue)."""
        channel_names.check_channel_name(channel, receive=True)
        return self.topology.channel_queue(channel)

    def queues_of(self, channel: str) -> List[str]:
        """The queue behind a receive name, and an ordered channel's shards that exist."""
        queue = self.queue_of(channel)
        return [queue] + [q for q in self.topology.shard_queues(channel) if self.exists(q)]

    def get(self, queue: str) -> Optional[Fetched]:
        """The next message of ``queue``, unacked; None when it is empty or does not exist."""
        if queue not in self._known and not self.exists(queue):
            return None
        try:
            method, properties, body = self._channel.basic_get(queue, auto_ack=False)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen()  # deleted meanwhile: what this channel held goes back
            self._known.discard(queue)
            if exc.reply_code == NOT_FOUND:
                return None
            raise BrokerOperationError(exc.reply_code, exc.reply_text) from None
        if method is None:
            return None
        # A GetOk comes with its tag, properties and body (bytes): types-pika
        # makes them Optional, and the body a str.
        tag = cast(int, method.delivery_tag)
        return Fetched(queue, tag, cast(pika.spec.BasicProperties, properties), cast(bytes, body))

    def decode(self, fetched: Fetched) -> Tuple[str, Dict[str, Any]]:
        """(channel, message), or UndecodableMessage saying why not."""
        channel = self.topology.channel_of_delivery(fetched.queue, fetched.headers)
        if not channel:
            raise UndecodableMessage("it names no process-local channel")
        try:
            return channel, self._serializer.loads(fetched.body)
        except UndecodableMessage:
            if not self._encrypted and fetched.body.startswith(FERNET_TOKEN_START):
                raise UndecodableMessage(
                    "it looks encrypted, and no symmetric_encryption_keys were given "
                    "(--symmetric-encryption-key, or the application's settings)"
                ) from None
            raise

    def ack(self, fetched: Fetched) -> None:
        self._channel.basic_ack(fetched.tag)

    def requeue(self, fetched: Fetched) -> None:
        """Put one message back where it was."""
        self._channel.basic_nack(fetched.tag, requeue=True)

    def requeue_all(self) -> None:
        """Put every unacked message back, in their order."""
        self._channel.basic_nack(0, multiple=True, requeue=True)

    # -- moving -----------------------------------------------------------------

    def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists (a passive declare, which never changes it)."""
        try:
            self._control.queue_declare(queue, passive=True)
            self._known.add(queue)
            return True
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen()
            if exc.reply_code == NOT_FOUND:
                return False
            raise BrokerOperationError(exc.reply_code, exc.reply_text) from None

    def purge(self, queue: str) -> Optional[int]:
        """Delete the messages ready in ``queue``: how many, or None if it does not exist.

        Messages taken unacked by a consumer are not ready, and stay."""
        try:
            frame = self._control.queue_purge(queue)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen()
            if exc.reply_code == NOT_FOUND:
                return None
            raise BrokerOperationError(exc.reply_code, exc.reply_text) from None
        return cast(int, frame.method.message_count)

    def publish(self, channel: str, fetched: Fetched) -> None:
        """Send ``fetched``'s body to ``channel`` and wait for the broker's confirm.

        The body is moved as it is (encrypted or not); the headers name the
        new channel. A queue that does not exist is declared with the
        configured arguments, as the layer's ``send`` does. Raises
        ChannelFull when the broker refuses the message.
        """
        queue = self._send_queue(channel, fetched)
        if queue not in self._known and not self.exists(queue):
            self._declare(channel, queue)
        properties = self._properties_for(channel, fetched.properties)
        if naming.is_shard_queue(queue):
            properties.delivery_mode = 2  # a socket's frames are persistent (naming)
        for attempt in range(2):
            try:
                self._channel.basic_publish(
                    "", queue, fetched.body, properties=properties, mandatory=True
                )
                return
            except pika.exceptions.UnroutableError:
                if attempt:
                    break
                self._declare(channel, queue)
            except pika.exceptions.NackError:
                raise ChannelFull("channel %s is full" % channel) from None
        raise BrokerOperationError(NOT_FOUND, "%s vanished while sending to it" % queue)

    def _send_queue(self, channel: str, fetched: Fetched) -> str:
        """Where the layer's ``send`` puts ``fetched`` for ``channel``: an ordered
        channel's frame goes to its socket's shard (a body that cannot be read
        to the channel's own queue)."""
        if not self.topology.shard_queues(channel):
            return self.topology.channel_queue(channel)
        try:
            _, message = self.decode(fetched)
        except UndecodableMessage:
            return self.topology.channel_queue(channel)
        return self.topology.send_queue(channel, message)

    def _declare(self, channel: str, queue: str) -> None:
        try:
            self._control.queue_declare(
                queue, durable=True, arguments=self.topology.queue_arguments(channel, queue)
            )
            self._known.add(queue)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen()
            raise BrokerOperationError(exc.reply_code, exc.reply_text) from None

    @staticmethod
    def _properties_for(
        channel: str, original: pika.spec.BasicProperties
    ) -> pika.spec.BasicProperties:
        headers = {
            key: value
            for key, value in (original.headers or {}).items()
            if not key.startswith("x-")
            and key not in (naming.CHANNEL_HEADER, naming.REPUBLISHED_HEADER)
        }
        if channel_names.is_process_local(channel):
            headers[naming.CHANNEL_HEADER] = channel
        return pika.BasicProperties(
            delivery_mode=original.delivery_mode or 1,  # persistent stays persistent
            content_type=original.content_type,
            message_id=original.message_id,
            timestamp=original.timestamp,
            headers=headers or None,
        )
