"""Carry over: the work in flight on a lost connection runs again on the next one.

Channels' worker loop catches nothing that ``receive`` or ``send_group``
raise, so a lost connection fails nobody: work whose caller still waits is
carried over, in order, and only an outage longer than ``operation_timeout``
reaches the caller. Publishes in doubt go again as marked copies (``publisher``).
Without it, test_connection_loss.py::test_sends_and_receives_ride_through_repeated_kills fails.
Declares and binds are idempotent, so they may run twice
(tests/test_connection_loss.py::test_group_calls_ride_through_kills).

``Dispatched`` is the I/O thread's; callers read ``retried`` and
``republished`` for the statistics.
"""

import collections
import logging
from typing import Deque, List

from ..work import Work

logger = logging.getLogger(__name__)

PRUNE_EVERY = 1024  # finished work is dropped from the list once it grows this long


class Dispatched(object):
    """The work dispatched on the current connection pair that may be carried over."""

    def __init__(self) -> None:
        self._works: Deque[Work] = collections.deque()
        self._prune_at = PRUNE_EVERY
        self.retried = 0  # pieces of work carried over
        self.republished = 0  # marked copies of publishes whose confirm was lost

    def add(self, work: Work) -> None:
        self._works.append(work)
        if len(self._works) >= self._prune_at:
            self._works = collections.deque(w for w in self._works if w.pending.wanted)
            self._prune_at = max(PRUNE_EVERY, 2 * len(self._works))

    def take(self) -> Deque[Work]:
        """All of it, in order, for a connection that is going; the list starts afresh."""
        works, self._works = self._works, collections.deque()
        self._prune_at = PRUNE_EVERY
        return works

    def carry(self, works: Deque[Work]) -> List[Work]:
        """Those of ``works`` whose callers still wait, counted and logged, to run first."""
        carried = [work for work in works if work.pending.wanted]
        if not carried:
            return carried
        uncertain = sum(1 for work in carried if work.maybe_delivered)
        self.retried += len(carried)
        self.republished += uncertain
        if uncertain:
            logger.warning(
                "%d publishes lost their confirm with the connection; they will be "
                "sent again, marked so that a receiver drops a copy it already has",
                uncertain,
            )
        logger.info("%d operations in flight will run again on the next connection", len(carried))
        return carried
