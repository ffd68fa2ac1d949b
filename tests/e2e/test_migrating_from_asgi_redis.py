"""docs/migrating.rst, "From asgi_redis", followed on the chat project.

The project as configured for asgi_redis (``chatproject.settings_asgi_redis``:
hosts, prefix, expiry, group_expiry, capacity, channel_capacity,
encryption keys, stats_prefix, connection_kwargs) is switched by the page's
settings step (``chatproject.settings_migrated`` calls
``examples/from_asgi_redis.py``, which the page includes), and the stack
started on the result passes the chat end-to-end tests. A setting the
mapping gets wrong (a key the layer does not take, a prefix with its ':')
makes daphne and the runworkers fail to start. The broker's queues then
carry the asgi_redis values.
"""

import importlib
import os
import sys
from unittest import mock

import pytest
from e2e_support import Client, new_stack, run_stack

# The chat end-to-end tests, run here on the switched project (these
# module's chat_stack and chat_layer fixtures replace the shared ones).
from test_channels_e2e import (  # noqa: F401
    test_daphne_runs_in_native_twisted_mode,
    test_disconnect_removes_the_member_from_the_group,
    test_echo,
    test_http_through_daphne,
    test_room_broadcast_reaches_every_member,
)

from asgi_amqp import AMQPChannelLayer

pytestmark = pytest.mark.slow

SETTINGS = "chatproject.settings_migrated"


@pytest.fixture(scope="module")
def chat_stack(broker):
    with run_stack(new_stack(broker, workers=2, settings=SETTINGS)) as stack:
        yield stack


@pytest.fixture(scope="module")
def migrated(chat_stack):
    """The switched ``CHANNEL_LAYERS["default"]`` as the stack's processes read it."""
    with mock.patch.dict(os.environ, chat_stack.environ()):
        for name in [n for n in sys.modules if n.startswith("chatproject.settings")]:
            del sys.modules[name]
        return importlib.import_module(SETTINGS).CHANNEL_LAYERS["default"]


@pytest.fixture(scope="module")
def chat_layer(migrated):
    """A layer made from the switched settings (for group_channels)."""
    layer = AMQPChannelLayer(**dict(migrated["CONFIG"], dead_letter_worker=False))
    yield layer
    layer.close()


def test_the_settings_step_maps_every_asgi_redis_setting(migrated, chat_stack):
    assert migrated["BACKEND"] == "asgi_amqp.AMQPChannelLayer"
    config = migrated["CONFIG"]
    assert config["prefix"] == chat_stack.prefix  # "chat:" without its ':'
    assert (config["expiry"], config["group_expiry"], config["capacity"]) == (30, 3600, 150)
    assert not {"hosts", "stats_prefix", "connection_kwargs"} & set(config)


def test_the_queues_carry_the_asgi_redis_settings(chat_stack, chat_layer):
    client = Client(chat_stack.ws_url("/echo/"))
    try:
        client.send_text("hello")
        assert client.recv_text(timeout=10).endswith(" hello")
    finally:
        client.close()
    prefix = chat_stack.prefix + ":q:"
    queues = {
        q["name"][len(prefix) :]: q["arguments"]
        for q in chat_layer.management_client().queues(prefix, columns="name,arguments")
    }

    def capacity(channel):
        found = [args for name, args in queues.items() if name.startswith(channel)]
        assert found, (channel, sorted(queues))
        assert {args["x-message-ttl"] for args in found} == {30000}  # expiry
        return {args["x-max-length"] for args in found}

    assert capacity("http.request") == {200}
    assert capacity("daphne.response.") == {500}
    assert capacity("websocket.receive#") == {300}
    assert capacity("websocket.connect") == {150}
