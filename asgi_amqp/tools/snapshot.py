"""One look at a layer's prefix on the broker, as plain data: what ``asgi-amqp top`` shows.

:func:`collect` asks the management API three things (the prefix's queues
with their figures, its group exchanges, and the vhost's bindings) and
reads the layer's topology (see ``naming``) back out of them:

* channels, by kind: normal, single-reader (``foo?bar``) and process-local
  (``foo!``, the one queue of a process's ``foo!...`` channels, with how
  many of those channels are members of groups: the bindings to it);
* for each: messages waiting, the capacity (the queue's ``x-max-length``),
  the broker's in and out rates, the age of the oldest message (the
  ``timestamp`` the layer gives each message), the readers (consumers),
  what the queue took in since it exists and, of that, how many messages
  left it without being delivered (expired, so dead-lettered);
* groups, with their members (the channels bound from the group
  exchange) and how many memberships lapsed (every binding's lease has
  ended, ``group_expiry`` after the last ``group_add``, and the
  dead-letter worker is about to remove it);
* the shared dead-letter queue: events waiting and taken in, their rates,
  and the dead-letter workers reading it.

The result is a tree of dataclasses (:class:`Snapshot`), so the live view,
the text and the JSON output share one collection. Figures are the broker's,
sampled every ``collect_statistics_interval`` (5 s by default); rates are 0
until a queue has two samples.
"""

import dataclasses
import fnmatch
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .. import channel_names, naming
from ..statistics import messages_taken_in

KINDS = ("normal", "single-reader", "process-local")
SORT_KEYS = ("depth", "rate", "age", "name")
QUEUE_COLUMNS = ",".join(
    [
        "name",
        "type",
        "arguments",
        "consumers",
        "messages",
        "messages_ready",
        "messages_unacknowledged",
        "head_message_timestamp",
        "message_stats",
        "backing_queue_status",
    ]
)


@dataclasses.dataclass
class ChannelView:
    """One channel queue (``name`` is ``foo!`` for a process-local queue)."""

    name: str
    kind: str
    depth: int  # messages ready
    unacked: int  # delivered to a reader, not yet acknowledged
    capacity: Optional[int]
    in_rate: float  # messages/s the broker routed here
    out_rate: float  # messages/s delivered to readers
    oldest_age: Optional[float]  # seconds the head message has waited; None when empty
    readers: int
    taken_in: int  # messages the queue took in since it exists
    expired: int  # of those, how many left without being delivered
    local_members: int = 0  # process-local: channels of this queue that are group members
    # The queues holding the channel (an ordered channel's shards too) and the
    # most messages one of them holds (None: its one queue's): a send fails
    # when its own queue is full, so that queue's fill is the channel's.
    queues: int = 1
    fullest_held: Optional[int] = None

    @property
    def fullest(self) -> int:
        """The most messages one of its queues holds."""
        return self.depth + self.unacked if self.fullest_held is None else self.fullest_held

    @property
    def fill(self) -> float:
        """What its fullest queue holds as a fraction of the capacity (0 when unknown)."""
        if not self.capacity:
            return 0.0
        return min(1.0, self.fullest / float(self.capacity))

    def as_dict(self) -> Dict[str, Any]:
        figures = dataclasses.asdict(self)
        # top's JSON keeps the figures it documents (docs/top.rst).
        del figures["queues"], figures["fullest_held"]
        if self.oldest_age is not None:
            figures["oldest_age"] = round(self.oldest_age, 1)
        return dict(figures, fill=round(self.fill, 4))


@dataclasses.dataclass
class GroupView:
    name: str
    members: int
    lapsed: int  # memberships whose lease ended: being dropped


@dataclasses.dataclass
class DeadLetterView:
    """The shared dead-letter queue: group expiry and dropped members go through it."""

    exists: bool
    pending: int  # events waiting for a worker
    taken_in: int  # events since the queue exists
    in_rate: float
    handled_rate: float
    workers: int  # dead-letter workers (consumers) of every layer process
    expired_messages: int  # channel messages that expired (sum over the channels shown)
    lapsed_memberships: int  # memberships whose lease ended (sum over the groups shown)


@dataclasses.dataclass
class Snapshot:
    prefix: str
    taken_at: float  # Unix time
    management_url: str  # without credentials
    channels: List[ChannelView]
    groups: List[GroupView]
    dead_letters: DeadLetterView

    def by_kind(self, kind: str) -> List[ChannelView]:
        return [c for c in self.channels if c.kind == kind]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "prefix": self.prefix,
            "taken_at": round(self.taken_at, 3),
            "management_url": self.management_url,
            "channels": [c.as_dict() for c in self.channels],
            "groups": [dataclasses.asdict(g) for g in self.groups],
            "dead_letters": dataclasses.asdict(self.dead_letters),
        }


# -- reading the broker's records -------------------------------------------------------------


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _rate(stats: Dict[str, Any], key: str) -> float:
    return _per_second((stats.get(key + "_details") or {}).get("rate"))


def _per_second(value: Any) -> float:
    return round(float(value), 2) if isinstance(value, (int, float)) else 0.0


def channel_kind(channel: str) -> str:
    if channel_names.is_process_local(channel):
        return "process-local"
    if "?" in channel:
        return "single-reader"
    return "normal"


def _capacity(record: Dict[str, Any]) -> Optional[int]:
    arguments = record.get("arguments") or {}
    length = arguments.get("x-max-length")
    if not isinstance(length, int):
        return None
    # naming.Topology: a quorum queue admits one message more than x-max-length.
    return length + 1 if arguments.get("x-queue-type") == "quorum" else length


def _sum_views(one: ChannelView, other: ChannelView) -> ChannelView:
    """Two queues of one channel (its own and a shard) as one view: the
    figures added up, the oldest age and the most readers; the capacity is
    each queue's."""
    ages = [age for age in (one.oldest_age, other.oldest_age) if age is not None]
    return dataclasses.replace(
        one,
        depth=one.depth + other.depth,
        unacked=one.unacked + other.unacked,
        capacity=one.capacity or other.capacity,
        in_rate=one.in_rate + other.in_rate,
        out_rate=one.out_rate + other.out_rate,
        oldest_age=max(ages) if ages else None,
        readers=max(one.readers, other.readers),
        taken_in=one.taken_in + other.taken_in,
        expired=one.expired + other.expired,
        queues=one.queues + other.queues,
        fullest_held=max(one.fullest, other.fullest),
    )


def _channel_view(channel: str, record: Dict[str, Any], now: float) -> ChannelView:
    stats = record.get("message_stats") or {}
    depth = _int(record.get("messages_ready"))
    unacked = _int(record.get("messages_unacknowledged"))
    head = record.get("head_message_timestamp")
    age = None
    if depth and isinstance(head, (int, float)) and head > 0:
        age = max(0.0, now - head)
    taken_in = messages_taken_in(record)
    delivered = max(0, _int(stats.get("deliver_get")) - _int(stats.get("redeliver")))
    # The queue's figures and its delivery counts are sampled by different
    # timers: clamped, so a sample between them cannot show a negative.
    left = taken_in
    if record.get("backing_queue_status") is None:
        # No count of what the queue itself took in (RabbitMQ 4.0's API, or
        # a quorum queue): the publishes, of which refused ones (a full
        # channel) then count as expired too.
        left = max(taken_in, _int(stats.get("publish")))
    expired = max(0, left - depth - unacked - delivered)
    return ChannelView(
        name=channel,
        kind=channel_kind(channel),
        depth=depth,
        unacked=unacked,
        capacity=_capacity(record),
        in_rate=_rate(stats, "publish"),
        out_rate=_rate(stats, "deliver_get"),
        oldest_age=age,
        readers=_int(record.get("consumers")),
        taken_in=taken_in,
        expired=expired,
    )


class Collector(object):
    """Takes snapshots of one layer's prefix through its management API client."""

    def __init__(self, client: Any, topology: naming.Topology) -> None:
        self._client = client
        self._topology = topology

    def __call__(self, pattern: Optional[str] = None) -> Snapshot:
        """A snapshot; ``pattern`` (a glob) keeps the channels and groups it matches."""
        topology = self._topology
        now = time.time()
        records = self._client.queues(topology.prefix + naming.SEPARATOR, QUEUE_COLUMNS)
        channels: Dict[str, ChannelView] = {}
        dead_letters: Optional[Dict[str, Any]] = None
        for record in records:
            name = str(record.get("name", ""))
            channel = topology.channel_of_queue(name)
            if channel:
                view = _channel_view(channel, record, now)
                # An ordered channel's shards count as the channel.
                channels[channel] = (
                    _sum_views(channels[channel], view) if channel in channels else view
                )
            elif name == topology.dead_letter_queue:
                dead_letters = record
        groups, local_members = self._groups(now)
        for owner, members in local_members.items():
            if owner in channels:
                channels[owner].local_members = len(members)
        if pattern:
            channels = {c: v for c, v in channels.items() if fnmatch.fnmatchcase(c, pattern)}
            groups = [g for g in groups if fnmatch.fnmatchcase(g.name, pattern)]
        shown = list(channels.values())
        return Snapshot(
            prefix=topology.prefix,
            taken_at=now,
            management_url=self._client.where,
            channels=shown,
            groups=groups,
            dead_letters=_dead_letter_view(dead_letters, shown, groups),
        )

    def _groups(self, now: float) -> Tuple[List[GroupView], Dict[str, Set[str]]]:
        """The groups, and the process-local members of each ``foo!`` queue."""
        topology = self._topology
        head = topology.group_exchange("")
        members: Dict[str, Dict[str, float]] = {}  # group -> {member: its lease's end}
        for name in self._client.exchange_names(head):
            group = topology.group_of_exchange(name)
            if group:
                members[group] = {}
        local_members: Dict[str, Set[str]] = {}
        for binding in self._client.exchange_bindings(head):
            group = topology.group_of_exchange(str(binding.get("source", "")))
            arguments = binding.get("arguments") or {}
            member = topology.member_of_binding(
                str(binding.get("destination", "")), binding.get("destination_type"), arguments
            )
            if not group or not member:
                continue
            # A binding per lease stamp: a member's lease ends with its last.
            stamp = str(arguments.get(naming.LEASE_HEADER))
            if not stamp.isdigit():
                continue  # not a lease's binding: the layer made none such
            ends = topology.lease_ends(int(stamp))
            of_group = members.setdefault(group, {})
            of_group[member] = max(of_group.get(member, 0.0), ends)
            if channel_names.is_process_local(member):
                local_members.setdefault(channel_names.non_local_name(member), set()).add(member)
        groups = [
            GroupView(
                name=group,
                members=len(of_group),
                lapsed=sum(1 for ends in of_group.values() if ends <= now),
            )
            for group, of_group in members.items()
        ]
        return groups, local_members


def _dead_letter_view(
    record: Optional[Dict[str, Any]], channels: List[ChannelView], groups: List[GroupView]
) -> DeadLetterView:
    record = record or {}
    stats = record.get("message_stats") or {}
    queue_status = record.get("backing_queue_status") or {}
    # Dead-lettered messages reach the queue without a publish, so the
    # broker's publish rate misses them; the queue's own ingress rate does not.
    # RabbitMQ 4.0's API has no backing_queue_status: there, what came in is
    # what went out plus how fast the queue grew.
    in_rate = queue_status.get("avg_ingress_rate")
    if in_rate is None and record:
        growth = (record.get("messages_details") or {}).get("rate")
        in_rate = max(0.0, _rate(stats, "deliver_get") + _per_second(growth))
    return DeadLetterView(
        exists=bool(record),
        pending=_int(record.get("messages")),
        taken_in=messages_taken_in(record) if record else 0,
        in_rate=_per_second(in_rate),
        handled_rate=_rate(stats, "ack"),
        workers=_int(record.get("consumers")),
        expired_messages=sum(c.expired for c in channels),
        lapsed_memberships=sum(g.lapsed for g in groups),
    )


def sort_channels(channels: List[ChannelView], key: str) -> List[ChannelView]:
    """``depth``, ``rate`` (in + out) and ``age``: largest first; ``name``: A to Z."""
    if key not in SORT_KEYS:
        raise ValueError("sort key must be one of %s, not %r" % (", ".join(SORT_KEYS), key))
    by_name = sorted(channels, key=lambda c: c.name)
    if key == "depth":
        return sorted(by_name, key=lambda c: -(c.depth + c.unacked))
    if key == "rate":
        return sorted(by_name, key=lambda c: -(c.in_rate + c.out_rate))
    if key == "age":
        return sorted(by_name, key=lambda c: -(c.oldest_age or 0.0))
    return by_name
