"""Resource alarms: the broker blocks the publishing connection.

While the broker blocks the publishing connection (``Connection.Blocked``,
with its reason, "low on memory" or "low on disk"), every publish fails at
once with ``BrokerBlocked`` on the I/O thread, which never holds work for
an alarm: whether a caller waits for it to clear is the caller's choice
(the layer's ``_publish``: a worker's thread waits, daphne's reactor thread
must not), and ``unblocked`` is the event it waits on. Publishes already in
flight when the block arrives fail with it too (the broker may still
deliver them when it reads their frames after the alarm). ``Connection.Unblocked`` ends it by
itself; nothing reconnects. pika's ``blocked_connection_timeout`` is off
unless the URL sets it: closing a blocked connection does not end an alarm,
and the new connection would be blocked again at its first publish.

``ResourceAlarms`` is a mixin of ``connection.IOThread`` (its
``_publishing`` connection and ``_session``); it runs on the I/O thread,
and ``blocked`` is read by callers for the layer's statistics.
"""

import logging
import threading
import time

from ..urls import describe_parameters

logger = logging.getLogger(__name__)


class ResourceAlarms(object):
    """``Connection.Blocked`` and ``Connection.Unblocked`` on the publishing connection."""

    # The broker's reason while it blocks publishing (a resource alarm), else None.
    blocked = None
    blocked_since = None
    unblocked: threading.Event  # set while publishing is not blocked (callers wait on it)

    def _on_blocked(self, connection, frame):
        if connection is not self._publishing:
            return
        reason = getattr(frame.method, "reason", None) or "a resource alarm"
        self.blocked = reason
        self.blocked_since = time.monotonic()
        self.unblocked.clear()
        logger.warning(
            "the broker at %s blocks publishing: %s (a resource alarm); sends fail with "
            "BrokerBlocked until it clears, receives go on",
            describe_parameters(connection.params),
            reason,
        )
        if self._session is not None:
            self._session.publisher.block(reason)

    def _on_unblocked(self, connection, _frame):
        if connection is not self._publishing:
            return
        logger.warning(
            "the broker at %s publishes again: the alarm cleared after %.1f s",
            describe_parameters(connection.params),
            time.monotonic() - (self.blocked_since or time.monotonic()),
        )
        self._set_unblocked()

    def _set_unblocked(self):
        self.blocked = None
        self.blocked_since = None
        self.unblocked.set()
        if self._session is not None:
            self._session.publisher.unblock()
