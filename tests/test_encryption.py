"""symmetric_encryption_keys, and bodies the layer cannot decode.

The body on the broker is read with a plain pika client from the channel's
queue, ``{prefix}:q:{channel}``. Foreign bodies are published the same way.
"""

import base64
import hashlib
import logging
import uuid

import msgpack
import pika
import pytest
from cryptography.fernet import Fernet, InvalidToken

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from helpers import wait_until

PREFIX = "t-enc-%s" % uuid.uuid4().hex[:8]
OLD = Fernet.generate_key()
NEW = Fernet.generate_key()
OTHER = Fernet.generate_key()


# -- fixtures ------------------------------------------------------------------------------


def _layer(factory, broker, keys, **config):
    """A layer from ``factory`` (new_layer or module_layer) on PREFIX with ``keys``."""
    config.setdefault("dead_letter_worker", False)
    return factory(
        broker,
        prefix=PREFIX,
        expiry=60,
        receive_timeout=1,
        symmetric_encryption_keys=keys,
        **config,
    )


@pytest.fixture(scope="module")
def layers(broker, module_layer):
    """Layers on one prefix that differ only in their keys."""
    return {
        "plain": _layer(module_layer, broker, None, dead_letter_worker=True, flush=True),
        "old": _layer(module_layer, broker, [OLD]),
        "new+old": _layer(module_layer, broker, [NEW, OLD]),
        "old+new": _layer(module_layer, broker, [OLD, NEW]),
        "other": _layer(module_layer, broker, [OTHER]),
    }


@pytest.fixture(scope="module")
def raw(broker):
    """A plain pika channel with publisher confirms, standing in for a foreign client."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    yield channel
    connection.close()


@pytest.fixture
def channel_name(request):
    return "enc.%s.%s" % (request.node.originalname.replace("_", "-")[:40], uuid.uuid4().hex[:8])


@pytest.fixture
def skipped(caplog):
    """The layer's "skipped a message" warnings, as a function returning their messages."""
    caplog.set_level(logging.WARNING, logger="asgi_amqp")

    def messages():
        return [
            r.getMessage()
            for r in caplog.records
            if r.name.startswith("asgi_amqp")
            and r.levelno == logging.WARNING
            and "skipped" in r.getMessage()
        ]

    return messages


def queue_of(layer, channel):
    name = layer.topology.channel_queue(channel)
    assert name == "%s:q:%s" % (PREFIX, channel.split("!")[0] + ("!" if "!" in channel else ""))
    return name


def publish_raw(raw, queue, body, headers=None):
    """Publish like a foreign client; mandatory, so a missing queue is an error."""
    raw.basic_publish("", queue, body, pika.BasicProperties(headers=headers), mandatory=True)


def put_back(raw, queue, delivery_tag, count):
    """Requeue deliveries up to ``delivery_tag`` and wait until ``queue`` holds ``count`` again.

    basic.nack has no reply, so without the wait another connection's
    basic.get could run before the requeue and find the queue empty.
    """
    raw.basic_nack(delivery_tag, multiple=True, requeue=True)
    wait_until(
        lambda: raw.queue_declare(queue, passive=True).method.message_count >= count,
        5,
        interval=0.01,
        message="the requeued messages coming back",
    )


def take_raw(raw, queue):
    """The body of the first message in ``queue``, put back afterwards."""
    method, _properties, body = raw.basic_get(queue, auto_ack=False)
    assert method is not None, "no message in %s" % queue
    put_back(raw, queue, method.delivery_tag, 1)
    return body


MESSAGE = {
    "text": "PLAINTEXT-MARKER the quick brown fox",
    "bytes": b"BYTES-MARKER\x00\x01\x02",
    "list": [1, 2.5, None, True, "\U0001f600"],
    "nested": {"reply_channel": "http.response!abc"},
}


# -- round trips -------------------------------------------------------------------------------


def test_encrypted_round_trip(layers, channel_name):
    layer = layers["old"]
    layer.send(channel_name, MESSAGE)
    assert layer.receive([channel_name]) == (channel_name, MESSAGE)
    layer.send(channel_name, MESSAGE)
    assert layer.receive([channel_name], block=True) == (channel_name, MESSAGE)
    assert layer.receive([channel_name]) == (None, None)


def test_encrypted_group_round_trip(layers, channel_name):
    layer = layers["old"]
    layer.group_add("enc-group", channel_name)
    try:
        layer.send_group("enc-group", MESSAGE)
        assert layer.receive([channel_name], block=True) == (channel_name, MESSAGE)
    finally:
        layer.group_discard("enc-group", channel_name)


def test_body_on_the_broker_is_not_readable(layers, raw, channel_name):
    layer = layers["old"]
    layer.send(channel_name, MESSAGE)
    body = take_raw(raw, queue_of(layer, channel_name))

    for plaintext in (
        b"PLAINTEXT-MARKER",
        b"quick brown fox",
        b"BYTES-MARKER",
        b"reply_channel",
        b"http.response",
        b"text",
        "\U0001f600".encode("utf8"),
    ):
        assert plaintext not in body
    assert msgpack.packb(MESSAGE, use_bin_type=True) not in body
    try:
        decoded = msgpack.unpackb(body, raw=False)
    except Exception:
        pass
    else:
        assert decoded != MESSAGE
    # It is a Fernet token under the layer's key, of exactly this message.
    assert msgpack.unpackb(Fernet(OLD).decrypt(body), raw=False) == MESSAGE
    with pytest.raises(InvalidToken):
        Fernet(NEW).decrypt(body)

    # Looking did not consume it.
    assert layer.receive([channel_name]) == (channel_name, MESSAGE)


def test_plaintext_layer_body_is_msgpack(layers, raw, channel_name):
    """The contrast that makes the test above meaningful."""
    layer = layers["plain"]
    layer.send(channel_name, MESSAGE)
    body = take_raw(raw, queue_of(layer, channel_name))
    assert b"PLAINTEXT-MARKER" in body
    assert msgpack.unpackb(body, raw=False) == MESSAGE
    assert layer.receive([channel_name]) == (channel_name, MESSAGE)


def test_identical_messages_encrypt_differently(layers, raw, channel_name):
    layer = layers["old"]
    layer.send(channel_name, MESSAGE)
    layer.send(channel_name, MESSAGE)
    queue = queue_of(layer, channel_name)
    first, _, first_body = raw.basic_get(queue, auto_ack=False)
    second, _, second_body = raw.basic_get(queue, auto_ack=False)
    put_back(raw, queue, second.delivery_tag, 2)
    assert first_body != second_body
    assert layer.receive([channel_name]) == (channel_name, MESSAGE)
    assert layer.receive([channel_name]) == (channel_name, MESSAGE)


# -- key rotation ------------------------------------------------------------------------------


def test_rotation_new_reader_reads_old_writer(layers, channel_name, skipped):
    layers["old"].send(channel_name, MESSAGE)
    assert layers["new+old"].receive([channel_name]) == (channel_name, MESSAGE)
    assert skipped() == []


def test_rotation_writer_encrypts_with_its_first_key(layers, raw, channel_name):
    layers["new+old"].send(channel_name, MESSAGE)
    body = take_raw(raw, queue_of(layers["new+old"], channel_name))
    assert msgpack.unpackb(Fernet(NEW).decrypt(body), raw=False) == MESSAGE
    with pytest.raises(InvalidToken):
        Fernet(OLD).decrypt(body)
    # A reader that already has the new key (in any position) reads it...
    assert layers["old+new"].receive([channel_name]) == (channel_name, MESSAGE)


def test_rotation_old_only_reader_skips_new_writer(layers, channel_name, skipped):
    """...and one that does not skips it: readers must get the new key before writers use it."""
    old = layers["old"]
    layers["new+old"].send(channel_name, {"from": "new"})
    assert old.receive([channel_name]) == (None, None)
    assert len(skipped()) == 1
    # A message old can decode, sent next, is received normally.
    layers["old+new"].send(channel_name, {"from": "old+new"})
    assert old.receive([channel_name]) == (channel_name, {"from": "old+new"})


@pytest.mark.parametrize("block", [False, True], ids=["get", "block"])
def test_foreign_key_is_skipped_with_a_warning(layers, channel_name, skipped, block):
    other = layers["other"]
    dropped = other.connection_statistics()["undecodable_messages"]
    layers["old"].send(channel_name, {"secret": "for old"})
    assert other.receive([channel_name], block=block) == (None, None)
    warnings = skipped()
    assert len(warnings) == 1
    assert queue_of(other, channel_name) in warnings[0]
    assert "key" in warnings[0]
    assert "for old" not in warnings[0]
    assert "channel %s " % channel_name in warnings[0]
    assert other.connection_statistics()["undecodable_messages"] == dropped + 1
    # The skipped message was taken off the queue, not put back to loop forever.
    assert other.receive([channel_name]) == (None, None)
    assert layers["old"].receive([channel_name]) == (None, None)
    assert len(skipped()) == 1
    # The layer still works.
    other.send(channel_name, {"secret": "for other"})
    assert other.receive([channel_name], block=block) == (channel_name, {"secret": "for other"})


@pytest.mark.parametrize("block", [False, True], ids=["get", "block"])
def test_one_receive_skips_undecodable_and_returns_the_next_valid(
    layers, channel_name, skipped, block
):
    layers["other"].send(channel_name, {"n": 1})
    layers["plain"].send(channel_name, {"n": 2})
    layers["old"].send(channel_name, {"n": 3})
    assert layers["old"].receive([channel_name], block=block) == (channel_name, {"n": 3})
    assert len(skipped()) == 2


# -- keys ----------------------------------------------------------------------------------------


def test_a_single_key_instead_of_a_list_is_a_type_error():
    for keys in (OLD, OLD.decode("ascii")):
        with pytest.raises(TypeError):
            AMQPChannelLayer(url="amqp://127.0.0.1:1/%2F", symmetric_encryption_keys=keys)


def test_keys_as_str_bytes_and_non_fernet_secrets_interoperate(broker, channel_name, new_layer):
    """A Fernet key works as bytes or str; any other secret (e.g. a SECRET_KEY) is stretched."""
    secret = "django-insecure-#k3y-that-is-not-a-fernet-key!"
    pairs = [
        ([OLD], [OLD.decode("ascii")]),
        ([secret], [secret.encode("utf8")]),
        ([secret], [base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest())]),
    ]
    for writer_keys, reader_keys in pairs:
        writer = _layer(new_layer, broker, writer_keys)
        reader = _layer(new_layer, broker, reader_keys)
        writer.send(channel_name, MESSAGE)
        assert reader.receive([channel_name]) == (channel_name, MESSAGE)
        writer.close()
        reader.close()


def test_size_limit_applies_to_the_encrypted_body(broker, channel_name, new_layer):
    """Encryption grows a body by about a third; the limit counts what goes to the broker."""
    message = {"bytes": b"x" * 800}
    assert len(msgpack.packb(message, use_bin_type=True)) < 1000
    layer = _layer(new_layer, broker, [OLD], max_message_size=1000)
    with pytest.raises(asgi_amqp.MessageTooLarge):
        layer.send(channel_name, message)
    layer.send(channel_name, {"bytes": b"x" * 500})
    assert layer.receive([channel_name]) == (channel_name, {"bytes": b"x" * 500})


# -- malformed bodies from foreign clients ----------------------------------------------------

_MALFORMED_ANY = [
    pytest.param(b"not msgpack", id="text"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\xc1", id="reserved-byte"),
    pytest.param(msgpack.packb(["a", "list"]), id="msgpack-list"),
    pytest.param(msgpack.packb("a string"), id="msgpack-str"),
    pytest.param(msgpack.packb({1: "int key"}), id="msgpack-int-key"),
    pytest.param(msgpack.packb({"a": 1}) + b"trailing", id="msgpack-plus-garbage"),
    pytest.param(msgpack.packb({"a": 1})[:-1], id="msgpack-truncated"),
]


def _encrypted_malformed():
    fernet = Fernet(OLD)
    return [
        pytest.param(fernet.encrypt(msgpack.packb(["a", "list"])), id="token-of-list"),
        pytest.param(fernet.encrypt(b"not msgpack"), id="token-of-text"),
        pytest.param(Fernet(OTHER).encrypt(msgpack.packb({"a": 1})), id="token-other-key"),
        pytest.param(msgpack.packb({"a": 1}), id="plaintext-valid-msgpack"),
        pytest.param(fernet.encrypt(msgpack.packb({"a": 1}))[:-5], id="token-truncated"),
    ]


@pytest.mark.parametrize("block", [False, True], ids=["get", "block"])
@pytest.mark.parametrize("kind", ["plain", "old"])
def test_malformed_foreign_bodies_are_skipped_and_the_next_valid_returned(
    layers, raw, channel_name, skipped, kind, block
):
    layer = layers[kind]
    bodies = [p.values[0] for p in _MALFORMED_ANY]
    if kind == "old":
        bodies += [p.values[0] for p in _encrypted_malformed()]
    assert layer.receive([channel_name]) == (None, None)  # declares the queue
    queue = queue_of(layer, channel_name)
    for body in bodies:
        publish_raw(raw, queue, body)
    layer.send(channel_name, MESSAGE)

    assert layer.receive([channel_name], block=block) == (channel_name, MESSAGE)
    assert len(skipped()) == len(bodies)
    assert all(queue in warning for warning in skipped())
    assert layer.receive([channel_name]) == (None, None)
    # Still works.
    layer.send(channel_name, {"after": True})
    assert layer.receive([channel_name], block=block) == (channel_name, {"after": True})


@pytest.mark.parametrize("body", _MALFORMED_ANY + _encrypted_malformed())
def test_each_malformed_body_alone_gives_none_and_a_warning(
    layers, raw, channel_name, skipped, body
):
    layer = layers["old"]
    assert layer.receive([channel_name]) == (None, None)
    publish_raw(raw, queue_of(layer, channel_name), body)
    assert layer.receive([channel_name]) == (None, None)
    assert len(skipped()) == 1
    layer.send(channel_name, {"ok": 1})
    assert layer.receive([channel_name]) == (channel_name, {"ok": 1})


def test_process_local_queue_envelopes(layers, raw, skipped):
    """Messages in a process-local queue must name their channel in the asgi-channel header."""
    layer = layers["plain"]
    base = "enc.local%s!" % uuid.uuid4().hex[:6]
    assert layer.receive([base]) == (None, None)
    queue = queue_of(layer, base)
    body = msgpack.packb({"foreign": True}, use_bin_type=True)
    publish_raw(raw, queue, body)  # no header
    publish_raw(raw, queue, body, headers={"asgi-channel": "elsewhere!abc"})  # not this queue
    publish_raw(raw, queue, body, headers={"asgi-channel": 42})
    publish_raw(raw, queue, body, headers={"asgi-channel": base + "fromheader"})
    assert layer.receive([base]) == (base + "fromheader", {"foreign": True})
    assert len(skipped()) == 3
    layer.send(base + "xyz", MESSAGE)
    assert layer.receive([base], block=True) == (base + "xyz", MESSAGE)
    assert layer.receive([base]) == (None, None)
