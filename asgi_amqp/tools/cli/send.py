"""``asgi-amqp send`` and ``send-group``: one message, or every line of a file.

Bulk mode reads JSON Lines and hands each to ``tools.bulk.BulkSender``.
"""

import itertools
import os
import signal
import stat
import sys
import threading
import time
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ...errors import AuthenticationError, BrokerConnectionError, MessageTooLarge
from ...serialization import validate_message
from .. import bulk
from ..jsonbytes import loads
from .base import (
    EPILOG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PARTIAL,
    MAX_REPORTED_ERRORS,
    PROG,
    CLIError,
    _error_for,
    _LayerErrors,
    _message_argument,
    _mismatch_hint,
    _one_line,
    cli,
    click,
)
from .keyboard import SignalHandler
from .settings import Settings

if TYPE_CHECKING:
    from ...layer import AMQPChannelLayer

# -- send -----------------------------------------------------------------------------

ON_FULL = click.Choice(list(bulk.ON_FULL))


def _reporter(
    write: Optional[Callable[[str], None]] = None,
) -> Callable[[Any, BaseException], None]:
    """report(where, exc) for a BulkSender: one line each, at most MAX_REPORTED_ERRORS."""
    say = write or (lambda text: click.echo(text, err=True))
    counter = itertools.count(1)

    def report(where: Any, exc: BaseException) -> None:
        count = next(counter)
        if count <= MAX_REPORTED_ERRORS:
            say("%s: %s" % (where, _describe(exc)))
        elif count == MAX_REPORTED_ERRORS + 1:
            say("(further errors are not shown)")

    return report


def _describe(exc: BaseException) -> str:
    if isinstance(exc, AuthenticationError):  # the broker answered: it was reached
        return _one_line(exc)
    if isinstance(exc, BrokerConnectionError):
        return "cannot reach the broker: %s" % _one_line(exc)
    return _one_line(exc) + _mismatch_hint(exc)


def _summary(sender: bulk.BulkSender, elapsed: float) -> str:
    rate = sender.sent / elapsed if elapsed > 0 else 0.0
    return "sent %d, channel full %d, failed %d, not attempted %d in %.2f s (%s msg/s)" % (
        sender.sent,
        sender.full,
        sender.failed,
        sender.not_attempted,
        elapsed,
        ("%.1f" if rate < 10 else "%.0f") % rate,
    )


def _resume_line(sender: bulk.BulkSender) -> Optional[str]:
    """Where a run that did not send every line can start again, or None."""
    first = sender.first_unconfirmed
    if first is None:
        return None
    text = "first line not confirmed: %d (resume with --skip %d)" % (first, first - 1)
    if sender.last_sent is not None and sender.last_sent > first:
        text += "; lines after it up to %d were sent, and a resume sends those again" % (
            sender.last_sent
        )
    return text


class _StopSignals(object):
    """SIGINT and SIGTERM stop a bulk send between two lines, not in the middle.

    A signal is only noted: reading stops before the next line, what was
    handed to the broker is waited for (each within the layer's
    ``operation_timeout``), and the summary then accounts for every line.
    An exception raised wherever the signal struck could abandon a publish
    the broker confirmed (a line sent but counted as not) or one it never
    got (the reverse). A second signal ends the wait at once.
    """

    NAMES: Dict[int, str] = {signal.SIGINT: "an interrupt", signal.SIGTERM: "SIGTERM"}

    def __init__(self) -> None:
        self.received: Optional[int] = None  # the first signal's number
        self._saved: Dict[int, SignalHandler] = {}  # signal -> the handler it had

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.NAMES:
                self._saved[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved = {}

    def _note(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.received is not None:
            self.__exit__()
            raise KeyboardInterrupt("a second %s" % self.NAMES[signum])
        self.received = signum

    @property
    def reason(self) -> Optional[str]:
        return self.NAMES.get(self.received) if self.received is not None else None


def _exit_code(sender: bulk.BulkSender, signals: Optional[_StopSignals] = None) -> int:
    if signals is not None and signals.received is not None:
        return 128 + signals.received  # 130 for an interrupt, 143 for SIGTERM
    if sender.fatal is not None:
        return EXIT_ERROR
    if sender.full or sender.failed or sender.not_attempted or sender.stopped is not None:
        return EXIT_PARTIAL
    return EXIT_OK


def _fatal_error(fatal: BaseException) -> CLIError:
    return _error_for(fatal) or CLIError(_one_line(fatal))


def _parse_line(text: str, layer: "AMQPChannelLayer") -> Tuple[str, str, Dict[str, Any]]:
    """(kind, name, message) of one JSON Lines record, or raise ValueError."""
    try:
        record = loads(text)
    except ValueError as exc:
        raise ValueError("invalid JSON: %s" % exc)
    if not isinstance(record, dict):
        raise ValueError('expected a JSON object with "channel" or "group" and "message"')
    unknown = set(record) - {"channel", "group", "message"}
    if unknown:
        raise ValueError("unknown key(s): %s" % ", ".join(sorted(unknown)))
    if ("channel" in record) == ("group" in record):
        raise ValueError('give exactly one of "channel" and "group"')
    kind = "channel" if "channel" in record else "group"
    name = record[kind]
    try:
        if kind == "channel":
            layer.valid_channel_name(name)
        else:
            layer.valid_group_name(name)
    except TypeError as exc:
        raise ValueError(_one_line(exc))
    if "message" not in record:
        raise ValueError('missing "message"')
    message = record["message"]
    if not isinstance(message, dict):
        raise ValueError('"message" must be a JSON object')
    try:
        validate_message(message)
    except TypeError as exc:
        raise ValueError(_one_line(exc))
    return kind, name, message


def _text(line: bytes) -> str:
    """A line of input as text; one that is not UTF-8 is an error of that line only."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            "not UTF-8 text (byte 0x%02x at column %d)" % (line[exc.start], exc.start + 1)
        ) from None


def _count_lines(stream: IO[bytes]) -> Optional[int]:
    """Number of non-blank lines of a regular file (for the progress bar), else None."""
    try:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        position = stream.tell()
        count = sum(1 for line in stream if line.strip())
        stream.seek(position)
    except (AttributeError, OSError, ValueError):  # not a file
        try:
            stream.seek(0)
        except (AttributeError, OSError, ValueError):
            pass
        return None
    return count


def _progress(total: Optional[int], stream: Optional[IO[str]] = None) -> Any:
    """A tqdm bar when ``stream`` (stderr) is a terminal, else None."""
    stream = stream or sys.stderr
    try:
        if not stream.isatty():
            return None
        from tqdm import tqdm
    except (ImportError, AttributeError, ValueError):
        return None
    return tqdm(total=total, unit="msg", file=stream, dynamic_ncols=True, leave=False)


def _send_bulk(
    settings: Settings,
    stream: IO[bytes],
    on_full: str,
    retries: int,
    jobs: int,
    skip: int = 0,
    retry_for: Optional[float] = None,
) -> int:
    layer = settings.layer(existing_capacities=True)
    total = _count_lines(stream)
    bar = _progress(total)
    write: Optional[Callable[[str], None]] = None
    if bar is not None:
        write = lambda text: bar.write(text, file=sys.stderr)  # noqa: E731
    if settings.silent:
        write = lambda text: None  # noqa: E731
    sender = bulk.BulkSender(
        layer,
        on_full=on_full,
        retries=retries,
        jobs=jobs,
        report=_reporter(write),
        keep_existing=True,
        retry_for=retry_for,
        progress=None if settings.quiet else (lambda text: click.echo(text, err=True)),
    )
    started = time.monotonic()
    counted = 0  # non-blank lines taken from the input (skipped ones included)
    stopped_before = None  # the line reading stopped at, unread, or None
    with _StopSignals() as signals:
        try:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                if sender.done or signals.received is not None:
                    stopped_before = number
                    break
                counted += 1
                if number <= skip:
                    continue
                where = "line %d" % number
                try:
                    kind, name, message = _parse_line(_text(line), layer)
                except ValueError as exc:
                    sender.invalid(where, exc, number)
                else:
                    sender.submit(kind, name, message, where, number)
                if bar is not None:
                    bar.update(1)
            if signals.received is not None:
                sender.stop(signals.reason or "a signal")
        finally:
            sender.close()
            if bar is not None:
                bar.close()
    if stopped_before is not None:
        # Lines never read: counted where the file's size is known (a pipe's is not).
        sender.skipped(total - counted if total is not None else 0, stopped_before)
    elapsed = time.monotonic() - started
    if sender.fatal is not None and sender.processed - sender.not_attempted <= 1:
        raise _fatal_error(sender.fatal)
    if sender.fatal is not None:
        click.echo("%s: error: %s" % (PROG, _fatal_error(sender.fatal).format_message()), err=True)
    if sender.stopped:
        click.echo(
            "%s: stopped at %s"
            % (PROG, sender.stopped.replace("(on_full=fail)", "(--on-full=fail)")),
            err=True,
        )
    if not settings.quiet:
        if sender.retry_given_up:
            click.echo(
                "%s: gave up retrying after %.0f s (--retry-for): %d messages counted as "
                "channel full without a retry"
                % (PROG, sender.retry_seconds, sender.retry_given_up),
                err=True,
            )
        click.echo(_summary(sender, elapsed), err=True)
        if stopped_before is not None and total is None:
            click.echo(
                "the rest of the input, from line %d, was not read" % stopped_before, err=True
            )
        resume = _resume_line(sender)
        if resume is not None:
            click.echo(resume, err=True)
    return _exit_code(sender, signals)


@cli.command(epilog=EPILOG)
@click.argument("channel", required=False)
@click.argument("message_json", metavar="[MESSAGE_JSON]", required=False)
@click.option(
    "--from",
    "source",
    type=click.File("rb"),
    metavar="FILE",
    help="Send every line of FILE ('-' for stdin), JSON Lines of "
    '{"channel": ..., "message": {...}} or '
    '{"group": ..., "message": {...}}.',
)
@click.option(
    "--on-full",
    type=ON_FULL,
    default="fail",
    show_default=True,
    help="When a channel is full: fail (stop), skip (count it and go on), or "
    "retry with exponential backoff, then count it as full and go on.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Attempts after the first with --on-full=retry (waits 0.1 s, 0.2 s, ... at most 2 s).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=64),
    default=1,
    show_default=True,
    help="Deprecated and ignored: bulk sends are pipelined (thousands of messages in "
    "flight on one connection, in order per channel).",
)
@click.option(
    "--retry-for",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="With --on-full=retry: the time all retries of the run may take together; "
    "after it, full channels count as full at once [default: no bound].",
)
@click.option(
    "--skip",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="With --from: leave out the first N lines, to resume a run at the line its "
    "summary names as the first not confirmed.",
)
@click.pass_obj
def send(
    settings: Settings,
    channel: Optional[str],
    message_json: Optional[str],
    source: Optional[IO[bytes]],
    on_full: str,
    retries: int,
    jobs: int,
    skip: int,
    retry_for: Optional[float],
) -> None:
    """Send MESSAGE_JSON (a JSON object) to CHANNEL, or every line of --from FILE.

    Bulk mode shows a progress bar on a terminal, reports bad lines with
    their line number and goes on, and ends with a summary line: sent,
    channel full, failed, and the rate.
    """
    if source is not None:
        if channel is not None or message_json is not None:
            raise click.UsageError("give either CHANNEL MESSAGE_JSON or --from FILE, not both")
        sys.exit(_send_bulk(settings, source, on_full, retries, jobs, skip, retry_for))
    if channel is None or message_json is None:
        raise click.UsageError("give CHANNEL and MESSAGE_JSON, or --from FILE")
    message = _message_argument(message_json)
    _send_one(settings, "channel", channel, message, on_full, retries)


@cli.command("send-group", epilog=EPILOG)
@click.argument("group")
@click.argument("message_json", metavar="MESSAGE_JSON")
@click.pass_obj
def send_group(settings: Settings, group: str, message_json: str) -> None:
    """Send MESSAGE_JSON (a JSON object) to every channel in GROUP.

    Members whose channel is full miss the message, as ASGI says.
    """
    message = _message_argument(message_json)
    _send_one(settings, "group", group, message, "fail", 0)


def _send_one(
    settings: Settings,
    kind: str,
    name: str,
    message: Dict[str, Any],
    on_full: str,
    retries: int,
) -> None:
    layer = settings.layer(existing_capacities=True)
    with _LayerErrors():
        if kind == "channel":
            layer.valid_channel_name(name)
        else:
            layer.valid_group_name(name)
    try:
        validate_message(message)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(_one_line(exc), param_hint="MESSAGE_JSON")
    reported: List[BaseException] = []
    sender = bulk.BulkSender(
        layer,
        on_full=on_full,
        retries=retries,
        report=lambda where, exc: reported.append(exc),
        keep_existing=True,
    )
    sender.submit(kind, name, message, "%s %s" % (kind, name))
    sender.close()
    if sender.fatal is not None:
        raise _fatal_error(sender.fatal)
    for problem in reported:
        # The message itself (too large, say): an invalid message, exit 2.
        if isinstance(problem, (MessageTooLarge, TypeError, ValueError)):
            raise CLIError("%s %s: %s" % (kind, name, _one_line(problem)))
        raise _error_for(problem) or CLIError(
            "%s %s: %s" % (kind, name, _describe(problem)), EXIT_PARTIAL
        )
    if sender.full:
        raise CLIError(
            "channel %s is full (capacity %d)" % (name, layer.get_capacity(name)), EXIT_PARTIAL
        )
    if sender.failed:
        sys.exit(EXIT_PARTIAL)
