"""asgiref 1.1.2's conformance suite, against RabbitMQ and against the in-memory reference.

The settings are the ones the suite documents: 1 s message expiry with a
1.1 s expiry delay, 2 s group expiry, and capacity 5.
"""

import uuid

import pytest
from asgiref import conformance
from asgiref.inmemory import ChannelLayer as InMemoryChannelLayer

from asgi_amqp import AMQPChannelLayer


def _layer(request, broker, queue_type):
    layer = AMQPChannelLayer(
        queue_type=queue_type,
        url=broker.amqp_url,
        management_url=broker.management_url,
        prefix="conf-%s" % uuid.uuid4().hex[:8],
        expiry=1,
        group_expiry=2,
        capacity=5,
        receive_timeout=1,
    )
    request.cls.channel_layer = layer
    yield layer
    layer.flush()
    layer.close()


@pytest.fixture(scope="class")
def amqp_layer(request, broker):
    yield from _layer(request, broker, "classic")


@pytest.fixture(scope="class")
def quorum_layer(request, broker):
    yield from _layer(request, broker, "quorum")


@pytest.mark.usefixtures("amqp_layer")
class TestAMQPConformance(conformance.ConformanceTestCase):
    expiry_delay = 1.1
    capacity_limit = 5


@pytest.mark.usefixtures("quorum_layer")
class TestAMQPQuorumConformance(conformance.ConformanceTestCase):
    """Every mode the layer offers: quorum queues too."""

    expiry_delay = 1.1
    capacity_limit = 5


class TestInMemoryConformance(conformance.ConformanceTestCase):
    """The suite itself, on asgiref's own layer (group_expiry 1: its test sleeps 1 s more)."""

    channel_layer = InMemoryChannelLayer(expiry=1, group_expiry=1, capacity=5)
    expiry_delay = 1.1
    capacity_limit = 5
