"""Groups on the broker: membership, expiry by lease and by message expiry, local members."""

import threading
import time

import pytest

from helpers import Management, at_moment, drain, wait_until


@pytest.fixture
def layer(broker, new_layer):
    return new_layer(broker, flush=True, expiry=1, group_expiry=2, capacity=5, receive_timeout=1)


def test_group_send_reaches_normal_and_local_members(layer):
    layer.group_add("room", "member.a")
    layer.group_add("room", "proc!x")
    layer.group_add("room", "proc!y")
    layer.send_group("room", {"n": 1})
    assert layer.receive(["member.a"]) == ("member.a", {"n": 1})
    local = sorted(drain(layer, ["proc!"]))
    assert local == [("proc!x", {"n": 1}), ("proc!y", {"n": 1})]


def test_group_discard_and_group_channels(layer):
    for channel in ("c.one", "c.two", "p!three"):
        layer.group_add("g", channel)
    assert sorted(layer.group_channels("g")) == ["c.one", "c.two", "p!three"]
    layer.group_discard("g", "c.two")
    layer.group_discard("g", "p!three")
    assert layer.group_channels("g") == ["c.one"]
    layer.send_group("g", {"x": 1})
    assert layer.receive(["c.two", "p!"]) == (None, None)
    assert layer.receive(["c.one"]) == ("c.one", {"x": 1})


def test_discard_of_unknown_member_and_group_is_harmless(layer):
    layer.group_discard("never-made", "nobody")
    layer.group_discard("never-made", "nobody!local")
    assert layer.group_channels("never-made") == []
    layer.send_group("never-made", {"x": 1})  # nobody joined: dropped, no error
    layer.send("still.works", {"ok": True})
    assert layer.receive(["still.works"]) == ("still.works", {"ok": True})


def test_a_group_deleted_when_it_emptied_can_be_joined_again(broker, layer):
    """The broker deletes a group's exchange (auto-delete) when its last
    member leaves: joining again makes it again."""
    api = Management(broker)
    exchange = layer.topology.group_exchange("again")
    layer.group_add("again", "first.member")
    layer.group_discard("again", "first.member")
    wait_until(
        lambda: exchange not in api.exchange_names(exchange),
        timeout=5,
        message="the emptied group's exchange deleted",
    )
    layer.group_add("again", "second.member")
    layer.group_add("again", "second!local")
    layer.send_group("again", {"n": 2})
    assert layer.receive(["second.member"]) == ("second.member", {"n": 2})
    assert layer.receive(["second!"]) == ("second!local", {"n": 2})


def test_group_calls_from_many_threads_at_once(broker, new_layer):
    """Concurrent group_add and group_discard calls run on several admin
    channels of one connection; each one completes, and only its own."""
    layer = new_layer(broker, flush=True, expiry=30, group_expiry=60)
    members = ["many.t%d" % n for n in range(12)] + ["many!t%d" % n for n in range(12)]
    errors = []

    def join_then_leave(channel):
        try:
            layer.group_add("crowd", channel)
            layer.group_add("crowd", channel)  # a renewal, on whichever channel
            if channel.endswith(("0", "2", "4", "6", "8")):
                layer.group_discard("crowd", channel)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append((channel, exc))

    threads = [threading.Thread(target=join_then_leave, args=(c,)) for c in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads), errors
    staying = sorted(c for c in members if not c.endswith(("0", "2", "4", "6", "8")))
    assert sorted(layer.group_channels("crowd")) == staying
    layer.send_group("crowd", {"all": True})
    normal = [c for c in staying if "!" not in c]
    received = sorted(drain(layer, normal) + drain(layer, ["many!"]))
    assert received == [(c, {"all": True}) for c in staying]


def test_membership_expires_after_group_expiry(layer):
    layer.group_add("gx", "exp.normal")
    layer.group_add("gx", "exp!local")
    wait_until(lambda: layer.group_channels("gx") == [], timeout=6, message="group expiry")
    layer.send_group("gx", {"late": True})
    assert layer.receive(["exp.normal", "exp!"]) == (None, None)


def test_repeated_group_add_renews_membership(layer):
    layer.group_add("renew", "keep.me")
    layer.group_add("renew", "drop.me")
    started = time.monotonic()
    # Renew one member every half group_expiry, well past the first expiry.
    for step in range(7):
        at_moment(started, 0.5 * step)
        layer.group_add("renew", "keep.me")
    at_moment(started, 3.5)
    wait_until(
        lambda: layer.group_channels("renew") == ["keep.me"],
        timeout=3,
        message="only the renewed member left",
    )
    layer.send_group("renew", {"still": "here"})
    assert layer.receive(["keep.me"]) == ("keep.me", {"still": "here"})
    assert layer.receive(["drop.me"]) == (None, None)


def test_message_expiry_drops_normal_member_from_all_groups(layer):
    layer.group_add("a", "slow.reader")
    layer.group_add("b", "slow.reader")
    layer.group_add("a", "other")
    layer.send("slow.reader", {"never": "read"})
    # expiry=1: the message dies, and the worker removes the member everywhere.
    wait_until(
        lambda: layer.group_channels("a") == ["other"] and layer.group_channels("b") == [],
        timeout=6,
        message="membership dropped after message expiry",
    )


def test_message_expiry_drops_local_member(layer):
    layer.group_add("lg", "daphne!conn1")
    layer.group_add("lg", "daphne!conn2")
    layer.send("daphne!conn1", {"never": "read"})
    wait_until(
        lambda: layer.group_channels("lg") == ["daphne!conn2"],
        timeout=6,
        message="local member dropped after message expiry",
    )


def test_group_send_to_full_member_does_not_raise(broker, new_layer):
    # send_group waits 2 s for room (test_send_group_waits_for_room): the
    # messages must outlive it.
    layer = new_layer(broker, flush=True, capacity=5)
    layer.group_add("full", "tiny")
    layer.group_add("full", "roomy")
    for _ in range(5):
        layer.send("tiny", {"fill": 1})
    with pytest.raises(layer.ChannelFull):
        layer.send("tiny", {"fill": 1})
    layer.send_group("full", {"g": 1})  # must not raise
    assert layer.receive(["roomy"]) == ("roomy", {"g": 1})
    assert len(drain(layer, ["tiny"])) == 5


def test_flush_removes_only_this_layers_objects(broker, layer, new_layer):
    other = new_layer(broker, flush=True, expiry=30)
    other.send("survivor", {"v": 1})
    layer.send("victim", {"v": 1})
    layer.group_add("fg", "victim")
    layer.flush()
    assert layer.receive(["victim"]) == (None, None)
    assert layer.group_channels("fg") == []
    assert other.receive(["survivor"]) == ("survivor", {"v": 1})
    leftovers = Management(broker).objects(layer.topology.prefix + ":")
    assert leftovers <= layer.topology.infrastructure() | {layer.topology.channel_queue("victim")}


def test_queues_and_exchanges_go_away_after_their_ttls(broker, layer):
    api = Management(broker)
    topology = layer.topology
    layer.group_add("ttl", "short.lived")
    layer.group_discard("ttl", "short.lived")
    layer.send("short.lived", {"v": 1})
    assert layer.receive(["short.lived"]) == ("short.lived", {"v": 1})
    queue = topology.channel_queue("short.lived")
    member = topology.member_exchange("short.lived")
    assert api.queue(queue) is not None
    # x-expires is twice the expiry (2 s); the auto-delete member exchange
    # goes with its queue's last binding.
    wait_until(
        lambda: api.queue(queue) is None, timeout=10, interval=0.25, message="channel queue expired"
    )
    wait_until(
        lambda: member not in api.exchange_names(member),
        timeout=5,
        interval=0.25,
        message="member exchange deleted",
    )


def test_a_join_notice_the_full_process_queue_refused_binds_nothing(broker, new_layer):
    """A publish of ``group_add`` not acked stops it before any binding. The
    join notice, refused by a full process queue, goes again on its own
    (``_notify``: up to 2 s for room, then ``ChannelFull``), and no binding
    is made for a membership its process was never told of."""
    layer = new_layer(broker, flush=True, group_expiry=60, capacity=2)
    layer.send("full!x", {"n": 1})
    layer.send("full!x", {"n": 2})
    with pytest.raises(layer.ChannelFull):
        layer.group_add("refused", "full!a")
    assert layer.group_channels("refused") == []
    assert [layer.receive(["full!"])[1] for _ in range(2)] == [{"n": 1}, {"n": 2}]
    layer.group_add("refused", "full!a")  # room now: the same lease, told and bound
    layer.send_group("refused", {"to": "refused"})
    assert layer.receive(["full!"], block=True) == ("full!a", {"to": "refused"})
