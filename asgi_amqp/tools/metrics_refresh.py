"""At most one look at the broker every ``refresh`` seconds, however often it is scraped.

``asgi-amqp metrics`` serves the figures of :mod:`asgi_amqp.tools.snapshot`
(what ``asgi-amqp top`` shows) and the broker's alarms. One look costs the
management API the requests of one refresh of ``top`` plus the alarms
check; Prometheus may scrape every second, and several servers may scrape
one exporter. So :class:`Readings` keeps the last :class:`Reading` and takes
a new one only once it is ``refresh`` seconds old. Scrapes that find it
stale at the same time wait for one look, under a lock (with a limit: past
it they get the last reading). A failed look is kept as long as a good one,
so an API that is down is not asked more often either.
"""

import dataclasses
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from .snapshot import Snapshot

logger = logging.getLogger(__name__)

Alarms = Optional[List[Dict[str, str]]]  # None: the broker cannot tell
Look = Callable[[], Tuple[Snapshot, Alarms]]

# How long a scrape waits for another scrape's look before it takes the last
# reading: below Prometheus' default scrape_timeout (10 s).
LOOK_WAIT = 8.0


@dataclasses.dataclass
class Reading:
    """One look at the broker: its figures, or why there are none."""

    snapshot: Optional[Snapshot]
    alarms: Alarms
    error: Optional[str]  # one line, without credentials (the client's messages have none)
    taken_at: float  # time.monotonic() when the look ended
    duration: float  # seconds the look took


class Readings(object):
    """The last reading, renewed on demand at most every ``refresh`` seconds."""

    def __init__(
        self,
        look: Look,
        refresh: float,
        first: Reading,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not refresh > 0:
            raise ValueError("refresh must be a positive number of seconds, not %r" % (refresh,))
        self._look = look
        self.refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._last = first
        self.looks = 1  # the first reading's look included
        self.failures = 0 if first.error is None else 1

    @staticmethod
    def take(look: Look, clock: Callable[[], float] = time.monotonic) -> Reading:
        """A reading from one look; what the look raises propagates (the command's first)."""
        started = clock()
        snapshot, alarms = look()
        ended = clock()
        return Reading(snapshot, alarms, None, ended, ended - started)

    def current(self) -> Reading:
        """The last reading, after a new look if it is ``refresh`` seconds old."""
        if not self._stale():
            return self._last
        if not self._lock.acquire(timeout=LOOK_WAIT):
            return self._last  # another scrape's look is slow: the figures we have
        try:
            if self._stale():  # another scrape may have looked meanwhile
                self._renew()
            return self._last
        finally:
            self._lock.release()

    def _stale(self) -> bool:
        return self._clock() - self._last.taken_at >= self.refresh

    def _renew(self) -> None:
        started = self._clock()
        self.looks += 1
        try:
            reading = self.take(self._look, self._clock)
        except Exception as exc:  # kept and served as asgi_amqp_up 0, never a failed scrape
            ended = self._clock()
            error = " ".join(str(exc).split()) or type(exc).__name__
            reading = Reading(None, None, error, ended, ended - started)
            self.failures += 1
            if self._last.error is None:
                logger.error("cannot read the broker's figures: %s", error)
            else:
                logger.debug("still cannot read the broker's figures: %s", error)
        else:
            if self._last.error is not None:
                logger.warning("reading the broker's figures again")
        self._last = reading
