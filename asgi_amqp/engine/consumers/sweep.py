"""The consumers' timer: held messages go back after ``linger``, unwanted consumers are cancelled.

A held message could wait in a busy process while another is idle, so it
goes back once it waited ``linger`` (``linger / k`` with ``k`` of one normal
queue held). A process-local queue's wait ``PROCESS_LOCAL_HOLD`` at least: no
other process could take them. A consumer nobody wanted for ``idle_timeout``
(``linger`` if started for polls) is cancelled to free the broker's resources.

Broker fact: a quorum queue before 4.0 puts what it is given back behind the
later messages (``test_a_poller_that_pauses_gets_its_messages_in_order``).

Owned by ``pool.ConsumerPool``; I/O thread only. Owns its timer and when it is due.
"""

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from ...naming import is_process_local_queue, is_shard_queue
from ..deliveries import HeldMessages

if TYPE_CHECKING:
    from .pool import ConsumerPool

logger = logging.getLogger(__name__)

# Seconds a process-local queue's held messages wait for the next poll; then
# they go back, to expire there if nobody polls (and drop their channel's groups).
PROCESS_LOCAL_HOLD = 5.0
# Seconds between two ``keep_asked``: the consumers of receives served from held
# messages stay wanted (``test_a_busy_worker_keeps_consuming_a_quiet_shard``).
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
        self._timer: Any = None  # the I/O loop's, while one is scheduled
        self._due_at = 0.0  # monotonic
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
        """Sweep by ``when`` (monotonic) at the latest."""
        if self._timer is not None and self._due_at <= when:
            return
        self.stop()
        self.schedule(max(0.0, when - time.monotonic()))

    def stop(self) -> None:
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None

    def allowed_wait(self, queue: str, count: int) -> float:
        """How long the oldest of ``count`` messages held from ``queue`` may wait."""
        if is_process_local_queue(queue):
            return max(self._linger, PROCESS_LOCAL_HOLD)
        return self._linger / max(count, 1)

    def _sweep(self) -> None:
        """Then due when the oldest held message reaches its limit, not a whole
        interval later."""
        self._timer = None
        pool = self._pool
        if not pool.ready:
            return
        pool.acks.send_taken()  # before held messages behind them go back
        now = time.monotonic()
        if now - self._kept_at >= KEEP_ASKED_EVERY:
            self._kept_at = now
            pool.keep_asked(self._held.asked_since(now - KEEP_ASKED_EVERY))
        wanted = pool.waited_for()
        due: Optional[float] = None
        for consumer in pool.consumers():
            if consumer.queue in wanted or not consumer.active:
                continue
            if is_shard_queue(consumer.queue):
                # What a shard holds is this process's to hand out: given back,
                # a quorum queue may requeue it behind the later frames.
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
