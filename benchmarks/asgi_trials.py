"""The scenarios for any asgiref 1.x channel layer, through its public API only.

``LayerTrials(layer, keeper)`` builds one ``harness.Trial`` per scenario.
``keeper`` does the untimed housekeeping for that layer (purge a channel,
count what it holds, fill it fast); ``Keeper`` is the slow generic one that
uses ``receive`` and ``send``. Used in the harness's process (AMQPChannelLayer,
asgiref.inmemory) and in worker processes (asgi_redis in its own virtualenv;
the layer for the memory scenario), so only the standard library, msgpack
and the harness are imported here.
"""

import os
import random
import string
import threading
import time

from .harness import RoundResult
from .scenarios import GROUP_MEMBERS, MEMBERSHIP_ROOMS, MESSAGE, RECEIVE_CHANNELS

SEND_CHANNEL = "bench.send"
RECEIVE_CHANNEL = "bench.receive"
MULTI_CHANNELS = ["bench.multi%d" % k for k in range(RECEIVE_CHANNELS)]
MULTI_FULL = MULTI_CHANNELS[RECEIVE_CHANNELS // 2]
EMPTY_CHANNELS = ["bench.empty%d" % k for k in range(RECEIVE_CHANNELS)]
# One daphne process's reply channels: it receives from their common base
# (the part up to the '!'), and a message names the WebSocket it is for.
LOCAL_BASE = "daphne.response.poll!"
LOCAL_FULL = LOCAL_BASE + "ws05"
ROUNDTRIP_CHANNEL = "bench.roundtrip"
WAKEUP_CHANNEL = "bench.wakeup"
GROUP = "bench-group"
GROUP_CHANNELS = ["bench.member%03d" % k for k in range(GROUP_MEMBERS)]
MEMORY_CHANNELS = ["bench.mem%d" % k for k in range(4)]
# Group membership (i)-(l): process-local channels of two "daphne processes",
# the measured ones and one kept member per group (discard scenarios).
REPLY_BASE = "daphne.response.bench!"
KEEP_BASE = "daphne.response.keep!"
ROOMS = ["bench-room%d" % k for k in range(MEMBERSHIP_ROOMS)]
MEMBERSHIP_SCENARIOS = ("group-add", "group-discard", "group-add-8t", "group-discard-8t")
CAPACITY = 1000000
EXPIRY = 60

ALL_CHANNELS = (
    [SEND_CHANNEL, RECEIVE_CHANNEL, ROUNDTRIP_CHANNEL, WAKEUP_CHANNEL]
    + MULTI_CHANNELS
    + GROUP_CHANNELS
    + MEMORY_CHANNELS
    + EMPTY_CHANNELS
    + [REPLY_BASE, KEEP_BASE, LOCAL_BASE]
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
    def __init__(self, layer, keeper, blocking=True):
        self.layer = layer
        self.keeper = keeper
        self.blocking = blocking  # False: receive(block=True) does not wait (inmemory)
        self._grouped = False

    def has(self, scenario_name):
        if scenario_name == "wakeup":
            return self.blocking
        return (
            scenario_name
            in (
                "send",
                "send-8t",
                "receive",
                "receive-10",
                "poll-10",
                "poll-local",
                "receive-local",
                "roundtrip",
                "group",
                "memory",
            )
            + MEMBERSHIP_SCENARIOS
        )

    def trial(self, scenario_name, ops, options=None):
        from .harness import Trial

        method = getattr(self, "t_" + scenario_name.replace("-", "_"))
        if scenario_name == "memory":
            return Trial(run=lambda ops: method(ops, options or {}))
        return method(ops)

    # -- (a), (b) ---------------------------------------------------------------

    def _send_trial(self, ops):
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

    t_send = _send_trial
    t_send_8t = _send_trial

    # -- (c), (d) ---------------------------------------------------------------

    def _receive_trial(self, ops, channels, full, stored=None):
        """``stored``: where ``full``'s messages are kept, if not under its own
        name (a process-local channel's base)."""
        from .harness import Trial

        layer, keeper = self.layer, self.keeper
        stored = stored or full

        def prepare():
            for channel in channels:
                keeper.purge(channel)
            keeper.fill(full, ops)
            seen = keeper.wait_depth(stored, ops)
            if seen is not None and seen != ops:
                raise RuntimeError("filled %s with %d messages, it holds %s" % (full, ops, seen))

        def op(_i):
            got, message = layer.receive(channels, block=False)
            return got == full and message is not None

        def finish():
            left = keeper.depth(stored)
            if left:
                keeper.purge(stored)
                return ["%d messages left after %d receives" % (left, ops)]
            return []

        return Trial(op, prepare=prepare, finish=finish)

    def t_receive(self, ops):
        return self._receive_trial(ops, [RECEIVE_CHANNEL], RECEIVE_CHANNEL)

    def t_receive_10(self, ops):
        return self._receive_trial(ops, list(MULTI_CHANNELS), MULTI_FULL)

    def t_receive_local(self, ops):
        return self._receive_trial(ops, [LOCAL_BASE], LOCAL_FULL, stored=LOCAL_BASE)

    # -- (m), (n) ---------------------------------------------------------------

    def _poll_trial(self, channels):
        from .harness import Trial

        layer, keeper = self.layer, self.keeper

        def prepare():
            for channel in channels:
                keeper.purge(channel)

        def op(_i):
            return layer.receive(channels, block=False) == (None, None)

        return Trial(op, prepare=prepare, finish=lambda: [])

    def t_poll_10(self, ops):
        return self._poll_trial(list(EMPTY_CHANNELS))

    def t_poll_local(self, ops):
        return self._poll_trial([LOCAL_BASE])

    # -- (e) -----------------------------------------------------------------------

    def t_roundtrip(self, ops):
        from .harness import Trial

        layer, keeper, channel = self.layer, self.keeper, ROUNDTRIP_CHANNEL
        channels = [channel]

        def op(_i):
            layer.send(channel, MESSAGE)
            got, message = layer.receive(channels, block=True)
            return got == channel and message is not None

        return Trial(op, prepare=lambda: keeper.purge(channel), finish=lambda: [])

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

    # -- (i)-(l) ---------------------------------------------------------------------

    def _membership_trial(self, ops, discard):
        from .harness import Trial

        layer, keeper = self.layer, self.keeper
        pairs = memberships(local_channels(REPLY_BASE, ops))
        kept = memberships(local_channels(KEEP_BASE, len(ROOMS))) if discard else []

        def prepare():
            keeper.purge(REPLY_BASE)
            keeper.purge(KEEP_BASE)
            if discard:
                for group, channel in pairs + kept:
                    layer.group_add(group, channel)
                problems = check_membership_round(layer.send_group, keeper, pairs, kept, True)
                if problems:
                    raise RuntimeError("the memberships to discard: " + "; ".join(problems))

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

    def t_group_discard(self, ops):
        return self._membership_trial(ops, discard=True)

    t_group_add_8t = t_group_add
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

    # -- (h) -----------------------------------------------------------------------

    def t_memory(self, ops, options):
        return run_memory(self.layer, options, progress=options.get("progress"))


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


def rss_bytes():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_memory(layer, options, progress=None):
    """Send and receive ``options["to"]`` messages, recording RSS every
    ``options["step"]`` messages received; samples: seq = checkpoint,
    value = RSS bytes, dur = time since the previous checkpoint."""
    total = int(options.get("to", 300000))
    step = int(options.get("step", 10000))
    senders = int(options.get("senders", 4))
    receivers = int(options.get("receivers", 2))
    window = threading.BoundedSemaphore(int(options.get("window", 2000)))
    channels = list(MEMORY_CHANNELS)
    lock = threading.Lock()
    state = {"sent": 0, "received": 0, "next": step}
    errors = []
    stop = threading.Event()
    perf = time.perf_counter_ns
    checkpoints = []  # (t_ns, dur_ns, received, rss)
    begin = perf()
    last = [begin]
    checkpoints.append((begin, 0, 0, rss_bytes()))

    def send_loop(k):
        n = 0
        while not stop.is_set():
            with lock:
                if state["sent"] >= total:
                    return
                state["sent"] += 1
            while not window.acquire(timeout=1):
                if stop.is_set():
                    return
            try:
                layer.send(channels[n % len(channels)], MESSAGE)
            except Exception as exc:
                errors.append("send: %s: %s" % (type(exc).__name__, exc))
                window.release()
                if len(errors) > 20:
                    stop.set()
            n += 1

    def receive_loop():
        while not stop.is_set():
            try:
                got, message = layer.receive(channels, block=True)
            except Exception as exc:
                errors.append("receive: %s: %s" % (type(exc).__name__, exc))
                if len(errors) > 20:
                    stop.set()
                continue
            if got is None:
                with lock:
                    if state["received"] >= total:
                        return
                continue
            window.release()
            with lock:
                state["received"] += 1
                received = state["received"]
                checkpoint = received >= state["next"] or received >= total
                if checkpoint:
                    state["next"] += step
            if checkpoint:
                now = perf()
                checkpoints.append((now, now - last[0], received, rss_bytes()))
                last[0] = now
                if progress:
                    progress(received, total)
            if received >= total:
                stop.set()
                return

    threads = [threading.Thread(target=send_loop, args=(k,), daemon=True) for k in range(senders)]
    threads += [threading.Thread(target=receive_loop, daemon=True) for _ in range(receivers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + float(options.get("timeout", 3600))
    while any(t.is_alive() for t in threads):
        if time.monotonic() > deadline:
            errors.append("timed out after %.0f s" % float(options.get("timeout", 3600)))
            stop.set()
            break
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(15)
    wall = (perf() - begin) / 1e9
    result = RoundResult(
        len(checkpoints),
        wall,
        [c[0] for c in checkpoints],
        [c[1] for c in checkpoints],
        [True] * len(checkpoints),
        errors[:20],
        None,
        [float(c[3]) for c in checkpoints],
    )
    result.units = state["received"]
    result.extra = {
        "seq": [c[2] for c in checkpoints],
        "sent": state["sent"],
        "received": state["received"],
    }
    if state["received"] < total:
        result.problems.append("only %d of %d messages received" % (state["received"], total))
    return result
