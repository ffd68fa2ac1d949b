"""Acks of held messages that callers took in their own threads, sent in batches.

A caller that finds its next message already pushed (``HeldMessages``)
takes it under a lock, and the ack follows through the I/O thread. Sent one
by one, those acks cost the broker as much as the deliveries themselves:
consuming 20,000 messages from a queue with a prefetch window of 16, the
broker spent 141 us of CPU per message with one ``basic.ack`` each and 64 us
with one ``basic.ack(multiple=True)`` per 8 (154 and 73 us for a quorum
queue). daphne takes the whole fan-out of a chat, 1,000 deliveries a second
for 20 clients in rooms of 5, from its one process-local queue, so its acks
were a good part of what a 2-core machine's broker did. Each ack also woke
the I/O thread unless a wake-up was pending already.

So an ack may wait, in ``TakenAcks``, while its caller is likely to come
back for the next held message of the same queue at once: the queue is
process-local (no other process reads it, so a message redelivered after a
connection loss comes back to this process, whose hand-off log drops it,
``deliveries.HandedOff``), more of it is held, and fewer than ``ACK_BATCH``
acks wait. Otherwise the take asks the I/O thread to send every waiting ack
now. The I/O thread also sends them before anything else it is woken for,
and before a sweep (``Sweep``) gives held messages back, so an ack never
waits longer than the held messages behind it, which ``linger`` bounds.

``Acks.send_taken`` sends them: one ``basic.ack`` with
``multiple=True`` for the run of waiting acks that starts at the oldest
unsettled delivery of the consumers' channel, and a single ack for each of
the others. ``Unsettled`` is what makes ``multiple`` safe: it knows every
delivery tag the channel was pushed and not yet acked or nacked, so a
multiple ack never covers a message nobody took.

``Acks`` is owned by ``consumers.pool.ConsumerPool``: every ack and nack
of the consumers' channel goes through it, which is what keeps
``Unsettled`` exact. It owns that ``Unsettled`` and the ``requeued`` flag
(I/O thread only); the ``TakenAcks`` it sends from is shared with the
I/O thread's callers (``io.thread.IOThread.take_pushed`` adds to it). It
reads the pool's channel and consumers through the pool's public names.
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

# Acks that may wait together; half the default consumer_prefetch of 16, so
# that the broker still has room to push while they wait.
ACK_BATCH = 8


class SendTakenAcks(Work):
    """Ack the held messages callers took in their own threads (``Acks.send_taken``).

    The I/O thread already sends them when it drains its inbox; this work
    is what wakes it for them (``IOThread.take_pushed`` submits it), and
    finds nothing left as a rule. Nobody waits for it, and it never runs on
    a next connection: the lost connection's deliveries are back in their
    queues.
    """

    __slots__ = ()
    retry = False

    def __call__(self, session: "Session") -> None:
        session.consumers.acks.send_taken()
        self.pending.resolve(None)


class TakenAcks(object):
    """Held messages callers took whose acks the I/O thread has not sent yet.

    Callers' threads add; the I/O thread takes them all when it sends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: List[Tuple[str, Held]] = []

    def add(self, queue: str, held: Held, more_held: bool) -> bool:
        """Record that a caller took ``held`` from ``queue``.

        True if the acks should go now: see the module docstring for when
        one may wait. ``more_held``: whether ``queue`` still has held messages.
        """
        with self._lock:
            self._taken.append((queue, held))
            waiting = len(self._taken)
        return waiting >= ACK_BATCH or not more_held or not is_process_local_queue(queue)

    def take_all(self) -> List[Tuple[str, Held]]:
        """Every ``(queue, held)`` recorded so far, oldest first."""
        with self._lock:
            taken, self._taken = self._taken, []
        return taken

    def __len__(self) -> int:
        return len(self._taken)


class Unsettled(object):
    """Delivery tags of one channel not yet acked or nacked, oldest first.

    Tags grow with each delivery on a channel, and a dict keeps insertion
    order, so the first key is the oldest unsettled delivery. I/O thread only.
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

        That is the end of the run of ``tags`` starting at the oldest
        unsettled tag with no unsettled tag outside ``tags`` in it; None if
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
    """Acks and nacks on the consumers' channel, single or batched (I/O thread only)."""

    def __init__(self, pool: "ConsumerPool", taken: TakenAcks) -> None:
        self._pool = pool
        self._taken = taken  # shared with callers' threads: see TakenAcks
        self._unsettled = Unsettled()  # this channel's deliveries not yet acked or nacked
        self.requeued = False  # a nack was sent since the last barrier (``Polls.barrier``)

    def new_channel(self) -> None:
        """Delivery tags start again on a new channel."""
        self._unsettled.clear()

    def pushed(self, tag: int) -> None:
        """The channel was pushed ``tag``: it is unsettled until acked or nacked."""
        self._unsettled.pushed(tag)

    def gone(self, tag: int) -> None:
        """``tag`` needs no ack any more (its queue was deleted with it)."""
        self._unsettled.settled(tag)

    def acknowledge(self, queue: str, held: Held) -> None:
        """Ack a held message a caller has taken on the I/O thread."""
        consumer = self._pool.consumer(queue)
        if consumer is not None:
            consumer.wanted_at = time.monotonic()
        if self.settle_held(held, ack=True) and held.owner is not None:
            held.owner.unacked -= 1
            held.owner.handed_at = time.monotonic()

    def send_taken(self) -> None:
        """Ack what callers took in their own threads (``TakenAcks``).

        One ``multiple`` ack covers the run that starts at the oldest
        unsettled delivery of this channel, where every message was taken;
        the others are acked one by one. A message from a closed channel
        needs no ack: the broker put it back, and the hand-off log drops it
        when it comes again.
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
        """Ack or nack a held message on the channel it came by, if that is still open.

        That is the consumers' channel, or for a message adopted from a
        ``basic.get`` (see ``Polls.adopt``) a getter's lane. Once its channel
        closed the broker has put it back already. True if it was sent.
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
