"""Group fan-out waits for the broker to settle after an outage that refused connections.

After an outage in which the broker refused new connections (a restart, or
a cluster node going away), publishes that fan out to process-local group
members are held for ``settle_after_outage`` seconds. The broker carries
that fan-out by dead-lettering, which is at most once: measured on 3.10, a
group message dead-lettered into a quorum queue in the first 0.4-0.5 s
after the node accepts connections again is dropped while the queue's
leader is being elected, for 300 queues as for one, even though its
publish was confirmed. A connection merely killed needs no settling, and
classic queues are ready when the node accepts connections.

``SettlingAfterOutage`` is a mixin of ``connection.IOThread`` (its loop,
``_session``, ``_waiting`` and ``_dispatch``); everything here runs on the
I/O thread. Held work stays in ``_settling``, which a loss hands to the
next connection and a close fails, like any other work.
"""

import collections
import logging
import time

logger = logging.getLogger(__name__)


class SettlingAfterOutage(object):
    """Holds publishes that fan out until ``settle_after_outage`` has passed."""

    _settle_after_outage = 0.0
    _settled_at = 0.0  # monotonic time from which fan-out goes out

    def _begin_settling(self):
        """The pair opened after refused attempts: hold fan-out from now on."""
        if self._settle_after_outage <= 0:
            return
        logger.info(
            "the broker was unreachable: group fan-out waits %.1f s for its queues to settle",
            self._settle_after_outage,
        )
        self._settled_at = time.monotonic() + self._settle_after_outage

    def _held_to_settle(self, work):
        """Hold ``work`` if it fans out while the broker settles; True if held."""
        if not getattr(work, "fans_out", False) or time.monotonic() >= self._settled_at:
            return False
        if not self._settling:
            self._ioloop.call_later(self._settled_at - time.monotonic(), self._release_settling)
        self._settling.append(work)
        return True

    def _release_settling(self):
        remaining = self._settled_at - time.monotonic()
        if remaining > 0:  # a timer left from an earlier settling period
            self._ioloop.call_later(remaining, self._release_settling)
            return
        settling, self._settling = self._settling, collections.deque()
        for work in settling:
            if not work.pending.wanted:
                continue
            if self._session is not None:
                self._dispatch(work)
            else:
                self._waiting.append(work)
