"""``flush`` deletes the layer's own objects under its prefix, and nothing else.

Next to a prefix ``P`` live the layers of ``Pb``, ``P.b`` and ``Pxb`` (``.``
must not act as a wildcard when the prefix goes into the management API's
name filter), and objects someone else named ``P:x:...``, ``P:x`` and
``P:q`` (under ``P:`` but not of a kind the layer makes). Flushing ``P``
leaves all of them; flushing ``P.b`` leaves ``Pxb``. An empty or wildcard
prefix is refused before anything is listed.
"""

import uuid

import pika
import pytest

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.management import ManagementClient
from helpers import Management, SilentBroker


@pytest.fixture
def base():
    return "f%s" % uuid.uuid4().hex[:8]


def _fill(layer):
    """A channel with a message, a process-local one, and a group with both as members."""
    layer.send("chan", {"n": 1})
    local = "proc!" + uuid.uuid4().hex[:8]
    layer.send(local, {"n": 2})
    layer.group_add("room", "chan")
    layer.group_add("room", local)


def _foreign_objects(broker, base):
    """Objects under ``base:`` that the layer does not make, declared by someone else."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        names = ["%s:x:other" % base, "%s:x" % base, "%s:q" % base]
        for name in names:
            channel.queue_declare(name, durable=True, arguments={"x-expires": 60000})
        channel.exchange_declare("%s:x:exchange" % base, "fanout", durable=True, auto_delete=True)
        channel.queue_bind(names[0], "%s:x:exchange" % base)
        return set(names) | {"%s:x:exchange" % base}
    finally:
        connection.close()


def test_flush_leaves_neighbouring_prefixes_and_foreign_names(broker, new_layer, base):
    api = Management(broker)
    layers = {
        prefix: new_layer(broker, prefix=prefix, expiry=30, flush=True)
        for prefix in (base, base + "b", base + ".b", base + "xb")
    }
    for layer in layers.values():
        _fill(layer)
    foreign = _foreign_objects(broker, base)
    before = {prefix: api.objects(prefix + ":") for prefix in layers}
    assert foreign <= before[base]

    layers[base].flush()
    left = api.objects(base + ":")
    assert left == foreign | layers[base].topology.infrastructure(), left
    for neighbour in (base + "b", base + ".b", base + "xb"):
        assert api.objects(neighbour + ":") == before[neighbour], neighbour
        assert layers[neighbour].receive(["chan"]) == ("chan", {"n": 1})

    layers[base + ".b"].flush()
    assert api.objects(base + "xb:") == before[base + "xb"]
    assert api.objects(base + ":") == left

    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        for name in foreign - {"%s:x:exchange" % base}:
            channel.queue_delete(name)
    finally:
        connection.close()


@pytest.mark.parametrize("prefix", ["", "*", ".*", "a*", "a?", "a:x", "a b", "^a", "a$", "é"])
def test_a_prefix_that_could_match_others_is_refused(prefix):
    with pytest.raises(ValueError, match="prefix"):
        AMQPChannelLayer(url="amqp://guest:guest@127.0.0.1:1/%2F", prefix=prefix)


def test_flush_refuses_a_prefix_emptied_after_construction():
    with SilentBroker() as silent:
        layer = AMQPChannelLayer(
            url=silent.amqp_url, management_url=silent.management_url, prefix="ok"
        )
        layer.topology.prefix = ""
        with pytest.raises(ValueError, match="prefix"):
            layer.flush()
        silent.assert_untouched(layer)
        layer.close()


def test_the_management_client_lists_nothing_for_an_empty_prefix():
    with SilentBroker() as silent:
        client = ManagementClient(silent.management_url, "/")
        for listing in (client.queue_names, client.exchange_names, client.queues):
            with pytest.raises(ValueError, match="prefix"):
                listing("")
        assert not silent.touched()


@pytest.mark.slow
def test_a_flush_of_thousands_of_objects_is_not_one_wait(broker, base, new_layer):
    """A flush deletes in runs, each waited for within ``operation_timeout``:
    2,000 queues outlast a timeout of two seconds when sent as one run (each
    delete costs the broker one to a few milliseconds), and the flush said
    "no answer" of a broker that was working. It deletes every one."""
    layer = new_layer(broker, prefix=base, operation_timeout=2.0)
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        names = ["%s:q:many.%d" % (base, n) for n in range(2000)]
        for name in names:
            channel._impl.queue_declare(name, durable=True, callback=None)
        channel.queue_declare(names[-1], passive=True)  # all made before it answers
    finally:
        connection.close()
    layer.flush()
    assert not Management(broker).objects(base + ":q:many.")
