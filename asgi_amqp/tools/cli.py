"""The ``asgi-amqp`` command: send, receive, groups, flush and statistics.

Run ``asgi-amqp --help`` (or ``python -m asgi_amqp --help``). Needs click,
and tqdm for the progress bar of bulk sends: ``pip install 'asgi-amqp-layer[cli]'``.
"""

import json
import os
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

try:
    import click
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the asgi-amqp command needs click: pip install 'asgi-amqp-layer[cli]'") from None

from .. import __version__, statistics
from . import bulk
from .bulk import send_one
from .jsonbytes import dumps, loads
from ..errors import (AuthenticationError, BrokerConnectionError, BrokerOperationError,
                     ManagementAPIError, MessageTooLarge)
from ..serialization import validate_message
from ..urls import redact

EXIT_OK = 0
EXIT_PARTIAL = 1  # some messages were skipped or failed (or fewer than --count received)
EXIT_ERROR = 2    # usage, configuration or connection error

PROG = "asgi-amqp"
MAX_REPORTED_ERRORS = 20
CONSECUTIVE_CONNECTION_ERRORS = 3

EPILOG = """\b
Exit status:
  0  everything was sent (received, done)
  1  some messages were skipped because a channel was full, or failed;
     receive: fewer than --count messages arrived; flush: not confirmed
  2  usage error, invalid name, or the broker (or its management API)
     cannot be reached

\b
Bytes in JSON: {"__bytes__": "<base64>"} stands for a bytes value, in
messages given to send and in the output of receive.

Give the password in AMQP_URL rather than --url: a command line is visible
to other users of the machine and stays in the shell history.
"""


# -- errors -----------------------------------------------------------------------

class CLIError(click.ClickException):
    """One line on stderr and an exit status (2 unless said otherwise)."""

    def __init__(self, message, exit_code=EXIT_ERROR):
        super(CLIError, self).__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo("%s: error: %s" % (PROG, self.format_message()), err=True)


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _error_for(exc):
    """A CLIError for an exception the layer raised, or None for anything else."""
    if isinstance(exc, AuthenticationError):
        return CLIError(_one_line(exc))
    if isinstance(exc, BrokerConnectionError):
        return CLIError("cannot reach the broker: %s" % _one_line(exc))
    if isinstance(exc, ManagementAPIError):
        return CLIError(_one_line(exc))
    if isinstance(exc, BrokerOperationError):
        return CLIError("%s%s" % (_one_line(exc), _mismatch_hint(exc)), EXIT_PARTIAL)
    if isinstance(exc, (TypeError, ValueError)):
        return CLIError(_one_line(exc))
    return None


def _mismatch_hint(exc):
    if getattr(exc, "reply_code", None) == 406:
        return (" (do --expiry and --capacity match the settings of the application "
                "that uses this prefix?)")
    return ""


class _LayerErrors(object):
    """Turns the layer's exceptions into one-line CLI errors."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, click.exceptions.Exit):
            return False
        error = _error_for(exc)
        if error is None:
            return False
        raise error from None


# JSON with bytes: see jsonbytes.



def _message_argument(text):
    try:
        message = loads(text)
    except ValueError as exc:
        raise click.BadParameter("not valid JSON: %s" % exc, param_hint="MESSAGE_JSON")
    if not isinstance(message, dict):
        raise click.BadParameter("must be a JSON object", param_hint="MESSAGE_JSON")
    return message


# -- settings and the layer --------------------------------------------------------

class Settings(object):
    """The global options; makes the layer on first use and closes it at exit."""

    def __init__(self, url, management_url, prefix, expiry, capacity):
        self.url = url
        self.management_url = management_url
        self.prefix = prefix
        self.expiry = expiry
        self.capacity = capacity
        self._layer = None

    def layer(self):
        if self._layer is None:
            from ..layer import AMQPChannelLayer

            config = {"prefix": self.prefix, "dead_letter_worker": False}
            if self.url:
                config["url"] = self.url
            if self.management_url:
                config["management_url"] = self.management_url
            if self.expiry is not None:
                config["expiry"] = self.expiry
            if self.capacity is not None:
                config["capacity"] = self.capacity
            with _LayerErrors():
                self._layer = AMQPChannelLayer(**config)
        return self._layer

    def where(self):
        from ..layer import DEFAULT_URL

        return redact(self.url or DEFAULT_URL)

    def close(self):
        if self._layer is not None:
            self._layer.close()


def _has_password(url):
    try:
        return bool(url) and urlsplit(url).password is not None
    except ValueError:
        return False


def _note_password(ctx, name, variable):
    source = ctx.get_parameter_source(name)
    if source == click.core.ParameterSource.COMMANDLINE and _has_password(ctx.params.get(name)):
        click.echo("%s: note: --%s holds a password, which other users can see in the "
                   "process list and which stays in the shell history; set %s instead"
                   % (PROG, name.replace("_", "-"), variable), err=True)


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar="AMQP_URL", metavar="URL",
              help="AMQP URL of the broker [env var: AMQP_URL; default: "
                   "amqp://guest:guest@localhost:5672/%2F].")
@click.option("--management-url", envvar="AMQP_MANAGEMENT_URL", metavar="URL",
              help="RabbitMQ management API, for group-members, flush and stats "
                   "[env var: AMQP_MANAGEMENT_URL; default: the broker's host, port 15672].")
@click.option("--prefix", default="asgi", show_default=True,
              help="The layer's prefix (the application's 'prefix' setting).")
@click.option("--expiry", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="The application's 'expiry' setting [default: 60]; queues are "
                   "declared with it.")
@click.option("--capacity", type=click.IntRange(min=1), metavar="N",
              help="The application's 'capacity' setting [default: 100].")
@click.version_option(__version__, "-V", "--version", prog_name=PROG)
@click.pass_context
def cli(ctx, url, management_url, prefix, expiry, capacity):
    """Send and receive ASGI 1.0 messages on RabbitMQ through asgi_amqp.

    Use the same --prefix, --expiry and --capacity as the application:
    RabbitMQ refuses to declare a channel's queue with other settings.
    """
    _note_password(ctx, "url", "AMQP_URL")
    _note_password(ctx, "management_url", "AMQP_MANAGEMENT_URL")
    settings = Settings(url, management_url, prefix, expiry, capacity)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


# -- send -----------------------------------------------------------------------------

ON_FULL = click.Choice(list(bulk.ON_FULL))


class Batch(object):
    """Sends messages, counts outcomes and applies the ``--on-full`` policy.

    Thread-safe: with ``jobs > 1`` sends run on a pool of threads.
    """

    def __init__(self, layer, on_full="fail", retries=5, report=None, sleep=time.sleep):
        self.layer = layer
        self.on_full = on_full
        self.retries = retries
        self.sent = 0
        self.full = 0
        self.failed = 0
        self.stopped = None       # why the batch stopped early, if it did
        self.fatal = None         # a CLIError that ends the batch with status 2
        self._lock = threading.Lock()
        self._report = report or (lambda text: click.echo(text, err=True))
        self._reported = 0
        self._connection_errors = 0
        self._sleep = sleep

    def report(self, where, text):
        with self._lock:
            self._reported += 1
            count = self._reported
        if count <= MAX_REPORTED_ERRORS:
            self._report("%s: %s" % (where, text))
        elif count == MAX_REPORTED_ERRORS + 1:
            self._report("(further errors are not shown)")

    def invalid(self, where, text):
        with self._lock:
            self.failed += 1
        self.report(where, text)

    @property
    def processed(self):
        return self.sent + self.full + self.failed

    def send(self, kind, name, message, where):
        """Send one message (kind "channel" or "group"); the outcome is counted."""
        try:
            sent = send_one(self.layer, kind, name, message, self.on_full, self.retries,
                            sleep=self._sleep)
        except (TypeError, ValueError, MessageTooLarge, BrokerOperationError) as exc:
            self.invalid(where, _one_line(exc) + _mismatch_hint(exc))
            return
        except AuthenticationError as exc:
            with self._lock:
                self.failed += 1
                self.fatal = self.fatal or _error_for(exc)
            return
        except BrokerConnectionError as exc:
            with self._lock:
                self.failed += 1
                self._connection_errors += 1
                if self.sent == 0 or self._connection_errors >= CONSECUTIVE_CONNECTION_ERRORS:
                    self.fatal = self.fatal or _error_for(exc)
                    return
            self.report(where, "cannot reach the broker: %s" % _one_line(exc))
            return
        with self._lock:
            if sent:
                self.sent += 1
                self._connection_errors = 0
            else:
                self.full += 1
                if self.on_full == "fail" and self.stopped is None:
                    self.stopped = "%s: channel %s is full (--on-full=fail)" % (where, name)

    @property
    def done(self):
        return self.stopped is not None or self.fatal is not None

    def summary(self, elapsed):
        rate = self.sent / elapsed if elapsed > 0 else 0.0
        return "sent %d, channel full %d, failed %d in %.2f s (%.0f msg/s)" % (
            self.sent, self.full, self.failed, elapsed, rate)

    def exit_code(self):
        if self.fatal is not None:
            return EXIT_ERROR
        if self.full or self.failed or self.stopped is not None:
            return EXIT_PARTIAL
        return EXIT_OK


def _parse_line(text, layer):
    """(kind, name, message) of one JSON Lines record, or raise ValueError."""
    try:
        record = loads(text)
    except ValueError as exc:
        raise ValueError("invalid JSON: %s" % exc)
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object with \"channel\" or \"group\" and \"message\"")
    unknown = set(record) - {"channel", "group", "message"}
    if unknown:
        raise ValueError("unknown key(s): %s" % ", ".join(sorted(unknown)))
    if ("channel" in record) == ("group" in record):
        raise ValueError("give exactly one of \"channel\" and \"group\"")
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
        raise ValueError("missing \"message\"")
    message = record["message"]
    if not isinstance(message, dict):
        raise ValueError("\"message\" must be a JSON object")
    try:
        validate_message(message)
    except TypeError as exc:
        raise ValueError(_one_line(exc))
    return kind, name, message


def _count_lines(stream):
    """Number of non-blank lines of a regular file (for the progress bar), else None."""
    try:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        position = stream.tell()
        count = sum(1 for line in stream if line.strip())
        stream.seek(position)
    except (AttributeError, OSError, ValueError):  # not a file, or not UTF-8
        try:
            stream.seek(0)
        except (AttributeError, OSError, ValueError):
            pass
        return None
    return count


def _progress(total, stream=None):
    """A tqdm bar when ``stream`` (stderr) is a terminal, else None."""
    stream = stream or sys.stderr
    try:
        if not stream.isatty():
            return None
        from tqdm import tqdm
    except (ImportError, AttributeError, ValueError):
        return None
    return tqdm(total=total, unit="msg", file=stream, dynamic_ncols=True, leave=False)


def _send_bulk(settings, stream, on_full, retries, jobs):
    layer = settings.layer()
    total = _count_lines(stream)
    bar = _progress(total)
    if bar is not None:
        def report(text):
            bar.write(text, file=sys.stderr)
    else:
        report = None
    batch = Batch(layer, on_full=on_full, retries=retries, report=report)
    started = time.monotonic()
    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
    window = threading.BoundedSemaphore(jobs * 4)

    def send(kind, name, message, where):
        try:
            batch.send(kind, name, message, where)
        finally:
            if bar is not None:
                bar.update(1)
            if pool is not None:
                window.release()

    try:
        for number, line in enumerate(stream, 1):
            if batch.done:
                break
            if not line.strip():
                continue
            where = "line %d" % number
            try:
                kind, name, message = _parse_line(line, layer)
            except ValueError as exc:
                batch.invalid(where, str(exc))
                if bar is not None:
                    bar.update(1)
                continue
            if pool is None:
                send(kind, name, message, where)
            else:
                window.acquire()
                pool.submit(send, kind, name, message, where)
    except UnicodeDecodeError as exc:
        batch.invalid("input", "not UTF-8 text: %s" % exc)
    except KeyboardInterrupt:
        batch.stopped = batch.stopped or "an interrupt"
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
    elapsed = time.monotonic() - started
    if batch.fatal is not None and batch.processed <= 1:
        raise batch.fatal
    if batch.fatal is not None:
        click.echo("%s: error: %s" % (PROG, batch.fatal.format_message()), err=True)
    if batch.stopped:
        click.echo("%s: stopped at %s" % (PROG, batch.stopped), err=True)
    click.echo(batch.summary(elapsed), err=True)
    return batch.exit_code()


@cli.command(epilog=EPILOG)
@click.argument("channel", required=False)
@click.argument("message_json", metavar="[MESSAGE_JSON]", required=False)
@click.option("--from", "source", type=click.File("r", encoding="utf-8"), metavar="FILE",
              help="Send every line of FILE ('-' for stdin), JSON Lines of "
                   "{\"channel\": ..., \"message\": {...}} or "
                   "{\"group\": ..., \"message\": {...}}.")
@click.option("--on-full", type=ON_FULL, default="fail", show_default=True,
              help="When a channel is full: fail (stop), skip (count it and go on), or "
                   "retry with exponential backoff, then count it as full and go on.")
@click.option("--retries", type=click.IntRange(min=0), default=5, show_default=True,
              help="Attempts after the first with --on-full=retry (waits 0.1 s, 0.2 s, ... "
                   "at most 2 s).")
@click.option("--jobs", type=click.IntRange(min=1, max=64), default=1, show_default=True,
              help="Bulk mode: messages in flight at once. More than 1 is faster but may "
                   "reorder messages to one channel.")
@click.pass_obj
def send(settings, channel, message_json, source, on_full, retries, jobs):
    """Send MESSAGE_JSON (a JSON object) to CHANNEL, or every line of --from FILE.

    Bulk mode shows a progress bar on a terminal, reports bad lines with
    their line number and goes on, and ends with a summary line: sent,
    channel full, failed, and the rate.
    """
    if source is not None:
        if channel is not None or message_json is not None:
            raise click.UsageError("give either CHANNEL MESSAGE_JSON or --from FILE, not both")
        sys.exit(_send_bulk(settings, source, on_full, retries, jobs))
    if channel is None or message_json is None:
        raise click.UsageError("give CHANNEL and MESSAGE_JSON, or --from FILE")
    message = _message_argument(message_json)
    _send_one(settings, "channel", channel, message, on_full, retries)


@cli.command("send-group", epilog=EPILOG)
@click.argument("group")
@click.argument("message_json", metavar="MESSAGE_JSON")
@click.pass_obj
def send_group(settings, group, message_json):
    """Send MESSAGE_JSON (a JSON object) to every channel in GROUP.

    Members whose channel is full miss the message, as ASGI says.
    """
    message = _message_argument(message_json)
    _send_one(settings, "group", group, message, "fail", 0)


def _send_one(settings, kind, name, message, on_full, retries):
    layer = settings.layer()
    with _LayerErrors():
        if kind == "channel":
            layer.valid_channel_name(name)
        else:
            layer.valid_group_name(name)
    try:
        validate_message(message)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(_one_line(exc), param_hint="MESSAGE_JSON")
    batch = Batch(layer, on_full=on_full, retries=retries)
    batch.send(kind, name, message, "%s %s" % (kind, name))
    if batch.fatal is not None:
        raise batch.fatal
    if batch.full:
        raise CLIError("channel %s is full (capacity %d)" % (name, layer.get_capacity(name)),
                       EXIT_PARTIAL)
    if batch.failed:
        sys.exit(EXIT_PARTIAL)


# -- receive ----------------------------------------------------------------------------

@cli.command(epilog=EPILOG)
@click.argument("channels", nargs=-1, required=True, metavar="CHANNEL...")
@click.option("-n", "--count", type=click.IntRange(min=1), metavar="N",
              help="Stop after N messages.")
@click.option("-t", "--timeout", type=click.FloatRange(min=0), default=5.0, show_default=True,
              metavar="SECONDS",
              help="Stop once no message has arrived for SECONDS; 0 takes only what is "
                   "waiting now, 'inf' waits for ever.")
@click.pass_obj
def receive(settings, channels, count, timeout):
    """Receive messages from CHANNEL... and print them as JSON Lines.

    Each line is {"channel": ..., "message": {...}}. A process-local
    channel is given as "name!" and receives for every "name!..." channel.
    Exit status 1 when --count was given and fewer messages arrived.
    """
    layer = settings.layer()
    with _LayerErrors():
        for channel in channels:
            layer.valid_channel_name(channel, receive=True)
    try:
        received = _receive_loop(layer, list(channels), count, timeout)
    except KeyboardInterrupt:
        received = None
    if received is None:
        sys.exit(EXIT_OK if count is None else EXIT_PARTIAL)
    if count is not None and received < count:
        click.echo("%s: received %d of %d messages" % (PROG, received, count), err=True)
        sys.exit(EXIT_PARTIAL)


def _receive_loop(layer, channels, count, timeout):
    """Receive and print; the number of messages printed."""
    received = 0
    deadline = time.monotonic() + timeout
    with _LayerErrors():
        while count is None or received < count:
            if timeout == 0:
                channel, message = layer.receive(channels, block=False)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                layer.receive_timeout = max(0.05, min(1.0, remaining))
                channel, message = layer.receive(channels, block=True)
            if channel is None:
                if timeout == 0:
                    break
                continue
            received += 1
            deadline = time.monotonic() + timeout
            try:
                click.echo(dumps({"channel": channel, "message": message}))
                sys.stdout.flush()
            except BrokenPipeError:
                # The reader went away (`| head`): stop quietly.
                _quiet_stdout()
                sys.exit(EXIT_OK if count is None or received >= count else EXIT_PARTIAL)
    return received


def _quiet_stdout():
    # Python would complain about the closed pipe again when it flushes at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# -- channels and groups ------------------------------------------------------------------

@cli.command("new-channel", epilog=EPILOG)
@click.argument("pattern")
@click.pass_obj
def new_channel(settings, pattern):
    """Print a new, unused channel name made from PATTERN (which ends with '?')."""
    with _LayerErrors():
        click.echo(settings.layer().new_channel(pattern))


@cli.command("group-add", epilog=EPILOG)
@click.argument("group")
@click.argument("channel")
@click.pass_obj
def group_add(settings, group, channel):
    """Add CHANNEL to GROUP (for the layer's group_expiry)."""
    with _LayerErrors():
        settings.layer().group_add(group, channel)


@cli.command("group-discard", epilog=EPILOG)
@click.argument("group")
@click.argument("channel")
@click.pass_obj
def group_discard(settings, group, channel):
    """Remove CHANNEL from GROUP."""
    with _LayerErrors():
        settings.layer().group_discard(group, channel)


@cli.command("group-members", epilog=EPILOG)
@click.argument("group")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def group_members(settings, group, as_json):
    """Print the channels in GROUP, one a line (needs the management API)."""
    with _LayerErrors():
        members = sorted(settings.layer().group_channels(group))
    if as_json:
        click.echo(json.dumps(members))
    else:
        for member in members:
            click.echo(member)


@cli.command(epilog=EPILOG)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def flush(settings, yes):
    """Delete every channel, group and message under the prefix.

    Asks for confirmation unless --yes is given (needs the management API).
    """
    layer = settings.layer()
    if not yes:
        question = "Delete every channel, group and message with prefix %r on %s?" % (
            layer.topology.prefix, settings.where())
        try:
            confirmed = click.confirm(question, default=False, err=True)
        except click.Abort:  # end of input or Ctrl-C
            confirmed = False
        if not confirmed:
            click.echo("%s: nothing was flushed" % PROG, err=True)
            sys.exit(EXIT_PARTIAL)
    with _LayerErrors():
        layer.flush()
    click.echo("%s: flushed prefix %r" % (PROG, layer.topology.prefix), err=True)


# -- statistics -------------------------------------------------------------------------------

_COLUMNS = (
    ("channel", None),
    ("pending", "messages_pending"),
    ("count", "messages_count"),
    ("count/s", "messages_count_per_second"),
    ("max age", "messages_max_age"),
    ("full", "channel_full_count"),
    ("full/s", "channel_full_count_per_second"),
)


def _cell(value):
    if isinstance(value, float):
        return "%.1f" % value
    return str(value)


@cli.command(epilog=EPILOG)
@click.argument("channels", nargs=-1, metavar="[CHANNEL...]")
@click.option("--json", "as_json", is_flag=True,
              help="Print {\"global\": {...}, \"channels\": {name: {...}}} as JSON.")
@click.pass_obj
def stats(settings, channels, as_json):
    """Queue figures of the given channels, or of every channel of the prefix.

    From the management API, which updates them every few seconds (5 s by
    default); "full" counts only this command's own ChannelFull errors and
    is 0 here. A process-local channel "name!..." is shown as its queue "name!".
    """
    layer = settings.layer()
    with _LayerErrors():
        if channels:
            per_channel = {c: statistics.channel_statistics(layer, c) for c in channels}
        else:
            per_channel = statistics.all_channel_statistics(layer)
        total = statistics.global_statistics(layer)
    if as_json:
        click.echo(json.dumps({"global": total, "channels": per_channel}, sort_keys=True))
        return
    rows = [[name] + [_cell(per_channel[name][key]) for _, key in _COLUMNS[1:]]
            for name in sorted(per_channel)]
    rows.append(["(all channels)"] + [_cell(total[key]) for _, key in _COLUMNS[1:]])
    header = [title for title, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]

    def line(cells):
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join([first] + rest).rstrip()

    click.echo(line(header))
    for row in rows:
        click.echo(line(row))


# -- entry point ----------------------------------------------------------------------------

def main(argv=None):
    """The ``asgi-amqp`` console script."""
    return cli.main(args=argv, prog_name=PROG)


if __name__ == "__main__":  # pragma: no cover
    main()
