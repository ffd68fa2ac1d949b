"""The dead-letter worker: group expiry and dropping members whose messages expire.

It runs on its own thread with its own ``BlockingConnection``, so it never
delays callers; the workers of every layer process share the one dead-letter
queue, so each event is handled once. What arrives there:

* a **lease** that ended: its stamp's binding is removed from the group
  exchange; a later ``group_add``'s binding lives on, with its own lease.
* a channel message that **expired**: its channel leaves all its groups. A
  normal channel's member exchange is deleted, with every binding; a
  process-local channel's bindings are found through the management API
  (else they stay until their leases end) and removed, and a drop notice
  tells its process (``local_groups``).
* a **notice** that expired unread in a process-local queue: sent back while
  it still means something, so the process, reading again, knows its members.
* a message at a quorum queue's **delivery limit**: the layer's own nacks
  can reach it, so it is sent back to the end of its queue with what is left
  of its ``expiry``, and logged; if expired or refused, logged as dropped.

Broker facts:

* the group exchange is auto-delete and goes with its last binding
  (``test_a_group_deleted_when_it_emptied_can_be_joined_again``);
* RabbitMQ 4.0 dead-letters a quorum queue's message at its 21st delivery
  (``test_a_message_given_back_25_times_is_still_received``);
* ``x-delivery-limit`` cannot raise it: a new argument makes existing queues'
  declares fail (406, ``test_a_receive_from_a_queue_with_another_expiry``),
  and ``-1``, 4.0's "no limit", is a limit of 0 on 3.10.8;
* a 404 closes only its channel, so topology changes run on a second one.

Events are collected by the consumer callback, handled after
``process_data_events`` returns, then acked. The loop reconnects with backoff
after any error. A dead-letter queue with other settings cannot be fixed by
retrying: it is logged once at ERROR, kept in ``mismatch``, and checked again
every ``MISMATCH_RECHECK`` seconds.

The worker thread owns the connection, its channels and ``_dropped``;
``ready`` and ``mismatch`` are read by other threads.
"""

import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, cast

import pika
import pika.connection
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from .. import channel_names, naming
from ..errors import BrokerOperationError, QueueSettingsMismatch, settings_mismatch
from ..urls import describe_parameters
from .futures import wait_seconds

logger = logging.getLogger(__name__)

THREAD_NAME = "asgi_amqp-deadletters"

POLL_SECONDS = 0.2
MISMATCH_RECHECK = 60.0  # seconds between checks of a dead-letter queue with other settings
PREFETCH = 50
DELIVERY_LIMIT = "delivery_limit"  # x-death reason: a quorum queue's delivery limit

Headers = Mapping[str, Any]  # an AMQP table: the broker's x-death, the layer's asgi-* headers
Delivery = Tuple[pika.spec.Basic.Deliver, pika.spec.BasicProperties, bytes]


class DeadLetterWorker(object):
    def __init__(
        self,
        parameters: Iterable[pika.connection.Parameters],
        topology: naming.Topology,
        name: str = THREAD_NAME,
        max_backoff: float = 2.0,
        bindings_to: Optional[Callable[[str], List[Dict[str, Any]]]] = None,
    ) -> None:
        self._parameters = list(parameters)
        self._topology = topology
        self._name = name
        self._max_backoff = max_backoff
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._connection: Optional[pika.BlockingConnection] = None
        self._inbox: List[Delivery] = []
        self._actions: Optional[BlockingChannel] = None
        self._republish: Optional[BlockingChannel] = None  # a confirming channel
        self._bindings_to = bindings_to  # the management API's, or None
        self._dropped: Dict[str, float] = {}  # process-local channel -> monotonic time
        self._attempt = 0
        self.ready = threading.Event()
        # The dead-letter queue exists with other settings.
        self.mismatch: Optional[QueueSettingsMismatch] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        seconds = wait_seconds(timeout)  # a limit, checked before anything stops
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(seconds)
            if self._thread.is_alive():
                logger.warning("dead-letter worker did not stop within %.1f s", timeout)

    # -- the worker thread ---------------------------------------------------

    def _run(self) -> None:
        self._attempt = 0
        while not self._stop.is_set():
            parameters = self._parameters[self._attempt % len(self._parameters)]
            try:
                self._serve(parameters)
            except QueueSettingsMismatch as exc:
                self.ready.clear()
                self._settings_differ(exc)
            except Exception as exc:  # the thread must never die silently
                self.ready.clear()
                self._attempt += 1
                delay = min(self._max_backoff, 0.1 * 2 ** min(self._attempt, 10))
                # Retries at DEBUG: a process waiting for its broker would log one
                # every few seconds.
                logger.log(
                    logging.WARNING if self._attempt == 1 else logging.DEBUG,
                    "dead-letter worker: %s (%s); retrying in %.1f s",
                    _describe_error(exc),
                    describe_parameters(parameters),
                    delay,
                )
                self._stop.wait(delay)
            finally:
                self._close_connection()

    def _settings_differ(self, mismatch: QueueSettingsMismatch) -> None:
        """Report the mismatch once, then check again every ``MISMATCH_RECHECK``."""
        if self.mismatch is None or str(self.mismatch) != str(mismatch):
            logger.error(
                "dead-letter worker cannot run: %s. Group expiry does not run in this "
                "process until then; checked again every %.0f s",
                mismatch,
                MISMATCH_RECHECK,
            )
        else:
            logger.debug("dead-letter worker: still %s", mismatch)
        self.mismatch = mismatch
        self._stop.wait(MISMATCH_RECHECK)

    def _serve(self, parameters: pika.connection.Parameters) -> None:
        connection = self._connection = pika.BlockingConnection(parameters)
        events = connection.channel()
        try:
            self._declare_dead_letter_queue(events)
        except pika.exceptions.ChannelClosedByBroker as exc:
            error = BrokerOperationError(exc.reply_code, exc.reply_text)
            raise settings_mismatch(error, self._topology.explain_mismatch) from None
        if self.mismatch is not None:
            logger.warning("dead-letter worker: the dead-letter queue is usable again")
            self.mismatch = None
        events.basic_qos(prefetch_count=PREFETCH)
        events.basic_consume(self._topology.dead_letter_queue, self._collect)
        self._actions = connection.channel()
        self._attempt = 0
        self.ready.set()
        while not self._stop.is_set():
            # pika takes seconds as a float; types-pika says int.
            connection.process_data_events(time_limit=POLL_SECONDS)  # type: ignore[arg-type]
            batch, self._inbox = self._inbox, []
            for method, properties, body in batch:
                self._handle(properties, body)
                # A Deliver always carries its tag; types-pika makes every field Optional.
                events.basic_ack(cast(int, method.delivery_tag))

    def _declare_dead_letter_queue(self, channel: BlockingChannel) -> None:
        topology = self._topology
        # types-pika's ExchangeType has no members mypy sees; pika takes the names.
        channel.exchange_declare(topology.dead_letter_exchange, "fanout", durable=True)  # type: ignore[arg-type]
        channel.queue_declare(
            topology.dead_letter_queue,
            durable=True,
            arguments=topology.dead_letter_queue_arguments(),
        )
        channel.queue_bind(topology.dead_letter_queue, topology.dead_letter_exchange)
        channel.exchange_declare(topology.group_router, "direct", durable=True)  # type: ignore[arg-type]

    def _collect(
        self,
        _channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        self._inbox.append((method, properties, body))

    def _close_connection(self) -> None:
        self._republish = None
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception:
                logger.debug("dead-letter worker: error closing connection", exc_info=True)

    # -- events ---------------------------------------------------------------

    def _handle(self, properties: pika.spec.BasicProperties, body: bytes) -> None:
        headers: Headers = properties.headers or {}
        deaths: List[Headers] = headers.get("x-death") or []
        reason = _text(deaths[0].get("reason")) if deaths else ""
        if reason == DELIVERY_LIMIT:
            self._give_back(properties, body, deaths[0])
            return
        if reason != "expired":
            return
        kind = _text(headers.get(naming.KIND_HEADER))
        try:
            if kind == naming.LEASE_KIND:
                self._end_lease(headers)
            elif kind in naming.NOTICE_KINDS:
                self._renew_notice(properties, body, deaths[0])
            else:
                self._drop_channel(headers, deaths)
        except pika.exceptions.ChannelClosedByBroker as exc:
            # Already gone; only the actions channel is lost.
            logger.debug("dead-letter worker: %s", exc)
            self._actions = self._connected().channel()

    def _give_back(
        self, properties: pika.spec.BasicProperties, body: bytes, death: Headers
    ) -> None:
        """Send a message that reached its queue's delivery limit back there."""
        queue = _text(death.get("queue"))
        channel = self._topology.channel_of_queue(queue)
        if not channel:
            return
        sent_at = properties.timestamp
        left = self._topology.expiry
        if isinstance(sent_at, int) and sent_at > 0:
            left -= max(0.0, time.time() - sent_at)
        count = death.get("count")
        if left <= 0:
            logger.warning(
                "a message of %s reached its quorum queue's delivery limit (%s times) "
                "after its expiry; dropped",
                channel,
                count,
            )
            return
        original: Headers = properties.headers or {}
        headers = {
            key: value
            for key, value in original.items()
            if not key.startswith("x-")  # the broker's own: x-death, x-delivery-count
        }
        again = pika.BasicProperties(
            delivery_mode=properties.delivery_mode,
            content_type=properties.content_type,
            message_id=properties.message_id,
            timestamp=properties.timestamp,
            headers=headers or None,
            expiration=str(max(1, int(left * 1000))),
        )
        try:
            self._confirming().basic_publish("", queue, body, again, mandatory=True)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as exc:
            logger.warning(
                "a message of %s reached its quorum queue's delivery limit and its queue "
                "did not take it back (%s); dropped",
                channel,
                type(exc).__name__,
            )
            return
        logger.warning(
            "a message of %s reached its quorum queue's delivery limit (delivered %s "
            "times); sent back to the end of its queue",
            channel,
            count,
        )

    def _renew_notice(
        self, properties: pika.spec.BasicProperties, body: bytes, death: Headers
    ) -> None:
        """Send an expired notice back to its process's queue while it matters."""
        headers: Headers = properties.headers or {}
        queue = _text(death.get("queue"))
        if _text(headers.get(naming.KIND_HEADER)) == naming.JOIN_KIND:
            ends = headers.get(naming.LEASE_ENDS_HEADER)
            until = ends / 1000.0 if isinstance(ends, int) else 0.0
        else:
            sent_at = properties.timestamp if isinstance(properties.timestamp, int) else 0
            until = sent_at + self._topology.group_expiry + self._topology.lease_slice
        if time.time() >= until or not self._topology.channel_of_queue(queue):
            return
        again = pika.BasicProperties(
            message_id=properties.message_id,
            timestamp=properties.timestamp,
            headers={key: value for key, value in headers.items() if not key.startswith("x-")},
        )
        try:
            self._confirming().basic_publish("", queue, body, again, mandatory=True)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as exc:
            # Full, or gone with its process: nobody will read it.
            logger.debug("an expired notice for %s was not renewed: %s", queue, exc)

    def _confirming(self) -> BlockingChannel:
        if self._republish is None or not self._republish.is_open:
            self._republish = self._connected().channel()
            self._republish.confirm_delivery()
        return self._republish

    def _connected(self) -> pika.BlockingConnection:
        """Events are handled only while the worker has one."""
        if self._connection is None:
            raise RuntimeError("dead-letter worker: an event handled without a connection")
        return self._connection

    def _topology_channel(self) -> BlockingChannel:
        """The channel for topology changes, opened by ``_serve``."""
        if self._actions is None:
            raise RuntimeError("dead-letter worker: an event handled without a channel")
        return self._actions

    def _end_lease(self, headers: Headers) -> None:
        group = _text(headers.get(naming.GROUP_HEADER))
        channel = _text(headers.get(naming.MEMBER_HEADER))
        stamp = _text(headers.get(naming.LEASE_HEADER))
        if not group or not channel or not stamp.isdigit():
            logger.warning("dead-letter worker: a lease names no group, member or stamp; ignored")
            return
        topology = self._topology
        group_exchange = topology.group_exchange(group)
        member, arguments = topology.membership_binding(channel, int(stamp))
        logger.debug("lease %s of %s in %s ended", stamp, channel, group)
        self._topology_channel().exchange_unbind(
            destination=member, source=group_exchange, routing_key="", arguments=arguments
        )

    def _drop_channel(self, headers: Headers, deaths: List[Headers]) -> None:
        channel = _text(headers.get(naming.CHANNEL_HEADER)) or self._channel_from_deaths(deaths)
        if not channel:
            return
        logger.debug("message expired in %s: dropping it from its groups", channel)
        if channel_names.is_process_local(channel):
            self._drop_local_member(channel)
        else:
            self._topology_channel().exchange_delete(self._topology.member_exchange(channel))

    def _drop_local_member(self, channel: str) -> None:
        """Unbind a process-local channel from every group, and tell its process.

        Once per ``expiry`` per channel, though each of its expired messages comes here.
        """
        now = time.monotonic()
        if now - self._dropped.get(channel, -1e9) < self._topology.expiry:
            return
        if len(self._dropped) > 10000:
            self._dropped.clear()
        self._dropped[channel] = now
        topology = self._topology
        queue = topology.channel_queue(channel)
        member = topology.member_exchange(channel_names.non_local_name(channel))
        bindings: List[Dict[str, Any]] = []
        if self._bindings_to is not None:
            try:
                bindings = self._bindings_to(member)
            except Exception as exc:  # no management API: the leases end them
                logger.debug("dead-letter worker: bindings to %s unknown: %s", member, exc)
        for binding in bindings:
            source = str(binding.get("source", ""))
            arguments = binding.get("arguments") or {}
            if not topology.group_of_exchange(source):
                continue
            if topology.member_of_binding(member, "exchange", arguments) != channel:
                continue
            self._topology_channel().exchange_unbind(
                destination=member, source=source, routing_key="", arguments=arguments
            )
        notice = pika.BasicProperties(
            headers={naming.KIND_HEADER: naming.DROP_KIND, naming.MEMBER_HEADER: channel}
        )
        self._topology_channel().basic_publish("", queue, b"", notice)

    def _channel_from_deaths(self, deaths: List[Headers]) -> Optional[str]:
        """A normal channel whose message expired, from its x-death history."""
        channel = self._topology.channel_of_queue(_text(deaths[0].get("queue")))
        if channel and not channel.endswith("!"):
            return channel
        return None


def _describe_error(exc: BaseException) -> str:
    """The exception's class, and the broker's reply if any (a 403: docs/permissions.rst)."""
    code = getattr(exc, "reply_code", None)
    if code is None:
        return type(exc).__name__
    return "%s %s %s" % (type(exc).__name__, code, getattr(exc, "reply_text", ""))


def _text(value: object) -> str:
    """A header's text: bytes decoded; "" for a missing one or one that is not text."""
    if isinstance(value, bytes):
        return value.decode("utf8", "replace")
    return value if isinstance(value, str) else ""
