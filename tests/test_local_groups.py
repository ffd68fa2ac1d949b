"""A process's own group members, and the copies made for them (no broker).

``LocalGroups`` reads the join, leave and drop notices that come through a
process-local queue, and turns one group message into a copy per member
whose lease has not ended. These tests drive it with headers as the broker
delivers them and a clock of their own.
"""

from asgi_amqp import naming
from asgi_amqp.local_groups import NOTICE, LocalGroups

QUEUE = "p:q:daphne!"


class Clock(object):
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class Missed(object):
    """Counts the copies a full member missed (the layer's ``group_sends_dropped``)."""

    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1


def _groups(capacity=5, expiry=60.0, clock=None, missed=None):
    topology = naming.Topology("p", expiry, 86400, lambda channel: capacity)
    return LocalGroups(
        topology, lambda channel: capacity, missed or Missed(), clock=clock or Clock()
    )


def _join(group, member, ends):
    return {
        naming.KIND_HEADER: naming.JOIN_KIND,
        naming.GROUP_HEADER: group,
        naming.MEMBER_HEADER: member,
        naming.LEASE_ENDS_HEADER: int(ends * 1000),
    }


def _leave(group, member):
    return {
        naming.KIND_HEADER: naming.LEAVE_KIND,
        naming.GROUP_HEADER: group,
        naming.MEMBER_HEADER: member,
    }


def _group_message(group):
    return {naming.GROUP_HEADER: group}


def test_a_join_notice_is_applied_and_not_handed_out():
    local = _groups()
    assert local.members_of(QUEUE, _join("room", "daphne!a", 2000)) is NOTICE
    assert local.members_of(QUEUE, _group_message("room")) == ["daphne!a"]
    assert local.members_of(QUEUE, _group_message("other")) == []


def test_members_are_per_queue():
    local = _groups()
    local.members_of(QUEUE, _join("room", "daphne!a", 2000))
    assert local.members_of("p:q:other!", _group_message("room")) == []


def test_a_leave_notice_ends_the_membership_at_once():
    local = _groups()
    local.members_of(QUEUE, _join("room", "daphne!a", 2000))
    local.members_of(QUEUE, _join("room", "daphne!b", 2000))
    assert local.members_of(QUEUE, _leave("room", "daphne!a")) is NOTICE
    assert local.members_of(QUEUE, _group_message("room")) == ["daphne!b"]


def test_a_membership_ends_with_the_lease_its_latest_notice_named():
    clock = Clock(1000.0)
    local = _groups(clock=clock)
    local.members_of(QUEUE, _join("room", "daphne!a", 1010))
    local.members_of(QUEUE, _join("room", "daphne!a", 1020))  # renewed
    local.members_of(QUEUE, _join("room", "daphne!a", 1015))  # an older notice, late
    clock.now = 1019.0
    assert local.members_of(QUEUE, _group_message("room")) == ["daphne!a"]
    clock.now = 1020.0
    assert local.members_of(QUEUE, _group_message("room")) == []


def test_a_notice_whose_lease_already_ended_adds_nobody():
    clock = Clock(1000.0)
    local = _groups(clock=clock)
    local.members_of(QUEUE, _join("room", "daphne!a", 999))
    assert local.members_of(QUEUE, _group_message("room")) == []


def test_a_drop_notice_ends_every_membership_of_the_channel():
    local = _groups()
    for group in ("a", "b"):
        local.members_of(QUEUE, _join(group, "daphne!x", 2000))
        local.members_of(QUEUE, _join(group, "daphne!y", 2000))
    drop = {naming.KIND_HEADER: naming.DROP_KIND, naming.MEMBER_HEADER: "daphne!x"}
    assert local.members_of(QUEUE, drop) is NOTICE
    assert local.members_of(QUEUE, _group_message("a")) == ["daphne!y"]
    assert local.members_of(QUEUE, _group_message("b")) == ["daphne!y"]


def test_messages_that_are_not_a_group_fan_out_are_left_to_the_caller():
    local = _groups()
    local.members_of(QUEUE, _join("room", "daphne!a", 2000))
    assert local.members_of(QUEUE, {naming.CHANNEL_HEADER: "daphne!a"}) is None
    assert local.members_of(QUEUE, {}) is None


def test_bytes_headers_are_read_as_text():
    local = _groups()
    join = {
        naming.KIND_HEADER: b"join",
        naming.GROUP_HEADER: b"room",
        naming.MEMBER_HEADER: b"daphne!a",
        naming.LEASE_ENDS_HEADER: 2000000,
    }
    assert local.members_of(QUEUE, join) is NOTICE
    assert local.members_of(QUEUE, {naming.GROUP_HEADER: b"room"}) == ["daphne!a"]


def test_copies_come_back_oldest_first_for_their_queue_only():
    local = _groups()
    local.keep(QUEUE, ["daphne!a", "daphne!b"], b"one")
    local.keep(QUEUE, ["daphne!a"], b"two")
    assert local.take(["p:q:other!"]) is None
    assert local.take([QUEUE]) == (QUEUE, "daphne!a", b"one")
    assert local.take(["p:q:other!", QUEUE]) == (QUEUE, "daphne!b", b"one")
    assert local.take([QUEUE]) == (QUEUE, "daphne!a", b"two")
    assert local.take([QUEUE]) is None


def test_a_full_member_misses_the_copy_counted_and_logged(caplog):
    missed = Missed()
    local = _groups(capacity=2, missed=missed)
    for body in (b"1", b"2", b"3"):
        local.keep(QUEUE, ["daphne!a", "daphne!b"], body)
    taken = [local.take([QUEUE]) for _ in range(5)]
    assert [copy[2] for copy in taken if copy] == [b"1", b"1", b"2", b"2"]
    assert missed.count == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("is full" in text for text in warnings)


def test_a_copy_waits_at_most_expiry_and_expires_uncounted():
    clock = Clock(1000.0)
    missed = Missed()
    local = _groups(expiry=60.0, clock=clock, missed=missed)
    local.keep(QUEUE, ["daphne!a"], b"old")
    clock.now = 1060.0
    assert local.take([QUEUE]) is None
    assert missed.count == 0  # it expired, as a message in a queue would


def test_forget_clears_members_and_copies():
    local = _groups()
    local.members_of(QUEUE, _join("room", "daphne!a", 2000))
    local.keep(QUEUE, ["daphne!a"], b"x")
    local.forget()
    assert local.take([QUEUE]) is None
    assert local.members_of(QUEUE, _group_message("room")) == []
