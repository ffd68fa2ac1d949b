"""A membership is a binding with a lease, not a queue.

What each membership leaves on the broker, and when it goes: no queue per
membership, a binding per lease stamp that the dead-letter worker removes
when the lease ends (also while the member's queue is in use), nothing
left after ``group_discard``, and one copy of a group message per process
queue however many of its channels are members.
"""

import pika
import pytest

from asgi_amqp import naming
from helpers import Management, wait_until

pytestmark = pytest.mark.slow

GROUP_EXPIRY = 2
# A lease ends between group_expiry and a quarter more; the worker and the
# management API's view take a moment more.
LEASE_END = GROUP_EXPIRY * 1.25 + 4


def _bindings_from(broker, layer, group):
    return Management(broker).exchange_bindings_from(layer.topology.group_exchange(group))


def _depth(broker, queue):
    """The broker's own count of the messages ``queue`` holds (a passive declare)."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def _queues(broker, layer):
    return sorted(Management(broker).queue_names(layer.topology.prefix + ":"))


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_memberships_make_no_queue_of_their_own(broker, new_layer, queue_type):
    layer = new_layer(broker, flush=True, queue_type=queue_type, group_expiry=60)
    members = ["m.a", "m.b", "proc!x", "proc!y", "proc!z"]
    for group in ("one", "two"):
        for channel in members:
            layer.group_add(group, channel)
    topology = layer.topology
    expected = {topology.dead_letter_queue, topology.lease_queue}
    expected |= {topology.channel_queue(c) for c in members}
    assert set(_queues(broker, layer)) == expected  # 3 channel queues for 5 members
    for group in ("one", "two"):
        assert sorted(layer.group_channels(group)) == sorted(members)
        assert len(_bindings_from(broker, layer, group)) == len(members)


def test_a_group_message_reaches_a_process_queue_once_for_all_its_members(broker, new_layer):
    layer = new_layer(broker, flush=True)
    for channel in ("once!a", "once!b", "once!c"):
        layer.group_add("room", channel)
    layer.send_group("room", {"n": 1})
    # The three join notices and the message once, not once per member.
    assert _depth(broker, layer.topology.channel_queue("once!")) == 4
    received = sorted(layer.receive(["once!"]) for _ in range(3))
    assert received == [("once!%s" % c, {"n": 1}) for c in "abc"]
    assert layer.receive(["once!"]) == (None, None)


@pytest.mark.parametrize("channel, reader", [("ends.normal", "ends.normal"), ("ends!l", "ends!")])
def test_a_lease_ends_while_its_member_is_read(broker, new_layer, channel, reader):
    """The member's queue stays in use (a reader polls it), so only the
    lease's end can remove the membership: the worker must unbind exactly
    the binding it made."""
    layer = new_layer(broker, flush=True, expiry=1, group_expiry=GROUP_EXPIRY)
    layer.group_add("brief", channel)
    assert len(_bindings_from(broker, layer, "brief")) == 1

    def ended():
        layer.receive([reader])  # keeps the queue in use
        return layer.group_channels("brief") == []

    wait_until(ended, LEASE_END, interval=0.2, message="the lease's binding removed")
    layer.send_group("brief", {"late": True})
    assert layer.receive([reader]) == (None, None)


def test_renewals_within_a_stamp_add_no_binding(broker, new_layer):
    layer = new_layer(broker, flush=True, group_expiry=800)  # stamps of 100 s
    stamp = layer.topology.lease_stamp()
    for _ in range(5):
        layer.group_add("same", "same.member")
        layer.group_add("same", "same!local")
    if layer.topology.lease_stamp() != stamp:  # the calls crossed a stamp: one more each
        assert len(_bindings_from(broker, layer, "same")) <= 4
    else:
        assert len(_bindings_from(broker, layer, "same")) == 2
    assert _depth(broker, layer.topology.lease_queue) <= 4  # one per membership and stamp


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_group_discard_leaves_nothing_and_the_process_stops_copying(broker, new_layer, queue_type):
    layer = new_layer(broker, flush=True, queue_type=queue_type, group_expiry=60)
    for channel in ("gone!a", "gone!b", "gone.normal"):
        layer.group_add("room", channel)
    layer.group_discard("room", "gone!a")
    layer.group_discard("room", "gone.normal")
    assert layer.group_channels("room") == ["gone!b"]
    layer.send_group("room", {"after": "discard"})
    assert layer.receive(["gone!"]) == ("gone!b", {"after": "discard"})
    assert layer.receive(["gone!", "gone.normal"]) == (None, None)
    layer.group_discard("room", "gone!b")
    api = Management(broker)
    assert api.exchange_names(layer.topology.group_exchange("")) == []  # auto-deleted


def test_a_receive_right_after_send_group_sees_it_with_quorum_queues(broker, new_layer):
    """asgiref's test_groups_process, 30 times in a row: the message is in
    the process's queue when send_group returns, and the process knows its
    members from the notices queued ahead of it."""
    layer = new_layer(broker, flush=True, queue_type="quorum", group_expiry=60)
    for attempt in range(30):
        group = "fast-%d" % attempt
        layer.group_add(group, "fast!a")
        layer.group_add(group, "fast!b")
        layer.send_group(group, {"n": attempt})
        got = sorted([layer.receive(["fast!"]), layer.receive(["fast!"])])
        assert got == [("fast!a", {"n": attempt}), ("fast!b", {"n": attempt})], attempt
        assert layer.receive(["fast!"]) == (None, None)


@pytest.mark.parametrize("group_expiry", [80, 86400])
def test_the_lease_stamps_cover_every_live_binding(group_expiry):
    """group_discard unbinds live_stamps(): every stamp whose lease has not
    ended, by the clock of a process whose clock is up to CLOCK_SKEW (at
    most a slice) ahead or behind."""
    topology = naming.Topology("p", 60, group_expiry, lambda channel: 10)
    skew = min(naming.CLOCK_SKEW, topology.lease_slice)
    for now in [1_000_000.0 + k * topology.lease_slice / 7 for k in range(15)]:
        stamps = topology.live_stamps(now)
        for clock in (now - skew, now, now + skew):  # this process's, others'
            for age in [group_expiry * k / 16 for k in range(21)]:  # since a group_add
                stamp = topology.lease_stamp(clock - age)
                alive = topology.lease_ends(stamp) - (clock - now) > now
                assert stamp in stamps or not alive, (now, clock, age)
        extra = 2 if skew == topology.lease_slice else 1
        assert naming.LEASE_SLICES + 1 <= len(stamps) <= naming.LEASE_SLICES + 1 + extra
