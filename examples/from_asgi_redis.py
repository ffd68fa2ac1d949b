"""Django's ``CHANNEL_LAYERS`` switched from asgi_redis 1.4 to asgi_amqp.

The settings step of docs/migrating.rst. Either keep the asgi_redis entries
in settings.py and switch them at its end (copy this file into the
project)::

    from from_asgi_redis import switch_layers

    CHANNEL_LAYERS = switch_layers(CHANNEL_LAYERS, url=os.environ["AMQP_URL"])

or print the switched entries once and paste them over the old ones::

    python from_asgi_redis.py myproject.settings

Entries of other backends are left as they are. Extra keyword arguments of
``switch_layers`` become asgi_amqp options (``operation_timeout=30``...).
"""

import importlib
import pprint
import sys
from typing import Any, Dict, Mapping

REDIS_BACKENDS = (
    "asgi_redis.RedisChannelLayer",
    "asgi_redis.RedisLocalChannelLayer",
    "asgi_redis.RedisSentinelChannelLayer",
)
# asgi_redis CONFIG keys that mean the same in asgi_amqp.
SAME = ("expiry", "group_expiry", "capacity", "channel_capacity", "symmetric_encryption_keys")
# asgi_redis CONFIG keys with no asgi_amqp counterpart: Redis servers, Redis
# connection options and the statistics key prefix. ``url`` replaces hosts.
DROPPED = ("hosts", "services", "sentinel_refresh_interval", "connection_kwargs", "stats_prefix")


def switch_config(config: Mapping[str, Any], url: Any, **options: Any) -> Dict[str, Any]:
    """An asgi_redis ``CONFIG`` as asgi_amqp's: ``url`` is the broker (or a list of nodes)."""
    unknown = set(config) - set(SAME) - set(DROPPED) - {"prefix"}
    if unknown:
        raise ValueError("not an asgi_redis 1.4 setting: %s" % ", ".join(sorted(unknown)))
    switched = {key: config[key] for key in SAME if key in config}
    if "prefix" in config:
        # asgi_redis ends its prefix with ':'; asgi_amqp adds the ':' itself.
        switched["prefix"] = config["prefix"].rstrip(":")
    switched["url"] = url
    switched.update(options)
    return switched


def switch_layers(layers: Mapping[str, Any], url: Any, **options: Any) -> Dict[str, Any]:
    """``CHANNEL_LAYERS`` with every asgi_redis entry made an asgi_amqp one."""
    switched = {}
    for alias, entry in layers.items():
        if entry.get("BACKEND") in REDIS_BACKENDS:
            entry = dict(entry, BACKEND="asgi_amqp.AMQPChannelLayer")
            for key in ("CONFIG", "TEST_CONFIG"):
                if key in entry:
                    entry[key] = switch_config(entry[key], url, **options)
        switched[alias] = entry
    return switched


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python from_asgi_redis.py SETTINGS_MODULE")
    settings = importlib.import_module(sys.argv[1])
    pprint.pprint(
        switch_layers(settings.CHANNEL_LAYERS, url="amqp://USER:PASSWORD@HOST:5672/VHOST"),
        sort_dicts=False,
    )
