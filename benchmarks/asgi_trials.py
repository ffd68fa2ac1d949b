"""The scenarios for any asgiref 1.x channel layer, through its public API only.

``LayerTrials(layer, keeper)`` builds one ``harness.Trial`` per scenario.
``keeper`` does the untimed housekeeping for that layer (purge a channel,
count what it holds, fill it fast); ``Keeper`` is the slow generic one that
uses ``receive`` and ``send``. Used in the harness's process (AMQPChannelLayer)
and in worker processes (asgi_redis in its own virtualenv; the layer of
another source tree), so only the standard library, msgpack and the harness
are imported here.
"""

import random
import string
import time

from .scenarios import GROUP_MEMBERS, MEMBERSHIP_ROOMS, MESSAGE, RECEIVE_CHANNELS

SEND_CHANNEL = "bench.send"
RECEIVE_CHANNEL = "bench.receive"
MULTI_CHANNELS = ["bench.multi%d" % k for k in range(RECEIVE_CHANNELS)]
MULTI_FULL = MULTI_CHANNELS[RECEIVE_CHANNELS // 2]
EMPTY_CHANNELS = ["bench.empty%d" % k for k in range(RECEIVE_CHANNELS)]
WAKEUP_CHANNEL = "bench.wakeup"
GROUP = "bench-group"
GROUP_CHANNELS = ["bench.member%03d" % k for k in range(GROUP_MEMBERS)]
# Group membership (i), (j): process-local channels of two "daphne processes",
# the measured ones and one kept member per group (discard scenarios).
REPLY_BASE = "daphne.response.bench!"
KEEP_BASE = "daphne.response.keep!"
ROOMS = ["bench-room%d" % k for k in range(MEMBERSHIP_ROOMS)]
MEMBERSHIP_SCENARIOS = ("group-add", "group-renew", "group-discard", "group-discard-8t")
CAPACITY = 1000000
EXPIRY = 60

ALL_CHANNELS = (
    [SEND_CHANNEL, RECEIVE_CHANNEL, WAKEUP_CHANNEL]
    + MULTI_CHANNELS
    + GROUP_CHANNELS
    + EMPTY_CHANNELS
    + [REPLY_BASE, KEEP_BASE]
)


def local_channels(base, count):
    """``count`` fresh process-local channels ``base + <random>``, as daphne names
    its WebSocket reply channels."""
    alphabet = string.ascii_letters + string.digits
    tag = "".join(random.choice(alphabet) for _ in range(8))
    return ["%s%s%05d" % (base, tag, i) for i in range(count)]


def memberships(channels):
    """(group, channel) pairs: the channels spread over ``ROOMS`` round robin."""
    return [(ROOMS[i % len(ROOMS)], channel) for i, channel in enumerate(channels)]


class Keeper(object):
    """Untimed housekeeping through the layer's own API (slow but generic)."""

    def __init__(self, layer):
        self.layer = layer

    def purge(self, channel):
        while self.layer.receive([channel], block=False)[0] is not None:
            pass

    def depth(self, channel):
        """Messages waiting in ``channel``, or None if this keeper cannot tell."""
        return None

    def wait_depth(self, channel, expected):
        return self.depth(channel)

    def fill(self, channel, count):
        for _ in range(count):
            self.layer.send(channel, MESSAGE)

    def check_deliveries(self, channel, pairs, present, notices, what):
        """Problems with what one send_group to each group left in ``channel``
        (the process-local channels of ``pairs``), taken or counted here:
        with ``present``, one message per membership, otherwise none.
        ``notices`` ({kind: count}): the join and leave notices of the round,
        for a layer that sends such through the process's queue (asgi_amqp;
        ``broker.MembershipKeeping``); a layer that queues one copy per
        member sends none."""
        expected = len(pairs) if present else 0
        seen = self.wait_depth(channel, expected)
        if seen is None:
            return ["cannot count the messages in %s" % channel]
        if seen != expected:
            return [
                "%s: one send_group to each of %d groups left %d messages in %s, not %d"
                % (what, len(ROOMS), seen, channel, expected)
            ]
        return []

    def check_memberships(self, pairs, present):
        """Problems with the layer's own record of ``pairs`` (group, channel):
        with ``present``, each must be there; otherwise none may. The generic
        check asks ``group_channels``; layers whose record is elsewhere override it."""
        group_channels = getattr(self.layer, "group_channels", None)
        if group_channels is None:
            return []
        wanted = {}
        for group, channel in pairs:
            wanted.setdefault(group, set()).add(channel)
        wrong = 0
        for group, channels in wanted.items():
            found = set(group_channels(group)) & channels
            wrong += len(channels - found) if present else len(found)
        if wrong:
            return [
                "%d of %d memberships %s group_channels"
                % (wrong, len(pairs), "missing from" if present else "still in")
            ]
        return []

    def forget(self, pairs):
        """Remove the memberships ``pairs`` after a round (untimed)."""
        for group, channel in pairs:
            self.layer.group_discard(group, channel)


class LayerTrials(object):
    def __init__(self, layer, keeper):
        self.layer = layer
        self.keeper = keeper
        self._grouped = False

    def has(self, scenario_name):
        return (
            scenario_name
            in ("send", "receive", "receive-10", "poll-10", "group", "wakeup")
            + MEMBERSHIP_SCENARIOS
        )

    def trial(self, scenario_name, ops):
        return getattr(self, "t_" + scenario_name.replace("-", "_"))(ops)

    # -- (a) ---------------------------------------------------------------------

    def t_send(self, ops):
        from .harness import Trial

        layer, keeper, channel = self.layer, self.keeper, SEND_CHANNEL

        def op(_i):
            layer.send(channel, MESSAGE)

        def finish():
            seen = keeper.wait_depth(channel, ops)
            keeper.purge(channel)
            if seen is not None and seen != ops:
                return ["%d messages confirmed but %s in the channel" % (ops, seen)]
            return []

        return Trial(op, prepare=lambda: keeper.purge(channel), finish=finish)

    # -- (c), (d) ---------------------------------------------------------------

    def _receive_trial(self, ops, channels, full):
        from .harness import Trial

        layer, keeper = self.layer, self.keeper

        def prepare():
            for channel in channels:
                keeper.purge(channel)
            keeper.fill(full, ops)
            seen = keeper.wait_depth(full, ops)
            if seen is not None and seen != ops:
                raise RuntimeError("filled %s with %d messages, it holds %s" % (full, ops, seen))

        def op(_i):
            got, message = layer.receive(channels, block=False)
            return got == full and message is not None

        def finish():
            left = keeper.depth(full)
            if left:
                keeper.purge(full)
                return ["%d messages left after %d receives" % (left, ops)]
            return []

        return Trial(op, prepare=prepare, finish=finish)

    def t_receive(self, ops):
        return self._receive_trial(ops, [RECEIVE_CHANNEL], RECEIVE_CHANNEL)

    def t_receive_10(self, ops):
        return self._receive_trial(ops, list(MULTI_CHANNELS), MULTI_FULL)

    # -- (m) ---------------------------------------------------------------------

    def t_poll_10(self, ops):
        from .harness import Trial

        layer, keeper, channels = self.layer, self.keeper, list(EMPTY_CHANNELS)

        def prepare():
            for channel in channels:
                keeper.purge(channel)

        def op(_i):
            return layer.receive(channels, block=False) == (None, None)

        return Trial(op, prepare=prepare, finish=lambda: [])

    # -- (f) -----------------------------------------------------------------------

    def t_group(self, ops):
        from .harness import Trial

        layer, keeper = self.layer, self.keeper

        def prepare():
            if not self._grouped:
                for channel in GROUP_CHANNELS:
                    layer.group_add(GROUP, channel)
                self._grouped = True
            for channel in GROUP_CHANNELS:
                keeper.purge(channel)

        def op(_i):
            layer.send_group(GROUP, MESSAGE)

        def finish():
            expected = ops
            depths = [keeper.wait_depth(channel, expected) for channel in GROUP_CHANNELS]
            for channel in GROUP_CHANNELS:
                keeper.purge(channel)
            if any(d is None for d in depths):
                return []
            trial.delivered = sum(depths)
            short = [(c, d) for c, d in zip(GROUP_CHANNELS, depths) if d != expected]
            if short:
                return [
                    "%d of %d members do not hold %d messages (e.g. %s: %s)"
                    % (len(short), len(depths), expected, short[0][0], short[0][1])
                ]
            return []

        trial = Trial(op, prepare=prepare, finish=finish)
        return trial

    # -- (i), (j) ---------------------------------------------------------------------

    def _membership_trial(self, ops, discard, renew=False):
        from .harness import Trial

        layer, keeper = self.layer, self.keeper
        pairs = memberships(local_channels(REPLY_BASE, ops))
        kept = memberships(local_channels(KEEP_BASE, len(ROOMS))) if discard else []

        def prepare():
            keeper.purge(REPLY_BASE)
            keeper.purge(KEEP_BASE)
            if discard or renew:
                for group, channel in pairs + kept:
                    layer.group_add(group, channel)
                problems = check_membership_round(layer.send_group, keeper, pairs, kept, True)
                if problems:
                    raise RuntimeError("the memberships made untimed: " + "; ".join(problems))

        if discard:

            def op(i):
                group, channel = pairs[i]
                layer.group_discard(group, channel)

        else:

            def op(i):
                group, channel = pairs[i]
                layer.group_add(group, channel)

        def finish():
            try:
                return check_membership_round(layer.send_group, keeper, pairs, kept, not discard)
            finally:
                keeper.forget(pairs + kept)

        return Trial(op, prepare=prepare, finish=finish)

    def t_group_add(self, ops):
        return self._membership_trial(ops, discard=False)

    def t_group_renew(self, ops):
        return self._membership_trial(ops, discard=False, renew=True)

    def t_group_discard(self, ops):
        return self._membership_trial(ops, discard=True)

    t_group_discard_8t = t_group_discard

    # -- (g) -----------------------------------------------------------------------

    def t_wakeup(self, ops):
        from .harness import Trial

        layer, keeper, channel = self.layer, self.keeper, WAKEUP_CHANNEL
        channels = [channel]

        def receive(_i):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got, message = layer.receive(channels, block=True)
                if got is not None:
                    return got == channel and message is not None
            return False

        def send(_i):
            layer.send(channel, MESSAGE)

        return Trial(
            receive=receive, send=send, prepare=lambda: keeper.purge(channel), finish=lambda: []
        )


def check_membership_round(send_group, keeper, pairs, kept, present):
    """Problems found after a membership round (an empty list if none).

    One ``send_group`` per group (``send_group(group, message)``); then
    ``keeper.check_deliveries`` looks at what reached the measured channels'
    shared process-local queue (with ``present``, each membership's message:
    a copy per member, or for asgi_amqp one per group that the process
    copies; otherwise none) and the kept members' queue (each one's
    message); both are emptied. A layer that tells a process
    of its members through that queue has put a join notice per membership
    there in an add round (a leave notice in a discard round); the kept
    members' join notices are there until the first check. Then
    ``keeper.check_memberships`` looks at the layer's own record."""
    problems = []
    for group in ROOMS:
        send_group(group, MESSAGE)
    if kept:
        # Check the kept members first: a message that reaches a discarded
        # member travels as fast as theirs.
        notices = {"join": len(kept)} if present else {}
        problems += keeper.check_deliveries(
            KEEP_BASE, kept, True, notices, "%d kept members" % len(kept)
        )
        if not present:
            time.sleep(0.1)
    notices = {"join" if present else "leave": len(pairs)}
    what = "%d %s memberships" % (len(pairs), "added" if present else "discarded")
    problems += keeper.check_deliveries(REPLY_BASE, pairs, present, notices, what)
    keeper.purge(REPLY_BASE)
    keeper.purge(KEEP_BASE)
    problems += keeper.check_memberships(pairs, present)
    if kept:
        problems += keeper.check_memberships(kept, True)
    return problems
