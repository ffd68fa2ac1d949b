"""Bad input is refused in the caller, before anything reaches the broker.

Every refusal is checked twice:

* on an *offline* layer whose URL points at a listening socket that never
  answers: the error must come at once, no I/O thread may have been started
  and nobody may have connected to that socket (a call that did try to talk
  to a broker would hang there until ``operation_timeout``);
* on a *live* layer on the session broker: after the error the layer still
  does a send/receive round trip, and the management API shows that no queue
  or exchange other than the ones the valid calls made exists under the
  module's prefix (a send to a fresh channel always creates its queue, so a
  refused send to a fresh channel that left a queue behind reached the broker).
"""

import datetime
import decimal
import logging
import time
import uuid
from urllib.parse import urlsplit

import msgpack
import pytest
from asgiref.base_layer import BaseChannelLayer

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from helpers import Management, SilentBroker, free_port, make_layer

PREFIX = "t-bad-%s" % uuid.uuid4().hex[:8]
OK_CHANNEL = "roundtrip.ok"
MB = 1024 * 1024
PROMPT = 0.9  # seconds: a refusal that waited for anything took 1 s or more (the timeouts)

# Broker objects the valid calls of this module may create under PREFIX.
ALLOWED = {
    PREFIX + ":dlx",
    PREFIX + ":dead-letters",
    PREFIX + ":groups",
    PREFIX + ":q:" + OK_CHANNEL,
}


# -- helpers -------------------------------------------------------------------


def broker_objects(broker, prefix=PREFIX):
    """Names of all queues and exchanges whose name starts with ``prefix:``."""
    return Management(broker, timeout=10).objects(prefix + ":")


def roundtrip(layer, channel=OK_CHANNEL):
    """The layer still works: a message sent is received, and nothing else is there."""
    message = {"check": uuid.uuid4().hex, "payload": b"\x00\xff"}
    layer.send(channel, message)
    assert layer.receive([channel]) == (channel, message)
    assert layer.receive([channel]) == (None, None)


def assert_live_intact(layer, broker):
    roundtrip(layer)
    unexpected = broker_objects(broker) - ALLOWED
    assert not unexpected, "refused calls created broker objects: %s" % sorted(unexpected)


def refuse(call, exc=TypeError):
    """Run ``call``; it must raise ``exc`` within PROMPT seconds. Returns the ExceptionInfo."""
    started = time.monotonic()
    with pytest.raises(exc) as info:
        call()
    elapsed = time.monotonic() - started
    assert elapsed < PROMPT, "took %.2f s to refuse" % elapsed
    return info


# -- fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def layer(broker, module_layer):
    layer = module_layer(
        broker, flush=True, prefix=PREFIX, expiry=30, receive_timeout=1, operation_timeout=5
    )
    roundtrip(layer)  # connected, infrastructure declared
    return layer


@pytest.fixture(scope="module")
def offline(silent_broker, module_layer):
    return module_layer(silent_broker, prefix=PREFIX + "-off", operation_timeout=1)


@pytest.fixture(params=["offline", "live"])
def target(request, broker):
    """Each refusal test runs against both layers; ``check()`` verifies the aftermath."""
    if request.param == "offline":
        layer, sink = request.getfixturevalue("offline"), request.getfixturevalue("silent_broker")
        check = lambda: sink.assert_untouched(layer)  # noqa: E731
    else:
        layer = request.getfixturevalue("layer")
        check = lambda: assert_live_intact(layer, broker)  # noqa: E731
    return layer, check


# -- channel names -----------------------------------------------------------------

BAD_CHANNEL_NAMES = [
    pytest.param(b"websocket.send", id="bytes"),
    pytest.param(None, id="None"),
    pytest.param(42, id="int"),
    pytest.param(1.5, id="float"),
    pytest.param(["a"], id="list"),
    pytest.param("", id="empty"),
    pytest.param("a" * 100, id="100-chars"),
    pytest.param("a" * 300, id="300-chars"),
    pytest.param("a!" + "b" * 98, id="100-chars-local"),
    pytest.param("foo bar", id="space"),
    pytest.param(" foo", id="leading-space"),
    pytest.param("foo/bar", id="slash"),
    pytest.param("foo:bar", id="colon"),
    pytest.param("foo#", id="hash"),
    pytest.param("foo\tbar", id="tab"),
    pytest.param("caf\u00e9", id="latin1-letter"),
    pytest.param("\u65e5\u672c", id="cjk"),
    pytest.param("\U0001f600", id="emoji"),
    pytest.param("!foo", id="bang-first"),
    pytest.param("?foo", id="question-first"),
    pytest.param("foo!bar!baz", id="two-bangs"),
    pytest.param("foo?bar?baz", id="two-questions"),
    pytest.param("foo!bar?baz", id="bang-and-question"),
    pytest.param("foo?", id="single-reader-without-suffix"),
]

CHANNEL_CALLS = {
    "send": lambda layer, name: layer.send(name, {"a": 1}),
    "receive": lambda layer, name: layer.receive([name]),
    "receive-block": lambda layer, name: layer.receive([name], block=True),
    "receive-among-valid": lambda layer, name: layer.receive([OK_CHANNEL, name], block=True),
    "group_add": lambda layer, name: layer.group_add("valid-group", name),
    "group_discard": lambda layer, name: layer.group_discard("valid-group", name),
}


@pytest.mark.parametrize("call", sorted(CHANNEL_CALLS))
@pytest.mark.parametrize("name", BAD_CHANNEL_NAMES)
def test_invalid_channel_name_is_a_type_error(target, call, name):
    layer, check = target
    refuse(lambda: CHANNEL_CALLS[call](layer, name))
    check()


@pytest.mark.parametrize(
    "channels",
    [
        pytest.param(["foo!bar"], id="local-with-suffix"),
        pytest.param([OK_CHANNEL, "foo!bar"], id="local-with-suffix-among-valid"),
        pytest.param(["foo?"], id="single-reader-without-suffix"),
    ],
)
@pytest.mark.parametrize("block", [False, True])
def test_receive_needs_process_local_names_to_end_at_the_bang(target, channels, block):
    layer, check = target
    info = refuse(lambda: layer.receive(channels, block=block))
    if "foo!bar" in channels:
        assert "!" in str(info.value)
    check()


@pytest.mark.parametrize(
    "channels",
    [
        pytest.param(OK_CHANNEL, id="str"),
        pytest.param(None, id="None"),
        pytest.param(5, id="int"),
        pytest.param({OK_CHANNEL: 1}, id="dict"),
        pytest.param(b"roundtrip.ok", id="bytes"),
    ],
)
@pytest.mark.parametrize("block", [False, True])
def test_receive_needs_a_collection_of_names(target, channels, block):
    layer, check = target
    refuse(lambda: layer.receive(channels, block=block))
    check()


@pytest.mark.parametrize(
    "channels",
    [
        pytest.param([], id="empty-list"),
        pytest.param((), id="empty-tuple"),
        pytest.param(set(), id="empty-set"),
        pytest.param(iter(()), id="empty-iterator"),
    ],
)
@pytest.mark.parametrize("block", [False, True])
def test_receive_from_no_channels_is_nothing_at_once(target, channels, block):
    """As in asgiref's in-memory layer and asgi_redis: (None, None), no wait, no broker."""
    layer, check = target
    started = time.monotonic()
    assert layer.receive(channels, block=block) == (None, None)
    assert time.monotonic() - started < 0.5
    check()


def test_longest_valid_name_works(layer, broker):
    """The boundary of the length check: 99 characters is a valid name."""
    name = "n" * 99
    ALLOWED.add(PREFIX + ":q:" + name)
    roundtrip(layer, name)
    with pytest.raises(TypeError):
        layer.send(name + "n", {})


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param("foo", id="no-question-mark"),
        pytest.param("foo!?", id="bang"),
        pytest.param("foo!bar?", id="bang-suffix"),
        pytest.param("foo!", id="bang-only"),
        pytest.param("?", id="nothing-before"),
        pytest.param("foo??", id="two-questions"),
        pytest.param("foo bar?", id="space"),
        pytest.param("caf\u00e9?", id="unicode"),
        pytest.param("a" * 100 + "?", id="too-long"),
        pytest.param(b"foo?", id="bytes"),
        pytest.param(None, id="None"),
        pytest.param(5, id="int"),
    ],
)
def test_new_channel_refuses_bad_patterns(target, pattern):
    layer, check = target
    refuse(lambda: layer.new_channel(pattern))
    check()


def test_new_channel_names_are_valid_and_unique(target):
    layer, check = target
    names = {layer.new_channel("reply.x?") for _ in range(200)}
    assert len(names) == 200
    for name in names:
        assert name.startswith("reply.x?") and len(name) > len("reply.x?")
        layer.valid_channel_name(name)
    check()


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param("a?b?", id="question-inside"),
        pytest.param("a" * 90 + "?", id="result-too-long"),
    ],
)
def test_new_channel_never_returns_a_name_the_layer_refuses(offline, silent_broker, pattern):
    try:
        name = offline.new_channel(pattern)
    except TypeError:
        return  # refusing the pattern is fine too
    offline.valid_channel_name(name)  # raises TypeError today
    silent_broker.assert_untouched(offline)


# -- group names -------------------------------------------------------------------

BAD_GROUP_NAMES = [
    pytest.param(b"chat", id="bytes"),
    pytest.param(None, id="None"),
    pytest.param(7, id="int"),
    pytest.param("", id="empty"),
    pytest.param("g" * 100, id="100-chars"),
    pytest.param("chat room", id="space"),
    pytest.param("chat/room", id="slash"),
    pytest.param("chat:room", id="colon"),
    pytest.param("chat!", id="bang"),
    pytest.param("chat!x", id="bang-suffix"),
    pytest.param("chat?", id="question"),
    pytest.param("chat?x", id="question-suffix"),
    pytest.param("caf\u00e9", id="unicode-letter"),
    pytest.param("\U0001f600", id="emoji"),
]

GROUP_CALLS = {
    "group_add": lambda layer, group: layer.group_add(group, OK_CHANNEL),
    "group_discard": lambda layer, group: layer.group_discard(group, OK_CHANNEL),
    "send_group": lambda layer, group: layer.send_group(group, {"a": 1}),
    "group_channels": lambda layer, group: layer.group_channels(group),
}


@pytest.mark.parametrize("call", sorted(GROUP_CALLS))
@pytest.mark.parametrize("group", BAD_GROUP_NAMES)
def test_invalid_group_name_is_a_type_error(target, call, group):
    layer, check = target
    refuse(lambda: GROUP_CALLS[call](layer, group))
    check()


# -- names the broker cannot take --------------------------------------------------------
#
# asgiref's name regexes end in ``$`` (which also matches before a trailing
# newline) and use ``\d``/``\w`` (which match any Unicode digit/letter), and the
# layer relies on them. The ASGI names are ASCII only, and these names break
# broker calls: RabbitMQ answers a declare of ``x\n`` with the name ``x``, which
# pika never matches to the request (the operation hangs and every later one on
# that AMQP channel queues behind it), and 99 four-byte digits make a queue
# name longer than AMQP's 255-byte limit.

NAMES_THE_BROKER_CANNOT_TAKE = [
    pytest.param("send", "chat\n", id="send-trailing-newline"),
    pytest.param("receive", "chat\n", id="receive-trailing-newline"),
    pytest.param("group_add", "room\n", id="group-trailing-newline"),
    pytest.param("send_group", "room\n", id="send-group-trailing-newline"),
    pytest.param("send", "\U0001d7d8" * 99, id="send-256-bytes-of-digits"),
    pytest.param("receive", "\U0001d7d8" * 99, id="receive-256-bytes-of-digits"),
]

_CALLS = {
    "send": lambda layer, name: layer.send(name, {"a": 1}),
    "receive": lambda layer, name: layer.receive([name]),
    "group_add": lambda layer, name: layer.group_add(name, OK_CHANNEL),
    "send_group": lambda layer, name: layer.send_group(name, {"a": 1}),
}


@pytest.fixture
def throwaway_offline(new_layer):
    with SilentBroker() as sink:
        layer = new_layer(
            sink, prefix=PREFIX + "-off2", operation_timeout=0.5, dead_letter_worker=False
        )
        yield layer, sink


@pytest.mark.parametrize("call, name", NAMES_THE_BROKER_CANNOT_TAKE)
def test_names_the_broker_cannot_take_are_refused(throwaway_offline, call, name):
    layer, sink = throwaway_offline
    refuse(lambda: _CALLS[call](layer, name), exc=TypeError)
    sink.assert_untouched(layer)


@pytest.mark.slow
def test_a_trailing_newline_group_does_not_wedge_the_layer(broker):
    layer = make_layer(broker, operation_timeout=1)
    try:
        roundtrip(layer)
        try:
            layer.group_add("room\n", "member")
        except (TypeError, asgi_amqp.OperationTimeout):
            pass
        layer.group_add("room", "member")  # times out today
        roundtrip(layer, "a.brand.new.channel")  # so does the declare of a new queue
    finally:
        layer.close()  # takes 10 s today: pika cannot close the stuck channel
        cleaner = make_layer(broker, prefix=layer.topology.prefix, dead_letter_worker=False)
        cleaner.flush()
        cleaner.close()


# -- messages --------------------------------------------------------------------------


def _fresh_channel():
    return "badmsg.%s" % uuid.uuid4().hex[:12]


@pytest.mark.parametrize(
    "message",
    [
        pytest.param([], id="list"),
        pytest.param([("a", 1)], id="list-of-pairs"),
        pytest.param((("a", 1),), id="tuple-of-pairs"),
        pytest.param("text", id="str"),
        pytest.param(b"bytes", id="bytes"),
        pytest.param(None, id="None"),
        pytest.param(5, id="int"),
        pytest.param({"a"}, id="set"),
    ],
)
@pytest.mark.parametrize("via", ["send", "send_group"])
def test_message_must_be_a_dict(target, message, via):
    layer, check = target
    if via == "send":
        info = refuse(lambda: layer.send(_fresh_channel(), message))
    else:
        info = refuse(lambda: layer.send_group("valid-group", message))
    assert "dict" in str(info.value)
    check()


@pytest.mark.parametrize(
    "message, where, type_name",
    [
        pytest.param({1: "x"}, "message", "int", id="int-key"),
        pytest.param({b"k": "x"}, "message", "bytes", id="bytes-key"),
        pytest.param({(1, 2): "x"}, "message", "tuple", id="tuple-key"),
        pytest.param({None: "x"}, "message", "NoneType", id="None-key"),
        pytest.param({"ok": 1, 2.5: "x"}, "message", "float", id="float-key-after-valid"),
        pytest.param({"a": {"b": {3: 1}}}, "message['a']['b']", "int", id="nested-int-key"),
        pytest.param(
            {"a": [{"ok": 1}, {b"k": 1}]}, "message['a'][1]", "bytes", id="bytes-key-in-list"
        ),
    ],
)
def test_non_str_keys_are_a_type_error_naming_the_path(target, message, where, type_name):
    layer, check = target
    text = str(refuse(lambda: layer.send(_fresh_channel(), message)).value)
    assert where + " " in text and type_name in text and "key" in text, text
    check()


class _Thing(object):
    pass


@pytest.mark.parametrize(
    "value, type_name",
    [
        pytest.param({1, 2}, "set", id="set"),
        pytest.param(frozenset([1]), "frozenset", id="frozenset"),
        pytest.param(_Thing(), "_Thing", id="object"),
        pytest.param(object(), "object", id="bare-object"),
        pytest.param(1 + 2j, "complex", id="complex"),
        pytest.param(datetime.datetime(2017, 1, 1), "datetime", id="datetime"),
        pytest.param(datetime.date(2017, 1, 1), "date", id="date"),
        pytest.param(decimal.Decimal("1.5"), "Decimal", id="Decimal"),
        pytest.param(bytearray(b"x"), "bytearray", id="bytearray"),
        pytest.param(memoryview(b"x"), "memoryview", id="memoryview"),
        pytest.param(uuid.UUID(int=1), "UUID", id="UUID"),
        pytest.param(len, "builtin_function_or_method", id="function"),
        pytest.param(ValueError("x"), "ValueError", id="exception"),
    ],
)
@pytest.mark.parametrize("shape", ["top", "deep"])
def test_values_outside_asgi_types_are_a_type_error_naming_key_and_type(
    target, value, type_name, shape
):
    layer, check = target
    if shape == "top":
        message, where = {"ok": 1, "bad": value}, "message['bad']"
    else:
        message = {"a": [1, "two", {"b": {"c": [None, value]}}], "z": b""}
        where = "message['a'][2]['b']['c'][1]"
    text = str(refuse(lambda: layer.send(_fresh_channel(), message)).value)
    assert where + " " in text and type_name in text, text
    check()


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"n": 2**64}, id="2**64"),
        pytest.param({"n": -(2**63) - 1}, id="-2**63-1"),
        pytest.param({"n": 10**30}, id="10**30"),
        pytest.param({"a": [0, {"n": -(10**30)}]}, id="nested"),
    ],
)
def test_integers_msgpack_cannot_carry_are_a_value_error(target, message):
    layer, check = target
    refuse(lambda: layer.send(_fresh_channel(), message), exc=ValueError)
    check()


def test_integer_edges_round_trip(layer, broker):
    message = {"min": -(2**63), "max": 2**64 - 1, "list": [2**63, -1, 0]}
    layer.send(OK_CHANNEL, message)
    assert layer.receive([OK_CHANNEL]) == (OK_CHANNEL, message)
    assert_live_intact(layer, broker)


def test_nesting_deeper_than_the_limit_is_a_value_error(target):
    layer, check = target
    deep = []
    for _ in range(100):
        deep = [deep]
    refuse(lambda: layer.send(_fresh_channel(), {"deep": deep}), exc=ValueError)
    check()


def test_reasonable_nesting_round_trips(layer, broker):
    deep = "bottom"
    for index in range(30):
        deep = {"level%d" % index: [deep]}
    layer.send(OK_CHANNEL, {"deep": deep})
    assert layer.receive([OK_CHANNEL]) == (OK_CHANNEL, {"deep": deep})
    assert_live_intact(layer, broker)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"s": "a\ud800b"}, id="value"),
        pytest.param({"\udfff": 1}, id="key"),
    ],
)
def test_lone_surrogates_are_refused_before_the_broker(target, message):
    """Text that has no UTF-8 encoding cannot be a msgpack str."""
    layer, check = target
    refuse(lambda: layer.send(_fresh_channel(), message), exc=(TypeError, ValueError))
    check()


# -- message size ------------------------------------------------------------------------


def _assert_too_large(exc, layer):
    assert isinstance(exc, asgi_amqp.MessageTooLarge)
    assert isinstance(exc, layer.MessageTooLarge)
    assert isinstance(exc, BaseChannelLayer.MessageTooLarge)
    assert layer.MessageTooLarge is asgi_amqp.MessageTooLarge
    assert issubclass(asgi_amqp.MessageTooLarge, BaseChannelLayer.MessageTooLarge)


@pytest.mark.parametrize("via", ["send", "send_group"])
def test_twenty_megabytes_is_too_large_and_refused_promptly(target, via):
    layer, check = target
    message = {"bytes": b"\x00" * (20 * MB)}
    started = time.monotonic()
    with pytest.raises(BaseChannelLayer.MessageTooLarge) as info:
        if via == "send":
            layer.send(_fresh_channel(), message)
        else:
            layer.send_group("valid-group", message)
    assert time.monotonic() - started < 2.0
    _assert_too_large(info.value, layer)
    check()


def test_one_megabyte_round_trips_with_the_default_limit(layer, broker):
    """ASGI requires layers to take messages of at least 1 MB."""
    assert layer._serializer.max_message_size >= MB
    message = {"bytes": bytes(range(256)) * (MB // 256)}
    assert len(message["bytes"]) == MB
    layer.send(OK_CHANNEL, message)
    assert layer.receive([OK_CHANNEL]) == (OK_CHANNEL, message)
    assert_live_intact(layer, broker)


def test_the_limit_is_exact(broker, silent_broker, new_layer):
    """A body of exactly max_message_size bytes is accepted; one byte more is not."""
    message = {"bytes": b"x" * 1000, "text": "y"}
    size = len(msgpack.packb(message, use_bin_type=True))
    exact = new_layer(
        broker, prefix=PREFIX, expiry=30, max_message_size=size, dead_letter_worker=False
    )
    short = new_layer(
        silent_broker,
        prefix=PREFIX + "-off3",
        max_message_size=size - 1,
        dead_letter_worker=False,
    )
    exact.send(OK_CHANNEL, message)
    assert exact.receive([OK_CHANNEL]) == (OK_CHANNEL, message)
    with pytest.raises(asgi_amqp.MessageTooLarge):
        short.send(OK_CHANNEL, message)
    assert short.threads() == []


def test_a_raised_limit_carries_twenty_megabytes(broker, new_layer):
    """Up to the broker's own limit: 128 MiB before RabbitMQ 4.0, 16 MiB
    since. Past it the broker closes the publishing channel (406), and the
    send is ``MessageTooLarge`` naming that limit: not delivered, where it
    used to say "may or may not have been delivered"."""
    big = new_layer(
        broker, prefix=PREFIX, expiry=30, max_message_size=30 * MB, dead_letter_worker=False
    )
    payload = bytes(range(256)) * (20 * MB // 256)
    message = {"bytes": payload, "text": "\u00e9" * 1000}
    if Management(broker).overview()["rabbitmq_version"].startswith("3."):
        big.send(OK_CHANNEL, message)
    else:
        with pytest.raises(asgi_amqp.MessageTooLarge, match="16777216 bytes") as info:
            big.send(OK_CHANNEL, message)
        assert "not delivered" in str(info.value)
        payload = bytes(range(256)) * (15 * MB // 256)  # under 16 MiB: carried
        message = {"bytes": payload, "text": "\u00e9" * 1000}
        big.send(OK_CHANNEL, message)
    channel, received = big.receive([OK_CHANNEL])
    assert channel == OK_CHANNEL
    assert received["bytes"] == payload and received == message


# -- constructor ---------------------------------------------------------------------------

NUMERIC_SETTINGS = [
    "expiry",
    "group_expiry",
    "capacity",
    "receive_timeout",
    "operation_timeout",
    "max_message_size",
]


@pytest.mark.parametrize("value", [0, 0.0, -1, -0.001, "10", True, None, [5]], ids=repr)
@pytest.mark.parametrize("setting", NUMERIC_SETTINGS)
def test_bad_numeric_settings_are_a_value_error(silent_broker, setting, value):
    with pytest.raises(ValueError) as info:
        AMQPChannelLayer(url=silent_broker.amqp_url, **{setting: value})
    assert setting in str(info.value)
    assert not silent_broker.touched()


@pytest.mark.parametrize("value", [1, 0, "yes", None], ids=repr)
def test_persistent_must_be_a_bool(silent_broker, value):
    with pytest.raises(ValueError, match="persistent must be True or False"):
        AMQPChannelLayer(url=silent_broker.amqp_url, persistent=value)
    assert not silent_broker.touched()


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=repr)
@pytest.mark.parametrize(
    "setting", ["expiry", "group_expiry", "capacity", "receive_timeout", "operation_timeout"]
)
def test_nan_and_infinite_settings_are_a_value_error(silent_broker, setting, value):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=silent_broker.amqp_url, **{setting: value})


@pytest.mark.parametrize(
    "url",
    [
        "http://guest:guest@127.0.0.1:5672/",
        "https://127.0.0.1/",
        "redis://localhost:6379/0",
        "127.0.0.1:5672",
        "localhost",
        "amqp+tls://127.0.0.1/",
    ],
)
def test_bad_url_scheme_is_a_value_error(url):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=url)


def test_one_bad_url_in_a_list_is_a_value_error(broker):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=[broker.amqp_url, "redis://localhost/"])
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=[broker.amqp_url, ""])


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@127.0.0.1:notaport/%2F",
        "amqp://guest:guest@127.0.0.1:99999/%2F",
        "amqp://guest:guest@127.0.0.1/%2F?heartbeat=often",
        "amqp://guest:guest@127.0.0.1/%2F?no_such_option=1",
    ],
)
def test_malformed_amqp_url_is_a_value_error(url):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=url)


@pytest.mark.parametrize(
    "prefix",
    ["", "a" * 41, "has space", "has:colon", "has/slash", "caf\u00e9", "a*", None, 5, b"asgi"],
    ids=repr,
)
def test_bad_prefix_is_a_value_error(silent_broker, prefix):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=silent_broker.amqp_url, prefix=prefix)


def test_longest_prefix_is_accepted(silent_broker):
    AMQPChannelLayer(url=silent_broker.amqp_url, prefix="p" * 40).close()
    assert not silent_broker.touched()


def test_prefix_with_trailing_newline_is_a_value_error(silent_broker):
    with pytest.raises(ValueError):
        AMQPChannelLayer(url=silent_broker.amqp_url, prefix="asgi\n")


def test_constructing_a_layer_does_not_connect(silent_broker):
    layer = AMQPChannelLayer(url=silent_broker.amqp_url, prefix="lazy")
    assert layer.threads() == []
    assert not silent_broker.touched()
    layer.close()


# -- unreachable broker, wrong credentials ------------------------------------------------

SECRET = "s3cr3tPassw0rd"


def _exception_texts(exc):
    seen, texts = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


@pytest.fixture
def unreachable(new_layer):
    port = free_port()
    return new_layer(
        "amqp://guest:%s@127.0.0.1:%d/%%2F" % (SECRET, port),
        prefix=PREFIX + "-unr",
        operation_timeout=5,
        first_connect_timeout=0,  # no wait for a broker that may still be starting
    )


def test_unreachable_broker_is_a_prompt_connection_error(unreachable, layer, broker):
    for attempt in (
        lambda: unreachable.send("some.channel", {"a": 1}),
        lambda: unreachable.send("some.channel", {"a": 1}),  # and again, after the first failure
        lambda: unreachable.receive(["some.channel"]),
        lambda: unreachable.group_add("group", "some.channel"),
    ):
        started = time.monotonic()
        with pytest.raises(asgi_amqp.BrokerConnectionError) as info:
            attempt()
        assert time.monotonic() - started < 5.0
        assert isinstance(info.value, ConnectionError)
        assert isinstance(info.value, asgi_amqp.AMQPLayerError)
        assert not isinstance(info.value, asgi_amqp.AuthenticationError)
        assert SECRET not in _exception_texts(info.value)
    assert_live_intact(layer, broker)


def test_wrong_password_is_a_prompt_authentication_error(broker, layer, new_layer):
    parts = urlsplit(broker.amqp_url)
    url = parts._replace(netloc="guest:%s@%s:%d" % (SECRET, parts.hostname, parts.port)).geturl()
    wrong = new_layer(url, prefix=PREFIX + "-auth", operation_timeout=5)
    for attempt in (
        lambda: wrong.send("some.channel", {"a": 1}),
        lambda: wrong.send("some.channel", {"a": 1}),
    ):
        started = time.monotonic()
        with pytest.raises(asgi_amqp.AuthenticationError) as info:
            attempt()
        assert time.monotonic() - started < 5.0
        assert isinstance(info.value, asgi_amqp.BrokerConnectionError)
        assert isinstance(info.value, ConnectionError)
        assert SECRET not in _exception_texts(info.value)
    assert_live_intact(layer, broker)


def test_closing_a_layer_that_never_connected_logs_no_error(caplog):
    layer = make_layer(
        "amqp://guest:guest@127.0.0.1:%d/%%2F" % free_port(),
        prefix=PREFIX + "-cls",
        operation_timeout=0.3,
    )
    with pytest.raises(asgi_amqp.BrokerConnectionError):
        layer.send("some.channel", {"a": 1})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asgi_amqp"):
        layer.close()
    errors = [
        r for r in caplog.records if r.name.startswith("asgi_amqp") and r.levelno >= logging.ERROR
    ]
    assert errors == [], [r.getMessage() for r in errors]
