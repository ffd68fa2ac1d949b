"""The command's resolved settings, its layer and reader, and its logging.

``Settings`` resolves the given options once, on first use: explicit option
> environment variable > config file > Django settings > the layer's
defaults (``tools.layerconfig``).
"""

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import click

from ...urls import parse_urls, redact
from .. import layerconfig
from .errors import PROG, CLIError, _LayerErrors, _one_line
from .options import _NOT_LAYER, _RANK

if TYPE_CHECKING:  # imported on first use: a command's start stays quick
    from ...layer import AMQPChannelLayer
    from ..reader import QueueReader

logger = logging.getLogger(__name__)


class Settings(object):
    """The given options, resolved once into the layer's config; the layer on first use."""

    def __init__(self, given: Dict[str, Tuple[int, Any]]) -> None:
        self._given = given
        self._config: Optional[Dict[str, Any]] = None
        self._layer: Optional[AMQPChannelLayer] = None

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
            # --url and --hosts name one setting: the one given the higher way
            # wins (--hosts over AMQP_URL); given alike, both are an error.
            url, hosts = self._given.get("url"), self._given.get("hosts")
            if url is not None and hosts is not None and url[0] != hosts[0]:
                del overrides["url" if url[0] < hosts[0] else "hosts"]
            try:
                config = layerconfig.layer_config(
                    django_settings=self.given("django_settings"),
                    alias=self.given("layer_alias") or "default",
                    config_file=self.given("config_file"),
                    overrides=overrides,
                    django_setup=bool(self.given("django_setup")),
                )
            except layerconfig.ConfigError as exc:
                raise CLIError(_one_line(exc)) from None
            config["dead_letter_worker"] = False
            # An operator's command says at once that the broker is down,
            # unless a source asks it to wait (a start-up script).
            config.setdefault("first_connect_timeout", 0.0)
            logger.info("layer settings: %s", _printable(config))
            self._config = config
        return self._config

    def urls(self) -> List[str]:
        from ...layer import DEFAULT_URL

        url = self.config().get("url") or os.environ.get("AMQP_URL") or DEFAULT_URL
        return [url] if isinstance(url, str) else list(url)

    def layer(self, existing_capacities: bool = False) -> "AMQPChannelLayer":
        """The layer (made on first use). With ``existing_capacities``, for
        sending: channels whose queue exists count as full at the queue's own
        capacity (read through the management API when it answers)."""
        if self._layer is None:
            from ...layer import AMQPChannelLayer

            config = self.config()
            # The layer checks every setting and connects on first use only:
            # nothing (the management API included) is contacted before the
            # settings are known to be valid.
            with _LayerErrors():
                layer = AMQPChannelLayer(**config)
            if existing_capacities:
                found = layerconfig.with_existing_capacities(config, self.urls())
                if found != config:
                    layer.close()
                    with _LayerErrors():
                        layer = AMQPChannelLayer(**found)
            self._layer = layer
        return self._layer

    def reader(self) -> "QueueReader":
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

    @property
    def silent(self) -> bool:
        """-qq: not even the errors of single lines; only one that ends the command."""
        return self.given("quiet", 0) - self.given("verbose", 0) >= 2

    def note(self, text: str) -> None:
        """An informational line on stderr (a summary, a count), unless --quiet."""
        if not self.quiet:
            click.echo("%s: %s" % (PROG, text), err=True)

    def where(self) -> str:
        return ", ".join(redact(url) for url in self.urls())

    def close(self) -> None:
        if self._layer is not None:
            self._layer.close()


def _printable(config: Dict[str, Any]) -> str:
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


def _layer_value(name: str, value: Any) -> Any:
    """A command-line or environment value as the layer takes it."""
    if name == "url" and isinstance(value, str) and "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    if name == "channel_capacity":
        return dict(value)
    if name in ("symmetric_encryption_keys", "hosts"):
        return list(value) or None  # an empty list: not given
    return value


_LOG_HANDLER = "asgi_amqp.cli"


def _configure_logging(verbosity: int) -> None:
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
    # pika logs what the tools expect (a passive declare's 404, a returned
    # publish, with the first bytes of its body, each failed connection
    # attempt before the next URL is tried) as warnings and errors: shown
    # with -vv only. The handler's own filter holds this even for a record
    # whose logger checked its level before this function ran.
    if verbosity < 2:
        handler.addFilter(_not_pika)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("pika").setLevel(level if verbosity >= 2 else logging.CRITICAL)


def _not_pika(record: logging.LogRecord) -> bool:
    return not (record.name == "pika" or record.name.startswith("pika."))


def _has_password(url: str) -> bool:
    try:
        return bool(url) and any(urlsplit(u).password is not None for u in url.split(","))
    except ValueError:
        return False


def _note_passwords(given: Dict[str, Tuple[int, Any]]) -> None:
    for name, variable in (
        ("url", "AMQP_URL"),
        ("hosts", "ASGI_AMQP_HOSTS"),
        ("management_url", "AMQP_MANAGEMENT_URL"),
    ):
        entry = given.get(name)
        if entry is not None and entry[0] == _RANK[click.core.ParameterSource.COMMANDLINE]:
            value = entry[1] if isinstance(entry[1], str) else ",".join(entry[1])
            if _has_password(value):
                click.echo(
                    "%s: note: --%s holds a password, which other users can see in the "
                    "process list and which stays in the shell history; set %s instead"
                    % (PROG, name.replace("_", "-"), variable),
                    err=True,
                )
