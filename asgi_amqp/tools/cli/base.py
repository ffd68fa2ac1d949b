"""The ``asgi-amqp`` command's group, shared options, settings and errors.

Every command module registers itself on ``cli``; each one turns the
layer's exceptions into one line on stderr and an exit status here.

The layer options (``--capacity``, ``--expiry`` ...) and the settings
sources (``--django-settings``, ``--config``) are accepted before the
command and after it: ``layer_options`` puts the same options on the group
and on every command, and each given value is remembered in the context's
``meta``, which click shares between a group and its command. ``Settings``
resolves them once, on first use: explicit option > environment variable >
config file > Django settings > the layer's defaults.
"""

import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import click

from ... import __version__
from ...errors import (
    AuthenticationError,
    BrokerConnectionError,
    BrokerOperationError,
    ManagementAPIError,
)
from ...urls import parse_urls, redact
from .. import layerconfig
from ..jsonbytes import loads

EXIT_OK = 0
EXIT_PARTIAL = 1  # some messages were skipped or failed (or fewer than --count received)
EXIT_ERROR = 2  # usage, configuration or connection error, or a message left unread

PROG = "asgi-amqp"
MAX_REPORTED_ERRORS = 20
ENV_PREFIX = "ASGI_AMQP_"

logger = logging.getLogger(__name__)

EPILOG = """\b
Exit status:
  0  everything was sent (received, done)
  1  some messages were skipped because a channel was full, or failed;
     receive: fewer than --count messages arrived; flush: not confirmed;
     requeue: a destination channel was full
  2  usage or configuration error, invalid name, a message that cannot
     be decrypted or decoded (left in its queue), or the broker (or its
     management API) cannot be reached

\b
JSON: {"__bytes__": "<base64>"} stands for bytes and {"__float__": "nan"}
("inf", "-inf") for floats JSON cannot carry, in messages given to send
and in the output of receive and peek.

Settings, highest first: options (before or after the command),
ASGI_AMQP_* environment variables, --config FILE, the Django settings'
CHANNEL_LAYERS, the layer's defaults. Give the password in AMQP_URL rather
than --url: a command line is visible to other users of the machine.
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
    if isinstance(exc, (TypeError, ValueError, ImportError)):
        return CLIError(_one_line(exc))
    return None


def _mismatch_hint(exc):
    if getattr(exc, "reply_code", None) == 406:
        return (
            " (load the application's settings with --django-settings or --config, "
            "or give the same --expiry, --capacity and --queue-type)"
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


def _message_argument(text):
    try:
        message = loads(text)
    except ValueError as exc:
        raise click.BadParameter("not valid JSON: %s" % exc, param_hint="MESSAGE_JSON")
    if not isinstance(message, dict):
        raise click.BadParameter("must be a JSON object", param_hint="MESSAGE_JSON")
    return message


# -- the group: one-line usage errors -------------------------------------------------


class _Group(click.Group):
    """click's group, with every error as one line on stderr.

    click prints a usage error as the usage, a hint and the error on
    separate lines; here it is one line that ends with the hint to --help.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super(_Group, self).main(args, prog_name, complete_var, False, **extra)
        try:
            code = super(_Group, self).main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else PROG
            click.echo(
                "%s: error: %s (see '%s --help')" % (PROG, _one_line(exc.format_message()), where),
                err=True,
            )
            sys.exit(EXIT_ERROR)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("%s: aborted" % PROG, err=True)
            sys.exit(EXIT_PARTIAL)
        except ImportError as exc:  # an optional package a setting needs
            click.echo("%s: error: %s" % (PROG, _one_line(exc)), err=True)
            sys.exit(EXIT_ERROR)
        sys.exit(code if isinstance(code, int) else EXIT_OK)


# -- shared options -------------------------------------------------------------------

_GIVEN = "asgi_amqp.given"  # ctx.meta key: {option name: (rank, value)}
_RANK = {
    click.core.ParameterSource.COMMANDLINE: 2,
    click.core.ParameterSource.ENVIRONMENT: 1,
}


def _remember(ctx, param, value):
    """Keep an option that was given; the command's own wins over the group's."""
    rank = _RANK.get(ctx.get_parameter_source(param.name))
    if rank is not None:
        given = ctx.meta.setdefault(_GIVEN, {})
        if param.name not in given or rank >= given[param.name][0]:
            given[param.name] = (rank, value)
    return value


class _ListOf(click.ParamType):
    """A repeatable option whose environment variable is a comma-separated list."""

    envvar_list_splitter = ","

    def __init__(self, name, convert=None):
        self.name = name
        self._convert = convert

    def convert(self, value, param, ctx):
        if self._convert is None or not isinstance(value, str):
            return value
        try:
            return self._convert(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def split_envvar_value(self, rv):
        return [item.strip() for item in rv.split(",") if item.strip()]


def _capacity_pattern(text):
    pattern, sep, number = text.rpartition("=")
    if not sep or not pattern:
        raise ValueError("%r is not PATTERN=N, e.g. 'http.request=200'" % text)
    try:
        capacity = int(number)
    except ValueError:
        raise ValueError("%r: the capacity %r is not an integer" % (text, number)) from None
    if capacity < 1:
        raise ValueError("%r: the capacity must be at least 1" % text)
    return pattern, capacity


_POSITIVE = click.FloatRange(min=0, min_open=True)

# (flags, layer option or None, click keyword arguments); env var ASGI_AMQP_<NAME>
# unless given. Each one is a keyword argument of AMQPChannelLayer (see
# layerconfig.LAYER_OPTIONS) except the settings sources and verbosity.
_OPTIONS: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = [
    (
        ("--url",),
        dict(
            envvar="AMQP_URL",
            metavar="URL[,URL...]",
            help="AMQP URL of the broker, or a comma-separated list of cluster nodes "
            "tried in turn [default: amqp://guest:guest@localhost:5672/%2F].",
        ),
    ),
    (
        ("--management-url",),
        dict(
            envvar="AMQP_MANAGEMENT_URL",
            metavar="URL",
            help="RabbitMQ management API, for group-members, flush and stats "
            "[default: the broker's host, port 15672].",
        ),
    ),
    (
        ("--django-settings", "django_settings"),
        dict(
            envvar="DJANGO_SETTINGS_MODULE",
            metavar="MODULE",
            help="Read CHANNEL_LAYERS[--layer]['CONFIG'] from this Django settings module "
            "(imported from the current directory or PYTHONPATH).",
        ),
    ),
    (
        ("--layer", "layer_alias"),
        dict(
            envvar=ENV_PREFIX + "LAYER",
            metavar="ALIAS",
            help="The CHANNEL_LAYERS entry to read [default: default].",
        ),
    ),
    (
        ("--config", "config_file"),
        dict(
            envvar=ENV_PREFIX + "CONFIG",
            metavar="FILE",
            type=click.Path(dir_okay=False),
            help="A JSON or TOML (.toml) file: an object of the layer's options.",
        ),
    ),
    (("--prefix",), dict(help="The layer's prefix [default: asgi].")),
    (
        ("--expiry",),
        dict(type=_POSITIVE, metavar="SECONDS", help="Message expiry [default: 60]."),
    ),
    (
        ("--group-expiry",),
        dict(type=_POSITIVE, metavar="SECONDS", help="Group membership expiry [default: 86400]."),
    ),
    (
        ("--capacity",),
        dict(type=click.IntRange(min=1), metavar="N", help="Channel capacity [default: 100]."),
    ),
    (
        ("--channel-capacity",),
        dict(
            type=_ListOf("PATTERN=N", _capacity_pattern),
            multiple=True,
            metavar="PATTERN=N",
            help="Capacity of the channels matching a glob PATTERN, e.g. "
            "'http.request=200'; repeatable, put before the application's patterns.",
        ),
    ),
    (
        ("--queue-type",),
        dict(type=click.Choice(["classic", "quorum"]), help="[default: classic]"),
    ),
    (
        ("--symmetric-encryption-key", "symmetric_encryption_keys"),
        dict(
            type=_ListOf("KEY"),
            multiple=True,
            envvar=ENV_PREFIX + "SYMMETRIC_ENCRYPTION_KEYS",
            metavar="KEY",
            help="Encrypt with the first key, decrypt with any; repeatable "
            "(the environment variable is comma-separated).",
        ),
    ),
    (
        ("--max-message-size",),
        dict(type=click.IntRange(min=1), metavar="BYTES", help="[default: 8 MiB]"),
    ),
    (
        ("--operation-timeout",),
        dict(type=_POSITIVE, metavar="SECONDS", help="Broker call timeout [default: 10]."),
    ),
    (
        ("--receive-timeout",),
        dict(type=_POSITIVE, metavar="SECONDS", help="The layer's receive_timeout [default: 5]."),
    ),
    (("--linger",), dict(type=_POSITIVE, metavar="SECONDS", help="[default: 0.25]")),
    (
        ("--consumer-idle-timeout",),
        dict(type=_POSITIVE, metavar="SECONDS", help="[default: 30]"),
    ),
    (
        ("--consumer-prefetch",),
        dict(type=click.IntRange(1, 65535), metavar="N", help="[default: 16]"),
    ),
    (
        ("-v", "--verbose"),
        dict(count=True, envvar=None, help="More log output on stderr (-vv: debug)."),
    ),
    (("-q", "--quiet"), dict(count=True, envvar=None, help="Errors only (-qq: none).")),
]

# Options that are not layer options.
_NOT_LAYER = {"django_settings", "layer_alias", "config_file", "verbose", "quiet"}


class _Option(click.Option):
    """An option whose error names its environment variable only when the bad
    value came from it (click names it whenever the help shows it)."""

    def get_error_hint(self, ctx):
        hint = click.Parameter.get_error_hint(self, ctx)
        if ctx is not None and self.envvar:
            if ctx.get_parameter_source(self.name) == click.core.ParameterSource.ENVIRONMENT:
                hint += " (from %s)" % self.envvar
        return hint


def _option(flags: Tuple[str, ...], kwargs: Dict[str, Any]) -> Callable[[Any], Any]:
    names = [f for f in flags if f.startswith("-")]
    dest = [f for f in flags if not f.startswith("-")]
    name = dest[0] if dest else names[-1].lstrip("-").replace("-", "_")
    kwargs = dict(kwargs)
    kwargs.setdefault("envvar", ENV_PREFIX + name.upper())
    if kwargs["envvar"] is None:
        del kwargs["envvar"]
    else:
        kwargs["show_envvar"] = True
    return click.option(*names, name, cls=_Option, expose_value=False, callback=_remember, **kwargs)


def layer_options(function):
    """Put every shared option on a group or command (so both positions work)."""
    for flags, kwargs in reversed(_OPTIONS):
        function = _option(flags, kwargs)(function)
    return function


def command(*args, **kwargs):
    """``cli.command`` with the shared options and the epilog."""
    kwargs.setdefault("epilog", EPILOG)

    def decorate(function):
        return cli.command(*args, **kwargs)(layer_options(function))

    return decorate


# -- settings and the layer --------------------------------------------------------


class Settings(object):
    """The given options, resolved once into the layer's config; the layer on first use."""

    def __init__(self, given: Dict[str, Tuple[int, Any]]) -> None:
        self._given = given
        self._config: Optional[Dict[str, Any]] = None
        self._layer: Any = None

    def given(self, name: str, default: Any = None) -> Any:
        entry = self._given.get(name)
        return default if entry is None else entry[1]

    def config(self) -> Dict[str, Any]:
        """The layer's keyword arguments, from every source in precedence order."""
        if self._config is None:
            _note_passwords(self._given)
            _configure_logging(self.given("verbose", 0) - self.given("quiet", 0))
            overrides = {
                name: _layer_value(name, entry[1])
                for name, entry in self._given.items()
                if name not in _NOT_LAYER
            }
            try:
                config = layerconfig.layer_config(
                    django_settings=self.given("django_settings"),
                    alias=self.given("layer_alias") or "default",
                    config_file=self.given("config_file"),
                    overrides=overrides,
                )
            except layerconfig.ConfigError as exc:
                raise CLIError(_one_line(exc)) from None
            config["dead_letter_worker"] = False
            logger.info("layer settings: %s", _printable(config))
            self._config = config
        return self._config

    def urls(self):
        from ...layer import DEFAULT_URL

        url = self.config().get("url") or os.environ.get("AMQP_URL") or DEFAULT_URL
        return [url] if isinstance(url, str) else list(url)

    def layer(self, existing_capacities: bool = False):
        """The layer (made on first use). With ``existing_capacities``, for
        sending: channels whose queue exists count as full at the queue's own
        capacity (read through the management API when it answers)."""
        if self._layer is None:
            from ...layer import AMQPChannelLayer

            config = self.config()
            if existing_capacities:
                config = layerconfig.with_existing_capacities(config, self.urls())
            with _LayerErrors():
                self._layer = AMQPChannelLayer(**config)
        return self._layer

    def reader(self):
        """A QueueReader on the same broker, names and keys as the layer."""
        from ...serialization import Serializer
        from ..reader import QueueReader

        layer = self.layer()
        config = self.config()
        with _LayerErrors():
            serializer = Serializer(
                config.get("max_message_size", layerconfig.LAYER_OPTIONS["max_message_size"]),
                config.get("symmetric_encryption_keys"),
            )
            return QueueReader(
                parse_urls(self.urls()),
                layer.topology,
                serializer,
                encrypted=bool(config.get("symmetric_encryption_keys")),
            )

    @property
    def quiet(self) -> bool:
        return self.given("quiet", 0) > self.given("verbose", 0)

    def note(self, text: str) -> None:
        """An informational line on stderr (a summary, a count), unless --quiet."""
        if not self.quiet:
            click.echo("%s: %s" % (PROG, text), err=True)

    def where(self):
        return ", ".join(redact(url) for url in self.urls())

    def close(self):
        if self._layer is not None:
            self._layer.close()


def _printable(config):
    """The resolved settings for the log: no passwords, no keys."""
    shown = dict(config)
    if shown.get("url"):
        urls = shown["url"]
        shown["url"] = [redact(u) for u in urls] if isinstance(urls, list) else redact(urls)
    if shown.get("management_url"):
        shown["management_url"] = redact(shown["management_url"])
    if shown.get("symmetric_encryption_keys"):
        shown["symmetric_encryption_keys"] = "(%d keys)" % len(shown["symmetric_encryption_keys"])
    return ", ".join("%s=%r" % item for item in sorted(shown.items(), key=lambda kv: kv[0]))


def _layer_value(name, value):
    """A command-line or environment value as the layer takes it."""
    if name == "url" and isinstance(value, str) and "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    if name == "channel_capacity":
        return dict(value)
    if name == "symmetric_encryption_keys":
        return list(value)
    return value


_LOG_HANDLER = "asgi_amqp.cli"


def _configure_logging(verbosity):
    """Log records on stderr: errors by default (the command reports failures
    itself, in one line), -v adds warnings and information, -vv debug, -q nothing."""
    levels = {-1: logging.CRITICAL + 1, 0: logging.ERROR, 1: logging.INFO}
    level = levels.get(max(-1, min(verbosity, 2)), logging.DEBUG)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _LOG_HANDLER:
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_LOG_HANDLER)
    handler.setFormatter(logging.Formatter(PROG + ": %(levelname)s: %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    # pika logs what the tools expect (a passive declare's 404, a returned
    # publish, with the first bytes of its body) as warnings: debug only.
    logging.getLogger("pika").setLevel(level if verbosity >= 2 else logging.CRITICAL)


def _has_password(url):
    try:
        return bool(url) and any(urlsplit(u).password is not None for u in url.split(","))
    except ValueError:
        return False


def _note_passwords(given):
    for name, variable in (("url", "AMQP_URL"), ("management_url", "AMQP_MANAGEMENT_URL")):
        entry = given.get(name)
        if entry is not None and entry[0] == _RANK[click.core.ParameterSource.COMMANDLINE]:
            if _has_password(entry[1]):
                click.echo(
                    "%s: note: --%s holds a password, which other users can see in the "
                    "process list and which stays in the shell history; set %s instead"
                    % (PROG, name.replace("_", "-"), variable),
                    err=True,
                )


@click.group(
    cls=_Group,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@layer_options
@click.version_option(__version__, "-V", "--version", prog_name=PROG)
@click.pass_context
def cli(ctx):
    """Send, receive, inspect and move ASGI 1.0 messages on RabbitMQ through asgi_amqp.

    Load the application's layer settings (--django-settings, --config, or
    the options): a command that creates a channel's queue creates it with
    them. A queue that exists is used with the arguments it has.
    """
    settings = Settings(ctx.meta.setdefault(_GIVEN, {}))
    ctx.obj = settings
    ctx.call_on_close(settings.close)
