"""The ASGI 1.0 ``statistics`` extension.

``global_statistics(layer)`` and ``channel_statistics(layer, channel)`` return dicts
with the keys the ASGI spec names:

``messages_count``
    messages the channel's queue took in since it was (re)created or its node
    restarted, not since server start (:func:`messages_taken_in`).
``messages_count_per_second``
    the broker's publish rate into the queue (``publish_details.rate``).
``messages_pending``
    messages waiting in the queue (``messages_ready``).
``messages_max_age``
    seconds the head message has waited, by its ``timestamp`` (whole seconds:
    test_messages_max_age_from_the_head_message_timestamp); 0 when there is none.
``channel_full_count``, ``channel_full_count_per_second``
    ``send``'s ``ChannelFull`` in *this process* (the broker counts no refused publishes
    per queue), in all and in the last second, from the layer's ``_stats`` (a
    :class:`Counters`); 0 without it.

The rest comes from RabbitMQ's management API, which computes queue figures every
``collect_statistics_interval`` (5 s by default; tests/test_statistics.py waits for it):
a figure can be that old, and a new queue's rates are 0 until it has two samples. The
global figures are sums (the age a maximum) over ``{prefix}:q:*``; ``foo!bar``'s are
its queue ``foo!``'s. Without the API the calls raise ``ManagementAPIError``, naming
the URL.
"""

import collections
import threading
import time
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Union,
)

from .channel_names import non_local_name
from .management import ManagementClient
from .naming import Topology

__all__ = [
    "KEYS",
    "Counters",
    "global_statistics",
    "channel_statistics",
    "missing_channels",
    "all_channel_statistics",
    "messages_taken_in",
]

KEYS = (
    "messages_count",
    "messages_count_per_second",
    "messages_pending",
    "messages_max_age",
    "channel_full_count",
    "channel_full_count_per_second",
)

Figures = Dict[str, Union[int, float]]  # the KEYS: counts are int, rates float


class Source(Protocol):
    """What the statistics read of a layer (``AMQPChannelLayer`` is one), and its
    optional ``_stats`` (a :class:`Counters`), read with ``getattr``."""

    @property
    def topology(self) -> Topology: ...

    def management_client(self) -> ManagementClient: ...

    def valid_channel_name(self, name: str, receive: bool = False) -> bool: ...


class Counters(object):
    """Thread-safe ``ChannelFull`` counters, owned by a layer: any thread, under its lock.

    ``count_full(channel)`` records one; ``full_count`` is the total, ``full_rate`` the
    number per second over the last ``window`` seconds (in ``buckets`` steps);
    ``channel=None`` means all. Channels count by their queue (``foo!bar`` as ``foo!``);
    beyond ``max_channels`` the least recently counted are forgotten, not the totals.
    """

    def __init__(
        self,
        window: float = 1.0,
        buckets: int = 10,
        max_channels: int = 10000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window <= 0 or buckets < 1 or max_channels < 1:
            raise ValueError("window, buckets and max_channels must be positive")
        self.window = float(window)
        self._step = self.window / buckets
        self._buckets = buckets
        self._max_channels = max_channels
        self._clock = clock
        self._lock = threading.Lock()
        self._total = _Series()
        self._channels: "collections.OrderedDict[str, _Series]" = collections.OrderedDict()
        self.undecodable = 0  # messages dropped because they could not be decoded
        self.group_sends_dropped = 0  # send_group messages an alarm or a full member refused

    def count_undecodable(self) -> None:
        with self._lock:
            self.undecodable += 1

    def count_group_send_dropped(self) -> None:
        with self._lock:
            self.group_sends_dropped += 1

    @staticmethod
    def _key(channel: str) -> str:
        return non_local_name(channel)

    def count_full(self, channel: str) -> None:
        bucket = int(self._clock() // self._step)
        key = self._key(channel)
        with self._lock:
            self._total.add(bucket, self._buckets)
            series = self._channels.get(key)
            if series is None:
                series = self._channels[key] = _Series()
                if len(self._channels) > self._max_channels:
                    self._channels.popitem(last=False)
            else:
                self._channels.move_to_end(key)
            series.add(bucket, self._buckets)

    def _series(self, channel: Optional[str]) -> Optional["_Series"]:
        if channel is None:
            return self._total
        return self._channels.get(self._key(channel))

    def full_count(self, channel: Optional[str] = None) -> int:
        with self._lock:
            series = self._series(channel)
            return series.count if series is not None else 0

    def full_rate(self, channel: Optional[str] = None) -> float:
        bucket = int(self._clock() // self._step)
        with self._lock:
            series = self._series(channel)
            if series is None:
                return 0.0
            return series.recent(bucket, self._buckets) / self.window

    def channels(self) -> List[str]:
        """The channels (queue names' channel part) with a ChannelFull on record."""
        with self._lock:
            return list(self._channels)


class _Series(object):
    """A total and per-bucket counts for the last few buckets (under the owner's lock)."""

    __slots__ = ("count", "_recent")

    def __init__(self) -> None:
        self.count = 0
        self._recent: Deque[List[int]] = collections.deque()  # [bucket, count], oldest first

    def add(self, bucket: int, keep: int) -> None:
        self.count += 1
        recent = self._recent
        if recent and recent[-1][0] == bucket:
            recent[-1][1] += 1
        else:
            recent.append([bucket, 1])
        while recent and recent[0][0] <= bucket - keep:
            recent.popleft()

    def recent(self, bucket: int, keep: int) -> int:
        return sum(n for b, n in self._recent if b > bucket - keep)


# -- the extension ------------------------------------------------------------


def _empty() -> Figures:
    return {
        "messages_count": 0,
        "messages_count_per_second": 0.0,
        "messages_pending": 0,
        "messages_max_age": 0,
        "channel_full_count": 0,
        "channel_full_count_per_second": 0.0,
    }


def _from_queue(record: Optional[Mapping[str, Any]], now: float) -> Figures:
    """The broker's figures of one queue record (a management API dict)."""
    figures = _empty()
    if not record:
        return figures
    stats = record.get("message_stats") or {}
    figures["messages_count"] = messages_taken_in(record)
    figures["messages_count_per_second"] = float(
        (stats.get("publish_details") or {}).get("rate") or 0.0
    )
    pending = int(record.get("messages_ready") or 0)
    figures["messages_pending"] = pending
    head = record.get("head_message_timestamp")
    if pending and isinstance(head, (int, float)) and head > 0:
        figures["messages_max_age"] = max(0, int(now - head))
    return figures


def messages_taken_in(record: Mapping[str, Any]) -> int:
    """How many messages a queue (a management API record) took in since it exists.

    A classic queue numbers what it takes in (``next_seq_id``), unlike the broker's
    ``publish``, which counts returned and refused publishes too
    (test_messages_count_is_what_the_queue_took_in). The API updates it apart from the
    depth, so it counts only when its ``len`` is the record's ``messages_ready``, else
    held plus delivered (test_messages_count_ignores_a_queue_sample_older_than_the_depth).
    A quorum queue has only ``publish``.
    """
    stats = record.get("message_stats") or {}
    if record.get("type") == "quorum":
        return _int(stats.get("publish"))
    backing = record.get("backing_queue_status") or {}
    taken = backing.get("next_seq_id")
    if taken is not None and backing.get("len") == record.get("messages_ready"):
        return _int(taken)
    delivered = _int(stats.get("deliver_get")) - _int(stats.get("redeliver"))
    return _int(record.get("messages")) + max(0, delivered)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _counters(layer: Source) -> Optional[Counters]:
    return getattr(layer, "_stats", None)


def _add_full(figures: Figures, counters: Optional[Counters], channel: Optional[str]) -> Figures:
    if counters is not None:
        figures["channel_full_count"] = counters.full_count(channel)
        figures["channel_full_count_per_second"] = counters.full_rate(channel)
    return figures


def _check_channel(layer: Source, channel: object) -> None:
    if not isinstance(channel, str):
        raise TypeError("channel name must be a str, not %s" % type(channel).__name__)
    layer.valid_channel_name(channel)  # raises TypeError; "foo!" is valid


def missing_channels(layer: Source, channels: Iterable[str]) -> List[str]:
    """Those of ``channels`` that have no queue on the broker (never used,
    expired, or flushed): their figures are all 0."""
    client = layer.management_client()
    missing: List[str] = []
    for channel in channels:
        _check_channel(layer, channel)
        if client.queue(layer.topology.channel_queue(channel)) is None:
            missing.append(channel)
    return missing


def channel_statistics(layer: Source, channel: str) -> Figures:
    """The statistics of one channel (of its queue, for ``foo!bar``; of its
    queue and shards together, for an ordered channel)."""
    _check_channel(layer, channel)
    topology, client, now = layer.topology, layer.management_client(), time.time()
    queue = topology.channel_queue(channel)
    if not topology.shard_queues(channel):
        figures = _from_queue(client.queue(queue), now)
    else:
        records = client.queues(queue)
        figures = _sum(
            _from_queue(r, now) for r in records if topology.channel_of_queue(r["name"]) == channel
        )
    return _add_full(figures, _counters(layer), channel)


def all_channel_statistics(layer: Source) -> Dict[str, Figures]:
    """``{channel: statistics}`` for every channel queue of the layer's prefix.

    Channels of process-local queues are named ``foo!``. Channels with a
    ChannelFull on record in this process but no queue are included too.
    """
    topology = layer.topology
    now = time.time()
    counters = _counters(layer)
    found: Dict[str, Figures] = {}
    for record in layer.management_client().queues(topology.channel_queue("")):
        channel = topology.channel_of_queue(record.get("name", ""))
        if channel:
            # An ordered channel's shards count as the channel.
            figures = _from_queue(record, now)
            found[channel] = _sum((found[channel], figures)) if channel in found else figures
    for channel in found:
        found[channel] = _add_full(found[channel], counters, channel)
    if counters is not None:
        for channel in counters.channels():
            if channel not in found:
                found[channel] = _add_full(_empty(), counters, channel)
    return found


def global_statistics(layer: Source) -> Figures:
    """The statistics of all the layer's channels together."""
    return summarize(all_channel_statistics(layer).values(), _counters(layer))


def summarize(per_channel: Iterable[Figures], counters: Optional[Counters] = None) -> Figures:
    """Totals of several channels' statistics (the maximum for the age)."""
    # The process-wide counters include channels that fell out of the per-channel table.
    return _add_full(_sum(per_channel), counters, None)


def _sum(queues: Iterable[Figures]) -> Figures:
    """The broker's figures of several queues together (the maximum for the age)."""
    total = _empty()
    for figures in queues:
        for key in ("messages_count", "messages_count_per_second", "messages_pending"):
            total[key] += figures[key]
        total["messages_max_age"] = max(total["messages_max_age"], figures["messages_max_age"])
    return total
