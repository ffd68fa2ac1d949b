"""The consumers' timer: held messages go back after ``linger``, unwanted consumers are cancelled.

A message held for a caller who never comes would wait in a busy process
while another process is idle, so it is nacked back once it has waited
``linger`` (``linger / k`` when ``k`` of one normal channel's queue are
held). A process-local queue's wait ``PROCESS_LOCAL_HOLD`` at least: no
other process could take them, and a quorum queue puts what it is given
back behind the later messages, so a daphne whose reactor paused for a
moment delivered its replies out of order; a consumer
nobody wanted for ``idle_timeout`` (``linger`` for one started for polls)
is cancelled to free the broker's resources. One timer on the I/O loop
serves every consumer, due when the oldest held message reaches its
limit rather than a whole interval later.

``Sweep`` is owned by ``consumers.pool.ConsumerPool`` and runs on the I/O
thread only. It owns the timer and when it is due; it reads the pool's
consumers and waiters, and cancels consumers, through the pool's public
methods.
"""

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from ...naming import is_process_local_queue, is_shard_queue
from ..deliveries import HeldMessages

if TYPE_CHECKING:
    from .pool import ConsumerPool

logger = logging.getLogger(__name__)

# Seconds the messages held from a process-local queue wait for this
# process's next poll before they go back (for a process that stopped
# polling: they expire in their queue, and its groups drop the channel).
PROCESS_LOCAL_HOLD = 5.0
# Seconds between two looks at what blocking receives served from held
# messages asked for. Without it a busy worker, whose receives always find
# a message held, cancelled the quiet shards it served after idle_timeout
# and never consumed them again: their sockets stalled.
KEEP_ASKED_EVERY = 1.0


class Sweep(object):
    """The sweep that gives back what lingered and cancels what nobody wants."""

    def __init__(
        self, pool: "ConsumerPool", held: HeldMessages, linger: float, idle_timeout: float
    ) -> None:
        self._pool = pool
        self._held = held
        self._linger = linger
        self._idle_timeout = idle_timeout
        self._timer: Any = None  # the I/O loop's timer handle, while one is scheduled
        self._due_at = 0.0  # monotonic time the scheduled sweep runs at
        self._kept_at = 0.0  # monotonic time of the last ``keep_asked``

    def schedule(self, due: Optional[float] = None) -> None:
        """Sweep in half the shorter limit, or in ``due`` seconds if sooner."""
        if self._timer is None and self._pool.ready:
            interval = max(0.01, min(self._linger, self._idle_timeout) / 2.0)
            if due is not None:
                interval = max(0.005, min(interval, due))
            self._due_at = time.monotonic() + interval
            self._timer = self._pool.ioloop.call_later(interval, self._sweep)

    def due_by(self, when: float) -> None:
        """Make the next sweep happen by ``when`` (monotonic) at the latest."""
        if self._timer is not None and self._due_at <= when:
            return
        self.stop()
        self.schedule(max(0.0, when - time.monotonic()))

    def stop(self) -> None:
        """Cancel the timer: the channel or the connection is gone."""
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None

    def allowed_wait(self, queue: str, count: int) -> float:
        """How long the oldest of ``count`` messages held from ``queue`` may wait."""
        if is_process_local_queue(queue):
            return max(self._linger, PROCESS_LOCAL_HOLD)
        return self._linger / max(count, 1)

    def _sweep(self) -> None:
        """Give back what lingered and cancel what nobody wants.

        The next sweep is due when the oldest held message reaches
        ``linger``, not a whole interval later: a held message is handed back
        within a few ms of ``linger``.
        """
        self._timer = None
        pool = self._pool
        if not pool.ready:
            return
        pool.acks.send_taken()  # before held messages behind them go back
        now = time.monotonic()
        if now - self._kept_at >= KEEP_ASKED_EVERY:
            # Blocking receives served from held messages reached no waiter.
            self._kept_at = now
            pool.keep_asked(self._held.asked_since(now - KEEP_ASKED_EVERY))
        wanted = pool.waited_for()
        due: Optional[float] = None
        for consumer in pool.consumers():
            if consumer.queue in wanted or not consumer.active:
                continue
            if is_shard_queue(consumer.queue):
                # What a shard holds is this process's to hand out: given
                # back, a quorum queue requeues it behind the shard's later
                # frames, and another process takes the socket's next one.
                # Only a shard nobody here wants any more goes back.
                if now - consumer.wanted_at > self._idle_timeout:
                    pool.cancel(consumer)
                continue
            if consumer.polled and now - consumer.wanted_at <= self._linger:
                # Polled within linger: what it holds is for the next poll.
                due = self._linger if due is None else min(due, self._linger)
                continue
            since, count = self._held.held_since(consumer.queue)
            allowed = self.allowed_wait(consumer.queue, count)
            lingered = since is not None and now - since > allowed
            unused_for = self._linger if consumer.polled else self._idle_timeout
            idle = since is None and now - consumer.wanted_at > unused_for
            if lingered or idle:
                if since is not None:  # lingered
                    logger.debug(
                        "%s: %d held messages go back after %.2f s",
                        consumer.queue,
                        count,
                        now - since,
                    )
                pool.cancel(consumer)
            elif since is not None:
                left = since + allowed - now + 0.002
                due = left if due is None else min(due, left)
        self.schedule(due)
