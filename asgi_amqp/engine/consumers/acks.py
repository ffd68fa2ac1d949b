"""Every ack and nack of the consumers' channel.

A caller that takes a held message in its own thread leaves the ack to the
I/O thread: it goes into ``TakenAcks`` and the caller wakes the I/O thread
(``IOThread.take_pushed``), which sends what waits there before the work it
is woken for and before a sweep gives held messages back. A process-local
queue's redelivery comes back to this process, whose hand-off log drops it
(``deliveries.HandedOff``).

Owned by ``pool.ConsumerPool``; ``Acks`` is the I/O thread's. ``TakenAcks``
is shared: callers' threads add to it (``IOThread.take_pushed``), under its
lock.
"""

import threading
import time
from typing import TYPE_CHECKING, List, Tuple

from ..deliveries import Held

if TYPE_CHECKING:
    from .pool import ConsumerPool


class TakenAcks(object):
    """Taken held messages whose acks are not sent yet.

    Callers' threads add; the I/O thread empties it; under its own lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: List[Tuple[str, Held]] = []

    def add(self, queue: str, held: Held) -> None:
        """Record that a caller took ``held`` from ``queue``."""
        with self._lock:
            self._taken.append((queue, held))

    def take_all(self) -> List[Tuple[str, Held]]:
        """Oldest first."""
        with self._lock:
            taken, self._taken = self._taken, []
        return taken

    def __len__(self) -> int:
        return len(self._taken)


class Acks(object):
    """Every ack and nack of the consumers' channel (I/O thread only)."""

    def __init__(self, pool: "ConsumerPool", taken: TakenAcks) -> None:
        self._pool = pool
        self._taken = taken  # shared with callers' threads

    def acknowledge(self, queue: str, held: Held) -> None:
        """Ack a held message handed over on the I/O thread."""
        consumer = self._pool.consumer(queue)
        if consumer is not None:
            consumer.wanted_at = time.monotonic()
        if self.settle_held(held, ack=True):
            held.owner.unacked -= 1
            held.owner.handed_at = time.monotonic()

    def send_taken(self) -> None:
        """Ack what callers took (``TakenAcks``), oldest first. A closed
        channel's need none: the broker put them back.
        """
        taken = self._taken.take_all()
        if not taken:
            return
        now = time.monotonic()
        channel = self._pool.channel
        if channel is not None and not channel.is_open:
            channel = None  # closing: the broker puts back what it carried
        for queue, held in taken:
            if channel is None or held.channel is not channel:
                self.acknowledge(queue, held)  # a closed channel's
                continue
            consumer = self._pool.consumer(queue)
            if consumer is not None:
                consumer.wanted_at = now
            channel.basic_ack(held.delivery_tag)
            held.owner.unacked -= 1
            held.owner.handed_at = now

    def ack_tag(self, tag: int) -> None:
        channel = self._pool.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: only called while the channel is ours")
        channel.basic_ack(tag)

    def nack_tag(self, tag: int) -> None:
        channel = self._pool.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: only called while the channel is ours")
        channel.basic_nack(tag, requeue=True)

    def settle_held(self, held: Held, ack: bool) -> bool:
        """Settle a held message on the consumers' channel if it is still the one
        that was pushed it; True if sent. A closed channel's messages are back in
        their queue already.
        """
        channel = held.channel
        if channel is not self._pool.channel or channel is None:
            return False
        (self.ack_tag if ack else self.nack_tag)(held.delivery_tag)
        return True
