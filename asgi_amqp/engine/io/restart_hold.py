"""Group fan-out waits for the broker's queues after an outage that refused connections.

After an outage in which the broker refused new connections (a restart, or
a cluster node going away), publishes that fan out to process-local group
members are held back for ``seconds`` (the layer's
``RESTART_HOLD_SECONDS`` for quorum queues). The broker carries that
fan-out by dead-lettering, which is at most once: measured on 3.10, a
group message dead-lettered into a quorum queue in the first 0.4-0.5 s
after the node accepts connections again is dropped while the queue's
leader is being elected, for 300 queues as for one, even though its
publish was confirmed. A connection merely killed needs no hold, and
classic queues are ready when the node accepts connections.

``RestartHold`` is owned by ``io.thread.IOThread`` and runs on the I/O
thread only. The work it holds back stays in it until the hold ends, when
it is handed to the ``release`` callable the thread gives it (run now, or
wait for a session); a loss takes it out (``take_all``) to hand it to the
next connection, and a close fails it, like any other work.
"""

import collections
import logging
import time
from typing import Callable, Deque

from ..work import Work

logger = logging.getLogger(__name__)

CallLater = Callable[[float, Callable[[], None]], object]


class RestartHold(object):
    """Holds back publishes that fan out until ``seconds`` after a refused outage."""

    def __init__(
        self, seconds: float, call_later: CallLater, release: Callable[[Work], None]
    ) -> None:
        self._seconds = seconds
        self._call_later = call_later  # the I/O loop's, resolved when called
        self._release = release  # runs a piece of work whose hold ended
        self._until = 0.0  # monotonic time from which fan-out goes out
        self._held_back: Deque[Work] = collections.deque()

    def begin(self) -> None:
        """The pair opened after refused attempts: hold fan-out back from now on."""
        if self._seconds <= 0:
            return
        logger.info(
            "the broker was unreachable: group fan-out waits %.1f s for its queues to be ready",
            self._seconds,
        )
        self._until = time.monotonic() + self._seconds

    def holds_back(self, work: Work) -> bool:
        """Hold ``work`` back if it fans out while the hold lasts; True if it did."""
        if not work.fans_out or time.monotonic() >= self._until:
            return False
        if not self._held_back:
            self._call_later(self._until - time.monotonic(), self._end)
        self._held_back.append(work)
        return True

    def take_all(self) -> Deque[Work]:
        """Everything held back, in order, for a connection that is going or a close."""
        held_back, self._held_back = self._held_back, collections.deque()
        return held_back

    def _end(self) -> None:
        remaining = self._until - time.monotonic()
        if remaining > 0:  # a timer left from an earlier hold
            self._call_later(remaining, self._end)
            return
        for work in self.take_all():
            if work.pending.wanted:
                self._release(work)
