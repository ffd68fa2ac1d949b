"""Receive state: what the broker has pushed to this process, and what it handed out.

Everything a receive needs to remember between calls lives here, shared by
the two ways of taking messages (``consumers`` for blocking receives,
``getter`` for non-blocking ones) and by callers' threads:

``Delivery``
    a message as it came off the broker, decoded later by the caller;
``HeldMessages``
    deliveries pushed to this process's consumers, unacked, waiting for a
    caller; any thread may take one, under its lock;
``HandedOff``
    the keys of messages recently handed to callers, which is how a
    redelivery or a marked copy of one is recognised and dropped;
``Liveness``
    which queues this connection knows to exist from its own recent use,
    so that a receive declares a queue only when it may have expired.
"""

import collections
import random
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Deque,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import pika

from ..naming import CHANNEL_HEADER, REPUBLISHED_HEADER
from .work import Queues, Work

# After a marked copy arrives, unmarked messages are compared with the
# copies for this long (seconds): its original, routed late from the closed
# connection, comes within it.
COPY_WINDOW = 60.0


if TYPE_CHECKING:
    from .consumers.pool import Consumer
    from .session import Session

# (queue, message id, channel): see ``delivery_key``.
DeliveryKey = Tuple[str, Optional[str], Any]


class Delivery(NamedTuple):
    """A message as it came off the broker, decoded later by the caller."""

    queue: str
    headers: Mapping[str, Any]
    body: bytes
    redelivered: bool
    message_id: Optional[str]


class HandedOff(object):
    """Keys of messages recently handed to callers of this process.

    A message can reach this process a second time in two ways, both after
    a connection dropped:

    * its ack was lost with the connection, so the broker redelivers it
      (flagged ``redelivered``);
    * its sender lost the publisher confirm and sent a marked copy
      (``naming.REPUBLISHED_HEADER``, see ``publisher``).

    Either is dropped when its key is in this log. A copy may also come
    *before* its original, if the broker is still routing the original from
    the closed connection when the sender's next connection publishes the
    copy; a busy broker after a restart is where duplicates pointing to
    this were counted. So for ``COPY_WINDOW`` after a copy arrived, an
    unmarked message whose key is that of a copy held or handed out, its
    original, is dropped too; otherwise an unmarked message costs no
    lookup. The key is the queue, the message id and the channel (the
    ``asgi-channel`` header). Other processes cannot see this log: on a
    channel read by several processes a copy may reach another process;
    see the docs' delivery guarantees. A copy comes back within
    ``operation_timeout`` of the reconnect, so the log holds enough keys for
    several seconds of a busy process.
    """

    def __init__(self, size: int = 50000, copies: int = 10000) -> None:
        self._size = size
        self._keys: "collections.OrderedDict[DeliveryKey, None]" = collections.OrderedDict()
        # Keys of marked copies handed out: if the original comes after all,
        # it is the duplicate. Copies are rare: only after a copy arrived
        # (within COPY_WINDOW) are unmarked messages looked up at all.
        self._copies_size = copies
        self._copies: "collections.OrderedDict[DeliveryKey, None]" = collections.OrderedDict()
        self._check_unmarked_until = 0.0
        self._lock = threading.Lock()  # callers add the messages they take themselves
        # The I/O thread's held messages (HeldMessages): a copy
        # that arrives while its original waits there, unhanded, is a copy.
        self.held: Optional[HeldMessages] = None
        # Keys of messages a non-blocking receive's wave has taken and not
        # yet handed out or put back: a copy arriving meanwhile is a copy.
        self._taking: "collections.Counter[DeliveryKey]" = collections.Counter()

    def taking(self, delivery: Delivery) -> None:
        """A wave took ``delivery``; until ``taken`` says how that ended, a copy is dropped."""
        if delivery.message_id:
            key = delivery_key(delivery.queue, delivery.message_id, delivery.headers)
            with self._lock:
                self._taking[key] += 1

    def taken(self, delivery: Delivery) -> None:
        """The wave handed ``delivery`` out (``add`` records that) or put it back."""
        if delivery.message_id:
            key = delivery_key(delivery.queue, delivery.message_id, delivery.headers)
            with self._lock:
                self._taking[key] -= 1
                if self._taking[key] <= 0:
                    del self._taking[key]

    def forget_taking(self) -> None:
        """The connection went: what the waves had taken is back in its queues."""
        with self._lock:
            self._taking.clear()

    def add(self, delivery: Delivery) -> None:
        if delivery.message_id:
            key = delivery_key(delivery.queue, delivery.message_id, delivery.headers)
            with self._lock:
                self._keys[key] = None
                if len(self._keys) > self._size:
                    self._keys.popitem(last=False)
                if REPUBLISHED_HEADER in delivery.headers:
                    self._copies[key] = None
                    if len(self._copies) > self._copies_size:
                        self._copies.popitem(last=False)

    def is_duplicate(self, queue: str, method: Any, properties: pika.spec.BasicProperties) -> bool:
        """Whether a delivery just pushed or fetched repeats one this process has.

        Runs on the I/O thread, for every delivery: the usual one (neither
        redelivered nor marked, and no copy arrived lately) returns at once.
        """
        headers = properties.headers
        marked = headers is not None and REPUBLISHED_HEADER in headers
        unmarked = not method.redelivered and not marked
        if unmarked:
            until = self._check_unmarked_until
            if not until or not properties.message_id:
                return False
            if time.monotonic() > until:
                self._check_unmarked_until = 0.0
                return False
        key = delivery_key(queue, properties.message_id, headers or {})
        # The held set first: a caller taking from it records the key here
        # before it lets go of the held set's lock (see HeldMessages.take).
        # For an unmarked message, what is held with its key is its copy.
        if self.held is not None and self.held.has(queue, key):
            return True
        with self._lock:
            if unmarked:
                # The original of a copy handed out, or of one a wave has
                # taken and not handed out yet (an unmarked message that is
                # not redelivered reaches this process once: what is being
                # taken with its key is its copy).
                return key in self._copies or key in self._taking
            if key in self._keys or key in self._taking:
                return True
        if marked:
            self._check_unmarked_until = time.monotonic() + COPY_WINDOW
        return False


def delivery_key(queue: str, message_id: Optional[str], headers: Mapping[str, Any]) -> DeliveryKey:
    """What tells one delivery from another in ``HandedOff``."""
    return queue, message_id, headers.get(CHANNEL_HEADER)


class Liveness(object):
    """Which queues this connection knows to exist, from its own recent use."""

    def __init__(self) -> None:
        self._until: Dict[str, float] = {}  # queue -> until when it surely exists

    def alive(self, queue: str) -> bool:
        return self._until.get(queue, 0) > time.monotonic()

    def touch(self, queue: str, arguments: Optional[Dict[str, Any]]) -> None:
        lease_ms = (arguments or {}).get("x-expires")
        if lease_ms:
            self._until[queue] = time.monotonic() + lease_ms / 2000.0

    def forget(self, queue: Optional[str] = None) -> None:
        if queue is None:
            self._until.clear()
        else:
            self._until.pop(queue, None)


class ForgetQueues(Work):
    """Forget which queues are known to exist (after a flush deleted them):
    the work ``Engine.forget_queues`` hands the I/O thread for the session's
    ``Liveness``."""

    __slots__ = ()

    def __call__(self, session: "Session") -> None:
        session.liveness.forget()
        self.pending.resolve(None)


class Held(object):
    """A message pushed to one of our consumers, unacked, waiting for a caller."""

    __slots__ = ("channel", "delivery_tag", "delivery", "since", "owner")

    def __init__(
        self,
        channel: Optional[pika.channel.Channel],
        delivery_tag: int,
        delivery: Delivery,
        owner: "Optional[Consumer]" = None,
    ) -> None:
        self.channel = channel  # compared by identity only, outside the I/O thread
        self.delivery_tag = delivery_tag
        self.delivery = delivery
        self.since = time.monotonic()
        self.owner = owner  # the consumer it was pushed to (its window counts it)


# Seconds after which a caller thread's entry in ``HeldMessages.asked`` or
# ``handling`` is forgotten: a thread that ended, or stopped receiving.
FORGOTTEN_AFTER = 60.0


class HeldMessages(object):
    """Held messages per queue, oldest first; safe to use from any thread.

    The I/O thread adds, withdraws and clears; any thread may ``take``. An
    entry taken by a caller whose channel had already closed is harmless: the
    broker redelivers that message flagged ``redelivered`` and the
    hand-off log (``HandedOff``) drops it.

    It also keeps what each caller thread's latest blocking receive asked
    for: one served from held messages never reaches the I/O thread, whose
    sweep must still count those queues as wanted (``consumers.sweep``);
    and the shard whose frame each caller thread handles, from the receive
    that gave it until the thread's next blocking receive: such a shard is
    not given back (``consumers.balance``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: Dict[str, Deque[Held]] = {}
        # thread -> (monotonic time, queues) of its latest blocking receive;
        # each caller's thread writes its own entry, the I/O thread reads.
        self._asked: Dict[int, Tuple[float, Queues]] = {}
        # thread -> (monotonic time, shard), written the same way
        self._handling: Dict[int, Tuple[float, str]] = {}

    def asked(self, queues: Queues) -> None:
        """This thread's blocking receive asks for ``queues``: its last frame is done."""
        ident = threading.get_ident()
        self._asked[ident] = (time.monotonic(), queues)
        self._handling.pop(ident, None)

    def handling(self, shard: str) -> None:
        """This thread was handed a frame of ``shard``."""
        self._handling[threading.get_ident()] = (time.monotonic(), shard)

    def shards_handled(self) -> Set[str]:
        """The shards whose frames caller threads handle now (I/O thread); a
        thread that has not come back for ``FORGOTTEN_AFTER`` s is forgotten."""
        since = time.monotonic() - FORGOTTEN_AFTER
        handled = set()
        for ident, (at, shard) in list(self._handling.items()):
            if at >= since:
                handled.add(shard)
            else:
                self._handling.pop(ident, None)
        return handled

    def asked_since(self, when: float) -> List[Queues]:
        """What blocking receives asked for from ``when`` on (I/O thread); the
        entries of threads that have not asked for ``FORGOTTEN_AFTER`` s go."""
        forgotten = time.monotonic() - FORGOTTEN_AFTER
        recent = []
        for ident, (at, queues) in list(self._asked.items()):
            if at >= when:
                recent.append(queues)
            elif at < forgotten:
                self._asked.pop(ident, None)
        return recent

    def add(self, queue: str, held: Held) -> None:
        with self._lock:
            self._by_queue.setdefault(queue, collections.deque()).append(held)

    def put_back(self, queue: str, held: Held) -> None:
        with self._lock:
            self._by_queue.setdefault(queue, collections.deque()).appendleft(held)

    def take(
        self, queues: Sequence[str], record: Optional[Callable[[Delivery], None]] = None
    ) -> Optional[Tuple[str, Held]]:
        """(queue, oldest Held) of a random one of ``queues`` holding any, or None.

        ``record(delivery)`` runs before the lock is released, so a thread
        asking ``has`` sees the message either here or wherever ``record``
        put it, never in neither.
        """
        with self._lock:
            candidates = [q for q in queues if q in self._by_queue]
            if not candidates:
                return None
            queue = random.choice(candidates)
            waiting = self._by_queue[queue]
            held = waiting.popleft()
            if not waiting:
                del self._by_queue[queue]
            if record is not None:
                record(held.delivery)
            return queue, held

    def holds(self, queue: str) -> bool:
        """Whether any message is held for ``queue``."""
        return queue in self._by_queue  # one dict lookup: atomic, no lock needed

    def has(self, queue: str, key: DeliveryKey) -> bool:
        """Whether a message with ``key`` (see ``delivery_key``) is held."""
        with self._lock:
            return any(
                key == delivery_key(queue, held.delivery.message_id, held.delivery.headers)
                for held in self._by_queue.get(queue, ())
            )

    def held_since(self, queue: str) -> Tuple[Optional[float], int]:
        """(when the oldest was pushed, how many are held) for ``queue``, or (None, 0)."""
        with self._lock:
            waiting = self._by_queue.get(queue)
            return (waiting[0].since, len(waiting)) if waiting else (None, 0)

    def withdraw(self, queue: str) -> List[Held]:
        with self._lock:
            return list(self._by_queue.pop(queue, ()))

    def withdraw_where(self, predicate: Callable[[Held], bool]) -> List[Held]:
        """Remove and return every held message for which ``predicate(held)`` is true."""
        with self._lock:
            removed: List[Held] = []
            for queue, waiting in list(self._by_queue.items()):
                kept = collections.deque(held for held in waiting if not predicate(held))
                if len(kept) != len(waiting):
                    removed.extend(held for held in waiting if predicate(held))
                    if kept:
                        self._by_queue[queue] = kept
                    else:
                        del self._by_queue[queue]
            return removed

    def clear(self) -> List[Held]:
        """Remove every held message; returns them."""
        with self._lock:
            removed = [held for waiting in self._by_queue.values() for held in waiting]
            self._by_queue.clear()
            return removed
