"""The one bulk-send engine, used by the command line and the Spark sender.

A cron job's ``asgi-amqp send --from FILE`` and a Spark partition's
``send_dataframe`` have the same needs: many messages through one layer,
several in flight at once, a policy for full channels, a count of what
became of every message, and a stop when going on is pointless (the broker
refused the credentials, or has been away for longer than the layer's
``operation_timeout`` several times in a row, so every further message
would wait that long too). ``BulkSender`` is that engine; the callers only
read their rows and say how a failure is reported.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional

from ..errors import AuthenticationError, BrokerConnectionError, ChannelFull

ON_FULL = ("fail", "skip", "retry")
RETRY_FIRST_DELAY = 0.1
RETRY_MAX_DELAY = 2.0
CONSECUTIVE_CONNECTION_ERRORS = 3


def send_one(
    layer: Any,
    kind: str,
    name: str,
    message: Dict[str, Any],
    on_full: str,
    retries: int,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Send to a channel (``kind`` "channel") or group; True once sent.

    False means the channel stayed full: at once, or with ``on_full="retry"``
    after ``retries`` waits of 0.1 s doubling up to 2 s. Any other error
    propagates to the caller, which decides how to count it.
    """
    attempt = 0
    while True:
        try:
            if kind == "group":
                layer.send_group(name, message)
            else:
                layer.send(name, message)
            return True
        except ChannelFull:
            if on_full != "retry" or attempt >= retries:
                return False
            sleep(min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2**attempt))
            attempt += 1


class BulkSender(object):
    """Sends many messages through one layer and counts what became of each.

    ``jobs`` sends are in flight at once: a window of ``4 * jobs`` over a
    pool of ``jobs`` threads, so reading rows never runs far ahead of
    sending them; with ``jobs=1`` each send runs in the caller's thread and
    order is kept.

    Every message ends in one count: ``sent``, ``full`` (its channel stayed
    full under ``on_full``) or ``failed``. ``report(where, exc)`` hears of
    each failure, in the thread that saw it. Sending stops early when
    ``on_full="fail"`` meets a full channel (``stopped`` says where), and
    gives up with ``fatal`` set to the error on an authentication error, or
    on a connection error before anything was sent or after
    ``CONSECUTIVE_CONNECTION_ERRORS`` in a row. A message submitted after
    that is counted as failed without being sent.
    """

    def __init__(
        self,
        layer: Any,
        on_full: str = "fail",
        retries: int = 5,
        jobs: int = 1,
        report: Optional[Callable[[str, BaseException], None]] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if on_full not in ON_FULL:
            raise ValueError("on_full must be one of %s, not %r" % (", ".join(ON_FULL), on_full))
        self.layer = layer
        self.on_full = on_full
        self.retries = retries
        self.sent = 0
        self.full = 0
        self.failed = 0
        self.stopped: Optional[str] = None  # where on_full="fail" stopped it
        self.fatal: Optional[BaseException] = None  # the error it gave up on
        self._report = report or (lambda where, exc: None)
        self._sleep = sleep
        self._lock = threading.Lock()
        self._connection_errors = 0
        self._pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
        self._window = threading.BoundedSemaphore(jobs * 4)

    @property
    def done(self) -> bool:
        """True once sending stopped early or gave up."""
        return self.stopped is not None or self.fatal is not None

    @property
    def processed(self) -> int:
        return self.sent + self.full + self.failed

    def submit(self, kind: str, name: str, message: Dict[str, Any], where: str) -> None:
        """Send one message (``kind`` "channel" or "group"), now or on the pool."""
        if self._pool is None:
            self._send(kind, name, message, where)
            return
        self._window.acquire()
        try:
            self._pool.submit(self._send_in_window, kind, name, message, where)
        except BaseException:
            self._window.release()
            raise

    def invalid(self, where: str, error: BaseException) -> None:
        """Count a message that could not even be read as failed, and report it."""
        with self._lock:
            self.failed += 1
        self._report(where, error)

    def close(self) -> None:
        """Wait for the sends in flight."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _send_in_window(self, kind: str, name: str, message: Dict[str, Any], where: str) -> None:
        try:
            self._send(kind, name, message, where)
        finally:
            self._window.release()

    def _send(self, kind: str, name: str, message: Dict[str, Any], where: str) -> None:
        if self.done:
            with self._lock:
                self.failed += 1
            return
        try:
            sent = send_one(
                self.layer, kind, name, message, self.on_full, self.retries, sleep=self._sleep
            )
        except BrokerConnectionError as exc:
            self._connection_failed(where, exc)
            return
        except Exception as exc:  # invalid, too large, refused by the broker, ...
            self.invalid(where, exc)
            return
        with self._lock:
            if sent:
                self.sent += 1
                self._connection_errors = 0
                return
            self.full += 1
            if self.on_full == "fail" and self.stopped is None:
                self.stopped = "%s: channel %s is full (on_full=fail)" % (where, name)

    def _connection_failed(self, where: str, exc: BrokerConnectionError) -> None:
        with self._lock:
            self.failed += 1
            self._connection_errors += 1
            give_up = (
                isinstance(exc, AuthenticationError)
                or self.sent == 0
                or self._connection_errors >= CONSECUTIVE_CONNECTION_ERRORS
            )
            if give_up and self.fatal is None:
                self.fatal = exc
        if not give_up:
            self._report(where, exc)
