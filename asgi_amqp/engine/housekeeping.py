"""The consumers' timers: held messages go back after ``linger``, unwanted consumers are cancelled.

A message held for a caller who never comes would wait in a busy process
while another process is idle, so it is nacked back once it has waited
``linger`` (``linger / k`` when ``k`` of one normal channel's queue are
held; a process-local queue's always get ``linger``: no other process could
take them, and its consumer holds up to a whole prefetch window); a consumer
nobody wanted for ``idle_timeout`` (``linger`` for one started for polls)
is cancelled to free the broker's resources. One timer on the I/O loop
serves every consumer, due when the oldest held message reaches its
limit rather than a whole interval later.

``Housekeeping`` is a mixin of ``consumers.ConsumerPool`` and uses its state
(``_consumers``, ``_held``, ``_waiters``, ``_cancel``); everything here runs
on the I/O thread.
"""

import time

from ..naming import is_process_local_queue


class Housekeeping(object):
    """The sweep that gives back what lingered and cancels what nobody wants."""

    _housekeeping = None  # the I/O loop's timer handle, while one is scheduled
    _housekeeping_at = 0.0

    def _schedule_housekeeping(self, due=None):
        if self._housekeeping is None and self.ready:
            interval = max(0.01, min(self._linger, self._idle_timeout) / 2.0)
            if due is not None:
                interval = max(0.005, min(interval, due))
            self._housekeeping_at = time.monotonic() + interval
            self._housekeeping = self._connection.ioloop.call_later(interval, self._sweep)

    def _sweep_by(self, when):
        """Make the next sweep happen by ``when`` (monotonic) at the latest."""
        if self._housekeeping is not None and self._housekeeping_at <= when:
            return
        if self._housekeeping is not None:
            self._connection.ioloop.remove_timeout(self._housekeeping)
            self._housekeeping = None
        self._schedule_housekeeping(max(0.0, when - time.monotonic()))

    def _allowed_wait(self, queue, count):
        """How long the oldest of ``count`` messages held from ``queue`` may wait."""
        if is_process_local_queue(queue):
            return self._linger
        return self._linger / max(count, 1)

    def _sweep(self):
        """Give back what lingered and cancel what nobody wants.

        The next sweep is due when the oldest held message reaches
        ``linger``, not a whole interval later: a held message is handed back
        within a few ms of ``linger``.
        """
        self._housekeeping = None
        if not self.ready:
            return
        self.send_taken_acks()  # before held messages behind them go back
        now = time.monotonic()
        wanted = set()
        for waiter in self._waiters:
            wanted |= waiter.queues
        due = None
        for consumer in list(self._consumers.values()):
            if consumer.queue in wanted or not consumer.active:
                continue
            if consumer.polled and now - consumer.wanted_at <= self._linger:
                # Polled within linger: what it holds is for the next poll.
                due = self._linger if due is None else min(due, self._linger)
                continue
            since, count = self._held.held_since(consumer.queue)
            allowed = self._allowed_wait(consumer.queue, count)
            lingered = since is not None and now - since > allowed
            unused_for = self._linger if consumer.polled else self._idle_timeout
            idle = since is None and now - consumer.wanted_at > unused_for
            if lingered or idle:
                self._cancel(consumer)
            elif since is not None:
                left = since + allowed - now + 0.002
                due = left if due is None else min(due, left)
        self._schedule_housekeeping(due)
