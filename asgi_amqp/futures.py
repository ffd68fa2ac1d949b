"""The hand-off between a calling thread and the I/O thread.

``concurrent.futures.Future`` cannot express the one rule receives need: a
message may be acknowledged to the broker only if the caller is still there
to take it. ``Pending`` makes that a single atomic decision. The I/O thread
calls ``resolve`` and learns whether the caller accepted the value; a caller
that gives up calls ``abandon``, and from then on ``resolve`` returns False,
so the I/O thread puts the message back instead of losing it.
"""

import threading

from .errors import OperationTimeout

_PENDING, _DONE, _ABANDONED = "pending", "done", "abandoned"


class Pending(object):
    __slots__ = ("_lock", "_event", "_state", "_value", "_error", "description")

    def __init__(self, description="operation"):
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._state = _PENDING
        self._value = None
        self._error = None
        self.description = description

    @property
    def wanted(self):
        """True while the caller still waits; I/O-thread work may be skipped otherwise."""
        return self._state == _PENDING

    def resolve(self, value=None):
        """Hand ``value`` to the caller. Returns False if nobody will take it."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _DONE
            self._value = value
        self._event.set()
        return True

    def fail(self, error):
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _DONE
            self._error = error
        self._event.set()
        return True

    def abandon(self):
        """Give up waiting. Returns False if a result arrived first."""
        with self._lock:
            if self._state == _DONE:
                return False
            self._state = _ABANDONED
        return True

    def _wait(self, timeout):
        """True if a result arrived; False once abandoned after ``timeout``.

        Anything that interrupts the wait (SystemExit from a signal handler,
        KeyboardInterrupt) abandons the operation first, so a message that
        arrives while the caller unwinds goes back to the queue.
        """
        try:
            arrived = self._event.wait(timeout)
        except BaseException:
            self.abandon()
            raise
        return arrived or not self.abandon()

    def _result(self):
        if self._error is not None:
            raise self._error
        return self._value

    def wait(self, timeout):
        """The result, or OperationTimeout after ``timeout`` seconds.

        On timeout the caller abandons the operation, unless the result won
        the race, in which case the result is returned as usual.
        """
        if not self._wait(timeout):
            raise OperationTimeout(
                "%s: no answer from the broker within %.1f s" % (self.description, timeout)
            )
        return self._result()

    def wait_or(self, timeout, default):
        """Like ``wait`` but returns ``default`` instead of raising on timeout."""
        if not self._wait(timeout):
            return default
        return self._result()
