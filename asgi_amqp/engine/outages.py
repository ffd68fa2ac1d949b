"""What callers do while the broker is away.

A blocking receive returns nothing through an outage, however long, and a
worker thread (one that has made a blocking receive: a Channels
runworker's) waits an outage out in its other calls too, because Channels
catches nothing around them (``Engine.wait`` and ``Engine._ride_out``).
Both say so once per outage, at WARNING, whatever the number of calls
that meet it. State: ``WorkerThread`` is per calling thread;
``OutageNotice`` is shared by every caller thread, under its lock.
"""

import logging
import threading
from typing import Optional

from .io import IOThread

logger = logging.getLogger(__name__)


class WorkerThread(threading.local):
    """``marked``: this thread has made a blocking receive (``Engine._ride_out``)."""

    marked = False


class OutageNotice(object):
    """One WARNING per outage, however many calls meet it.

    An outage is told apart by the moment its connection was lost
    (``IOThread.disconnected_since``). Shared by every caller thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: Optional[float] = None  # disconnected_since of the outage told

    def once(self, io: IOThread, what: str) -> None:
        since = io.disconnected_since
        if since is None:
            return
        with self._lock:
            if self._told == since:
                return
            self._told = since
        logger.warning(
            "the broker has been unreachable for %.1f s (%s); %s, and the layer keeps reconnecting",
            io.outage(),
            io.last_error_text or "connection lost",
            what,
        )
