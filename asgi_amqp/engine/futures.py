"""``Pending``: the one wait protocol between a caller's thread and the I/O thread.

A message may be acked only if its caller is still there to take it, which
``concurrent.futures.Future`` cannot express: once the caller called
``abandon``, the I/O thread's ``resolve`` returns False and the message
goes back instead of being lost. It also serves work nobody waits for (an
ack) and steps the I/O thread needs first (``on_done``).

The caller waits on a bare lock, released once: cheaper on the I/O thread,
the layer's bottleneck, than ``threading.Event.set`` (docs/benchmarks.rst,
"Measurements behind the code"). Every wait takes seconds; ``None`` is refused.

Made by one thread and shared by two: the caller waits and may abandon, the
I/O thread resolves or fails; ``_lock`` makes those one decision.
"""

import threading
from typing import Any, Callable, Optional

from ..errors import OperationTimeout

_PENDING, _DONE, _ABANDONED = "pending", "done", "abandoned"

# on_done(value, error), on the thread that resolves or fails the Pending.
OnDone = Callable[[Any, Optional[BaseException]], None]


def wait_seconds(timeout: float) -> float:
    """``timeout`` as a lock's timeout: never negative, never past ``TIMEOUT_MAX``."""
    if timeout is None:  # a caller without types: a wait needs a limit
        raise ValueError("a wait needs a timeout in seconds, not None")
    return min(max(timeout, 0), threading.TIMEOUT_MAX)


class Pending(object):
    __slots__ = (
        "_lock",
        "_arrived",
        "_state",
        "_value",
        "_error",
        "description",
        "_on_done",
        "thread",
    )

    def __init__(self, description: str = "operation", on_done: Optional[OnDone] = None) -> None:
        self._lock = threading.Lock()  # makes resolve/fail/abandon one decision
        self._arrived = threading.Lock()  # held until a result arrives
        self._arrived.acquire()
        self._state = _PENDING
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self.description = description
        self._on_done = on_done
        self.thread = threading.get_ident()  # the caller's, whom a delivery is for

    @property
    def wanted(self) -> bool:
        """True while the caller still waits; I/O-thread work may be skipped otherwise."""
        return self._state == _PENDING

    def resolve(self, value: Any = None) -> bool:
        """Hand ``value`` to the caller. Returns False if nobody will take it."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _DONE
            self._value = value
        self._arrived.release()
        if self._on_done is not None:
            self._on_done(value, None)
        return True

    def fail(self, error: BaseException) -> bool:
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _DONE
            self._error = error
        self._arrived.release()
        if self._on_done is not None:
            self._on_done(None, error)
        return True

    def abandon(self) -> bool:
        """Give up waiting. Returns False if a result arrived first."""
        with self._lock:
            if self._state == _DONE:
                return False
            self._state = _ABANDONED
        return True

    def arrived(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a result without giving up on it."""
        seconds = wait_seconds(timeout)
        try:
            arrived = self._arrived.acquire(timeout=seconds)
        except BaseException:
            self.abandon()
            raise
        if arrived:
            self._arrived.release()
        return arrived

    def _arrives(self, timeout: float) -> bool:
        """True if a result arrived; False once abandoned after ``timeout``.

        An interrupted wait (SystemExit, KeyboardInterrupt) abandons first, so
        a message that arrives while the caller unwinds goes back to its queue.
        """
        seconds = wait_seconds(timeout)
        try:
            arrived = self._arrived.acquire(timeout=seconds)
        except BaseException:
            self.abandon()
            raise
        if arrived:
            self._arrived.release()  # stays "arrived" for any later wait
            return True
        return not self.abandon()

    def answer(self) -> Any:
        """The result once it arrived (``arrived`` said so): the value, or its error raised."""
        if self._error is not None:
            raise self._error
        return self._value

    def result(self, timeout: float) -> Any:
        """The result, or ``OperationTimeout`` after ``timeout`` seconds (the operation is
        abandoned, unless the result won the race)."""
        if not self._arrives(timeout):
            raise OperationTimeout(
                "%s: no answer from the broker within %.1f s" % (self.description, timeout)
            )
        return self.answer()

    def result_or(self, timeout: float, default: Any) -> Any:
        """Like ``result`` but returns ``default`` instead of raising on timeout."""
        if not self._arrives(timeout):
            return default
        return self.answer()
