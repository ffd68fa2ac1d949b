"""The I/O thread's inbox: the one place where callers' threads meet it.

A caller appends its work under a lock and wakes the loop with pika's
``add_callback_threadsafe`` (its one call safe from another thread), only
when no wake-up is on its way: a burst of callers costs one wake-up.
"""

import collections
import threading
from typing import Deque, Iterable, List

from ...errors import LayerClosed
from ..work import Work


class Inbox(object):
    """Work for the I/O thread, and whether a wake-up is pending: callers put, it takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._works: Deque[Work] = collections.deque()
        self._wakeup_sent = False
        self.closed = False

    def put(self, works: Iterable[Work]) -> bool:
        """Add ``works``; True if the caller must wake the loop. ``LayerClosed`` once closed."""
        with self._lock:
            if self.closed:
                raise LayerClosed("the layer is closed")
            self._works.extend(works)
            if self._wakeup_sent:
                return False
            self._wakeup_sent = True
            return True

    def take_all(self) -> List[Work]:
        """Everything put so far, in order (on the I/O thread, once woken)."""
        with self._lock:
            self._wakeup_sent = False
            batch = list(self._works)
            self._works.clear()
        return batch

    def close(self) -> bool:
        """Refuse any further work; False if it was closed already."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            return True
