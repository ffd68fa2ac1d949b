"""``settings_asgi_redis`` switched to asgi_amqp by docs/migrating.rst's
settings step, as the page gives it: ``examples/from_asgi_redis.py`` called
at the end of the settings, with the broker from ``AMQP_URL`` and the
options the page adds for a Channels deployment.
"""

import os
import sys

from .settings_asgi_redis import *  # noqa: F401,F403
from .settings_asgi_redis import CHANNEL_LAYERS

# The page copies the file into the project; here it stays in examples/.
sys.path.append(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")
)
from from_asgi_redis import switch_layers  # noqa: E402

_URLS = [url.strip() for url in os.environ["AMQP_URL"].split(",") if url.strip()]
CHANNEL_LAYERS = switch_layers(
    CHANNEL_LAYERS,
    url=_URLS[0] if len(_URLS) == 1 else _URLS,
    management_url=os.environ.get("AMQP_MANAGEMENT_URL") or None,
    receive_timeout=2,
    operation_timeout=30,
)
