"""Property tests: every ASGI-valid message round-trips exactly; invalid input never leaves.

One live layer serves the whole module. Invalid input is also sent to an
*offline* layer whose URL points at a socket that never answers: a call that
tried to reach the broker would hang there, and the socket would see the
connection, so "refused before the broker" is checked directly.
"""

import copy
import datetime
import decimal
import math
import string
import uuid

import pytest
from asgiref.base_layer import BaseChannelLayer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

PREFIX = "t-prop-%s" % uuid.uuid4().hex[:8]
INT_MIN, INT_MAX = -(2**63), 2**64 - 1

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FAST_PROPERTY = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layer(broker, module_layer):
    return module_layer(broker, flush=True, prefix=PREFIX, expiry=60, receive_timeout=2)


@pytest.fixture(scope="module")
def offline(silent_broker, module_layer):
    return module_layer(silent_broker, prefix=PREFIX + "-off", operation_timeout=1)


# -- strategies ----------------------------------------------------------------------------

INT_EDGES = [
    0,
    1,
    -1,
    127,
    128,
    255,
    256,
    -32,
    -33,
    -128,
    -129,
    2**16,
    -(2**15) - 1,
    2**31 - 1,
    -(2**31),
    2**32,
    2**63 - 1,
    2**63,
    INT_MIN,
    INT_MAX,
]
SPECIAL_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\x07\x1b[0m",
    "\x7f",
    "\r\n\t\x0b\x0c",
    "\u2028\u2029",
    "\ufeff",
    "\ufffd",
    "\uffff",
    "\U0010ffff",
    "\U0001f600",
    "\U0001f469\u200d\U0001f469\u200d\U0001f467",
    "\u00e9e\u0301",
    "\u05d0\u0627",
    "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16"),
]

ints = st.one_of(st.sampled_from(INT_EDGES), st.integers(INT_MIN, INT_MAX))
floats = st.floats(allow_nan=False)  # inf, -inf, -0.0, subnormals included
texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(st.characters(codec="utf-8"), max_size=40))
binaries = st.one_of(
    st.sampled_from([b"", b"\x00", b"\xff\xfe", "\u00e9".encode("utf8")]), st.binary(max_size=64)
)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, binaries)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(texts, children, max_size=6)
    ),
    max_leaves=30,
)
messages = st.dictionaries(texts, values, max_size=8)


def same(a, b):
    """Equal *and* of the same types all the way down (True is not 1, b"a" is not "a")."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# -- valid messages round-trip ----------------------------------------------------------------


@PROPERTY
@given(message=messages, block=st.booleans())
def test_any_asgi_message_round_trips_exactly(layer, message, block):
    # One channel per receive mode: see test_non_blocking_receive_sees_confirmed_messages.
    channel = "prop.roundtrip.block" if block else "prop.roundtrip.get"
    layer.send(channel, message)
    received_channel, received = layer.receive([channel], block=block)
    assert received_channel == channel
    assert received == message
    assert same(received, message)


@FAST_PROPERTY
@given(numbers=st.lists(st.floats(), min_size=1, max_size=40))
def test_every_float_round_trips_including_nan(layer, numbers):
    channel = "prop.floats"
    layer.send(channel, {"numbers": numbers, "nan": float("nan")})
    received_channel, received = layer.receive([channel])
    assert received_channel == channel
    assert math.isnan(received["nan"])
    assert len(received["numbers"]) == len(numbers)
    for got, sent in zip(received["numbers"], numbers):
        assert type(got) is float
        if math.isnan(sent):
            assert math.isnan(got)
        else:
            assert got == sent and math.copysign(1.0, got) == math.copysign(1.0, sent)


def test_scalar_types_are_kept(layer):
    """The cases a lax comparison would let through, spelled out."""
    message = {
        "t": True,
        "f": False,
        "one": 1,
        "zero": 0,
        "float": 1.0,
        "neg0": -0.0,
        "bytes": b"abc",
        "str": "abc",
        "none": None,
        "empty-bytes": b"",
        "empty-str": "",
        "empty-list": [],
        "empty-dict": {},
        "tuple": (1, "a", b"b"),
    }
    layer.send("prop.types", message)
    channel, received = layer.receive(["prop.types"])
    assert channel == "prop.types"
    expected = dict(message, tuple=[1, "a", b"b"])  # tuples travel as lists
    assert same(received, expected), received


def test_non_blocking_receive_sees_confirmed_messages(layer):
    channel = "prop.mixed-receives"
    layer.send(channel, {"i": -1})
    assert layer.receive([channel], block=True) == (channel, {"i": -1})
    missed = []
    for i in range(300):
        layer.send(channel, {"i": i})  # returns once the broker confirmed it
        if layer.receive([channel]) != (channel, {"i": i}):
            missed.append(i)
            assert layer.receive([channel], block=True) == (channel, {"i": i})
    assert missed == [], "non-blocking receive missed %d confirmed messages" % len(missed)


# -- valid names round-trip ----------------------------------------------------------------------

_NAME_CHARS = r"[a-zA-Z0-9._\-]"
valid_channel_names = st.from_regex(
    r"\A%s{1,60}(!%s{0,30}|\?%s{1,30})?\Z" % (_NAME_CHARS, _NAME_CHARS, _NAME_CHARS)
)


@PROPERTY
@given(name=valid_channel_names)
def test_any_valid_ascii_channel_name_round_trips(layer, name):
    message = {"to": name}
    layer.send(name, message)
    # A process-local channel foo!bar is received by asking for foo!.
    receive_as = name[: name.index("!") + 1] if "!" in name else name
    assert layer.receive([receive_as]) == (name, message)


# -- invalid messages never leave ------------------------------------------------------------------


class _Opaque(object):
    pass


# (strategy of bad values, exception, text the error must contain)
_BAD_VALUES = st.one_of(
    st.builds(set, st.lists(st.integers(), max_size=3)).map(lambda v: (v, TypeError, "set")),
    st.just((frozenset(), TypeError, "frozenset")),
    st.builds(_Opaque).map(lambda v: (v, TypeError, "_Opaque")),
    st.complex_numbers().map(lambda v: (v, TypeError, "complex")),
    st.datetimes().map(lambda v: (v, TypeError, "datetime")),
    st.dates().map(lambda v: (v, TypeError, "date")),
    st.decimals(allow_nan=False).map(lambda v: (decimal.Decimal(v), TypeError, "Decimal")),
    st.binary().map(lambda v: (bytearray(v), TypeError, "bytearray")),
    st.just((datetime.timedelta(1), TypeError, "timedelta")),
    st.just((uuid.uuid4(), TypeError, "UUID")),
    st.integers(min_value=INT_MAX + 1).map(lambda v: (v, ValueError, str(v))),
    st.integers(max_value=INT_MIN - 1).map(lambda v: (v, ValueError, str(v))),
)
_BAD_KEYS = st.sampled_from([0, 1, -5, 2.5, b"key", (1, 2), None, True, frozenset()])


def _containers(value, path="message"):
    """Every dict and list inside ``value`` (itself included), with its path."""
    if isinstance(value, (dict, list)):
        yield value, path
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from _containers(item, "%s[%r]" % (path, key))


@PROPERTY
@given(message=messages, data=st.data())
def test_an_invalid_value_anywhere_is_refused_before_the_broker(
    layer, offline, silent_broker, message, data
):
    message = copy.deepcopy(message)
    containers = list(_containers(message))
    target, path = data.draw(st.sampled_from(containers), label="container")
    if isinstance(target, dict) and data.draw(st.booleans(), label="bad key"):
        target[data.draw(_BAD_KEYS, label="key")] = data.draw(values, label="its value")
        exception, words = TypeError, ["key", path]
    else:
        bad, exception, what = data.draw(_BAD_VALUES, label="bad value")
        if isinstance(target, dict):
            key = data.draw(texts, label="key")
            target[key] = bad
            where = "%s[%r]" % (path, key)
        else:
            index = data.draw(st.integers(0, len(target)), label="index")
            target.insert(index, bad)
            where = "%s[%r]" % (path, index)
        words = [where, what]

    for candidate in (offline, layer):
        with pytest.raises(exception) as info:
            candidate.send("prop.invalid", message)
        for word in words:
            assert word in str(info.value), (word, str(info.value))
        with pytest.raises(exception):
            candidate.send_group("prop-group", message)
    silent_broker.assert_untouched(offline)
    # Had anything been published, the channel's queue would hold it now.
    assert layer.receive(["prop.invalid"]) == (None, None)


class _Text(str):
    pass


class _Number(int):
    pass


def _nested(depth, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return {"deep": leaf}


_ANY_VALUES = st.recursive(
    st.one_of(
        scalars,
        _BAD_VALUES.map(lambda bad: bad[0]),
        st.builds(_Text, texts),
        st.builds(_Number, st.integers(-5, 5)),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.one_of(texts, _BAD_KEYS), children, max_size=4),
    ),
    max_leaves=20,
)


@FAST_PROPERTY
@given(
    message=st.one_of(
        st.dictionaries(texts, _ANY_VALUES, max_size=5),
        st.integers(60, 70).map(lambda depth: _nested(depth, 1)),
    )
)
def test_the_fast_validation_path_never_accepts_what_the_full_walk_refuses(message):
    """Sends check messages with a cheap walk first and fall back to the full one.

    The cheap walk may say "look closer" about a valid message (a str
    subclass, say), but whatever it accepts the full walk must accept too.
    """
    from asgi_amqp import serialization

    if serialization._plainly_valid(message, 0):
        serialization._validate_value(message, "message", 0)


# -- invalid names ---------------------------------------------------------------------------------

CHANNEL_RE = BaseChannelLayer.channel_name_regex
GROUP_RE = BaseChannelLayer.group_name_regex
_NAMEISH = string.ascii_letters[:6] + string.digits[:3] + "-_.?!" + " /:#*@\t\u00e9\u65e5\U0001f600"

name_candidates = st.one_of(
    st.text(_NAMEISH, max_size=30),
    st.text(max_size=30),
    st.text("ab?!", min_size=95, max_size=130),
    st.integers(0, 200).map(lambda n: "a" * n),
    st.binary(max_size=20),
    st.none(),
    st.integers(),
    st.lists(st.text(max_size=3), max_size=2),
)


def _invalid_channel(name):
    return not isinstance(name, str) or len(name) >= 100 or not CHANNEL_RE.match(name)


def _invalid_group(name):
    return not isinstance(name, str) or len(name) >= 100 or not GROUP_RE.match(name)


@FAST_PROPERTY
@given(name=name_candidates.filter(_invalid_channel))
def test_invalid_channel_names_are_a_type_error(offline, silent_broker, name):
    calls = [
        lambda: offline.send(name, {"a": 1}),
        lambda: offline.receive([name]),
        lambda: offline.receive(["prop.valid", name], block=True),
        lambda: offline.group_add("prop-group", name),
        lambda: offline.group_discard("prop-group", name),
    ]
    if isinstance(name, str):
        calls.append(lambda: offline.new_channel(name + "?"))
    for call in calls:
        with pytest.raises(TypeError):
            call()
    silent_broker.assert_untouched(offline)


@FAST_PROPERTY
@given(name=name_candidates.filter(_invalid_group))
def test_invalid_group_names_are_a_type_error(offline, silent_broker, name):
    for call in (
        lambda: offline.group_add(name, "prop.valid"),
        lambda: offline.group_discard(name, "prop.valid"),
        lambda: offline.send_group(name, {"a": 1}),
        lambda: offline.group_channels(name),
    ):
        with pytest.raises(TypeError):
            call()
    silent_broker.assert_untouched(offline)


@FAST_PROPERTY
@given(name=st.from_regex(r"\A%s{1,40}!%s{1,40}\Z" % (_NAME_CHARS, _NAME_CHARS)))
def test_receive_refuses_process_local_names_past_the_bang(offline, silent_broker, name):
    offline.valid_channel_name(name)  # a fine name to send to...
    with pytest.raises(TypeError):
        offline.receive([name])  # ...but not to receive from
    with pytest.raises(TypeError):
        offline.receive([name[: name.index("!") + 1], name], block=True)
    silent_broker.assert_untouched(offline)


@FAST_PROPERTY
@given(pattern=valid_channel_names.filter(lambda n: "?" not in n and "!" not in n))
def test_new_channel_names_from_valid_patterns(offline, silent_broker, pattern):
    assume(len(pattern) <= 80)  # longer patterns: see test_bad_input (new_channel bug)
    name = offline.new_channel(pattern + "?")
    assert name.startswith(pattern + "?") and len(name) > len(pattern) + 1
    offline.valid_channel_name(name)
    silent_broker.assert_untouched(offline)
