"""Settings of the chat example: Django 2.2 + Channels 1.1.8 on asgi_amqp.

Everything that differs between machines comes from the environment:

``AMQP_URL`` / ``AMQP_MANAGEMENT_URL``
    the broker and its management API (``make demo`` and the tests set them).
    ``AMQP_URL`` may list a cluster's nodes, comma-separated, as for the
    ``asgi-amqp`` command: the layer tries them in that order.
``CHAT_LAYER_PREFIX``
    prefix of the layer's queues and exchanges (default ``chat``); two
    deployments on one vhost with different prefixes never see each other.
``CHAT_STATE_DIR``
    where the channel sessions (file session engine) and the sqlite file
    live; every process of one deployment must share it. Default: a
    per-user directory under the system's temporary directory.
``CHAT_CAPACITY``
    the layer's channel capacity (default 100). Every process of one
    deployment must use the same: it is part of each queue's arguments, and
    a queue declared with another is refused. ``make bench-channels`` raises
    it so the runworker drain fits.
``CHAT_QUEUE_TYPE``
    ``classic`` (default) or ``quorum``: the layer's ``queue_type``. Like
    the capacity, every process of one deployment must use the same.
``CHAT_RECEIVE_TIMEOUT``
    seconds a blocking receive waits (default 2): how long daphne and
    runworker take at most to notice they should stop.
``CHAT_HANDLED_LOG``
    if set, the echo consumer appends ``<pid> <text>`` for every frame it
    handles, before it replies (the worker-kill test reads it).
``CHAT_TEST_HOOKS``
    if ``1``, the echo consumer obeys ``sleep <seconds>`` frames.
"""

import os
import tempfile

BASE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env_flag(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


STATE_DIR = os.environ.get("CHAT_STATE_DIR") or os.path.join(
    tempfile.gettempdir(), "asgi-amqp-chat-%d" % os.getuid()
)
SESSION_DIR = os.path.join(STATE_DIR, "sessions")
os.makedirs(SESSION_DIR, mode=0o700, exist_ok=True)

SECRET_KEY = os.environ.get("CHAT_SECRET_KEY", "chat-example-not-a-secret")
DEBUG = _env_flag("CHAT_DEBUG")
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"] + [
    h for h in os.environ.get("CHAT_ALLOWED_HOSTS", "").split(",") if h
]

INSTALLED_APPS = [
    "channels",
    "chat",
]
MIDDLEWARE = []
ROOT_URLCONF = "chatproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {},
    }
]

# Nothing is stored in a database; sqlite in the state directory keeps
# Django's connection handling (closed after every consumer) trivial.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(STATE_DIR, "db.sqlite3"),
    }
}

# channel_session and enforce_ordering keep per-socket state in a session
# store that every worker process must see: files in the shared directory.
SESSION_ENGINE = "django.contrib.sessions.backends.file"
SESSION_FILE_PATH = SESSION_DIR

USE_TZ = True
TIME_ZONE = "UTC"

_PREFIX = os.environ.get("CHAT_LAYER_PREFIX", "chat")
_URLS = [
    url.strip()
    for url in os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F").split(",")
    if url.strip()
]
_LAYER_CONFIG = {
    "url": _URLS[0] if len(_URLS) == 1 else _URLS,
    "management_url": os.environ.get("AMQP_MANAGEMENT_URL") or None,
    "prefix": _PREFIX,
    "expiry": 60,
    # daphne closes idle WebSockets after group_expiry seconds
    # (websocket_timeout defaults to it): a day, as in Channels' own default.
    "group_expiry": 86400,
    "capacity": int(os.environ.get("CHAT_CAPACITY", "100")),
    "receive_timeout": float(os.environ.get("CHAT_RECEIVE_TIMEOUT", "2")),
    "queue_type": os.environ.get("CHAT_QUEUE_TYPE", "classic"),
    # CHAT_PERSISTENT=1: classic queues keep their messages through a restart.
    "persistent": os.environ.get("CHAT_PERSISTENT") == "1",
    # Channels' worker loop catches nothing that receive or send raise, and
    # daphne calls send from its reactor: a call rides through an outage of
    # up to operation_timeout and raises after it. A broker restart keeps
    # clients away for 10-15 s, so ride through 30 s.
    "operation_timeout": float(os.environ.get("CHAT_OPERATION_TIMEOUT") or "30"),
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "asgi_amqp.AMQPChannelLayer",
        "ROUTING": "chatproject.routing.channel_routing",
        "CONFIG": _LAYER_CONFIG,
        # Channels' test helpers build the layer from TEST_CONFIG: same broker,
        # its own prefix, short expiries.
        "TEST_CONFIG": dict(
            _LAYER_CONFIG, prefix=_PREFIX + "-test", expiry=10, group_expiry=60, receive_timeout=1.0
        ),
    },
}

CHAT_HANDLED_LOG = os.environ.get("CHAT_HANDLED_LOG") or None
CHAT_TEST_HOOKS = _env_flag("CHAT_TEST_HOOKS")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "asgi_amqp": {
            "handlers": ["console"],
            "level": os.environ.get("CHAT_LAYER_LOG_LEVEL", "WARNING"),
            "propagate": False,
        },
        "chat": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # daphne's basicConfig puts the root logger at INFO: keep pika's
        # connection chatter out of it.
        "pika": {"level": "WARNING"},
    },
}
