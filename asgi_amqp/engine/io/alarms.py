"""Alarms: the broker blocks the publishing connection until a resource alarm clears.

Meanwhile every publish fails at once with ``BrokerBlocked``; whether to
wait for ``unblocked`` is the caller's choice (``Engine.publish``: a worker
waits, daphne's reactor thread must not). ``AlarmGate`` is
``io.thread.IOThread``'s; its methods run on the I/O thread.

* the broker blocks only connections that publish, and ``Connection.Unblocked``
  ends it without a reconnect
  (test_broker_alarms.py::test_an_alarm_blocks_sends_for_a_bounded_time_while_receives_go_on);
* publishes in flight when the block arrives may still be delivered after it;
* a new connection is blocked again at its first publish, so pika's
  ``blocked_connection_timeout`` stays off unless the URL sets it.
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
    """Whether an alarm blocks publishing, and the event callers wait on for it to clear."""

    def __init__(self) -> None:
        # The alarm's reason and start while it lasts: written by the I/O thread, read by callers.
        self.blocked: Optional[str] = None
        self.blocked_since: Optional[float] = None
        # Set while no alarm lasts: callers wait on it, the I/O thread sets it.
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
        """The alarm lifted, or the connection it blocked is gone."""
        self.blocked = None
        self.blocked_since = None
        self.unblocked.set()
        if publisher is not None:
            publisher.unblock()
