"""Receiving: ``receive`` and what it hands out.

``receive`` is a worker's hottest call and does the most in the caller's thread: it
maps channel names onto queues (``ReceiveTargets``), takes a message a consumer was
pushed already without a trip to the I/O thread, and decodes, skipping (and counting)
what cannot be read. The gets and waits run on the I/O thread (``engine``).
"""

import logging
import math
import random
import time
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

from . import naming
from .channel_names import check_channel_name
from .engine import Delivery, Engine, Queues
from .errors import BrokerOperationError, settings_mismatch
from .local_groups import NOTICE, LocalGroups, Members
from .serialization import Message, Serializer, UndecodableMessage
from .statistics import Counters

logger = logging.getLogger(__name__)

_MAX_SKIPPED = 100  # undecodable messages skipped in one receive call
_MAX_NOTICES = 10000  # join and leave notices applied in one receive call


Received = Tuple[str, Message]  # (channel, message)
Target = Tuple[str, Optional[Dict[str, Any]]]  # (queue, its arguments)
Targets = Tuple[Tuple[Target, ...], Tuple[str, ...]]  # a receive's queues, and their names


class Receiver(object):
    """``receive``, and the takes ``receive_twisted`` makes on daphne's reactor.

    The layer's; used from callers' threads only, several at once, daphne's
    reactor thread among them (``take_held``, which never waits).
    """

    def __init__(
        self,
        engine: Engine,
        topology: naming.Topology,
        serializer: Serializer,
        stats: Counters,
        receive_timeout: float,
        get_capacity: Callable[[str], int],
    ) -> None:
        self._engine = engine
        self._topology = topology
        self._serializer = serializer
        self._stats = stats  # undecodable counts (thread-safe, the layer's)
        # The layer's ``receive_timeout`` (callers' threads; set there only, checked below).
        self.timeout = receive_timeout
        # Channel names -> queues, cached (callers' threads; see ReceiveTargets).
        self.queues = ReceiveTargets(topology)
        # Process-local members and the copies waiting for them (callers' threads, under
        # its lock): this receiver fills and reads it, ``Groups.flush`` empties it.
        self.local_groups = LocalGroups(topology, get_capacity, stats.count_group_send_dropped)

    @property
    def timeout(self) -> float:
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        """A positive, finite number, so that a blocking receive always ends (the
        layer's ``receive_timeout`` setter comes here)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ValueError("receive_timeout must be a number of seconds, not %r" % (seconds,))
        if not 0 < seconds < math.inf:  # nan compares False
            raise ValueError("receive_timeout must be positive and finite, not %r" % (seconds,))
        self._timeout = seconds

    def receive(
        self, channels: Iterable[str], block: bool = False
    ) -> Tuple[Optional[str], Optional[Message]]:
        queues, names = self.queues(channels)
        if not names:
            return None, None  # as asgiref's in-memory layer and asgi_redis do
        # Copies for this process's members first: they left their queue ahead of all it
        # holds; then what a consumer was pushed already. Notices count against the timeout.
        deadline = time.monotonic() + self._timeout
        if block:
            self._engine.asked(queues)  # its consumers stay wanted (engine.consumers.sweep)
        found = self._local_copy(names) if self.local_groups.waiting else None
        if found is None:
            found = self._first_readable(
                lambda: self._engine.take_held(names) or self._fetch(queues, block, deadline)
            )
        return (None, None) if found is None else found

    def _local_copy(self, names: Tuple[str, ...]) -> Optional[Received]:
        """A copy of a group message waiting for a process-local member."""
        for _ in range(_MAX_SKIPPED):
            copy = self.local_groups.take(names)
            if copy is None:
                return None
            queue, channel, body = copy
            decoded = self._decode_body(queue, channel, body)
            if decoded is not None:
                return decoded
        return None

    def take_held(self, names: Tuple[str, ...]) -> Optional[Received]:
        """A message already pushed to this process for one of the queues ``names``,
        or None.

        Never waits nor starts the layer's threads, so that daphne's reactor
        thread may call it (``twisted_support.receive_twisted``).
        """
        copy = self._local_copy(names)
        if copy is not None or not self._engine.started_here:
            return copy
        return self._first_readable(lambda: self._engine.take_held(names))

    def _first_readable(
        self, next_delivery: Callable[[], Optional[Delivery]]
    ) -> Optional[Received]:
        """(channel, message) of the first delivery ``next_delivery()`` gives
        that decodes, skipping at most ``_MAX_SKIPPED`` that do not (and the
        notices to this process, which are applied); None once it gives None."""
        skipped = notices = 0
        while skipped < _MAX_SKIPPED and notices < _MAX_NOTICES:
            delivery = next_delivery()
            if delivery is None:
                return None
            members: Members = None
            if naming.is_process_local_queue(delivery.queue):
                members = self.local_groups.members_of(delivery.queue, delivery.headers)
            if members is NOTICE:
                notices += 1
                continue
            if members is None:
                decoded = self._decode(delivery)
            elif members:
                # A group message for this process's members: one copy each.
                first, rest = members[0], members[1:]
                self.local_groups.keep(delivery.queue, rest, delivery.body)
                decoded = self._decode_body(delivery.queue, first, delivery.body)
            else:
                logger.debug("a group message reached %s after its members left", delivery.queue)
                notices += 1
                continue
            if decoded is not None:
                return decoded
            skipped += 1
        return None

    def _fetch(self, queues: Queues, block: bool, deadline: float) -> Optional[Delivery]:
        """A Delivery from the broker: waited for by consumers until ``deadline``
        (``time.monotonic()``), or taken with basic.get. The queues go in random
        order, so that no channel starves another."""
        if len(queues) > 1:
            queues = list(queues)
            random.shuffle(queues)
        try:
            if not block:
                return self._engine.get(queues)
            return self._engine.wait(queues, max(0.0, deadline - time.monotonic()))
        except BrokerOperationError as exc:
            # A queue that exists with other settings: QueueSettingsMismatch names them.
            raise settings_mismatch(exc, self._topology.explain_mismatch) from None

    def _decode(self, delivery: Delivery) -> Optional[Received]:
        channel = self._topology.channel_of_delivery(delivery.queue, delivery.headers)
        return self._decode_body(delivery.queue, channel, delivery.body)

    def _decode_body(self, queue: str, channel: Optional[str], body: bytes) -> Optional[Received]:
        """(channel, message), or None for a message that is skipped."""
        try:
            if not channel:
                raise UndecodableMessage("it names no process-local channel")
            return channel, self._serializer.loads(body)
        except UndecodableMessage as exc:
            # Dropped (it was acked when taken): say so, without its body.
            self._stats.count_undecodable()
            logger.warning(
                "skipped a message of channel %s (queue %s) that cannot be read; dropped: %s",
                channel or self._topology.channel_of_queue(queue),
                queue,
                exc,
            )
            return None


_COLLECTIONS = (list, tuple, set, frozenset)  # read twice safely, without a copy


class ReceiveTargets(object):
    """``receive``'s channel names -> the distinct queues behind them, validated.

    A worker names the same few channels again and again: each name is checked
    and mapped once, each set of names once. Callers' threads: a dict's get and set
    are atomic, and an entry lost to a race (or to a clear at the limit) is made again.
    """

    def __init__(self, topology: naming.Topology) -> None:
        self._topology = topology
        # channel -> its (queue, arguments), and an ordered channel's shards
        self._targets: Dict[Any, Tuple[Target, ...]] = {}
        # frozenset of names -> their distinct (queue, arguments) and queue names
        self._sets: Dict[FrozenSet[Any], Targets] = {}

    def __call__(self, channels: Iterable[str]) -> Targets:
        """The distinct (queue, arguments), in the order of ``channels``, and their names;
        empty for an empty collection. Whoever asks the broker shuffles them
        (``Receiver._fetch``)."""
        # Any collection of names: Channels 1.x's worker passes a set. A bare
        # string is refused rather than read as a list of one-letter names.
        if type(channels) not in _COLLECTIONS:
            if isinstance(channels, (str, bytes, dict)) or not hasattr(channels, "__iter__"):
                raise TypeError(
                    "channels must be a list of channel names, not %s" % type(channels).__name__
                )
            channels = list(channels)  # read once: an iterator gives its names only once
        try:
            key: Optional[FrozenSet[Any]] = frozenset(channels)
        except TypeError:  # an unhashable, hence invalid, name: the full check says which
            key = None
        known = self._sets.get(key) if key is not None else None
        if known is None:
            channels = list(channels)
            known = self._unique_targets(channels)
            if key is not None:
                if len(self._sets) >= 1000:
                    self._sets.clear()
                self._sets[key] = known
        return known

    def _unique_targets(self, channels: List[Any]) -> Targets:
        queues: List[Target] = []
        seen = set()
        for channel in channels:
            for queue, arguments in self._targets_of(channel):
                if queue not in seen:
                    seen.add(queue)
                    queues.append((queue, arguments))
        return tuple(queues), tuple(queue for queue, _ in queues)

    def _targets_of(self, channel: Any) -> Tuple[Target, ...]:
        """A channel's queue, and an ordered channel's shards."""
        try:
            return self._targets[channel]
        except (KeyError, TypeError):  # TypeError: an unhashable, hence invalid, name
            pass
        check_channel_name(channel, receive=True)
        topology = self._topology
        queues = (topology.channel_queue(channel),) + topology.shard_queues(channel)
        targets = tuple((queue, topology.queue_arguments(channel, queue)) for queue in queues)
        if len(self._targets) >= 10000:
            self._targets.clear()
        self._targets[channel] = targets
        return targets
