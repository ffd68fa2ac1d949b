"""The ``asgi-amqp`` command's group, global options and errors.

Every command module registers itself on ``cli``; each one turns the
layer's exceptions into one line on stderr and an exit status here.
"""

from urllib.parse import urlsplit

try:
    import click
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the asgi-amqp command needs click: pip install 'asgi-amqp-layer[cli]'"
    ) from None

from ... import __version__
from ...errors import (
    AuthenticationError,
    BrokerBlocked,
    BrokerConnectionError,
    BrokerOperationError,
    ManagementAPIError,
    QueueSettingsMismatch,
)
from ...urls import redact
from ..jsonbytes import loads

EXIT_OK = 0
EXIT_PARTIAL = 1  # some messages were skipped or failed (or fewer than --count received)
EXIT_ERROR = 2  # usage, configuration or connection error

PROG = "asgi-amqp"
MAX_REPORTED_ERRORS = 20

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
    if isinstance(exc, BrokerBlocked):  # names the alarm; a ChannelFull otherwise
        return CLIError(_one_line(exc))
    if isinstance(exc, QueueSettingsMismatch):  # names the setting and the fix
        return CLIError(_one_line(exc), EXIT_PARTIAL)
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
        return (
            " (do --expiry and --capacity match the settings of the application "
            "that uses this prefix?)"
        )
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
            from ...layer import AMQPChannelLayer

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
        from ...layer import DEFAULT_URL

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
        click.echo(
            "%s: note: --%s holds a password, which other users can see in the "
            "process list and which stays in the shell history; set %s instead"
            % (PROG, name.replace("_", "-"), variable),
            err=True,
        )


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="AMQP_URL",
    metavar="URL",
    help="AMQP URL of the broker [env var: AMQP_URL; default: "
    "amqp://guest:guest@localhost:5672/%2F].",
)
@click.option(
    "--management-url",
    envvar="AMQP_MANAGEMENT_URL",
    metavar="URL",
    help="RabbitMQ management API, for group-members, flush and stats "
    "[env var: AMQP_MANAGEMENT_URL; default: the broker's host, port 15672].",
)
@click.option(
    "--prefix",
    default="asgi",
    show_default=True,
    help="The layer's prefix (the application's 'prefix' setting).",
)
@click.option(
    "--expiry",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="The application's 'expiry' setting [default: 60]; queues are declared with it.",
)
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    metavar="N",
    help="The application's 'capacity' setting [default: 100].",
)
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
