"""Every name and argument the layer gives to broker objects, in one place.

All objects are durable; docs/topology.rst explains them for users.

``{prefix}:q:{channel}``
    a channel's queue (``foo!bar`` lives in ``foo!``'s, named in ``asgi-channel``).
    ``x-max-length`` = capacity, ``reject-publish``: ChannelFull from the nack
    (test_a_full_channel_is_channel_full_for_its_items_only). ``x-message-ttl`` = expiry,
    dead-lettered to drop the channel from its groups
    (test_message_expiry_drops_normal_member_from_all_groups). ``x-expires`` = 2 x expiry
    (test_queues_and_exchanges_go_away_after_their_ttls); an expiring queue's messages
    are not dead-lettered.
``{prefix}:q:{channel}#{shard}``
    ``ORDERED_SHARDS`` shards: a message with ``reply_channel`` and an integer ``order``
    goes to its reply channel's; ``x-single-active-consumer`` gives a socket's frames to
    one process at a time, in order
    (test_each_socket_reaches_one_worker_at_a_time_and_the_workers_share_them).
``{prefix}:groups``
    the router, a direct exchange keyed by group: a group nobody joined is unroutable,
    not a 404 that closes the channel (test_discard_of_unknown_member_and_group_is_harmless).
``{prefix}:g:{group}``
    a group's fanout exchange, bound from the router; auto-delete, it goes with its last
    membership (test_a_group_deleted_when_it_emptied_can_be_joined_again).
``{prefix}:m:{channel}``
    a *member exchange* (fanout, auto-delete, bound to the channel's queue). A *membership*
    is a binding to it from a group exchange naming its lease's stamp (``asgi-lease``).
    ``foo!...`` share ``m:foo!``, each binding naming its member (``asgi-member``), and the
    process copies a group message to its members (``local_groups``). An exchange, since
    ``exchange.unbind`` can be ``nowait`` and ``queue.unbind`` cannot (AMQP 0-9-1):
    ``group_discard`` takes one round trip.
``{prefix}:e:{milliseconds}``
    the lease queue of one ``group_expiry``: each ``group_add`` puts a lease message in it,
    dead-lettered when the lease ends, and the dead-letter worker removes that binding; a
    repeated ``group_add`` binds a later stamp, renewing without a lookup.
``{prefix}:dlx`` and ``{prefix}:dead-letters``
    the dead-letter exchange and the queue every process's dead-letter worker consumes
    from, competing, so each event is handled once.

ASGI names never hold ``:`` (``channel_names``), so the names above parse back.
"""

import math
import re
import time
import zlib
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple, Union

from . import errors
from .channel_names import is_process_local, non_local_name

SEPARATOR = ":"
# ``#`` is never part of an ASGI name, so a shard's channel parses back.
SHARD_MARK = "#"
# Channels 1.x's enforce_ordering parks a frame out of turn in "__wait__.<reply channel>".
_WAIT_QUEUE = SEPARATOR + "q" + SEPARATOR + "__wait__."
ORDERED_SHARDS = 16  # shards of one ordered channel
# ASGI 1.0's channels whose messages carry ``reply_channel`` and ``order``. Not
# ``websocket.connect``: any process may run it (enforce_ordering parks frames before it),
# from one queue whose capacity refuses a connect storm early (daphne answers 503).
ORDERED_CHANNELS = ("websocket.receive", "websocket.disconnect")
CHANNEL_HEADER = "asgi-channel"
GROUP_HEADER = "asgi-group"
KIND_HEADER = "asgi-kind"
MEMBER_HEADER = "asgi-member"  # a lease's or a notice's member channel
LEASE_HEADER = "asgi-lease"  # the lease's stamp (a binding argument too)
LEASE_ENDS_HEADER = "asgi-lease-ends"  # when a joining member's lease ends, in ms since the epoch
LEASE_KIND = "lease"  # a message of the lease queue
JOIN_KIND = "join"  # a notice to a process: its channel joined a group
LEAVE_KIND = "leave"  # a notice to a process: its channel left a group
DROP_KIND = "drop"  # a notice to a process: its channel left every group
NOTICE_KINDS = (JOIN_KIND, LEAVE_KIND, DROP_KIND)
# A lease's stamps cut group_expiry into this many slices: a membership lasts from
# group_expiry to (1 + 1/LEASE_SLICES) times it after its last group_add, in at most
# LEASE_SLICES + 1 bindings, which group_discard unbinds (``Topology.live_stamps``).
LEASE_SLICES = 4
# Seconds by which two processes' clocks may differ (a slice at most), each stamping by
# its own: group_discard unbinds the stamps such a clock may have bound.
CLOCK_SKEW = 300.0
# On a message sent again after its confirm was lost with its connection: the receiver
# drops it if it handed out the original. Not ``x-``: RabbitMQ 3.13+ strips those.
REPUBLISHED_HEADER = "asgi-republished"

_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,40}", re.ASCII)
# The kinds of ``{prefix}:{kind}:{name}`` and the shared ``{prefix}:{name}``: all that the
# layer creates, ``flush`` may delete and a permission pattern admits.
KINDS = ("q", "g", "m", "e")
SHARED_NAMES = ("groups", "dlx", "dead-letters")
QUEUE_TYPES = ("classic", "quorum")
# A full quorum queue admits publishes again once down to this share of x-max-length
# (test_a_quorum_queue_admits_again_at_its_readmission_mark).
QUORUM_READMIT = 0.8


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


class Topology(object):
    """Maps channels and groups onto queue and exchange names and arguments.

    Fixed once made: any thread may read it."""

    def __init__(
        self,
        prefix: str,
        expiry: float,
        group_expiry: float,
        capacity_for: Callable[[str], int],
        queue_type: str = "classic",
        ordered_channels: Tuple[str, ...] = ORDERED_CHANNELS,
    ) -> None:
        check_prefix(prefix)
        if queue_type not in QUEUE_TYPES:
            raise ValueError(
                "queue_type must be one of %s, not %r" % (", ".join(QUEUE_TYPES), queue_type)
            )
        self.queue_type = queue_type
        self.prefix = prefix
        self.expiry = expiry
        self.group_expiry = group_expiry
        self._capacity_for = capacity_for
        # Channels whose messages with a reply channel and an order go to shards.
        self.ordered_channels = frozenset(ordered_channels)
        # kind -> "{prefix}:{kind}:", made on first use (any thread: a dict's get and
        # set are atomic, and the same string is made by whoever races).
        self._heads: Dict[str, str] = {}

    def _name(self, kind: str, *parts: str) -> str:
        return SEPARATOR.join((self.prefix, kind) + parts)

    # -- names ------------------------------------------------------------

    @property
    def dead_letter_exchange(self) -> str:
        return self._name("dlx")

    @property
    def dead_letter_queue(self) -> str:
        return self._name("dead-letters")

    @property
    def group_router(self) -> str:
        return self._name("groups")

    def infrastructure(self) -> Set[str]:
        """Objects shared by all channels and groups; flush empties but keeps them."""
        return {self.dead_letter_exchange, self.dead_letter_queue, self.group_router}

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of this layer's objects: ``{prefix}:{kind}:...``
        of a known kind or a shared object. ``flush`` deletes nothing else."""
        head, separator, rest = name.partition(SEPARATOR)
        if head != self.prefix or not separator:
            return False
        if rest in SHARED_NAMES:
            return True
        kind, separator, tail = rest.partition(SEPARATOR)
        return kind in KINDS and bool(separator) and bool(tail)

    def channel_queue(self, channel: str) -> str:
        """The queue that holds messages for ``channel`` (``foo!bar`` -> ``foo!``)."""
        return self._name("q", non_local_name(channel))

    def shard_queue(self, channel: str, reply_channel: str) -> str:
        """The shard of ordered ``channel`` that holds ``reply_channel``'s messages."""
        shard = zlib.crc32(reply_channel.encode("utf8")) % ORDERED_SHARDS
        return "%s%s%d" % (self.channel_queue(channel), SHARD_MARK, shard)

    def shard_queues(self, channel: str) -> Tuple[str, ...]:
        """Every shard queue of ``channel``: none unless it is ordered."""
        if channel not in self.ordered_channels:
            return ()
        queue = self.channel_queue(channel)
        return tuple("%s%s%d" % (queue, SHARD_MARK, i) for i in range(ORDERED_SHARDS))

    def send_queue(self, channel: str, message: Any) -> str:
        """The queue a message for ``channel`` goes to: for an ordered channel's message
        with ``reply_channel`` and an integer ``order``, its reply channel's shard."""
        if channel in self.ordered_channels and isinstance(message, dict):
            reply, order = message.get("reply_channel"), message.get("order")
            if isinstance(reply, str) and isinstance(order, int) and not isinstance(order, bool):
                return self.shard_queue(channel, reply)
        return self.channel_queue(channel)

    def group_exchange(self, group: str) -> str:
        return self._name("g", group)

    def member_exchange(self, channel: str) -> str:
        return self._name("m", channel)

    @property
    def lease_queue(self) -> str:
        return self._name("e", str(_ms(self.group_expiry)))

    # -- leases -----------------------------------------------------------

    @property
    def lease_slice(self) -> float:
        """Seconds of one stamp: group_add calls within one share a binding."""
        return self.group_expiry / float(LEASE_SLICES)

    def lease_stamp(self, now: Optional[float] = None) -> int:
        """The stamp of a lease taken at ``now`` (seconds since the epoch)."""
        return int(math.floor((time.time() if now is None else now) / self.lease_slice))

    def lease_ends(self, stamp: int) -> float:
        """When the leases of ``stamp`` end: group_expiry after the end of its slice."""
        return (stamp + 1) * self.lease_slice + self.group_expiry

    def live_stamps(self, now: Optional[float] = None) -> range:
        """Every stamp whose lease has not ended at ``now`` by a clock up to
        ``CLOCK_SKEW`` (a slice at most) off this one's: usually ``LEASE_SLICES + 1``,
        one more near a slice's edge. A binding whose lease ended is the dead-letter
        worker's to remove."""
        now = time.time() if now is None else now
        skew = min(CLOCK_SKEW, self.lease_slice)
        first = self.lease_stamp(now - skew - self.group_expiry)
        last = self.lease_stamp(now + skew)
        return range(first, last + 1)

    def membership_binding(self, channel: str, stamp: int) -> Tuple[str, Dict[str, str]]:
        """``(member exchange, arguments)`` of one lease's binding from a group exchange:
        a process-local channel's is its process's (``m:foo!``), naming the member."""
        arguments = {LEASE_HEADER: str(stamp)}
        if is_process_local(channel):
            arguments[MEMBER_HEADER] = channel
            return self.member_exchange(non_local_name(channel)), arguments
        return self.member_exchange(channel), arguments

    def member_of_binding(
        self,
        destination: str,
        destination_type: Optional[str],
        arguments: Optional[Mapping[str, Any]],
    ) -> Optional[str]:
        """The channel a binding from a group exchange makes a member, or None: for a
        process's member exchange (``m:foo!``), the binding's ``asgi-member``."""
        if destination_type != "exchange":
            return None
        channel = self.channel_of_member_exchange(destination)
        if not channel or not channel.endswith("!"):
            return channel  # a normal channel
        member = (arguments or {}).get(MEMBER_HEADER)
        if isinstance(member, bytes):
            member = member.decode("utf8", "replace")
        if isinstance(member, str) and member.startswith(channel):
            return member
        return None

    # -- parsing names back -------------------------------------------------

    def _strip(self, kind: str, name: str) -> Optional[str]:
        head = self._heads.get(kind)
        if head is None:
            head = self._heads[kind] = self._name(kind) + SEPARATOR
        if name.startswith(head):
            return name[len(head) :]
        return None

    def channel_of_queue(self, queue: str) -> Optional[str]:
        """``{prefix}:q:foo`` -> ``foo`` (``foo!`` for process-local queues,
        and ``foo`` for a shard ``foo#3``)."""
        channel = self._strip("q", queue)
        return channel.partition(SHARD_MARK)[0] if channel else channel

    def channel_of_delivery(self, queue: str, headers: Mapping[str, Any]) -> Optional[str]:
        """The channel a message taken from ``queue`` was sent to, or None: for a
        process-local queue ``foo!``, the one its ``asgi-channel`` header names."""
        channel = self.channel_of_queue(queue)
        if not channel or not channel.endswith("!"):
            return channel
        prefix = channel
        channel = headers.get(CHANNEL_HEADER)
        if isinstance(channel, bytes):
            channel = channel.decode("utf8", "replace")
        if isinstance(channel, str) and channel.startswith(prefix):
            return channel
        return None

    def channel_of_member_exchange(self, exchange: str) -> Optional[str]:
        return self._strip("m", exchange)

    def group_of_exchange(self, exchange: str) -> Optional[str]:
        """``{prefix}:g:foo`` -> ``foo``."""
        return self._strip("g", exchange)

    # -- arguments --------------------------------------------------------

    def channel_queue_arguments(self, channel: str) -> Dict[str, Union[int, str]]:
        capacity = int(self._capacity_for(channel))
        arguments: Dict[str, Union[int, str]] = {
            "x-max-length": capacity,
            "x-overflow": "reject-publish",
            "x-message-ttl": _ms(self.expiry),
            "x-expires": _ms(max(2 * self.expiry, 1)),
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }
        if self.queue_type == "quorum":
            # A quorum queue's reject-publish admits one message more than
            # x-max-length (tests/test_cluster.py, test_quorum_queue_behaviour).
            arguments["x-max-length"] = capacity - 1
            arguments["x-queue-type"] = "quorum"
        return arguments

    def queue_arguments(self, channel: str, queue: str) -> Dict[str, Union[int, str]]:
        """The arguments of ``channel``'s queue or one of its shards."""
        arguments = self.channel_queue_arguments(channel)
        if is_shard_queue(queue):
            arguments["x-single-active-consumer"] = True
        return arguments

    def refusing_depth(self, channel: str) -> int:
        """The least depth at which ``channel``'s queue refuses a publish for its length:
        its capacity, or a full quorum queue's ``QUORUM_READMIT`` mark. A refusal from
        this depth up is the queue being full, not a node failing."""
        capacity = int(self._capacity_for(channel))
        if self.queue_type != "quorum":
            return capacity
        max_length = capacity - 1  # see channel_queue_arguments
        return max(1, int(QUORUM_READMIT * max_length) + 1)

    def lease_queue_arguments(self) -> Dict[str, str]:
        """No ``x-expires``: it would delete the queue with leases pending, whose
        bindings nobody would remove. Each lease message's own expiration is never
        shorter than an earlier one's, so they expire at the head in order."""
        arguments = {"x-dead-letter-exchange": self.dead_letter_exchange}
        if self.queue_type == "quorum":
            arguments["x-queue-type"] = "quorum"
        return arguments

    def dead_letter_queue_arguments(self) -> Dict[str, str]:
        if self.queue_type == "quorum":
            return {"x-queue-type": "quorum"}
        return {}

    # -- a queue that exists with other settings ----------------------------

    def explain_mismatch(
        self, queue: str, argument: str, existing: Any, requested: Any
    ) -> Optional[errors.MismatchDetails]:
        """``errors.MismatchDetails`` in the layer's terms (``x-max-length`` is
        ``capacity``) for a queue of this prefix, or None for another queue."""
        channel = self.channel_of_queue(queue)
        if channel:
            what = "channel %r (queue %r)" % (channel, queue)
            fix = (
                "use the same capacity, channel_capacity, expiry and queue_type in every "
                "process of prefix %r, or delete the queue (asgi-amqp flush) so that it is "
                "created again with these settings" % self.prefix
            )
            setting, convert = _CHANNEL_QUEUE_SETTINGS.get(argument, (argument, None))
            if setting == "capacity" and self.queue_type == "quorum":
                convert = _plus_one  # see channel_queue_arguments
        elif queue == self.dead_letter_queue:
            channel = None
            what = "the shared dead-letter queue %r" % queue
            fix = (
                "use the same queue_type in every process of prefix %r, or delete that "
                "queue while no process of the prefix runs (it holds pending group "
                "expiries); the next layer creates it again" % self.prefix
            )
            setting, convert = _CHANNEL_QUEUE_SETTINGS.get(argument, (argument, None))
        elif self._strip("e", queue):
            channel = None
            what = "the lease queue %r" % queue
            fix = (
                "use the same queue_type in every process of prefix %r, or delete that "
                "queue while no process of the prefix runs (it holds the pending ends "
                "of memberships)" % self.prefix
            )
            setting, convert = _CHANNEL_QUEUE_SETTINGS.get(argument, (argument, None))
        else:
            return None
        if convert is not None:
            existing, requested = convert(existing), convert(requested)
        return errors.MismatchDetails(what, setting, existing, requested, channel, fix)


def _seconds(ms: Any, per: int = 1) -> Any:
    if ms is None or not isinstance(ms, int):
        return ms
    seconds = ms / 1000.0 / per
    return int(seconds) if seconds == int(seconds) else seconds


def _plus_one(value: Any) -> Any:
    return value + 1 if isinstance(value, int) else value


def _queue_type(value: Any) -> Any:
    return value or "classic"


# argument -> (the layer's setting, raw value -> the setting's value)
_CHANNEL_QUEUE_SETTINGS: Dict[str, Tuple[str, Optional[Callable[[Any], Any]]]] = {
    "x-max-length": ("capacity", None),
    "x-message-ttl": ("expiry", _seconds),
    "x-expires": ("expiry", lambda ms: _seconds(ms, per=2)),
    "x-queue-type": ("queue_type", _queue_type),
}


def check_prefix(prefix: object) -> None:
    """Raise ValueError unless ``prefix`` is a valid layer prefix: letters, digits,
    ``-``, ``_`` and ``.``, never ``:``, a glob or a wildcard (``.`` is escaped in
    patterns), so no prefix's names start with another's ``{prefix}:``."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(
            "prefix must be 1-40 characters of letters, digits, '-', '_' or '.', not %r" % (prefix,)
        )


def is_shard_queue(queue: str) -> bool:
    """Whether ``queue`` is a shard of an ordered channel (``{prefix}:q:{channel}#{shard}``)."""
    return SHARD_MARK in queue


def keeps_order(queue: str) -> bool:
    """Whether ``queue`` holds what Channels' ``enforce_ordering`` cannot lose: a
    socket's frames (a shard) or those it parked out of turn (``__wait__.``).

    Their messages are persistent whatever the layer's ``persistent``: a classic
    queue loses transient ones at ``stop_app``, and one lost frame parks every
    later frame of its socket (``test_what_enforce_ordering_needs_survives_stop_app``)."""
    return SHARD_MARK in queue or _WAIT_QUEUE in queue


def is_process_local_queue(queue: str) -> bool:
    """Whether ``queue`` is a process-local ``foo!`` queue, which only its process
    reads, so a consumer may stay on it. Not ``foo?bar``: Channels 1.x's
    ``enforce_ordering`` parks messages in ``__wait__...?...`` that every worker reads."""
    return queue.endswith("!")  # {prefix}:q:foo! (a shard ends in its number)
