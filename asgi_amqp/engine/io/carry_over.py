"""Work carried from a lost connection to the next: a lost connection fails nobody.

Channels' worker loop catches nothing that ``receive`` or ``send_group``
raise, so an exception there ends the runworker process. Instead, every
piece of work dispatched on the lost connection that its caller still waits
for is handed to the next connection, in the order it came: declares and
binds run again (they are idempotent), receives ask again, and publishes
are sent again (see ``publisher`` for the ones that may already be in their
queue). The caller's own timeout bounds all of it: only an outage longer
than ``operation_timeout`` reaches the caller, as ``OperationTimeout``
naming the lost connection.

``Dispatched`` keeps that work for the I/O thread (``io.thread.IOThread``),
the only thread that touches it; ``retried`` and ``republished`` are read by
callers for the layer's statistics.
"""

import collections
import logging
from typing import Deque, List

from ..work import Work

logger = logging.getLogger(__name__)

PRUNE_EVERY = 1024  # finished work is dropped from the list once it grows this long


class Dispatched(object):
    """The work dispatched on the current connection pair that may run again."""

    def __init__(self) -> None:
        self._works: Deque[Work] = collections.deque()
        self._prune_at = PRUNE_EVERY
        self.retried = 0  # pieces of work handed from a lost connection to the next
        self.republished = 0  # marked copies of publishes whose confirm was lost

    def add(self, work: Work) -> None:
        self._works.append(work)
        if len(self._works) >= self._prune_at:
            # Forget finished work, so the list grows only with work in flight.
            self._works = collections.deque(w for w in self._works if w.pending.wanted)
            self._prune_at = max(PRUNE_EVERY, 2 * len(self._works))

    def take(self) -> Deque[Work]:
        """All of it, in order, for a connection that is going; the list starts afresh."""
        works, self._works = self._works, collections.deque()
        self._prune_at = PRUNE_EVERY
        return works

    def carry(self, works: Deque[Work]) -> List[Work]:
        """Those of ``works`` whose callers still wait, counted and logged:
        the next connection runs them first."""
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
