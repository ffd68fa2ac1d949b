"""Resource alarms: the broker blocks the publishing connection.

While the broker blocks the publishing connection (``Connection.Blocked``,
with its reason, "low on memory" or "low on disk"), every publish fails at
once with ``BrokerBlocked`` on the I/O thread, which never holds work for
an alarm: whether a caller waits for it to clear is the caller's choice
(``Engine.publish``: a worker's thread waits, daphne's reactor thread
must not), and ``unblocked`` is the event it waits on. Publishes already in
flight when the block arrives fail with it too (the broker may still
deliver them when it reads their frames after the alarm). ``Connection.Unblocked`` ends it by
itself; nothing reconnects. pika's ``blocked_connection_timeout`` is off
unless the URL sets it: closing a blocked connection does not end an alarm,
and the new connection would be blocked again at its first publish.

``AlarmGate`` is owned by ``io.thread.IOThread``, which registers its own
``Connection.Blocked`` callbacks on the publishing connection and hands
the gate the frame's reason and the session's publisher. The gate's
methods run on the I/O thread; ``blocked`` and ``blocked_since`` are read
by callers for the layer's statistics, and ``unblocked`` is waited on by
callers (a ``threading.Event``, set by the I/O thread only).
"""

import logging
import threading
import time
from typing import Optional

import pika.connection

from ...urls import describe_parameters
from ..publisher import Publisher

logger = logging.getLogger(__name__)


class AlarmGate(object):
    """Whether the broker blocks publishing, and the event callers wait on for it to clear."""

    def __init__(self) -> None:
        # The broker's reason while it blocks publishing (a resource alarm),
        # else None. Written by the I/O thread, read by callers.
        self.blocked: Optional[str] = None
        self.blocked_since: Optional[float] = None
        # Set while publishing is not blocked: callers wait on it, the I/O thread sets it.
        self.unblocked = threading.Event()
        self.unblocked.set()

    def block(
        self, reason: str, parameters: pika.connection.Parameters, publisher: Optional[Publisher]
    ) -> None:
        """``Connection.Blocked`` arrived on the publishing connection."""
        self.blocked = reason
        self.blocked_since = time.monotonic()
        self.unblocked.clear()
        logger.warning(
            "the broker at %s blocks publishing: %s (a resource alarm); sends fail with "
            "BrokerBlocked until it clears, receives go on",
            describe_parameters(parameters),
            reason,
        )
        if publisher is not None:
            publisher.block(reason)

    def lift(self, parameters: pika.connection.Parameters, publisher: Optional[Publisher]) -> None:
        """``Connection.Unblocked`` arrived on the publishing connection."""
        logger.warning(
            "the broker at %s publishes again: the alarm cleared after %.1f s",
            describe_parameters(parameters),
            time.monotonic() - (self.blocked_since or time.monotonic()),
        )
        self.clear(publisher)

    def clear(self, publisher: Optional[Publisher]) -> None:
        """No alarm any more: it lifted, or the connection it blocked is gone."""
        self.blocked = None
        self.blocked_since = None
        self.unblocked.set()
        if publisher is not None:
            publisher.unblock()
