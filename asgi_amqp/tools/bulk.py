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

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from ..errors import (
    AuthenticationError,
    BrokerBlocked,
    BrokerConnectionError,
    BrokerOperationError,
    ChannelFull,
)
from ..pipeline import NotAttempted, SendError

if TYPE_CHECKING:
    from ..layer import AMQPChannelLayer

ON_FULL = ("fail", "skip", "retry")
RETRY_FIRST_DELAY = 0.1
RETRY_MAX_DELAY = 2.0
CONSECUTIVE_CONNECTION_ERRORS = 3
PROGRESS_EVERY = 5.0  # seconds between progress lines while retries wait

# The four kinds of message: every one ends as exactly one of them.
SENT = "sent"  # the broker confirmed it
REFUSED = "refused"  # its channel was full, or the broker named another refusal
IN_DOUBT = "in doubt"  # written to the broker, no confirm before the connection or run ended
NOT_SENT = "not sent"  # invalid, or never written to the broker
KINDS = (SENT, REFUSED, IN_DOUBT, NOT_SENT)

# on_line(token, kind, error): what became of the message ``token`` stands for.
OnLine = Callable[[Any, str, Optional[BaseException]], None]


def send_one(
    layer: "AMQPChannelLayer",
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
        except BrokerBlocked:
            raise  # a ChannelFull, but the whole broker's: waiting here cannot help
        except ChannelFull:
            if on_full != "retry" or attempt >= retries:
                return False
            sleep(min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2**attempt))
            attempt += 1


class StillInDoubt(Exception):
    """The error of a message an earlier run left in doubt, not sent again now."""


class BulkSender(object):
    """Sends many messages through one layer and counts what became of each.

    Sends are pipelined (``layer.send_pipeline``, which ``send_many`` uses too): a
    window of messages is in flight and the broker confirms them in a
    stream, so a bulk send is not one round trip per message. ``submit``
    may block while the window is full; ``close`` waits for the rest.
    Everything runs in the caller's thread.

    Every message ends as exactly one of ``KINDS``, counted in ``counts``
    and told to ``on_line(token, kind, error)`` in the order submitted:
    ``sent``; ``refused`` (its channel stayed full under ``on_full``, or
    the broker refused it, e.g. a permission); ``in doubt`` (written to the
    broker, but no confirm came before the connection was lost or the wait
    ended: the broker may have it); ``not sent`` (invalid, or never written).
    ``on_full``: "skip" counts a full channel's message and goes on, "retry"
    sends it again after 0.1 s, 0.2 s, ... up to ``retries`` times, "fail"
    stops: nothing is written after the refusal is seen, and the messages
    already in flight count as they turn out. ``report(where, exc)`` hears
    of each error that is not a full channel. Sending gives up, with
    ``fatal`` set to the error, on an authentication error, or on a
    connection error before anything was sent or after
    ``CONSECUTIVE_CONNECTION_ERRORS`` in a row; ``stop(why)`` stops it from
    outside (an interrupt).

    ``first_unconfirmed`` is the smallest ``position`` (a line number) whose
    message was not sent, or None; ``last_sent`` the largest sent.
    """

    def __init__(
        self,
        layer: "AMQPChannelLayer",
        on_full: str = "fail",
        retries: int = 5,
        jobs: int = 1,
        report: Optional[Callable[[Any, BaseException], None]] = None,
        sleep: Callable[[float], None] = time.sleep,
        keep_existing: bool = False,
        retry_for: Optional[float] = None,
        progress: Optional[Callable[[str], None]] = None,
        on_line: Optional[OnLine] = None,
    ) -> None:
        # ``jobs`` is accepted for compatibility: pipelining made threads
        # unnecessary for speed.
        if on_full not in ON_FULL:
            raise ValueError("on_full must be one of %s, not %r" % (", ".join(ON_FULL), on_full))
        self.layer = layer
        self.on_full = on_full
        self.retries = retries
        self.counts: Dict[str, int] = dict.fromkeys(KINDS, 0)
        self.full = 0  # the refused ones whose channel was full
        self.first_unconfirmed: Optional[int] = None
        self.last_sent: Optional[int] = None  # the largest position sent
        self.stopped: Optional[str] = None  # why sending stopped early
        self.stopped_at: Any = None  # the ``where`` of the message on_full="fail" stopped at
        self.fatal: Optional[BaseException] = None  # the error it gave up on
        self._report = report or (lambda where, exc: None)
        self._on_line = on_line or (lambda token, kind, error: None)
        self._sleep = sleep
        self._connection_errors = 0
        self._pipeline = layer.send_pipeline(self._record, keep_existing=keep_existing)
        # on_full="retry": the time all retries together may take (None: no
        # bound), a line now and then while they wait, and what they cost.
        self.retry_for = retry_for
        self._progress = progress
        self.retry_seconds = 0.0
        self.retry_given_up = 0  # full messages not retried: the bound was spent
        self._retried = 0
        self._progress_at = 0.0

    @property
    def sent(self) -> int:
        return self.counts[SENT]

    @property
    def refused(self) -> int:
        return self.counts[REFUSED]

    @property
    def in_doubt(self) -> int:
        return self.counts[IN_DOUBT]

    @property
    def not_sent(self) -> int:
        return self.counts[NOT_SENT]

    @property
    def done(self) -> bool:
        """True once sending stopped early or gave up."""
        return self.stopped is not None or self.fatal is not None

    @property
    def processed(self) -> int:
        return sum(self.counts.values())

    def submit(
        self,
        kind: str,
        name: str,
        message: Dict[str, Any],
        where: Any,
        position: Optional[int] = None,
        token: Any = None,
    ) -> None:
        """Send one message (``kind`` "channel" or "group")."""
        tag = (kind, name, message, where, position, token)
        if self.done:
            self._pipeline.put_error(NotAttempted("not sent: sending stopped"), tag)
            return
        self._pipeline.put(kind, name, message, tag)

    def invalid(
        self, where: Any, error: BaseException, position: Optional[int] = None, token: Any = None
    ) -> None:
        """A message that is not submitted, counted by ``error`` in its turn: one
        that could not even be read is not sent and reported; ``NotAttempted``
        is not sent, ``StillInDoubt`` in doubt, both without a report."""
        self._pipeline.put_error(error, ("channel", "", None, where, position, token))

    def skipped(self, count: int, first_position: Optional[int] = None) -> None:
        """Count ``count`` messages as not sent (e.g. lines never read),
        the first of them at ``first_position``."""
        self.counts[NOT_SENT] += count
        self._unconfirmed(first_position)

    def stop(self, why: str) -> None:
        """Write nothing more: what waits for its chunk is not sent."""
        self.stopped = self.stopped or why
        self._pipeline.stop(why)

    def close(self) -> None:
        """Wait for the sends in flight."""
        if self.done:
            self._pipeline.stop(self.stopped or "sending gave up")
        self._pipeline.flush()

    def _unconfirmed(self, position: Optional[int]) -> None:
        if position is not None and (
            self.first_unconfirmed is None or position < self.first_unconfirmed
        ):
            self.first_unconfirmed = position

    def _record(self, tag: Any, error: SendError, in_doubt: bool) -> None:
        kind, name, message, where, position, token = tag
        if _is_full(error) and self.on_full == "retry" and message is not None:
            error, in_doubt = self._retry(kind, name, message)
        line_kind = _kind_of(error, in_doubt)
        self.counts[line_kind] += 1
        if error is None:
            self._connection_errors = 0
            if position is not None and (self.last_sent is None or position > self.last_sent):
                self.last_sent = position
        else:
            self._unconfirmed(position)
            self._after_error(error, where, name)
        self._on_line(token, line_kind, error)

    def _after_error(self, error: BaseException, where: Any, name: str) -> None:
        """Report an error, and stop or give up when it says so."""
        if isinstance(error, (NotAttempted, StillInDoubt)):
            return
        if isinstance(error, BrokerBlocked):  # the broker's alarm, not a full channel
            self._give_up(error)
        elif _is_full(error):
            self.full += 1
            if self.on_full == "fail" and self.stopped is None:
                self.stop("%s: channel %s is full (on_full=fail)" % (where, name))
                self.stopped_at = where
        elif isinstance(error, BrokerConnectionError):
            self._connection_failed(where, error)
        else:  # invalid, too large, refused by the broker, ...
            self._report(where, error)

    def _retry(
        self, kind: str, name: str, message: Dict[str, Any]
    ) -> Tuple[Optional[BaseException], bool]:
        """Send a message whose channel was full again, with a growing pause,
        within what is left of ``retry_for``: (error or None, in doubt)."""
        self._retried += 1
        for attempt in range(self.retries):
            delay = min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2**attempt)
            if self.retry_for is not None and self.retry_seconds + delay > self.retry_for:
                self.retry_given_up += 1
                break
            self._sleep(delay)
            self.retry_seconds += delay
            self._tell_progress(name)
            try:
                if send_one(self.layer, kind, name, message, "fail", 0):
                    return None, False
            except BrokerConnectionError as exc:  # the send may have been written
                return exc, not isinstance(exc, AuthenticationError)
            except Exception as exc:
                return exc, False
        return ChannelFull("channel %s is full" % name), False

    def _tell_progress(self, name: str) -> None:
        """A line every PROGRESS_EVERY s while retries wait: a pipe shows no bar."""
        now = time.monotonic()
        if self._progress is None or now - self._progress_at < PROGRESS_EVERY:
            return
        self._progress_at = now
        bound = "" if self.retry_for is None else " of %.0f s allowed" % self.retry_for
        self._progress(
            "retrying full channels (now %s): %d messages, %.0f s waited%s; sent %d, "
            "channel full %d so far"
            % (name, self._retried, self.retry_seconds, bound, self.sent, self.full)
        )

    def _connection_failed(self, where: Any, exc: BrokerConnectionError) -> None:
        self._connection_errors += 1
        give_up = (
            isinstance(exc, AuthenticationError)
            or self.sent == 0
            or self._connection_errors >= CONSECUTIVE_CONNECTION_ERRORS
        )
        if give_up:
            self._give_up(exc)
        else:
            self._report(where, exc)

    def _give_up(self, error: BaseException) -> None:
        self.fatal = self.fatal or error
        self._pipeline.stop("sending gave up")


def _is_full(error: Optional[BaseException]) -> bool:
    """A channel's own refusal: not the broker's alarm, not an unreachable broker."""
    return isinstance(error, ChannelFull) and not isinstance(
        error, (BrokerBlocked, BrokerConnectionError)
    )


def _kind_of(error: Optional[BaseException], in_doubt: bool) -> str:
    if error is None:
        return SENT
    if in_doubt or isinstance(error, StillInDoubt):
        return IN_DOUBT
    if _is_full(error) or isinstance(error, BrokerOperationError):
        return REFUSED
    return NOT_SENT
