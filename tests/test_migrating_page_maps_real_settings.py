"""docs/migrating.rst's settings tables against the code they describe.

Every asgi_redis 1.4.3 and asgi_rabbitmq 0.5 setting has a row; every
asgi_amqp setting a row names is one the layer takes; and the page's
settings step, ``examples/from_asgi_redis.py`` (which the page includes),
does what the asgi_redis table says. The end-to-end run of that step is
tests/e2e/test_migrating_from_asgi_redis.py.
"""

import inspect
import os
import re
import sys
from typing import Dict, List, Optional

import pytest

from asgi_amqp import AMQPChannelLayer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "migrating.rst")
sys.path.insert(0, os.path.join(ROOT, "examples"))

from from_asgi_redis import switch_config, switch_layers  # noqa: E402

# The keywords of asgi_redis 1.4.3's RedisChannelLayer, RedisLocalChannelLayer
# and RedisSentinelChannelLayer, and of asgi_rabbitmq 0.5's
# RabbitmqChannelLayer and RabbitmqLocalChannelLayer (``url`` first).
ASGI_REDIS = {
    "expiry",
    "hosts",
    "prefix",
    "group_expiry",
    "capacity",
    "channel_capacity",
    "symmetric_encryption_keys",
    "stats_prefix",
    "connection_kwargs",
    "services",
    "sentinel_refresh_interval",
}
ASGI_RABBITMQ = {
    "url",
    "expiry",
    "group_expiry",
    "capacity",
    "channel_capacity",
    "symmetric_encryption_keys",
    "prefix",
}
LAYER_OPTIONS = set(inspect.signature(AMQPChannelLayer).parameters)
_BORDER = re.compile(r"^=+( +=+)+$")
_NAME = re.compile(r"``([a-z_]+)``")


def settings_table(first_header: str) -> Dict[str, Optional[str]]:
    """{old setting: asgi_amqp setting, or None for "(dropped)"} from the
    simple table whose first column is headed ``first_header``."""
    with open(PAGE, encoding="utf-8") as page:
        lines = page.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    border = lines[start - 1]
    assert _BORDER.match(border), border
    second = border.index("=", border.index(" "))
    third = border.index("=", border.index(" ", second))
    rows: Dict[str, Optional[str]] = {}
    for line in lines[start + 2 :]:
        if _BORDER.match(line):
            return rows
        old, new = line[:second].strip(), line[second:third].strip()
        if not old:
            continue  # a continuation line
        old_name = _NAME.fullmatch(old.split()[0])
        assert old_name, line
        if new == "(dropped)":
            rows[old_name.group(1)] = None
        else:
            new_name = _NAME.fullmatch(new)
            assert new_name, line
            rows[old_name.group(1)] = new_name.group(1)
    raise AssertionError("the table of %r has no end" % first_header)


REDIS_TABLE = settings_table("asgi_redis ``CONFIG``")
RABBITMQ_TABLE = settings_table("asgi_rabbitmq ``CONFIG``")


def test_every_old_setting_has_a_row():
    assert set(REDIS_TABLE) == ASGI_REDIS
    assert set(RABBITMQ_TABLE) == ASGI_RABBITMQ


@pytest.mark.parametrize("table", [REDIS_TABLE, RABBITMQ_TABLE], ids=["asgi_redis", "rabbitmq"])
def test_every_new_setting_is_one_the_layer_takes(table):
    named = {new for new in table.values() if new is not None}
    assert named and named <= LAYER_OPTIONS, named - LAYER_OPTIONS


SAMPLES = {
    "hosts": [("redis", 6379)],
    "prefix": "myproject:",
    "expiry": 30,
    "group_expiry": 3600,
    "capacity": 150,
    "channel_capacity": {"http.request": 200},
    "symmetric_encryption_keys": ["secret"],
    "stats_prefix": "myproject-meta:",
    "connection_kwargs": {"socket_timeout": 10},
    "services": ["mymaster"],
    "sentinel_refresh_interval": 5,
}


@pytest.mark.parametrize("setting", sorted(ASGI_REDIS))
def test_the_settings_step_does_what_the_table_says(setting):
    url = "amqp://guest:guest@rabbit:5672/%2F"
    switched = switch_config({setting: SAMPLES[setting]}, url)
    target = REDIS_TABLE[setting]
    assert switched["url"] == url
    if target is None:
        assert switched == {"url": url}
    elif target != "url":
        expected = "myproject" if setting == "prefix" else SAMPLES[setting]
        assert switched == {"url": url, target: expected}
    # The layer takes the result (the keys, the prefix without its ':').
    AMQPChannelLayer(**switched).close()


def test_the_settings_step_switches_asgi_redis_entries_only():
    layers = {
        "default": {
            "BACKEND": "asgi_redis.RedisChannelLayer",
            "ROUTING": "myproject.routing.channel_routing",
            "CONFIG": {"hosts": ["redis://redis:6379/0"], "capacity": 150},
            "TEST_CONFIG": {"prefix": "test:"},
        },
        "other": {"BACKEND": "asgiref.inmemory.ChannelLayer", "ROUTING": "x.routing"},
    }
    switched = switch_layers(layers, url="amqp://rabbit/", operation_timeout=30)
    assert switched["default"] == {
        "BACKEND": "asgi_amqp.AMQPChannelLayer",
        "ROUTING": "myproject.routing.channel_routing",
        "CONFIG": {"capacity": 150, "url": "amqp://rabbit/", "operation_timeout": 30},
        "TEST_CONFIG": {"prefix": "test", "url": "amqp://rabbit/", "operation_timeout": 30},
    }
    assert switched["other"] is layers["other"]
    with pytest.raises(ValueError, match="not an asgi_redis 1.4 setting: hostz"):
        switch_config({"hostz": []}, "amqp://rabbit/")


def test_the_page_includes_the_settings_step():
    with open(PAGE, encoding="utf-8") as page:
        text = page.read()
    includes: List[str] = re.findall(r"^\.\. literalinclude:: (\S+)$", text, re.M)
    assert includes == ["../examples/from_asgi_redis.py"]
