"""Receive state: what the broker pushed to this process, and what it handed out.

Shared by the consumers (blocking receives), the getter (non-blocking ones)
and callers' threads; each class says on which threads.

* a message whose ack went with its connection comes again, flagged ``redelivered``
  (test_connection_loss.py::test_sends_and_receives_ride_through_repeated_kills);
* the broker may route an original from a closed connection after its copy
  (test_connection_loss.py::test_an_original_that_comes_after_its_marked_copy_is_dropped).
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

from ..naming import CHANNEL_HEADER, REPUBLISHED_HEADER, SHARD_MARK
from .work import Queues, Work

# Seconds after a marked copy arrives during which unmarked messages are checked:
# its original, routed late from the closed connection, comes within them.
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
    """Keys (queue, message id, ``asgi-channel``) of messages recently handed to callers here.

    A redelivery (its ack went with the connection) or a marked copy (its
    confirm did, ``publisher``) with a key here is dropped. A copy may come
    before its original: for ``COPY_WINDOW`` after one arrived, an unmarked
    message with the key of a copy held or handed out is dropped too; else
    an unmarked message costs no lookup. A copy comes within
    ``operation_timeout`` of the reconnect, so ``size`` keys are enough.
    Other processes do not see this log (the docs' delivery guarantees).

    Callers add what they take themselves, under ``_lock``; the I/O thread checks.
    """

    def __init__(self, size: int = 50000, copies: int = 10000) -> None:
        self._size = size
        self._keys: "collections.OrderedDict[DeliveryKey, None]" = collections.OrderedDict()
        # Keys of marked copies handed out: an original that comes after one is the duplicate.
        self._copies_size = copies
        self._copies: "collections.OrderedDict[DeliveryKey, None]" = collections.OrderedDict()
        self._check_unmarked_until = 0.0
        self._lock = threading.Lock()  # callers add the messages they take themselves
        # What arrives while a message with its key is held is a copy.
        self.held: Optional[HeldMessages] = None
        # Keys a wave has taken and not yet handed out or put back: the same again is a copy.
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
        """Whether a delivery just pushed or fetched repeats one this process has (I/O thread).

        The usual one (neither redelivered nor marked, no copy lately) returns at once.
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
        # before it lets go of the held set's lock (HeldMessages.take).
        if self.held is not None and self.held.has(queue, key):
            return True
        with self._lock:
            if unmarked:
                # An unmarked message that is not redelivered comes once: one
                # with its key, handed out or being taken, was its copy.
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
    """Which queues this connection knows to exist, from its own recent use (I/O thread)."""

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
    """``Engine.forget_queues``'s work: forget which queues exist (a flush deleted them)."""

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
        owner: "Consumer",
    ) -> None:
        self.channel = channel  # compared by identity only, outside the I/O thread
        self.delivery_tag = delivery_tag
        self.delivery = delivery
        self.since = time.monotonic()
        self.owner = owner  # the consumer it was pushed to (its window counts it)


# Seconds after which a caller thread's ``asked`` or ``handling`` entry is forgotten.
FORGOTTEN_AFTER = 60.0


class HeldMessages(object):
    """Held messages per queue, oldest first: the I/O thread adds, withdraws and clears,
    any thread may ``take``, under ``_lock`` (none held: no lock). One taken after its
    channel closed comes again, ``redelivered``, and ``HandedOff`` drops it.

    Per caller thread, it also keeps what its latest blocking receive asked
    for, which the sweep counts as wanted even if held messages served it
    (``consumers.sweep``), and the shard whose frame it handles until its
    next blocking receive: no other thread is handed that shard's frames meanwhile
    (a runworker's threads would run one socket's frames at once, and
    ``enforce_ordering`` parks and loses them:
    ``test_a_sockets_next_frame_waits_for_the_thread_running_its_last``),
    and ``consumers.balance`` does not give it back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: Dict[str, Deque[Held]] = {}
        # thread -> (monotonic time, queues) of its latest blocking receive;
        # each caller's thread writes its own entry, the I/O thread reads.
        self._asked: Dict[int, Tuple[float, Queues]] = {}
        # thread -> (monotonic time, shard) of the frame it handles: set under
        # ``_lock`` when a frame is taken for it, removed by its next ``asked``.
        self._handling: Dict[int, Tuple[float, str]] = {}

    def asked(self, queues: Queues) -> None:
        """This thread's blocking receive asks for ``queues``: its last frame is done.

        Not a non-blocking one: Channels sends a consumer's replies after it
        returns, and its ``enforce_ordering`` polls a wait channel before."""
        ident = threading.get_ident()
        self._asked[ident] = (time.monotonic(), queues)
        self._handling.pop(ident, None)

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

    def _handled_by_others(self, thread: int) -> Set[str]:
        """The shards whose frames threads other than ``thread`` handle (under ``_lock``)."""
        since = time.monotonic() - FORGOTTEN_AFTER
        return {
            shard
            for ident, (at, shard) in list(self._handling.items())
            if ident != thread and at >= since
        }

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

    def put_back(self, queue: str, held: Held, thread: int) -> None:
        """Undo ``thread``'s take of ``held``, whose caller left."""
        with self._lock:
            self._by_queue.setdefault(queue, collections.deque()).appendleft(held)
            if self._handling.get(thread, (0, None))[1] == queue:
                del self._handling[thread]

    def take(
        self,
        queues: Sequence[str],
        thread: int,
        record: Optional[Callable[[Delivery], None]] = None,
    ) -> Optional[Tuple[str, Held]]:
        """(queue, oldest Held) of a random one of ``queues`` holding any, or None,
        for the caller ``thread``: a shard's only if no other thread handles one
        of its frames. No queue is preferred: under a backlog, a thread that kept
        to its last shard starved the others and every other channel.

        ``record(delivery)`` runs under the lock: ``has`` sees the message here or
        wherever ``record`` put it, never in neither.
        """
        if not self._by_queue:  # nothing held: no lock (an add now comes after this take)
            return None
        with self._lock:
            by_queue = self._by_queue
            candidates = [q for q in queues if q in by_queue]
            shards = [q for q in candidates if SHARD_MARK in q]
            if shards:
                busy = self._handled_by_others(thread)
                candidates = [q for q in candidates if q not in busy]
            if not candidates:
                return None
            queue = candidates[0] if len(candidates) == 1 else random.choice(candidates)
            waiting = by_queue[queue]
            held = waiting.popleft()
            if not waiting:
                del by_queue[queue]
            if shards and SHARD_MARK in queue:
                self._handling[thread] = (time.monotonic(), queue)
            if record is not None:
                record(held.delivery)
            return queue, held

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

    def clear(self) -> List[Held]:
        """Remove every held message; returns them."""
        with self._lock:
            removed = [held for waiting in self._by_queue.values() for held in waiting]
            self._by_queue.clear()
            return removed
