"""A repeated ``group_add`` extends a membership to ``group_expiry`` from that call.

A membership is a binding per lease stamp and a lease message that ends
it (see docs/topology.rst); it also needs its member's channel queue
(``x-expires`` twice ``expiry`` after its last use), which each
``group_add`` renews by declaring it again, answered: a re-declare sent
with ``nowait`` leaves the queue's lease where it was (measured on RabbitMQ
3.10.8 and 4.0.5). These tests renew a membership once and send to the
group after its first lease has run out but before the renewed one does.

The lease is the thing under test, so these tests keep a schedule on the
clock (``_at``, on ``helpers.at_moment``): each step happens at a moment
measured from the first ``group_add``, and every wait for an outcome is a
``wait_until`` with a deadline.
"""

import threading
import time

import pytest

from helpers import at_moment, wait_until

pytestmark = pytest.mark.slow

GROUP_EXPIRY = 2


def _at(start, moment):
    """The schedule's step at ``moment`` s after ``start``; fail if that moment
    has already passed by more than a quarter second, since the test's
    timing would then say nothing."""
    at_moment(start, moment, late=0.25)


class _Reader(object):
    """Blocking receives on some channels in a thread of its own, as a
    runworker or daphne keeps doing: the channels' queues are in use, and
    what arrives is collected."""

    def __init__(self, layer, channels):
        self.layer = layer
        self.channels = channels
        self.received = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="renewal-reader", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            channel, message = self.layer.receive(self.channels, block=True)
            if channel is not None:
                self.received.append((channel, message))

    def got(self, wanted):
        return sorted(wanted) == sorted(self.received)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()


def _queue_types():
    return ["classic", "quorum"]


# (queue_type, expiry): expiry below and above group_expiry. A quorum queue's
# x-expires lease is not renewed by a re-declare at all (measured on 3.10.8:
# gone at its first lease's end however often it was declared), so a quorum
# channel queue lives by its reader; both members here have one.
@pytest.mark.parametrize("queue_type", _queue_types())
@pytest.mark.parametrize("expiry", [1, 3], ids=["expiry-below", "expiry-above"])
@pytest.mark.parametrize("renew_at", [0.6, 1.6], ids=["before-half", "after-half"])
def test_a_repeated_group_add_extends_the_membership(
    broker, new_layer, queue_type, expiry, renew_at
):
    layer = new_layer(
        broker,
        flush=True,
        expiry=expiry,
        group_expiry=GROUP_EXPIRY,
        queue_type=queue_type,
        receive_timeout=0.5,
    )
    members = ["renew.normal", "renew!local"]
    reader = _Reader(layer, ["renew.normal", "renew!"])
    try:
        for channel in members:
            layer.group_add("renewed", channel)
        start = time.monotonic()
        _at(start, renew_at)
        for channel in members:
            layer.group_add("renewed", channel)
        renewed = time.monotonic()
        # The first lease ended at GROUP_EXPIRY (the local member's queue a
        # second later); the renewed one ends at renew_at + GROUP_EXPIRY.
        _at(renewed, GROUP_EXPIRY - 0.4)
        layer.send_group("renewed", {"still": "here"})
        wanted = [(channel, {"still": "here"}) for channel in members]
        wait_until(lambda: reader.got(wanted), timeout=3, message="both renewed members reached")
        # Renewed, not kept for ever: the membership ends with the renewed lease.
        wait_until(
            lambda: layer.group_channels("renewed") == [],
            timeout=GROUP_EXPIRY + 6,
            interval=0.2,
            message="the renewed membership expired",
        )
    finally:
        reader.stop()


@pytest.mark.parametrize("queue_type", _queue_types())
def test_the_reported_renewal_with_no_reader(broker, new_layer, queue_type):
    """The issue's steps: ``expiry=1, group_expiry=2``, a second ``group_add``
    at 1.2 s, ``send_group`` at 2.5 s, nobody reading the member in between.
    Classic queues only have a channel queue that a re-declare renews; with
    quorum queues the test has the process-local member alone.

    The process-local member's process reads its queue all along, as daphne
    does: a process that reads nothing for ``expiry`` lets its join notices
    expire, and the dead-letter worker sends them back after a moment, by
    which time a group message may be ahead of them (docs/topology.rst,
    "Notices that expire"); under load that made this test fail 1 run in 20."""
    layer = new_layer(broker, flush=True, expiry=1, group_expiry=2, queue_type=queue_type)
    local = "solo!member"
    members = [local] if queue_type == "quorum" else [local, "solo.member"]
    reader = _Reader(layer, ["solo!"])
    try:
        for channel in members:
            layer.group_add("g", channel)
        start = time.monotonic()
        _at(start, 1.2)
        for channel in members:
            layer.group_add("g", channel)
        _at(start, 2.5)
        assert sorted(layer.group_channels("g")) == sorted(members)
        layer.send_group("g", {"n": 1})
        if queue_type == "classic":
            assert layer.receive(["solo.member"], block=True) == ("solo.member", {"n": 1})
        wait_until(lambda: reader.got([(local, {"n": 1})]), timeout=3, message="the member reached")
    finally:
        reader.stop()


def test_a_member_renewed_beside_one_that_expired_still_receives(broker, new_layer):
    """Two members; a message to one of them expires, which drops it from
    its groups; the other is renewed and must get the next group message."""
    layer = new_layer(broker, flush=True, expiry=1, group_expiry=2)
    layer.group_add("pair", "pair.stale")
    layer.group_add("pair", "pair.live")
    start = time.monotonic()
    layer.send("pair.stale", {"never": "read"})
    wait_until(
        lambda: layer.group_channels("pair") == ["pair.live"],
        timeout=6,
        message="the stale member dropped after its message expired",
    )
    layer.group_add("pair", "pair.live")  # at 1.0 s or later: the message's expiry
    _at(start, 2.4)
    layer.send_group("pair", {"n": 2})
    assert layer.receive(["pair.live"], block=True) == ("pair.live", {"n": 2})
    assert layer.receive(["pair.stale"]) == (None, None)
