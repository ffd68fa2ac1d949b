"""The chat project as configured for asgi_redis 1.4: the starting point of
docs/migrating.rst's test (``settings_migrated`` switches it). Never run on
Redis; the servers named here do not exist.
"""

import re

from .settings import *  # noqa: F401,F403
from .settings import _PREFIX, SECRET_KEY

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "asgi_redis.RedisChannelLayer",
        "ROUTING": "chatproject.routing.channel_routing",
        "CONFIG": {
            "hosts": [("redis-1.invalid", 6379), "redis://redis-2.invalid:6379/0"],
            "prefix": _PREFIX + ":",
            "expiry": 30,
            "group_expiry": 3600,
            "capacity": 150,
            "channel_capacity": {
                "http.request": 200,
                "daphne.response.*": 500,
                re.compile(r"^websocket\.receive$"): 300,
            },
            "symmetric_encryption_keys": [SECRET_KEY],
            "stats_prefix": _PREFIX + "-meta:",
            "connection_kwargs": {"socket_timeout": 10},
        },
    },
}
