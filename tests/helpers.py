"""Shared test helpers: layers with private prefixes and waiting on conditions."""

import contextlib
import time
import uuid

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.management import ManagementClient


def make_layer(broker, **config):
    config.setdefault("prefix", "t-%s" % uuid.uuid4().hex[:10])
    return AMQPChannelLayer(url=broker.amqp_url, management_url=broker.management_url, **config)


def management(broker):
    return ManagementClient(broker.management_url, "/")


def wait_until(predicate, timeout, interval=0.05, message="condition"):
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("%s not met within %.1f s" % (message, timeout))
        time.sleep(interval)


def drain(layer, channels, block=False):
    """Every message currently receivable on ``channels``, as (channel, message) pairs."""
    received = []
    while True:
        channel, message = layer.receive(channels, block=block)
        if channel is None:
            return received
        received.append((channel, message))


@contextlib.contextmanager
def private_node():
    """A RabbitMQ node of the caller's own, for tests that break the broker."""
    from devtools.rabbitmq import RabbitNode

    node = RabbitNode()
    try:
        node.start()
        yield node
    finally:
        node.cleanup(graceful=False)
