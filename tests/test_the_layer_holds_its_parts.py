"""The API is put together from objects, not mixins.

``AMQPChannelLayer`` holds a ``Sender``, a ``Receiver`` and a ``Groups``,
each made with what it needs; no class of the API modules inherits from a
class of the package, so each piece of state has one owner, found where
it is declared. No broker is needed: the layer starts nothing until used.
"""

import inspect

import pytest
from asgiref.base_layer import BaseChannelLayer

import asgi_amqp
from asgi_amqp import groups, layer, pipeline, receiving, sending
from asgi_amqp.groups import Groups
from asgi_amqp.receiving import Receiver
from asgi_amqp.sending import Sender

API_MODULES = [layer, sending, receiving, groups, pipeline]


@pytest.mark.parametrize("module", API_MODULES, ids=lambda module: module.__name__)
def test_no_class_of_the_api_inherits_from_the_package(module):
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue  # imported, not defined here
        own = [
            base.__qualname__
            for base in cls.__mro__[1:]
            if base.__module__.split(".")[0] == asgi_amqp.__name__
        ]
        assert own == [], "%s.%s inherits %s" % (module.__name__, name, own)


def test_the_layer_inherits_asgirefs_base_only():
    assert layer.AMQPChannelLayer.__bases__ == (BaseChannelLayer,)


def test_the_layer_holds_one_of_each_part_and_their_settings_are_its():
    channel_layer = layer.AMQPChannelLayer(
        url="amqp://guest:guest@127.0.0.1:1/%2F", receive_timeout=1.5, operation_timeout=3.0
    )
    try:
        assert isinstance(channel_layer.sender, Sender)
        assert isinstance(channel_layer.receiver, Receiver)
        assert isinstance(channel_layer.groups, Groups)
        assert (channel_layer.receive_timeout, channel_layer.operation_timeout) == (1.5, 3.0)
        channel_layer.receive_timeout = 0.5
        channel_layer.operation_timeout = 2.0
        assert channel_layer.receiver.timeout == 0.5
        assert channel_layer.sender.operation_timeout == 2.0
        assert channel_layer.threads() == []  # made, not started
    finally:
        channel_layer.close()
