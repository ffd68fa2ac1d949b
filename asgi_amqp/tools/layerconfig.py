"""The application's layer settings, for the command line and the Spark sender.

A cron job that sends first to a channel creates its queue; if it used
settings of its own, the application would then meet a queue declared with
another capacity or expiry. So the tools read the application's own
settings, from these sources, later ones winning:

1. the layer's defaults (``AMQPChannelLayer``'s keyword arguments);
2. a Django settings module: ``CHANNEL_LAYERS[alias]["CONFIG"]``, as
   Channels' own commands read it;
3. a config file: a JSON or TOML object of the same keys;
4. environment variables and command-line options (the command line sorts
   those two out, see ``tools.cli.base``).

Every source is checked here, before anything reaches the broker: an
unknown key is an error that names the source and the key.
"""

import importlib
import inspect
import json
import logging
import os
import re
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli is the same parser, installed on 3.9 and 3.10 (setup.py)
    import tomli as tomllib

logger = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "LAYER_OPTIONS",
    "from_django",
    "from_file",
    "merge",
    "checked",
    "layer_config",
    "with_existing_capacities",
]

# Options the tools decide for themselves: a command-line run or a Spark
# task is short-lived and never runs the dead-letter worker.
TOOL_OWNED = ("dead_letter_worker",)


class ConfigError(ValueError):
    """A settings source that cannot be read or holds an unknown option."""


class UnknownOption(ConfigError, TypeError):
    """A key that is no ``AMQPChannelLayer`` option: a TypeError too, as an
    unexpected keyword argument is."""


# Keywords of AMQPChannelLayer that are no option.
NOT_OPTIONS = ("self",)

# Two names of one setting (``hosts`` is asgi_redis's name for ``url``): a
# source that gives one replaces what an earlier source gave as the other.
SAME_SETTING = {"url": "hosts", "hosts": "url"}


def _layer_parameters() -> Dict[str, Any]:
    """Every option of ``AMQPChannelLayer``, keyword-only ones included: the
    one list of options that every tool (the command line, a config file,
    the Django reader, Spark) accepts, so a new option reaches them all."""
    from ..layer import AMQPChannelLayer

    signature = inspect.signature(AMQPChannelLayer.__init__)
    return {
        name: parameter.default
        for name, parameter in signature.parameters.items()
        if name not in NOT_OPTIONS
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }


LAYER_OPTIONS: Dict[str, Any] = _layer_parameters()


def checked(config: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """``config`` as a dict, or ConfigError naming ``source`` and the first unknown key."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            "%s must be an object of layer options, not %s" % (source, type(config).__name__)
        )
    for key in config:
        if key not in LAYER_OPTIONS:
            raise UnknownOption(
                "%s has the unknown layer option %r (known: %s)"
                % (source, key, ", ".join(sorted(LAYER_OPTIONS)))
            )
    if config.get("hosts") is not None:
        from ..urls import urls_from_hosts

        if config.get("url") is not None:
            raise ConfigError("%s gives both 'url' and 'hosts': give the broker once" % source)
        try:
            urls_from_hosts(config["hosts"])
        except TypeError as exc:
            raise ConfigError("%s: %s" % (source, exc)) from None
    return dict(config)


# -- Django ----------------------------------------------------------------------------


def from_django(
    settings_module: str, alias: str = "default", setup: bool = False
) -> Dict[str, Any]:
    """``CHANNEL_LAYERS[alias]["CONFIG"]`` of a Django settings module.

    The module is imported as it is, without setting Django up, so a plain
    settings file works without the application's apps or even Django. With
    ``setup``, Django is set up first (``django.setup()``) and the settings
    are read from ``django.conf.settings``, for a project whose settings
    only make sense through Django. The current directory is on the import
    path, as for ``manage.py``.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if setup:
        layers = _django_settings(settings_module)
    else:
        layers = getattr(_import_settings(settings_module), "CHANNEL_LAYERS", None)
    source = "CHANNEL_LAYERS in %s" % settings_module
    if not isinstance(layers, Mapping):
        raise ConfigError("%s has no CHANNEL_LAYERS setting" % settings_module)
    if alias not in layers:
        raise ConfigError(
            "%s has no layer %r (it has: %s)" % (source, alias, ", ".join(sorted(layers)) or "none")
        )
    entry = layers[alias]
    backend = entry.get("BACKEND", "") if isinstance(entry, Mapping) else ""
    if not isinstance(backend, str) or not backend.startswith("asgi_amqp"):
        raise ConfigError(
            "layer %r in %s is %r, not an asgi_amqp layer" % (alias, settings_module, backend)
        )
    return checked(
        entry.get("CONFIG") or {}, "CHANNEL_LAYERS[%r]['CONFIG'] in %s" % (alias, settings_module)
    )


def _import_settings(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if exc.name and name.startswith(exc.name):
            raise ConfigError(
                "cannot import the Django settings module %r: %s (run from the "
                "project's directory, or set PYTHONPATH)" % (name, exc)
            ) from None
        raise ConfigError("the Django settings module %r failed to import: %s" % (name, exc))
    except Exception as exc:
        raise ConfigError("the Django settings module %r failed to import: %s" % (name, exc))


def _django_settings(name: str) -> Any:
    """``CHANNEL_LAYERS`` through Django itself, after ``django.setup()``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = name
    try:
        import django  # type: ignore[import-untyped,unused-ignore]
        from django.conf import settings  # type: ignore[import-untyped,unused-ignore]

        django.setup()
        return getattr(settings, "CHANNEL_LAYERS", None)
    except Exception as exc:
        raise ConfigError("Django could not be set up with %r: %s" % (name, _first_line(exc)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- files ------------------------------------------------------------------------------


def from_file(path: str) -> Dict[str, Any]:
    """The layer options in a JSON or TOML file (TOML when it ends in ``.toml``)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError("cannot read the config file %s: %s" % (path, exc.strerror or exc))
    if path.lower().endswith(".toml"):
        config = _parse_toml(path, data)
    else:
        try:
            config = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError("the config file %s is not valid JSON: %s" % (path, exc))
    return checked(config, "the config file %s" % path)


def _parse_toml(path: str, data: bytes) -> Any:
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("the config file %s is not valid TOML: %s" % (path, exc))


# -- merging ------------------------------------------------------------------------------


def merge(sources: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """One config from ``sources``, lowest precedence first.

    A later source's value replaces an earlier one's, except
    ``channel_capacity``: its patterns are merged, the later source's first
    (the layer takes the first pattern that matches), so that one
    ``--channel-capacity`` does not drop the application's other patterns.
    """
    result: Dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            if key == "channel_capacity" and result.get(key):
                value = _merge_capacities(value, result[key])
            if key in SAME_SETTING and value is not None:
                result.pop(SAME_SETTING[key], None)
            result[key] = value
    return result


def with_url(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``config`` with ``hosts``, if given, as the ``url`` list it stands for."""
    from ..urls import urls_from_hosts

    result = dict(config)
    hosts = result.pop("hosts", None)
    if hosts is not None:
        try:
            result["url"] = urls_from_hosts(hosts, result.get("url"))
        except TypeError as exc:
            raise ConfigError(str(exc)) from None
    return result


def _pairs(value: Any) -> List[Tuple[Any, Any]]:
    if isinstance(value, Mapping):
        return list(value.items())
    return [tuple(pair) for pair in value or ()]


def _merge_capacities(first: Any, then: Any) -> Dict[Any, Any]:
    merged: Dict[Any, Any] = dict(_pairs(first))
    for pattern, capacity in _pairs(then):
        merged.setdefault(pattern, capacity)
    return merged


def layer_config(
    django_settings: Optional[str] = None,
    alias: str = "default",
    config_file: Optional[str] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    django_setup: bool = False,
) -> Dict[str, Any]:
    """Keyword arguments for ``AMQPChannelLayer`` from every source, checked."""
    sources: List[Mapping[str, Any]] = []
    if django_settings:
        sources.append(from_django(django_settings, alias, setup=django_setup))
    if config_file:
        sources.append(from_file(config_file))
    if overrides:
        sources.append(checked(overrides, "the options"))
    return with_url(merge(sources))


# -- queues that exist -----------------------------------------------------------------------


def with_existing_capacities(config: Mapping[str, Any], urls: List[str]) -> Dict[str, Any]:
    """``config`` with the capacity of every existing channel queue whose
    ``x-max-length`` differs from what ``config`` would give it.

    A tool publishes to a queue that exists without declaring it again, so
    the queue keeps its own arguments; this makes the layer count a refusal
    from such a queue as ChannelFull at the queue's real capacity. Needs the
    management API (AMQP cannot read a queue's arguments); without it the
    config is returned as it is.
    """
    from asgiref.base_layer import BaseChannelLayer

    from ..management import ManagementClient
    from ..urls import management_url_for, vhost_of

    prefix = "%s:q:" % config.get("prefix", LAYER_OPTIONS["prefix"])
    url = (
        config.get("management_url")
        or os.environ.get("AMQP_MANAGEMENT_URL")
        or management_url_for(urls[0])
    )
    try:
        queues = ManagementClient(url, vhost_of(urls[0]), timeout=5.0).queues(prefix)
    except Exception as exc:  # unreachable, refused, not RabbitMQ's: go without
        logger.info("existing queues' capacities unknown: %s", exc)
        return dict(config)
    expected = BaseChannelLayer(
        capacity=config.get("capacity", LAYER_OPTIONS["capacity"]),
        channel_capacity=config.get("channel_capacity"),
    )
    found: Dict[Any, int] = {}
    for queue in queues:
        channel = queue.get("name", "")[len(prefix) :]
        capacity = _capacity_of(queue.get("arguments") or {})
        if channel and capacity is not None and capacity != expected.get_capacity(channel):
            # "foo!" holds every "foo!..." channel.
            pattern = re.escape(channel) + (".*" if channel.endswith("!") else "") + r"\Z"
            found[re.compile(pattern)] = capacity
    if not found:
        return dict(config)
    logger.info("%d existing queue(s) keep their own capacity", len(found))
    return merge([config, {"channel_capacity": found}])


def _capacity_of(arguments: Mapping[str, Any]) -> Optional[int]:
    length = arguments.get("x-max-length")
    if not isinstance(length, int):
        return None
    # naming.Topology: a quorum queue is declared one short of its capacity.
    return length + 1 if arguments.get("x-queue-type") == "quorum" else length
