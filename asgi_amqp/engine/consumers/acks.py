"""Every ack and nack of the consumers' channel; taken acks sent in batches.

A caller that takes a held message in its own thread leaves the ack to the
I/O thread; one ``basic.ack`` per message costs the broker about as much as
the delivery, so these acks wait in ``TakenAcks`` while the caller is likely
to take the next one at once (a process-local queue with more held, fewer
than ``ACK_BATCH`` waiting), then go as one ``multiple`` ack where
``Unsettled`` allows. The I/O thread sends them before anything else it is
woken for and before a sweep gives held messages back, so ``linger`` bounds
their wait. A process-local queue's redelivery comes back to this process,
whose hand-off log drops it (``deliveries.HandedOff``).

Broker fact: a ``multiple`` ack covers every unsettled delivery up to its tag
on the channel (``test_batched_acks_never_cover_a_message_nobody_took``).

Owned by ``pool.ConsumerPool``; ``Acks``, its ``Unsettled`` and ``requeued``
are the I/O thread's. ``TakenAcks`` is shared: callers' threads add to it
(``IOThread.take_pushed``), under its lock.
"""

import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...naming import is_process_local_queue
from ..deliveries import Held
from ..work import Work

if TYPE_CHECKING:
    from ..session import Session
    from .pool import ConsumerPool

# Acks that may wait together: half the default consumer_prefetch, so the
# broker still has room to push while they wait.
ACK_BATCH = 8


class SendTakenAcks(Work):
    """The work that wakes the I/O thread to send taken acks (``Acks.send_taken``).

    Nobody waits for it; not carried over, as a lost connection's deliveries
    are back in their queues.
    """

    __slots__ = ()
    retry = False

    def __call__(self, session: "Session") -> None:
        session.consumers.acks.send_taken()
        self.pending.resolve(None)


class TakenAcks(object):
    """Taken held messages whose acks are not sent yet.

    Callers' threads add; the I/O thread empties it; under its own lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: List[Tuple[str, Held]] = []

    def add(self, queue: str, held: Held, more_held: bool) -> bool:
        """Record that a caller took ``held``; True if the acks should go now.

        ``more_held``: whether ``queue`` still has held messages.
        """
        with self._lock:
            self._taken.append((queue, held))
            waiting = len(self._taken)
        return waiting >= ACK_BATCH or not more_held or not is_process_local_queue(queue)

    def take_all(self) -> List[Tuple[str, Held]]:
        """Oldest first."""
        with self._lock:
            taken, self._taken = self._taken, []
        return taken

    def __len__(self) -> int:
        return len(self._taken)


class Unsettled(object):
    """One channel's unsettled delivery tags, oldest first (I/O thread only).

    Tags grow on a channel and a dict keeps insertion order.
    """

    def __init__(self) -> None:
        self._tags: Dict[int, None] = {}

    def pushed(self, tag: int) -> None:
        self._tags[tag] = None

    def settled(self, tag: int) -> None:
        self._tags.pop(tag, None)

    def clear(self) -> None:
        self._tags = {}

    def multiple_upto(self, tags: List[int]) -> Optional[int]:
        """The highest of ``tags`` that one ``multiple`` ack may cover, or None.

        The end of the run of ``tags`` from the oldest unsettled tag; None if
        that run is shorter than two.
        """
        wanted = set(tags)
        upto: Optional[int] = None
        covered = 0
        for tag in self._tags:
            if tag not in wanted:
                break
            upto = tag
            covered += 1
        return upto if covered > 1 else None

    def settled_upto(self, upto: int) -> None:
        """Forget every tag up to ``upto`` (a multiple ack covered them)."""
        covered = []
        for tag in self._tags:  # oldest first
            if tag > upto:
                break
            covered.append(tag)
        for tag in covered:
            del self._tags[tag]


class Acks(object):
    """Every ack and nack of the consumers' channel (I/O thread only)."""

    def __init__(self, pool: "ConsumerPool", taken: TakenAcks) -> None:
        self._pool = pool
        self._taken = taken  # shared with callers' threads
        self._unsettled = Unsettled()
        self.requeued = False  # a nack was sent since the last barrier (``Polls.barrier``)

    def new_channel(self) -> None:
        """Delivery tags start again on a new channel."""
        self._unsettled.clear()

    def pushed(self, tag: int) -> None:
        self._unsettled.pushed(tag)

    def gone(self, tag: int) -> None:
        """``tag`` needs no ack (its queue was deleted)."""
        self._unsettled.settled(tag)

    def acknowledge(self, queue: str, held: Held) -> None:
        """Ack a held message handed over on the I/O thread."""
        consumer = self._pool.consumer(queue)
        if consumer is not None:
            consumer.wanted_at = time.monotonic()
        if self.settle_held(held, ack=True) and held.owner is not None:
            held.owner.unacked -= 1
            held.owner.handed_at = time.monotonic()

    def send_taken(self) -> None:
        """Ack what callers took (``TakenAcks``): one ``multiple`` ack for the
        run from the oldest unsettled delivery, the others one by one. A
        closed channel's need none: the broker put them back.
        """
        taken = self._taken.take_all()
        if not taken:
            return
        now = time.monotonic()
        channel = self._pool.channel
        if channel is not None and not channel.is_open:
            channel = None  # closing: the broker puts back what it carried
        ours = []
        for queue, held in taken:
            if held.owner is None or channel is None or held.channel is not channel:
                self.acknowledge(queue, held)  # adopted from a lane, or a closed channel
                continue
            consumer = self._pool.consumer(queue)
            if consumer is not None:
                consumer.wanted_at = now
            ours.append(held)
        if not ours or channel is None:
            return
        upto = self._unsettled.multiple_upto([held.delivery_tag for held in ours])
        if upto is not None:
            channel.basic_ack(upto, multiple=True)
            self._unsettled.settled_upto(upto)
        for held in ours:
            if upto is None or held.delivery_tag > upto:
                self.ack_tag(held.delivery_tag)
            if held.owner is not None:
                held.owner.unacked -= 1
                held.owner.handed_at = now

    def ack_tag(self, tag: int) -> None:
        channel = self._pool.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: only called while the channel is ours")
        channel.basic_ack(tag)
        self._unsettled.settled(tag)

    def nack_tag(self, tag: int) -> None:
        channel = self._pool.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: only called while the channel is ours")
        channel.basic_nack(tag, requeue=True)
        self._unsettled.settled(tag)

    def settle_held(self, held: Held, ack: bool) -> bool:
        """Settle a held message on its channel (the consumers', or an adopted
        message's lane) if still open; True if sent. A closed channel's
        messages are back in their queue already.
        """
        channel = held.channel
        if held.owner is not None:
            if channel is not self._pool.channel or channel is None:
                return False
        elif channel is None or not channel.is_open:
            return False
        if held.owner is None:  # adopted from a lane: not this channel's delivery
            if ack:
                channel.basic_ack(held.delivery_tag)
            else:
                channel.basic_nack(held.delivery_tag, requeue=True)
        else:
            (self.ack_tag if ack else self.nack_tag)(held.delivery_tag)
        if not ack:
            self.requeued = True
        return True
