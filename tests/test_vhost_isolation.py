"""Two vhosts, one prefix: layers on different vhosts never see each other.

A private node of this module's own gets vhosts ``vhost-a`` and ``vhost-b``
(guest may use both) and ``vhost-closed`` (guest may not). A layer on each
of the first two, with the same prefix, sends, joins groups and flushes; the
management API, listed per vhost, shows that nothing crosses over.
"""

import time
import uuid

import pytest

from asgi_amqp import AuthenticationError
from helpers import Management, private_node, wait_until

pytestmark = [pytest.mark.slow]

PREFIX = "shared"
VHOSTS = ("vhost-a", "vhost-b")


@pytest.fixture(scope="module")
def node():
    with private_node() as node:
        for vhost in VHOSTS + ("vhost-closed",):
            node.ctl("add_vhost", vhost)
        for vhost in VHOSTS:
            node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield node


def _url(node, vhost):
    return "amqp://guest:guest@127.0.0.1:%d/%s" % (node.amqp_port, vhost)


def _layer(new_layer, node, vhost, **config):
    """A layer on PREFIX in ``vhost``."""
    config.setdefault("operation_timeout", 5)
    return new_layer(
        _url(node, vhost),
        management_url=node.management_url,
        prefix=PREFIX,
        receive_timeout=1,
        **config,
    )


@pytest.fixture
def layers(node, new_layer):
    return tuple(_layer(new_layer, node, vhost, flush=True) for vhost in VHOSTS)


def _objects(node, vhost):
    """(queue names, exchange names) under the prefix in ``vhost``, from the management API."""
    client = Management(node, vhost)
    return set(client.queue_names(PREFIX + ":")), set(client.exchange_names(PREFIX + ":"))


def test_messages_stay_in_their_vhost(node, layers):
    a, b = layers
    a.send("chat", {"from": "a"})
    b.send("chat", {"from": "b"})
    a.send("only-a", {"n": 1})
    local = "reply!" + uuid.uuid4().hex[:12]  # as an ASGI server names them
    a.send(local, {"local": "a"})
    # Before anyone in vhost-b names these channels, vhost-b has no queue for them.
    queues_a, _ = _objects(node, "vhost-a")
    queues_b, _ = _objects(node, "vhost-b")
    assert {"%s:q:only-a" % PREFIX, "%s:q:reply!" % PREFIX} <= queues_a
    assert not {"%s:q:only-a" % PREFIX, "%s:q:reply!" % PREFIX} & queues_b
    assert "%s:q:chat" % PREFIX in queues_a and "%s:q:chat" % PREFIX in queues_b
    assert a.receive(["chat"], block=True) == ("chat", {"from": "a"})
    assert a.receive(["chat"]) == (None, None)
    assert b.receive(["chat"], block=True) == ("chat", {"from": "b"})
    assert b.receive(["chat"]) == (None, None)
    assert b.receive(["only-a"]) == (None, None)
    assert b.receive(["reply!"]) == (None, None)
    assert a.receive(["only-a"]) == ("only-a", {"n": 1})
    assert a.receive(["reply!"]) == (local, {"local": "a"})


def test_groups_stay_in_their_vhost(node, layers):
    a, b = layers
    a.group_add("room", "alice")
    b.group_add("room", "bob")
    local = "ws!" + uuid.uuid4().hex[:12]
    b.group_add("room", local)
    assert sorted(a.group_channels("room")) == ["alice"]
    assert sorted(b.group_channels("room")) == sorted(["bob", local])
    a.send_group("room", {"to": "a-room"})
    assert a.receive(["alice"], block=True) == ("alice", {"to": "a-room"})
    assert b.receive(["bob"]) == (None, None)
    assert b.receive(["ws!"]) == (None, None)
    b.send_group("room", {"to": "b-room"})
    assert b.receive(["bob"], block=True) == ("bob", {"to": "b-room"})
    assert b.receive(["ws!"], block=True) == (local, {"to": "b-room"})
    assert a.receive(["alice"]) == (None, None)
    # Discarding in one vhost leaves the other's membership alone.
    b.group_discard("room", "bob")
    assert sorted(a.group_channels("room")) == ["alice"]
    assert b.group_channels("room") == [local]
    _, exchanges_a = _objects(node, "vhost-a")
    _, exchanges_b = _objects(node, "vhost-b")
    assert "%s:m:alice" % PREFIX in exchanges_a and "%s:m:alice" % PREFIX not in exchanges_b
    # A process-local member is bound through its process's member exchange.
    assert "%s:m:ws!" % PREFIX in exchanges_b
    assert "%s:m:ws!" % PREFIX not in exchanges_a


def test_flush_touches_only_its_own_vhost(node, layers):
    a, b = layers
    for layer, name in ((a, "a"), (b, "b")):
        layer.send("kept", {"from": name})
        layer.group_add("room", "member-" + name)
    before_b = _objects(node, "vhost-b")
    assert "%s:q:kept" % PREFIX in before_b[0] and "%s:g:room" % PREFIX in before_b[1]
    a.flush()
    queues_a, exchanges_a = _objects(node, "vhost-a")
    # Only the shared infrastructure (kept, emptied) is left in vhost-a.
    assert queues_a <= a.topology.infrastructure(), queues_a
    assert exchanges_a <= a.topology.infrastructure(), exchanges_a
    assert _objects(node, "vhost-b") == before_b
    assert a.receive(["kept"]) == (None, None)
    assert a.group_channels("room") == []
    assert b.receive(["kept"]) == ("kept", {"from": "b"})
    assert b.group_channels("room") == ["member-b"]


def test_management_client_lists_per_vhost(node, layers):
    a, b = layers
    a.send("listed.a", {"n": 1})
    b.send("listed.b", {"n": 1})
    queues_a, _ = _objects(node, "vhost-a")
    queues_b, _ = _objects(node, "vhost-b")
    assert "%s:q:listed.a" % PREFIX in queues_a and "%s:q:listed.a" % PREFIX not in queues_b
    assert "%s:q:listed.b" % PREFIX in queues_b and "%s:q:listed.b" % PREFIX not in queues_a
    # Depths per vhost: each message is in its own vhost's queue only.
    depth_a = Management(node, "vhost-a").queue("%s:q:listed.a" % PREFIX)
    wait_until(
        lambda: Management(node, "vhost-a").queue("%s:q:listed.a" % PREFIX).get("messages") == 1,
        timeout=10,
        message="vhost-a's queue depth reported",
    )
    assert depth_a is not None
    # The default vhost saw nothing at all.
    assert _objects(node, "/") == (set(), set())


@pytest.mark.parametrize("vhost", ["vhost-closed", "no-such-vhost"])
def test_a_vhost_without_access_is_a_clear_error_within_seconds(node, vhost, new_layer):
    layer = _layer(new_layer, node, vhost, operation_timeout=3)
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as caught:
        layer.send("chat", {"n": 1})
    assert time.monotonic() - started < 5
    assert "vhost" in str(caught.value) and "guest:guest" not in str(caught.value)
    layer.close()
    wait_until(
        lambda: _objects(node, "/") == (set(), set()),
        timeout=1,
        message="nothing declared in the default vhost",
    )
