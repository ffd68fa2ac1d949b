"""The options every command shares: the layer's settings and where they come from.

They are accepted before the command and after it: the group and every
command carry the same options (``add_shared``), and each given value is
remembered in the context's ``meta``, which click shares between a group
and its command (``_remember``). ``settings.Settings`` resolves them.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import click

ENV_PREFIX = "ASGI_AMQP_"

_GIVEN = "asgi_amqp.given"  # ctx.meta key: {option name: (rank, value)}
_RANK: Dict[Optional[click.core.ParameterSource], int] = {
    click.core.ParameterSource.COMMANDLINE: 2,
    click.core.ParameterSource.ENVIRONMENT: 1,
}


_V = TypeVar("_V")


def _remember(ctx: click.Context, param: click.Parameter, value: _V) -> _V:
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

    def __init__(self, name: str, convert: Optional[Callable[[str], Any]] = None) -> None:
        self.name = name
        self._convert = convert

    def convert(
        self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]
    ) -> Any:
        if self._convert is None or not isinstance(value, str):
            return value
        try:
            return self._convert(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def split_envvar_value(self, rv: str) -> List[str]:
        return [item.strip() for item in rv.split(",") if item.strip()]


def _capacity_pattern(text: str) -> Tuple[str, int]:
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

# (flags, click keyword arguments); the environment variable is ASGI_AMQP_<NAME>
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
        ("--hosts",),
        dict(
            type=_ListOf("URL"),
            multiple=True,
            metavar="URL",
            help="The broker's nodes as the layer's 'hosts' (asgi_redis's name for a list "
            "of URLs); repeatable, the environment variable comma-separated. The same as "
            "--url with a list: give one of the two.",
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
        ("--django-setup", "django_setup"),
        dict(
            is_flag=True,
            help="Set Django up (django.setup()) and read the settings through it, "
            "for settings that need Django; by default the module is only imported.",
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
        ("--first-connect-timeout",),
        dict(
            type=click.FloatRange(min=0),
            metavar="SECONDS",
            help="Wait this long for a broker that is not up yet before failing "
            "[default: 0, fail at once; the layer's own default is 60].",
        ),
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
        ("--max-consumers",),
        dict(type=click.IntRange(min=1), metavar="N", help="[default: 1000]"),
    ),
    (
        ("--ordered-channel", "ordered_channels"),
        dict(
            type=_ListOf("CHANNEL"),
            multiple=True,
            envvar=ENV_PREFIX + "ORDERED_CHANNELS",
            metavar="CHANNEL",
            help="A channel whose messages with a reply_channel and an order reach one "
            "process at a time, in order; repeatable (the environment variable is "
            "comma-separated) [default: websocket.receive, websocket.disconnect].",
        ),
    ),
    (
        ("--persistent/--transient", "persistent"),
        dict(
            default=None,
            help="Publish persistent messages, which classic queues keep through a broker "
            "restart [default: transient].",
        ),
    ),
    (
        ("-v", "--verbose"),
        dict(count=True, envvar=None, help="More log output on stderr (-vv: debug)."),
    ),
    (
        ("-q", "--quiet"),
        dict(
            count=True,
            envvar=None,
            help="Errors only (-qq: only an error that ends the command, not those of "
            "single lines).",
        ),
    ),
]

# Options that are not layer options.
_NOT_LAYER = {"django_settings", "django_setup", "layer_alias", "config_file", "verbose", "quiet"}


class _Option(click.Option):
    """An option whose error names its environment variable only when the bad
    value came from it (click names it whenever the help shows it).

    ``shared`` marks the copy a command carries of the group's option: the
    command's --help leaves it out (``SharedHelp``), the group's shows it."""

    shared = False

    def get_error_hint(self, ctx: Optional[click.Context]) -> str:
        hint = click.Parameter.get_error_hint(self, ctx)
        if ctx is not None and self.envvar:
            if ctx.get_parameter_source(self.name) == click.core.ParameterSource.ENVIRONMENT:
                hint += " (from %s)" % self.envvar
        return hint


def _option(flags: Tuple[str, ...], kwargs: Dict[str, Any]) -> _Option:
    names = [f for f in flags if f.startswith("-")]
    dest = [f for f in flags if not f.startswith("-")]
    name = dest[0] if dest else names[-1].lstrip("-").replace("-", "_")
    kwargs = dict(kwargs)
    kwargs.setdefault("envvar", ENV_PREFIX + name.upper())
    if kwargs["envvar"] is None:
        del kwargs["envvar"]
    else:
        kwargs["show_envvar"] = True
    return _Option(names + [name], expose_value=False, callback=_remember, **kwargs)


def shared() -> List[_Option]:
    """New instances of every shared option, for the group or one command."""
    return [_option(flags, kwargs) for flags, kwargs in _OPTIONS]


def add_shared(command: click.Command) -> None:
    """Give ``command`` the shared options it does not have (after its own)."""
    own = {param.name for param in command.params}
    for option in shared():
        if option.name not in own:
            option.shared = True
            command.params.append(option)


SHARED_NOTE = (
    "The settings options of '%s --help' (--url, --prefix, --capacity, --config, "
    "-v, -q, ...) are accepted here too, before or after the command."
)


class SharedHelp(click.Command):
    """A command whose --help lists its own options, and names the shared ones
    in a line instead of repeating them."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = [
            record
            for param in self.get_params(ctx)
            if not getattr(param, "shared", False)
            for record in [param.get_help_record(ctx)]
            if record is not None
        ]
        if records:
            with formatter.section("Options"):
                formatter.write_dl(records)
        formatter.write_paragraph()
        root = ctx.find_root().info_name or "asgi-amqp"
        formatter.write_text(SHARED_NOTE % root)
