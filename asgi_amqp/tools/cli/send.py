"""``asgi-amqp send`` and ``send-group``: one message, or every line of a file.

Bulk mode reads JSON Lines and hands each to ``tools.bulk.BulkSender``.
"""

import codecs
import contextlib
import gc
import itertools
import json
import os
import shlex
import signal
import stat
import sys
import tempfile
import threading
import time
from types import FrameType
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Tuple,
)

from ...errors import (
    ACCESS_REFUSED,
    AuthenticationError,
    BrokerConnectionError,
    MessageTooLarge,
)
from ...pipeline import NotAttempted
from ...serialization import validate_message
from .. import bulk, rejects
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


def _summary(sender: bulk.BulkSender, lines: int, elapsed: float) -> str:
    rate = sender.sent / elapsed if elapsed > 0 else 0.0
    return "sent %d, refused %d, in doubt %d, not sent %d, of %d lines in %.2f s (%s msg/s)" % (
        sender.sent,
        sender.refused,
        sender.in_doubt,
        sender.not_sent,
        lines,
        elapsed,
        ("%.1f" if rate < 10 else "%.0f") % rate,
    )


def _skip_line(sender: bulk.BulkSender) -> Optional[str]:
    """The --skip that resumes a run, when it is exact: nothing in doubt, and
    nothing sent after the first line that was not."""
    first = sender.first_unconfirmed
    if first is None or sender.in_doubt:
        return None
    if sender.last_sent is not None and sender.last_sent > first:
        return None
    return "first line not sent: %d (--skip %d resumes there too)" % (first, first - 1)


RESENT_RISK = (
    "--resend-in-doubt: %d lines that were in doubt were sent again; each one the "
    "broker already had is now there twice"
)
IN_DOUBT_RISK = (
    "in doubt: %d lines were written to the broker but not confirmed; it may hold "
    "some or all of them. A resume leaves them out; --resend-in-doubt sends them "
    "again, and each one the broker had is then delivered twice"
)


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
    if sender.processed > sender.sent or sender.stopped is not None:
        return EXIT_PARTIAL
    return EXIT_OK


def _fatal_error(fatal: BaseException) -> CLIError:
    return _error_for(fatal) or CLIError(_one_line(fatal))


def _json(text: str) -> Any:
    try:
        return loads(text)
    except ValueError as exc:
        raise ValueError("invalid JSON: %s" % exc) from None


def _message_of(record: Any, layer: "AMQPChannelLayer") -> Tuple[str, str, Dict[str, Any]]:
    """(kind, name, message) of one JSON Lines record, or raise ValueError."""
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
    except (TypeError, RecursionError) as exc:
        raise ValueError(_one_line(exc))
    return kind, name, message


class _Line(NamedTuple):
    """An input line as the first run read it: a rejects record gives its own."""

    number: int
    raw: bytes
    in_doubt: bool  # a rejects record of a line an earlier run left in doubt


def _read(number: int, raw: bytes) -> Tuple[_Line, Any]:
    """The line and its JSON value, or the ValueError that says why it has none.

    A rejects record (``tools.rejects``) stands for its original line."""
    line = _Line(number, raw, False)
    try:
        value = _json(_text(raw))
        if not rejects.is_record(value):
            return line, value
        original, kind, raw = rejects.unwrap(value)
    except ValueError as exc:
        return line, exc
    line = _Line(original, raw, kind == bulk.IN_DOUBT)
    try:
        return line, _json(_text(raw))
    except ValueError as exc:
        return line, exc


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


def _rejects_path(stream: IO[bytes], given: Optional[str]) -> Tuple[str, bool]:
    """Where the rejects go, and whether that file is written even when empty.

    By default beside the input (``FILE.rejects``; a resume from a rejects
    file rewrites that file), else (a pipe, or a folder the command may not
    write to) in the current directory, else in the temporary one. A rejects
    file that was given, or that is the input itself, must be writable, and
    is always written: left as it was, it would list lines this run sent.
    """
    name = getattr(stream, "name", None)
    is_file = isinstance(name, str) and name not in ("-", "<stdin>") and os.path.isfile(name)
    if given is not None:
        _check_writable(given)
        return given, True
    if is_file:
        path = str(name)
        if path.endswith(".rejects"):
            _check_writable(path)
            return path, True
        if _writable(path + ".rejects"):
            return path + ".rejects", os.path.exists(path + ".rejects")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = "asgi-amqp-send-%s.rejects" % stamp
    if not _writable(path):
        path = os.path.join(tempfile.gettempdir(), path)
    return path, False


def _writable(path: str) -> bool:
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(folder, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


def _check_writable(path: str) -> None:
    if not _writable(path):
        raise CLIError(
            "cannot write the rejects file %s (every line not sent goes there): give "
            "--rejects FILE in a directory you can write to" % path
        )


def _lines(stream: IO[bytes], skip: int) -> Iterator[Tuple[int, bytes]]:
    """(number, line) of every non-blank line after the first ``skip``; a UTF-8
    byte-order mark at the start is dropped (a file saved as "utf-8-sig")."""
    for number, raw in enumerate(stream, 1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        if raw.strip() and number > skip:
            yield number, raw


def _check_bulk(settings: Settings, stream: IO[bytes], skip: int, as_json: bool) -> int:
    """--dry-run: check every line as a send would, send nothing, connect nowhere."""
    layer = settings.layer()  # made, not connected: it connects on first use
    report = _reporter((lambda text: None) if settings.silent else None)
    read = bad = 0
    for number, raw in _lines(stream, skip):
        read += 1
        line, value = _read(number, raw)
        try:
            if isinstance(value, ValueError):
                raise value
            _kind, _name, message = _message_of(value, layer)
            layer.sender.encode(message)  # the size limit, and the keys' encryption
        except (TypeError, ValueError, MessageTooLarge) as exc:
            bad += 1
            report("line %d" % line.number, exc)
    code = EXIT_PARTIAL if bad else EXIT_OK
    if as_json:
        click.echo(
            json.dumps({"lines": read, "valid": read - bad, "bad": bad, "exit_status": code})
        )
    elif not settings.quiet:
        click.echo(
            "dry run: %d lines, %d valid, %d bad; nothing was sent" % (read, read - bad, bad),
            err=True,
        )
    return code


def _reason(error: Optional[BaseException]) -> str:
    return "" if error is None else _describe(error)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Young objects collected every 50,000 allocations, not 700, while a bulk send runs.

    Every row makes a few objects that live until its confirm, so at the default
    threshold the collector walks the whole window in flight every few rows.
    The thresholds come back after.
    """
    before = gc.get_threshold()
    gc.set_threshold(50000, 20, 10)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _send_bulk(
    settings: Settings,
    stream: IO[bytes],
    on_full: str,
    retries: int,
    jobs: int,
    skip: int = 0,
    retry_for: Optional[float] = None,
    rejects_to: Optional[str] = None,
    resend_in_doubt: bool = False,
    as_json: bool = False,
) -> int:
    path, keep_empty = _rejects_path(stream, rejects_to)
    layer = settings.layer(existing_capacities=True)
    total = _count_lines(stream)
    bar = _progress(total)
    write: Optional[Callable[[str], None]] = None
    if bar is not None:
        write = lambda text: bar.write(text, file=sys.stderr)  # noqa: E731
    if settings.silent:
        write = lambda text: None  # noqa: E731
    out = rejects.RejectsFile(path)

    def on_line(line: _Line, kind: str, error: Optional[BaseException]) -> None:
        if kind != bulk.SENT:
            out.write(line.number, kind, _reason(error), line.raw)

    sender = bulk.BulkSender(
        layer,
        on_full=on_full,
        retries=retries,
        jobs=jobs,
        report=_reporter(write),
        keep_existing=True,
        retry_for=retry_for,
        progress=None if settings.quiet else (lambda text: click.echo(text, err=True)),
        on_line=on_line,
    )
    started = time.monotonic()
    read = 0  # non-blank lines read, after --skip
    unread_from = None  # the line a pipe's reading stopped at, or None
    resuming = False  # a line was a rejects record: its number is not this file's
    resent = 0  # lines in doubt sent again (--resend-in-doubt)
    with _fewer_collections(), _StopSignals() as signals:
        try:
            for number, raw in _lines(stream, skip):
                if signals.received is not None and sender.stopped is None:
                    sender.stop(signals.reason or "a signal")
                if sender.done and total is None:
                    unread_from = number  # a pipe may never end: stop reading it
                    break
                read += 1
                line, value = _read(number, raw)
                resuming = resuming or line.raw is not raw
                where = "line %d" % line.number
                if sender.done:  # the rest of a file goes to the rejects
                    error: BaseException = NotAttempted("not sent: the run stopped first")
                    if line.in_doubt:
                        error = bulk.StillInDoubt("in doubt since an earlier run")
                    sender.invalid(where, error, line.number, line)
                elif line.in_doubt and not resend_in_doubt:
                    error = bulk.StillInDoubt(
                        "in doubt since an earlier run (see --resend-in-doubt)"
                    )
                    sender.invalid(where, error, line.number, line)
                elif isinstance(value, ValueError):
                    sender.invalid(where, value, line.number, line)
                else:
                    resent += line.in_doubt
                    try:
                        kind, name, message = _message_of(value, layer)
                    except ValueError as exc:
                        sender.invalid(where, exc, line.number, line)
                    else:
                        sender.submit(kind, name, message, where, line.number, line)
                if bar is not None:
                    bar.update(1)
            if signals.received is not None:
                sender.stop(signals.reason or "a signal")
            sender.close()
        except BaseException:
            out.discard()  # a second signal, or a bug: no rejects file half written
            raise
        finally:
            sender.close()
            if bar is not None:
                bar.close()
    elapsed = time.monotonic() - started
    code = _exit_code(sender, signals)
    nothing_reached = sender.fatal is not None and sender.sent == 0 and sender.in_doubt == 0
    if nothing_reached:
        out.discard()  # the input itself is the resume
    replaced = not nothing_reached and out.finish(keep_empty)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "lines": read,
                    "sent": sender.sent,
                    "refused": sender.refused,
                    "in_doubt": sender.in_doubt,
                    "not_sent": sender.not_sent,
                    "resent_in_doubt": resent,
                    "rejects": path if out.count and not nothing_reached else None,
                    "unread_from": unread_from,
                    "seconds": round(elapsed, 3),
                    "error": _fatal_error(sender.fatal).format_message() if sender.fatal else None,
                    "exit_status": code,
                }
            )
        )
    if nothing_reached and sender.fatal is not None:
        raise _fatal_error(sender.fatal)
    if sender.fatal is not None:
        click.echo("%s: error: %s" % (PROG, _fatal_error(sender.fatal).format_message()), err=True)
    if sender.stopped and signals.received is None:
        click.echo(
            "%s: stopped at %s"
            % (PROG, sender.stopped.replace("(on_full=fail)", "(--on-full=fail)")),
            err=True,
        )
    if not settings.quiet and not as_json:
        if sender.retry_given_up:
            click.echo(
                "%s: gave up retrying after %.0f s (--retry-for): %d messages counted as "
                "refused without a retry" % (PROG, sender.retry_seconds, sender.retry_given_up),
                err=True,
            )
        click.echo(_summary(sender, read, elapsed), err=True)
        if unread_from is not None:
            click.echo("the rest of the input, from line %d, was not read" % unread_from, err=True)
        if sender.in_doubt:
            click.echo(IN_DOUBT_RISK % sender.in_doubt, err=True)
        if resent:
            click.echo(RESENT_RISK % resent, err=True)
        skip_line = None if resuming else _skip_line(sender)
        if skip_line is not None:
            click.echo(skip_line, err=True)
    if out.count and not settings.silent and not as_json:
        click.echo(
            "rejects: %s (%d lines); resume with: %s send --from %s"
            % (path, out.count, PROG, shlex.quote(path)),
            err=True,
        )
    elif replaced and not settings.quiet and not as_json:
        click.echo("rejects: %s is empty now: every line was sent" % path, err=True)
    return code


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
    help="With --from: leave out the first N lines (exact when nothing was in doubt "
    "and no line after the first not sent was sent; the rejects file always is).",
)
@click.option(
    "--rejects",
    "rejects_to",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="With --from: write every line not sent here, with its line number and kind; "
    "'send --from FILE' resumes [default: the input's name + .rejects, or "
    "asgi-amqp-send-TIME.rejects for stdin].",
)
@click.option(
    "--resend-in-doubt",
    is_flag=True,
    help="With --from a rejects file: send its lines in doubt again too (each one the "
    "broker had arrives twice).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --from: print the summary on stdout as one JSON object.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --from: check every line (JSON, names, size, encryption) and send "
    "nothing; exit status 1 if any line is bad.",
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
    rejects_to: Optional[str],
    resend_in_doubt: bool,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Send MESSAGE_JSON (a JSON object) to CHANNEL, or every line of --from FILE.

    Bulk mode shows a progress bar on a terminal, reports bad lines with
    their line number and goes on, and ends with a summary: sent, refused,
    in doubt and not sent, adding up to the lines read. Every line not sent
    goes to the rejects file, which 'send --from' resumes from.
    """
    if source is not None:
        if channel is not None or message_json is not None:
            raise click.UsageError("give either CHANNEL MESSAGE_JSON or --from FILE, not both")
        if dry_run:
            sys.exit(_check_bulk(settings, source, skip, as_json))
        sys.exit(
            _send_bulk(
                settings,
                source,
                on_full,
                retries,
                jobs,
                skip,
                retry_for,
                rejects_to,
                resend_in_doubt,
                as_json,
            )
        )
    if rejects_to is not None or resend_in_doubt or as_json or dry_run:
        raise click.UsageError(
            "--rejects, --resend-in-doubt, --json and --dry-run go with --from FILE"
        )
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
    except (TypeError, ValueError, RecursionError) as exc:
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
    if sender.in_doubt:  # after a connection error: the first one says which
        why = sender.fatal or next(iter(reported), None)
        raise CLIError(
            "%s %s: in doubt: it was written to the broker but no confirm came (%s); "
            "the broker may or may not have it"
            % (kind, name, _describe(why) if why is not None else "no answer"),
            EXIT_PARTIAL,
        )
    if sender.fatal is not None:
        raise _fatal_error(sender.fatal)
    for problem in reported:
        # The message itself (too large, say): an invalid message, exit 2.
        if isinstance(problem, (MessageTooLarge, TypeError, ValueError)):
            raise CLIError("%s %s: %s" % (kind, name, _one_line(problem)))
        if kind == "group" and getattr(problem, "reply_code", None) == ACCESS_REFUSED:
            raise CLIError(
                "group %s: this user may not send to groups (the broker refused it: %s). "
                "The 'sender' role (asgi-amqp permissions sender) sends to channels "
                "only; send-group needs the 'application' role's permissions"
                % (name, _one_line(problem)),
                EXIT_PARTIAL,
            )
        raise _error_for(problem) or CLIError(
            "%s %s: %s" % (kind, name, _describe(problem)), EXIT_PARTIAL
        )
    if sender.full:
        raise CLIError(
            "channel %s is full (capacity %d)" % (name, layer.get_capacity(name)), EXIT_PARTIAL
        )
    if sender.sent != 1:
        sys.exit(EXIT_PARTIAL)
