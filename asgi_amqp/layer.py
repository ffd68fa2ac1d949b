"""AMQPChannelLayer: the ASGI 1.0 channel layer API on RabbitMQ.

Each call validates its input in the caller's thread and goes to one of the
layer's parts, each built here with exactly what it needs and owning the state it
uses: ``sending.Sender`` (``send``, and every part's message properties),
``receiving.Receiver`` (``receive``, and ``receive_twisted`` through
``twisted_support``) and ``groups.Groups`` (the ``groups`` and ``flush``
extensions); ``pipeline`` sends many at once. They ask the broker through
``engine.Engine``, which runs each request on the I/O thread: no code here runs
there. Every broker object and its arguments come from ``naming.Topology``.
"""

import math
import os
import secrets
import string
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from asgiref.base_layer import BaseChannelLayer

from . import engine, naming, statistics, twisted_support
from .callers import Callers
from .channel_names import MAX_NAME_LENGTH, check_channel_name, check_group_name
from .engine import Engine
from .errors import ChannelFull, MessageTooLarge
from .groups import Groups
from .management import ManagementClient
from .pipeline import CHUNK, WINDOW, Report, SendPipeline, send_all
from .receiving import Receiver
from .sending import Sender
from .serialization import Message, Serializer
from .urls import management_url_for, parse_urls, redact, urls_from_hosts, vhost_of

DEFAULT_URL = "amqp://guest:guest@localhost:5672/%2F"
DEFAULT_MAX_MESSAGE_SIZE = 8 * 1024 * 1024
# Seconds a process waits for its first connection (docs/configuration.rst says why 60).
DEFAULT_FIRST_CONNECT_TIMEOUT = 60.0
_NAME_ALPHABET = string.ascii_letters + string.digits


class AMQPChannelLayer(BaseChannelLayer):
    """An ASGI 1.0 channel layer on RabbitMQ.

    :param url: AMQP URL, or a list of URLs (one per cluster node) tried in
        turn. Defaults to ``$AMQP_URL`` or ``amqp://guest:guest@localhost:5672/%2F``.
    :param expiry: seconds a message waits in a channel before it expires.
    :param group_expiry: seconds a group membership lasts without a new ``group_add``.
    :param capacity: default maximum number of messages waiting in a channel.
    :param channel_capacity: ``{pattern: capacity}``; glob strings or compiled regexes.
    :param prefix: prefix of every queue and exchange the layer creates; layers
        with different prefixes on one vhost never see each other's data.
    :param management_url: RabbitMQ management API; defaults to
        ``$AMQP_MANAGEMENT_URL``, else the first URL's host and credentials on
        port 15672. Needed by ``group_channels`` and ``flush``.
    :param receive_timeout: seconds a blocking ``receive`` waits before it
        returns ``(None, None)``.
    :param operation_timeout: seconds any other call waits for the broker
        before raising ``OperationTimeout``.
    :param max_message_size: largest encoded message accepted, in bytes.
    :param symmetric_encryption_keys: list of keys; messages are encrypted
        with the first (Fernet) and decrypted with any.
    :param linger: seconds a message pushed to this process for a blocking
        receive may wait for the next call before it is given back.
    :param consumer_idle_timeout: seconds after which an unused consumer is cancelled.
    :param consumer_prefetch: messages the broker may push to one consumer of
        this process before they are taken (16); more lets a worker's threads
        (``runworker --threads N``) overlap. A process-local channel's consumer
        always gets the whole window. Pushed messages do not count against
        ``capacity``, and go back after ``linger`` or if the process dies.
    :param max_consumers: consumers this process keeps at most (1000). Every
        channel received from gets one, non-blocking receives included, so that
        the next receive takes what was pushed; past this many, the one wanted
        longest ago is cancelled (daphne polls a reply channel per connection).
    :param queue_type: ``"classic"`` or ``"quorum"``: quorum channel queues
        survive the loss of a cluster node with their messages.
    :param dead_letter_worker: run the dead-letter worker in this process
        (group expiry, dropping expired members). At least one process
        sharing the prefix must run it.
    :param persistent: publish persistent messages (``delivery_mode`` 2), so
        that classic queues keep them through a broker restart, at the price of
        a disk write the confirm waits for; quorum queues keep every message
        anyway. Off by default, as ASGI 1.0 promises at most once: a restart of
        a classic queue's node then drops what waits.
    :param hosts: the node list under the name asgi_redis uses: a list of
        AMQP URLs, the same as a list in ``url``. asgi_redis's ``(host,
        port)`` pairs are refused with an error that names ``url``.
    :param ordered_channels: the channels whose messages with a ``reply_channel``
        and an integer ``order`` reach one receiving process at a time per reply
        channel, in order (ASGI 1.0's ``websocket.receive`` and
        ``websocket.disconnect``; see ``docs/topology.rst``). Normal channel names
        only; an empty list turns it off.
    :param first_connect_timeout: seconds a process that has never connected
        waits for the broker to come up (60); 0 never waits. A node that refuses
        or does not answer is waited for, as in an outage; refused credentials,
        an unknown vhost and TLS failures fail at once. Once it has passed,
        every call fails at once, naming the cause, until a connection opens.

    Its parts, which its methods call: ``sender`` (a ``sending.Sender``),
    ``receiver`` (a ``receiving.Receiver``) and ``groups`` (a ``groups.Groups``).
    """

    # Without I/O: every layer has a management URL, so "statistics" is always listed
    # (its calls raise ManagementAPIError when that API does not answer).
    extensions = ["groups", "flush", "send_many", "statistics"] + (
        ["twisted"] if twisted_support.AVAILABLE else []
    )

    ChannelFull = ChannelFull
    MessageTooLarge = MessageTooLarge

    def __init__(
        self,
        url: Union[None, str, Sequence[str]] = None,
        expiry: float = 60,
        group_expiry: float = 86400,
        capacity: int = 100,
        channel_capacity: Optional[Mapping[Any, int]] = None,
        prefix: str = "asgi",
        management_url: Optional[str] = None,
        receive_timeout: float = 5.0,
        operation_timeout: float = 10.0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        symmetric_encryption_keys: Optional[Sequence[Union[str, bytes]]] = None,
        linger: float = 0.25,
        consumer_idle_timeout: float = 30.0,
        consumer_prefetch: int = 16,
        max_consumers: int = 1000,
        dead_letter_worker: bool = True,
        queue_type: str = "classic",
        *,
        persistent: bool = False,
        hosts: Optional[Sequence[str]] = None,
        ordered_channels: Sequence[str] = naming.ORDERED_CHANNELS,
        first_connect_timeout: float = DEFAULT_FIRST_CONNECT_TIMEOUT,
    ) -> None:
        super(AMQPChannelLayer, self).__init__(
            expiry=expiry,
            group_expiry=group_expiry,
            capacity=capacity,
            channel_capacity=channel_capacity,
        )
        if hosts is not None:
            url = urls_from_hosts(hosts, url)
        url = url or os.environ.get("AMQP_URL") or DEFAULT_URL
        self._urls = [url] if isinstance(url, str) else list(url)
        self._parameters = parse_urls(self._urls)
        _positive("expiry", expiry)
        _positive("group_expiry", group_expiry)
        _positive("receive_timeout", receive_timeout)
        _positive("operation_timeout", operation_timeout)
        _positive("capacity", capacity)
        if (
            isinstance(first_connect_timeout, bool)
            or not isinstance(first_connect_timeout, (int, float))
            or not 0 <= first_connect_timeout < math.inf  # nan compares False
        ):
            raise ValueError(
                "first_connect_timeout must be a finite number of seconds, 0 or more, not %r"
                % (first_connect_timeout,)
            )
        if (
            isinstance(consumer_prefetch, bool)
            or not isinstance(consumer_prefetch, int)
            or not 1 <= consumer_prefetch <= 65535
        ):
            raise ValueError(
                "consumer_prefetch must be an integer from 1 to 65535, not %r"
                % (consumer_prefetch,)
            )
        if (
            isinstance(max_consumers, bool)
            or not isinstance(max_consumers, int)
            or max_consumers < 1
        ):
            raise ValueError("max_consumers must be a positive integer, not %r" % (max_consumers,))
        _positive("max_message_size", max_message_size)
        if not isinstance(persistent, bool):
            raise ValueError("persistent must be True or False, not %r" % (persistent,))
        for _pattern, value in self.channel_capacity:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    "channel_capacity values must be positive integers, not %r" % (value,)
                )
        self.topology = naming.Topology(
            prefix,
            expiry,
            group_expiry,
            self.get_capacity,
            queue_type=queue_type,
            ordered_channels=_ordered_channels(ordered_channels),
        )
        self._serializer = Serializer(max_message_size, symmetric_encryption_keys)
        self._management_url = (
            management_url
            or os.environ.get("AMQP_MANAGEMENT_URL")
            or management_url_for(self._urls[0])
        )
        if not self._management_url.startswith(("http://", "https://")):
            raise ValueError("management_url must be an http:// or https:// URL")
        # The management API's client, made on first use (callers' threads: two first
        # calls at once may each make one; the last made is kept).
        self._management: Optional[ManagementClient] = None
        # Each calling thread's kind, saying what its calls may wait for (each caller's
        # thread owns its own entry).
        self._callers = Callers()
        self._engine = Engine(
            self._parameters,
            self.topology,
            operation_timeout=operation_timeout,
            first_connect_timeout=first_connect_timeout,
            consumers=engine.ConsumerSettings(
                linger, consumer_idle_timeout, consumer_prefetch, max_consumers
            ),
            dead_letter_worker=dead_letter_worker,
            bindings_to=lambda exchange: self.management_client().exchange_bindings_to(exchange),
            caller=self._callers.kind,
        )
        # ChannelFull, undecodable and dropped group messages, counted by the parts,
        # read by the statistics (thread-safe, under its lock).
        self._stats = statistics.Counters()
        # The parts share the layer's engine, topology and serializer.
        # Sends, and the message properties of the other parts (callers' threads).
        self.sender = Sender(
            self._engine,
            self.topology,
            self._serializer,
            self._stats,
            operation_timeout,
            self.get_capacity,
            persistent,
            self._callers.kind,
        )
        # Receives (callers' threads).
        self.receiver = Receiver(
            self._engine,
            self.topology,
            self._serializer,
            self._stats,
            receive_timeout,
            self.get_capacity,
        )
        # Memberships, group sends and flush (callers' threads).
        self.groups = Groups(
            self.sender,
            self._engine,
            self.topology,
            self._stats,
            self.receiver.local_groups,
            self.management_client,
            expiry,
        )

    def __repr__(self) -> str:
        return "<%s %s prefix=%r>" % (
            type(self).__name__,
            ", ".join(redact(u) for u in self._urls),
            self.topology.prefix,
        )

    # -- lifecycle ------------------------------------------------------------

    def threads(self) -> List[threading.Thread]:
        """The threads this layer runs in this process (for monitoring)."""
        return self._engine.threads()

    def close(self) -> None:
        """Stop the I/O thread and the dead-letter worker; the layer is unusable afterwards."""
        self._engine.close()

    # -- the parts' settings ------------------------------------------------

    @property
    def operation_timeout(self) -> float:
        """Seconds any call but a blocking receive waits for the broker (the sender's)."""
        return self.sender.operation_timeout

    @operation_timeout.setter
    def operation_timeout(self, seconds: float) -> None:
        # Both owners: the sender's retries and alarm waits, the engine's waits for the
        # I/O thread. Checked as in the constructor: ``inf`` would make waits endless.
        _positive("operation_timeout", seconds)
        self.sender.operation_timeout = seconds
        self._engine.operation_timeout = seconds

    @property
    def receive_timeout(self) -> float:
        """Seconds a blocking ``receive`` waits (the receiver's)."""
        return self.receiver.timeout

    @receive_timeout.setter
    def receive_timeout(self, seconds: float) -> None:
        self.receiver.timeout = seconds

    # -- ASGI API -------------------------------------------------------------

    def send(self, channel: str, message: Message) -> None:
        self.sender.send(channel, message)

    def send_many(self, items: Iterable[Tuple[str, Message]]) -> List[Optional[BaseException]]:
        """Send every ``(channel, message)`` of ``items``, many in flight at once.

        The same promise as ``send`` for each message, without a broker round trip
        each; messages to one channel keep their order, and an invalid item is
        never published. Items are read as they are sent, so a generator of any
        length needs memory for the window (4096 messages) and the returned list.

        :returns: one error per item, in input order: None once the broker
            confirmed it, else the exception ``send`` would have raised
            (``ChannelFull``, a ``TypeError`` for an invalid name or message,
            ``MessageTooLarge``, a broker error).
        """
        return send_all(self, items, "channel")

    def send_pipeline(
        self,
        report: Report,
        keep_existing: bool = False,
        chunk: int = CHUNK,
        window: int = WINDOW,
    ) -> SendPipeline:
        """A ``pipeline.SendPipeline`` on this layer: what ``send_many``,
        ``send_group_many``, the command line's bulk mode and
        ``send_dataframe`` send through. ``report(tag, error, in_doubt)``
        is called for every message put, in order; ``keep_existing`` uses
        a queue that exists as it is (a tool sending for an application)."""
        return SendPipeline(self, self._engine, report, chunk, window, keep_existing)

    def receive(
        self, channels: Iterable[str], block: bool = False
    ) -> Tuple[Optional[str], Optional[Message]]:
        """ASGI's ``receive``: ``(channel, message)`` from one of ``channels``, or
        ``(None, None)``; with ``block`` it waits up to ``receive_timeout``. A thread
        that makes a blocking receive is a worker thread from then on: its other
        calls wait through an outage until the broker is back, as a runworker needs."""
        if block:
            self._callers.receives_blocking()
        return self.receiver.receive(channels, block)

    def receive_twisted(self, channels: Iterable[str]) -> Any:
        """Like ``receive(channels, block=True)`` but returns a Twisted Deferred."""
        return twisted_support.receive_twisted(self.receiver, channels)

    # -- groups and flush extensions ---------------------------------------------

    def group_add(self, group: str, channel: str) -> None:
        self.groups.group_add(group, channel)

    def group_discard(self, group: str, channel: str) -> None:
        self.groups.group_discard(group, channel)

    def group_channels(self, group: str) -> List[str]:
        return self.groups.group_channels(group)

    def send_group(self, group: str, message: Message) -> None:
        self.groups.send_group(group, message)

    def send_group_many(
        self, items: Iterable[Tuple[str, Message]]
    ) -> List[Optional[BaseException]]:
        """``send_many`` for ``(group, message)`` items: ``send_group`` for each."""
        return send_all(self, items, "group")

    def flush(self) -> None:
        """Delete every queue and exchange the layer made under its prefix.

        Only names of the layer's own kinds go; anything else under ``{prefix}:``,
        and every other prefix, stays. The shared dead-letter queue and exchange and
        the group router stay (emptied): other processes' workers depend on them.
        """
        self.groups.flush()

    # -- the rest of the API ------------------------------------------------------

    def new_channel(self, pattern: str) -> str:
        if not isinstance(pattern, str) or not pattern.endswith("?") or "!" in pattern:
            raise TypeError("new_channel pattern must end with '?', not %r" % (pattern,))
        check_group_name(pattern[:-1])  # the part before '?' has the group alphabet
        suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(12))
        name = pattern + suffix
        if len(name) > MAX_NAME_LENGTH:
            raise TypeError(
                "new_channel pattern %r is too long: the name must stay under "
                "100 characters with its 12-character suffix" % pattern
            )
        return name

    # -- statistics extension -------------------------------------------------

    def global_statistics(self) -> Dict[str, Any]:
        """ASGI ``statistics`` extension: figures for all channels of the prefix."""
        return statistics.global_statistics(self)

    def channel_statistics(self, channel: str) -> Dict[str, Any]:
        """ASGI ``statistics`` extension: figures for one channel (its queue)."""
        return statistics.channel_statistics(self, channel)

    def connection_statistics(self) -> Dict[str, Any]:
        """This process's view of its broker connection; asks the broker nothing.

        ``connected``
            whether the I/O thread has a connection now;
        ``outage_seconds``
            how long the current outage has lasted (0 while connected);
        ``connection_losses``
            connections lost since the layer started in this process;
        ``retried_operations``
            calls in flight at a loss that ran again on the next connection;
        ``republished``
            publishes whose confirm was lost with a connection, sent again marked
            so that their reader drops a copy (see the docs' "Broker outages");
        ``last_error``
            why the last connection was lost or refused, without credentials;
        ``undecodable_messages``
            messages taken and dropped as undecodable (not msgpack, not a dict,
            encrypted with an unknown key), each logged at WARNING with its channel;
        ``blocked``, ``blocked_reason``
            whether a resource alarm blocks this process's publishing now, and
            its reason ("low on memory", "low on disk"); a send waits for it
            within ``operation_timeout``, then raises ``BrokerBlocked`` (on
            daphne's reactor thread at once; see the docs' "Broker alarms");
        ``group_sends_dropped``
            ``send_group`` messages dropped, each logged at WARNING, because an
            alarm outlasted ``operation_timeout``, a member stayed full for 2 s,
            or a process-local member held ``capacity`` copies already.
        """
        figures = self._engine.connection_statistics()
        figures["undecodable_messages"] = self._stats.undecodable
        figures["group_sends_dropped"] = self._stats.group_sends_dropped
        return figures

    # -- helpers ----------------------------------------------------------------

    def management_client(self) -> ManagementClient:
        """The client of the broker's management API for this layer's vhost, made on
        first use: the statistics extension's source, and the tools' (``asgi-amqp top``)."""
        if self._management is None:
            self._management = ManagementClient(
                self._management_url, vhost_of(self._urls[0]), timeout=self.operation_timeout
            )
        return self._management

    # The base class's checks use loose regexes, and assert in valid_channel_names.
    def valid_channel_name(self, name: str, receive: bool = False) -> bool:
        check_channel_name(name, receive=receive)
        return True

    def valid_group_name(self, name: str) -> bool:
        check_group_name(name)
        return True

    def valid_channel_names(self, names: Iterable[str], receive: bool = False) -> bool:
        if isinstance(names, (str, bytes, dict)) or not hasattr(names, "__iter__"):
            raise TypeError("names must be a non-empty list")
        names = list(names)
        if not names:
            raise TypeError("names must be a non-empty list")
        for name in names:
            check_channel_name(name, receive=receive)
        return True


def _ordered_channels(channels: object) -> Tuple[str, ...]:
    """``ordered_channels`` checked: normal channel names only."""
    if isinstance(channels, (str, bytes)) or not isinstance(
        channels, (list, tuple, set, frozenset)
    ):
        raise ValueError("ordered_channels must be a list of channel names, not %r" % (channels,))
    for channel in channels:
        check_channel_name(channel)
        if "!" in channel or "?" in channel:
            raise ValueError(
                "ordered_channels takes normal channel names only, not %r" % (channel,)
            )
    return tuple(channels)


def _positive(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError("%s must be a positive number, not %r" % (name, value))
