"""The chat project on asgi_redis 1.4.3 instead of asgi_amqp (benchmark only).

``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) names the server; the
key prefix comes from ``CHAT_LAYER_PREFIX``. Needs asgi_redis (installed
with ``--no-deps``, see ``redis_layer``), redis-py 2.10 and txredisapi (for
daphne's native Twisted mode).
"""

import os

from .settings import *  # noqa: F401,F403
from .settings import _PREFIX

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "chatproject.redis_layer.RedisChannelLayer",
        "ROUTING": "chatproject.routing.channel_routing",
        "CONFIG": {
            "hosts": [os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")],
            "prefix": _PREFIX + ":",
            "expiry": 60,
            "group_expiry": 86400,
            "capacity": int(os.environ.get("CHAT_CAPACITY", "100")),
        },
    },
}
