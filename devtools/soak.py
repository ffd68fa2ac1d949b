"""A soak run: mixed traffic through one layer for a long time, and bounds on what grows.

``python -m devtools.soak --minutes 30 --out DIR`` (``make soak``) runs, in
this one process and through one :class:`asgi_amqp.AMQPChannelLayer`, the
traffic of a busy Channels 1.x worker at a moderate, steady rate:

* sender threads sending to shared channels (``soak.shared.N``) and to
  process-local channels (``soak.local!sN``);
* a blocking and a polling (non-blocking) receiver reading them;
* group churn: ``group_add`` of new and renewed members (single-reader
  ``soak.member?xyz`` channels nobody reads, whose messages expire, and
  process-local ``soak.local!gN`` members the receivers read),
  ``send_group`` and ``group_discard``, with a short ``group_expiry``;
* short-lived channels (``soak.tmp?xyz``): one message each, half of them
  read, half left to expire, so their queues go by ``x-expires``;
* a connection kill every ``--kill-every`` seconds
  (``rabbitmqctl close_all_connections``), on a private node only.

Every ``--sample-every`` seconds it records the process's RSS
(``/proc/self/status``), thread count, open file descriptors, the
broker's queue, exchange and binding counts under the soak's prefix and
the broker node's memory (management API). The samples go to
``DIR/samples.csv``, the figures and the verdict to ``DIR/summary.json``
and a chart to ``DIR/soak.png``.

The broker is a private node of its own (:mod:`devtools.rabbitmq`) unless
``$AMQP_URL`` (and ``$AMQP_MANAGEMENT_URL``) name one. Connections are
killed only on a node this run started; on a given broker the run skips
the kills and says so.

Bounds (the run exits with status 1 and names each bound that failed)
---------------------------------------------------------------------
The warm-up is the first 20 % of the traffic time (``--warmup``).

* **layer errors**: no call on the layer raised, kills included: the layer
  promises that a connection lost and back within ``operation_timeout``
  raises nothing.
* **hung calls**: every traffic thread ended within its join timeout.
* **traffic**: at least half of the target direct send rate was reached.
* **rss growth**: the RSS of the last sample under traffic exceeds the
  highest RSS of the warm-up by at most ``--rss-growth-mib`` (20 MiB).
* **threads**, **fds**: after the warm-up, never more than the warm-up's
  highest count plus ``--thread-margin`` (4) or ``--fd-margin`` (8).
* **broker queues, exchanges, bindings**: at every sample, at most the
  baseline (the prefix's objects before the traffic) plus the objects the
  traffic may keep alive at that moment, plus 10 % of those, at least 10.
  What the traffic may keep alive comes from a ledger of every object
  each call makes or renews, each kept until its last use plus the
  longest life the layer gives it (a channel queue: ``consumer_idle_timeout
  + 2 x expiry``; a membership's binding of one lease stamp: until the
  stamp's lease ends, at most 1 1/4 x ``group_expiry``, and 2 s for the
  dead-letter worker) plus 10 s.
* **back to baseline**: after the traffic stopped, the counts are back to
  the baseline within that longest life plus 10 s.
* **connection kills**: on a private node, every kill succeeded.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import dataclasses
import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.errors import ManagementAPIError
from asgi_amqp.management import ManagementClient
from asgi_amqp.urls import management_url_for, vhost_of
from devtools.rabbitmq import Broker, RabbitNode, provide_broker

__all__ = ["SoakConfig", "Soak", "main"]

MIB = 1024 * 1024
#: Added to every object's predicted life: the broker's timers, the
#: management API's view and the dead-letter worker after a kill all lag.
SLACK = 10.0
COUNTS = ("queues", "exchanges", "bindings")
#: What :meth:`Worker.call` returns when the call raised.
FAILED: Any = object()


@dataclasses.dataclass
class SoakConfig:
    """What to run and the bounds to hold it to (the command line's options)."""

    minutes: float = 30.0
    out: str = "soak-results"
    rate: float = 200.0  # direct sends per second, all sender threads together
    senders: int = 2
    shared_channels: int = 4
    local_channels: int = 8
    groups: int = 8
    group_ops: float = 4.0  # group_add (+ send_group) per second
    short_lived: float = 2.0  # short-lived channels per second
    expiry: float = 10.0
    group_expiry: float = 20.0
    consumer_idle_timeout: float = 10.0
    kill_every: float = 30.0
    kills: bool = True
    sample_every: float = 10.0
    warmup: float = 0.2
    rss_growth_mib: float = 20.0
    thread_margin: int = 4
    fd_margin: int = 8
    seed: Optional[int] = None

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def channel_life(self) -> float:
        """Longest a channel queue outlives its last use: the consumer a
        receive left is cancelled when idle, then ``x-expires`` (2 x expiry)."""
        return self.consumer_idle_timeout + 2 * self.expiry

    def lease_life(self) -> float:
        """Longest a membership's binding of one stamp lives from its
        ``group_add``: to its stamp's end, ``group_expiry`` and a slice (a
        quarter), and 2 s for the dead-letter worker that removes it."""
        return self.group_expiry * 1.25 + 2.0

    def settle(self) -> float:
        """How long the broker may take to be back at the baseline after the traffic."""
        return max(self.channel_life(), self.lease_life()) + SLACK


# -- counting ---------------------------------------------------------------------------------


class Tally:
    """Thread-safe counts of what the traffic did, and of what raised.

    Only counts and the first few error texts are kept, so that the
    harness itself does not grow with the run and spoil the RSS bound.
    """

    KEEP_ERRORS = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Dict[str, int] = collections.Counter()
        self.errors: Dict[str, int] = collections.Counter()
        self.error_texts: List[str] = []

    def add(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def error(self, call: str, exc: BaseException, elapsed: float) -> None:
        with self._lock:
            self.errors["%s %s" % (call, type(exc).__name__)] += 1
            if len(self.error_texts) < self.KEEP_ERRORS:
                self.error_texts.append(
                    "%s raised %s after %.1f s: %s"
                    % (call, type(exc).__name__, elapsed, str(exc)[:200])
                )

    def snapshot(self) -> Tuple[Dict[str, int], int]:
        with self._lock:
            return dict(self.counts), sum(self.errors.values())


class Ledger:
    """The broker objects the traffic may keep alive, each until a deadline.

    Every call that makes or renews an object records it here with the time
    it may live until (its last use plus the longest life the layer gives
    it, plus :data:`SLACK`). The broker's counts at any moment must stay
    below the baseline plus what is live here: that is the bound derived
    from the traffic, not a guess. Entries past their deadline are dropped,
    so the ledger stays as small as the live set.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: Dict[Tuple[str, str], float] = {}

    def keep(self, kind: str, name: str, life: float) -> None:
        """``kind`` is "queue", "exchange" or "binding"; ``name`` tells them apart."""
        deadline = time.monotonic() + life + SLACK
        key = (kind, name)
        with self._lock:
            if self._until.get(key, 0.0) < deadline:
                self._until[key] = deadline

    def live(self) -> Dict[str, int]:
        """Counts of live queues, exchanges and bindings (every queue also has its
        binding from the default exchange)."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, until in self._until.items() if until < now]:
                del self._until[key]
            kinds = collections.Counter(kind for kind, _ in self._until)
        return {
            "queues": kinds["queue"],
            "exchanges": kinds["exchange"],
            "bindings": kinds["binding"] + kinds["queue"],
        }

    @staticmethod
    def bound(baseline: int, live: int) -> int:
        return baseline + live + max(10, live // 10)


# -- traffic ----------------------------------------------------------------------------------


class Worker(threading.Thread):
    """One traffic thread: :meth:`step` at ``rate`` per second until stopped.

    Every layer call goes through :meth:`call`, which counts what raised
    (the soak fails on any) and goes on after a short pause, as a worker
    process would.
    """

    rate: float = 0.0  # steps per second; 0: as fast as step returns

    def __init__(self, soak: "Soak", name: str) -> None:
        super().__init__(name="soak-%s" % name, daemon=True)
        self.soak = soak
        self.layer = soak.layer
        self.tally = soak.tally
        self.ledger = soak.ledger
        self.config = soak.config
        self.random = random.Random(soak.random.random())
        self.stopping = threading.Event()

    def call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``; on an exception: counted, :data:`FAILED` returned
        after a pause."""
        started = time.monotonic()
        try:
            return function(*args)
        except Exception as exc:  # every kind is counted; the bound is zero
            self.tally.error(what, exc, time.monotonic() - started)
            self.stopping.wait(0.1)
            return FAILED

    def run(self) -> None:
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.step()
            if interval:
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self.stopping.wait(delay)
                elif delay < -1.0:  # fell behind (a kill): do not burst to catch up
                    next_at = time.monotonic()

    def step(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()


class DirectSender(Worker):
    """Sends numbered messages to the shared and the process-local channels in turn."""

    def __init__(self, soak: "Soak", index: int) -> None:
        super().__init__(soak, "sender-%d" % index)
        self.rate = self.config.rate / self.config.senders
        self.targets = soak.shared + soak.locals_
        self.n = 0

    def step(self) -> None:
        self.n += 1
        channel = self.targets[self.n % len(self.targets)]
        self.ledger.keep("queue", self.soak.queue_of(channel), self.config.channel_life())
        if (
            self.call("send", self.layer.send, channel, {"kind": "direct", "n": self.n})
            is not FAILED
        ):
            self.tally.add("direct sent")


class Receiver(Worker):
    """Reads the shared channels and the process-local queue, blocking or polling.

    A polling receiver pauses 10 ms when it found nothing, as daphne's
    busy loop does.
    """

    def __init__(self, soak: "Soak", block: bool) -> None:
        super().__init__(soak, "receiver-%s" % ("blocking" if block else "polling"))
        self.block = block
        self.sources = soak.shared + [soak.local_base]
        self.last_message = time.monotonic()

    def step(self) -> None:
        for channel in self.sources:
            self.ledger.keep("queue", self.soak.queue_of(channel), self.config.channel_life())
        what = "receive(block=True)" if self.block else "receive"
        got = self.call(what, self.layer.receive, self.sources, self.block)
        if got is FAILED or got[0] is None:
            if not self.block:
                self.stopping.wait(0.01)
            return
        self.last_message = time.monotonic()
        self.tally.add("%s received" % got[1].get("kind", "unknown"))


class GroupChurn(Worker):
    """``group_add`` (new members and renewals), ``send_group`` and ``group_discard``.

    New members are single-reader channels nobody reads (their group
    messages expire, which drops them from their groups) or process-local
    channels the receivers read; a membership not renewed lapses after
    ``group_expiry``. Each step sends one message to the group it touched.
    """

    def __init__(self, soak: "Soak") -> None:
        super().__init__(soak, "groups")
        self.rate = self.config.group_ops
        # Per group, the members added within group_expiry: what can be renewed or discarded.
        self.members: Dict[str, Deque[Tuple[float, str]]] = {
            "soak-group-%d" % i: collections.deque() for i in range(self.config.groups)
        }
        self.n = 0

    def step(self) -> None:
        group = self.random.choice(sorted(self.members))
        members = self.members[group]
        horizon = time.monotonic() - self.config.group_expiry / 2
        while members and members[0][0] < horizon:
            members.popleft()
        roll = self.random.random()
        if members and roll < 0.2:
            _, channel = members[self.random.randrange(len(members))]
            if self.call("group_discard", self.layer.group_discard, group, channel) is not FAILED:
                self.tally.add("group_discard")
        else:
            if members and roll < 0.45:
                channel = members[self.random.randrange(len(members))][1]  # a renewal
            elif self.random.random() < 0.5:
                channel = self.layer.new_channel("soak.member?")
            else:
                channel = "%s%s" % (self.soak.local_base, "g" + uuid.uuid4().hex[:10])
            self.keep_membership(group, channel)
            if self.call("group_add", self.layer.group_add, group, channel) is not FAILED:
                self.tally.add("group_add")
                members.append((time.monotonic(), channel))
        self.n += 1
        message = {"kind": "group", "n": self.n}
        if self.call("send_group", self.layer.send_group, group, message) is not FAILED:
            self.tally.add("send_group")

    def keep_membership(self, group: str, channel: str) -> None:
        """Record what ``group_add`` makes or renews, with how long each may live."""
        config, keep, soak = self.config, self.ledger.keep, self.soak
        lease = config.lease_life()
        stamp = self.layer.topology.lease_stamp()
        queue = soak.queue_of(channel)
        keep("queue", queue, config.channel_life())
        keep("exchange", "g:" + group, lease)
        keep("binding", "router>g:" + group, lease)
        # A normal channel's own member exchange, or for a process-local
        # channel its process's (m:foo!, shared by the process's channels),
        # the binding's arguments naming the member.
        member = queue[len("q:") :]
        keep("exchange", "m:" + member, config.channel_life())
        keep("binding", "m:%s>%s" % (member, queue), config.channel_life())
        keep("binding", "g:%s>m:%s %s@%d" % (group, member, channel, stamp), lease)


class ShortLivedChannels(Worker):
    """Fresh ``soak.tmp?xyz`` channels with one message each: half are read at
    once, half are left alone, so the message expires and then the queue."""

    def __init__(self, soak: "Soak") -> None:
        super().__init__(soak, "short-lived")
        self.rate = self.config.short_lived
        self.n = 0

    def step(self) -> None:
        self.n += 1
        channel = self.layer.new_channel("soak.tmp?")
        self.ledger.keep("queue", self.soak.queue_of(channel), self.config.channel_life())
        if (
            self.call("send", self.layer.send, channel, {"kind": "short", "n": self.n})
            is not FAILED
        ):
            self.tally.add("short sent")
            if self.n % 2:
                got = self.call("receive", self.layer.receive, [channel], False)
                if got is not FAILED and got[0] is not None:
                    self.tally.add("short received")
            else:
                self.tally.add("short left to expire")


class ConnectionKiller(Worker):
    """``rabbitmqctl close_all_connections`` on the soak's own node every ``kill_every`` s.

    Only a node this run started: killing connections on a broker someone
    else runs would hit their clients too.
    """

    def __init__(self, soak: "Soak", node: RabbitNode) -> None:
        super().__init__(soak, "killer")
        self.node = node
        self.kill_times: List[float] = []
        self.failures: List[str] = []

    def run(self) -> None:
        # The first kill one interval in, the last one at least an interval
        # before the end, so every kill is followed by traffic.
        while not self.stopping.wait(self.config.kill_every):
            self.step()

    def step(self) -> None:
        try:
            self.node.close_all_connections("soak kill %d" % (len(self.kill_times) + 1))
        except Exception as exc:  # the harness's failure, not the layer's
            self.failures.append(str(exc)[:200])
        else:
            self.kill_times.append(time.monotonic())
            self.tally.add("connection kills")


# -- measuring --------------------------------------------------------------------------------


class ProcessProbe:
    """This process's RSS, threads and open file descriptors, from /proc."""

    @staticmethod
    def rss_mib() -> float:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS in /proc/self/status")

    @staticmethod
    def threads() -> int:
        return threading.active_count()

    @staticmethod
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))


class BrokerProbe(ManagementClient):
    """The soak prefix's queues, exchanges and bindings, and the node's memory.

    The layer's own management client lists queues and exchanges by name
    prefix; bindings cannot be filtered by the API, so the vhost's are read
    in one request and those that touch the prefix counted (each queue's
    binding from the default exchange included).
    """

    def __init__(self, broker: Broker, prefix: str) -> None:
        url = broker.management_url or management_url_for(broker.amqp_url)
        super().__init__(url, vhost_of(broker.amqp_url), timeout=10.0)
        self.prefix = prefix + ":"

    def counts(self) -> Dict[str, int]:
        bindings = self._get("bindings/%s" % self._vhost, {"columns": "source,destination"})
        touching = sum(
            1
            for b in bindings or []
            if str(b.get("source", "")).startswith(self.prefix)
            or str(b.get("destination", "")).startswith(self.prefix)
        )
        return {
            "queues": len(self.queue_names(self.prefix)),
            "exchanges": len(self.exchange_names(self.prefix)),
            "bindings": touching,
        }

    def left(self) -> Dict[str, int]:
        """The prefix's queues and exchanges by kind (``q``, ``k``, ``m``, ...)."""
        names = self.queue_names(self.prefix) + self.exchange_names(self.prefix)
        kinds = collections.Counter(name[len(self.prefix) :].split(":")[0] for name in names)
        return dict(sorted(kinds.items()))

    def node_memory_mib(self) -> Optional[float]:
        """Memory used by the broker's node(s), summed; None if the API does not say."""
        nodes = self._get("nodes", {"columns": "name,mem_used"}) or []
        used = [n["mem_used"] for n in nodes if isinstance(n.get("mem_used"), (int, float))]
        return sum(used) / MIB if used else None


@dataclasses.dataclass
class Sample:
    """One row of samples.csv."""

    t: float
    phase: str  # "warmup", "run" or "settle"
    rss_mib: float
    threads: int
    fds: int
    queues: Optional[int] = None
    exchanges: Optional[int] = None
    bindings: Optional[int] = None
    bound_queues: Optional[int] = None
    bound_exchanges: Optional[int] = None
    bound_bindings: Optional[int] = None
    node_mem_mib: Optional[float] = None
    sent: int = 0
    received: int = 0
    errors: int = 0
    kills: int = 0


class Sampler(threading.Thread):
    """Takes a :class:`Sample` every ``sample_every`` s while the traffic runs."""

    def __init__(self, soak: "Soak") -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.soak = soak
        self.stopping = threading.Event()

    def run(self) -> None:
        interval = self.soak.config.sample_every
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.soak.take_sample()
            next_at += interval
            self.stopping.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self.stopping.set()


# -- the verdict ------------------------------------------------------------------------------


@dataclasses.dataclass
class Bound:
    name: str
    limit: str
    observed: str
    ok: bool


class Verdict:
    """Holds the samples and the counts to the bounds in the module's docstring."""

    def __init__(self, soak: "Soak") -> None:
        self.soak = soak
        self.config = soak.config
        samples = soak.samples
        self.warmup = [s for s in samples if s.phase == "warmup"] or samples[:1]
        self.later = [s for s in samples if s.phase != "warmup"]
        self.run = [s for s in samples if s.phase in ("warmup", "run")]

    def bounds(self) -> List[Bound]:
        return [
            self.layer_errors(),
            self.hung_calls(),
            self.traffic(),
            self.rss_growth(),
            self.ceiling("threads", self.config.thread_margin),
            self.ceiling("fds", self.config.fd_margin),
            *[self.broker_count(what) for what in COUNTS],
            self.back_to_baseline(),
            self.connection_kills(),
        ]

    def layer_errors(self) -> Bound:
        errors = self.soak.tally.errors
        total = sum(errors.values())
        detail = ", ".join("%s: %d" % kv for kv in sorted(errors.items()))
        return Bound(
            "layer errors", "0", "%d%s" % (total, " (%s)" % detail if detail else ""), not total
        )

    def hung_calls(self) -> Bound:
        hung = self.soak.hung
        return Bound("hung calls", "0 threads", "%d %s" % (len(hung), hung or ""), not hung)

    def traffic(self) -> Bound:
        seconds = max(self.soak.traffic_seconds, 1e-9)
        want = 0.5 * self.config.rate
        rate = self.soak.tally.counts["direct sent"] / seconds
        return Bound("traffic", ">= %.0f sends/s" % want, "%.0f sends/s" % rate, rate >= want)

    def rss_growth(self) -> Bound:
        base = max(s.rss_mib for s in self.warmup)
        end = self.run[-1].rss_mib
        growth = end - base
        return Bound(
            "rss growth",
            "<= %.0f MiB" % self.config.rss_growth_mib,
            "%+.1f MiB (warm-up max %.1f, end %.1f)" % (growth, base, end),
            growth <= self.config.rss_growth_mib,
        )

    def ceiling(self, field: str, margin: int) -> Bound:
        base = max(getattr(s, field) for s in self.warmup)
        peak = max((getattr(s, field) for s in self.later), default=base)
        return Bound(
            field,
            "<= %d (warm-up max %d + %d)" % (base + margin, base, margin),
            "max %d" % peak,
            peak <= base + margin,
        )

    def broker_count(self, what: str) -> Bound:
        rows = [s for s in self.soak.samples if getattr(s, what) is not None]
        over = [s for s in rows if getattr(s, what) > getattr(s, "bound_" + what)]
        peak = max(rows, key=lambda s: getattr(s, what), default=None)
        if peak is None:
            return Bound("broker " + what, "derived", "no sample", False)
        worst = max(
            over, key=lambda s: getattr(s, what) - getattr(s, "bound_" + what), default=peak
        )
        observed = "peak %d (bound then %d)" % (getattr(peak, what), getattr(peak, "bound_" + what))
        if over:
            observed += "; %d samples over, worst %d > %d at %.0f s" % (
                len(over),
                getattr(worst, what),
                getattr(worst, "bound_" + what),
                worst.t,
            )
        return Bound("broker " + what, "baseline + live + max(10, 10%)", observed, not over)

    def back_to_baseline(self) -> Bound:
        soak = self.soak
        after = soak.settled_after
        ok = after is not None
        if after is not None:
            observed = "after %.0f s" % after
        else:
            observed = "not within %.0f s: %s" % (self.config.settle(), soak.last_counts)
        return Bound(
            "back to baseline",
            "%s within %.0f s" % (soak.baseline, self.config.settle()),
            observed,
            ok,
        )

    def connection_kills(self) -> Bound:
        killer = self.soak.killer
        if killer is None:
            return Bound("connection kills", "-", "skipped: %s" % self.soak.kills_skipped, True)
        failed = killer.failures
        observed = "%d done, %d failed%s" % (
            len(killer.kill_times),
            len(failed),
            " (%s)" % failed[0] if failed else "",
        )
        return Bound("connection kills", "0 failed", observed, not failed)


class Chart:
    """``soak.png``: the four sampled figures against time, with their bounds.

    matplotlib is imported here only, with the Agg backend (no display), so
    the soak's RSS never includes it during the traffic.
    """

    @staticmethod
    def draw(soak: "Soak", path: str) -> Optional[str]:
        try:
            import matplotlib  # noqa: PLC0415

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: PLC0415
        except ImportError:
            return None
        samples, config = soak.samples, soak.config
        t = [s.t / 60.0 for s in samples]
        fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
        (ax_rss, ax_proc), (ax_broker, ax_node) = axes
        verdict = Verdict(soak)
        warm_rss = max(s.rss_mib for s in verdict.warmup)
        ax_rss.plot(t, [s.rss_mib for s in samples], label="RSS")
        ax_rss.axhline(warm_rss + config.rss_growth_mib, color="red", ls="--", label="bound")
        ax_rss.set_ylabel("MiB")
        ax_rss.set_title("soak process RSS")
        for field, margin, color in (
            ("threads", config.thread_margin, "tab:blue"),
            ("fds", config.fd_margin, "tab:orange"),
        ):
            ax_proc.plot(t, [getattr(s, field) for s in samples], color=color, label=field)
            ceiling = max(getattr(s, field) for s in verdict.warmup) + margin
            ax_proc.axhline(ceiling, color=color, ls="--", lw=0.8, label=field + " bound")
        ax_proc.set_title("threads and open file descriptors")
        for field, color in zip(COUNTS, ("tab:blue", "tab:orange", "tab:green")):
            rows = [(x, s) for x, s in zip(t, samples) if getattr(s, field) is not None]
            ax_broker.plot(
                [x for x, _ in rows], [getattr(s, field) for _, s in rows], color=color, label=field
            )
            bounded = [(x, s) for x, s in rows if getattr(s, "bound_" + field) is not None]
            ax_broker.plot(
                [x for x, _ in bounded],
                [getattr(s, "bound_" + field) for _, s in bounded],
                color=color,
                ls="--",
                lw=0.8,
                label=field + " bound",
            )
        ax_broker.set_title("broker objects under the prefix")
        memory = [(x, s.node_mem_mib) for x, s in zip(t, samples) if s.node_mem_mib is not None]
        ax_node.plot([x for x, _ in memory], [m for _, m in memory], color="tab:purple")
        ax_node.set_ylabel("MiB")
        ax_node.set_title("broker node memory (mem_used)")
        warm_end = config.seconds * config.warmup / 60.0
        kills = [(k - soak.started) / 60.0 for k in (soak.killer.kill_times if soak.killer else [])]
        for ax in axes.flat:
            ax.axvspan(0, warm_end, color="0.92")
            for k in kills:
                ax.axvline(k, color="0.7", lw=0.5)
            ax.axvline(soak.traffic_seconds / 60.0, color="k", lw=0.8)
            ax.grid(alpha=0.3)
        for ax in (ax_rss, ax_proc, ax_broker):
            ax.legend(fontsize=8, loc="upper left")
        for ax in axes[1]:
            ax.set_xlabel(
                "minutes (grey: warm-up; thin lines: connection kills; black: traffic stops)"
            )
        fig.suptitle("asgi_amqp soak, %g min" % config.minutes)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path


# -- the run ----------------------------------------------------------------------------------


class Soak:
    """One soak run on ``broker``; ``node`` is the private node to kill connections
    on (None: no kills). :meth:`run` returns the bounds, each held or not."""

    def __init__(
        self,
        config: SoakConfig,
        broker: Broker,
        node: Optional[RabbitNode] = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.broker = broker
        self.node = node
        self.say = say
        self.random = random.Random(config.seed)
        self.prefix = "soak-%s" % uuid.uuid4().hex[:8]
        self.tally = Tally()
        self.ledger = Ledger()
        self.probe = BrokerProbe(broker, self.prefix)
        self.samples: List[Sample] = []
        self.baseline: Dict[str, int] = {}
        self.last_counts: Optional[Dict[str, int]] = None
        self.settled_after: Optional[float] = None
        self.left_at_end: Dict[str, int] = {}
        self.hung: List[str] = []
        self.killer: Optional[ConnectionKiller] = None
        self.kills_skipped = ""
        self.broker_errors = 0
        self.started = time.monotonic()
        self.traffic_seconds = 0.0
        token = uuid.uuid4().hex[:6]
        self.shared = ["soak.shared.%d" % i for i in range(config.shared_channels)]
        self.local_base = "soak.local%s!" % token
        self.locals_ = ["%ss%d" % (self.local_base, i) for i in range(config.local_channels)]
        self.layer = AMQPChannelLayer(
            url=broker.amqp_url,
            management_url=broker.management_url,
            prefix=self.prefix,
            expiry=config.expiry,
            group_expiry=config.group_expiry,
            capacity=1000,
            receive_timeout=2.0,
            consumer_idle_timeout=config.consumer_idle_timeout,
        )

    @staticmethod
    def queue_of(channel: str) -> str:
        """The ledger's name of a channel's queue (``foo!bar`` lives in ``foo!``)."""
        return "q:" + (channel[: channel.index("!") + 1] if "!" in channel else channel)

    # -- the steps, in order --------------------------------------------------------------

    def run(self) -> List[Bound]:
        try:
            self.take_baseline()
            workers = self.start_traffic()
            self.run_for(self.config.seconds)
            self.stop_traffic(workers)
            self.settle()
        finally:
            self.layer.close()
        return Verdict(self).bounds()

    def take_baseline(self) -> None:
        """The prefix's objects before any traffic: the layer's infrastructure only
        (router, dead-letter exchange and queue), made by a send to an empty group."""
        self.layer.send_group("soak-nobody", {"kind": "none"})
        self.baseline = self.probe.counts()
        self.say("baseline on the broker: %s" % self.baseline)

    def start_traffic(self) -> List[Worker]:
        """The traffic threads, the sampler and, on a node of our own, the killer."""
        config = self.config
        workers: List[Worker] = [DirectSender(self, i) for i in range(config.senders)]
        workers += [Receiver(self, True), Receiver(self, False), GroupChurn(self)]
        workers += [ShortLivedChannels(self)]
        if not config.kills:
            self.kills_skipped = "--no-kills"
        elif self.node is None:
            self.kills_skipped = "the broker was not started by this run"
        else:
            self.killer = ConnectionKiller(self, self.node)
            workers.append(self.killer)
        if self.kills_skipped:
            self.say("connection kills skipped: %s" % self.kills_skipped)
        self.started = time.monotonic()
        for worker in workers:
            worker.start()
        self.sampler = Sampler(self)
        self.sampler.start()
        return workers

    def run_for(self, seconds: float) -> None:
        """Let the traffic run, with a progress line every minute."""
        end = self.started + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 60.0))
            counts, errors = self.tally.snapshot()
            last = self.samples[-1] if self.samples else None
            self.say(
                "%5.1f min: %d sent, %d received, %d group sends, %d errors, %d kills; %s"
                % (
                    (time.monotonic() - self.started) / 60.0,
                    counts.get("direct sent", 0),
                    counts.get("direct received", 0),
                    counts.get("send_group", 0),
                    errors,
                    counts.get("connection kills", 0),
                    "rss %.1f MiB, %d threads, %d fds, broker %s/%s/%s"
                    % (
                        last.rss_mib,
                        last.threads,
                        last.fds,
                        last.queues,
                        last.exchanges,
                        last.bindings,
                    )
                    if last
                    else "",
                )
            )

    def stop_traffic(self, workers: List[Worker]) -> None:
        """Stop the senders, let the receivers drain what was sent, then stop them."""
        self.traffic_seconds = time.monotonic() - self.started
        receivers = [w for w in workers if isinstance(w, Receiver)]
        others = [w for w in workers if not isinstance(w, Receiver)]
        for worker in others:
            worker.stop()
        join = self.layer.operation_timeout * 3 + 5
        self.join(others, join)
        quiet = 2.0
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if all(time.monotonic() - r.last_message > quiet for r in receivers):
                break
            time.sleep(0.2)
        for worker in receivers:
            worker.stop()
        self.join(receivers, join)
        self.sampler.stop()
        self.sampler.join(30)
        self.take_sample()

    def join(self, workers: Sequence[threading.Thread], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                self.hung.append(worker.name)

    def settle(self) -> None:
        """Wait for the broker's counts to return to the baseline, sampling."""
        stopped = time.monotonic()
        deadline = stopped + self.config.settle()
        next_sample = stopped + self.config.sample_every
        while True:
            counts = self.broker_counts()
            self.last_counts = counts
            if counts == self.baseline:
                self.settled_after = time.monotonic() - stopped
                self.take_sample(counts)
                self.say("back to the baseline %.0f s after the traffic" % self.settled_after)
                return
            if time.monotonic() > deadline:
                self.take_sample(counts)
                with contextlib.suppress(ManagementAPIError):
                    self.left_at_end = self.probe.left()
                self.say(
                    "not back to the baseline: %s, not %s; left by kind: %s"
                    % (counts, self.baseline, self.left_at_end)
                )
                return
            if time.monotonic() >= next_sample:
                self.take_sample(counts)
                next_sample += self.config.sample_every
                with contextlib.suppress(ManagementAPIError):
                    self.say(
                        "%.0f s after the traffic, left by kind: %s"
                        % (time.monotonic() - stopped, self.probe.left())
                    )
            time.sleep(1.0)

    # -- measuring ------------------------------------------------------------------------

    def broker_counts(self) -> Optional[Dict[str, int]]:
        try:
            return self.probe.counts()
        except ManagementAPIError as exc:
            self.broker_errors += 1
            self.say("the management API failed: %s" % exc)
            return None

    def phase(self, t: float) -> str:
        if self.traffic_seconds:
            return "settle"
        return "warmup" if t <= self.config.seconds * self.config.warmup else "run"

    def take_sample(self, counts: Optional[Dict[str, int]] = None) -> Sample:
        t = time.monotonic() - self.started
        phase = self.phase(t)
        if counts is None:
            counts = self.broker_counts()
        live = self.ledger.live()
        totals, errors = self.tally.snapshot()
        sample = Sample(
            t=round(t, 1),
            phase=phase,
            rss_mib=round(ProcessProbe.rss_mib(), 2),
            threads=ProcessProbe.threads(),
            fds=ProcessProbe.fds(),
            sent=totals.get("direct sent", 0),
            received=totals.get("direct received", 0),
            errors=errors,
            kills=totals.get("connection kills", 0),
        )
        if counts is not None:
            for what in COUNTS:
                setattr(sample, what, counts[what])
                setattr(sample, "bound_" + what, Ledger.bound(self.baseline[what], live[what]))
        with contextlib.suppress(ManagementAPIError):
            memory = self.probe.node_memory_mib()
            sample.node_mem_mib = round(memory, 1) if memory is not None else None
        self.samples.append(sample)
        return sample

    # -- output ---------------------------------------------------------------------------

    def write(self, bounds: List[Bound]) -> Dict[str, str]:
        """samples.csv, summary.json and soak.png in ``config.out``; their paths."""
        out = self.config.out
        os.makedirs(out, exist_ok=True)
        paths = {"samples": os.path.join(out, "samples.csv")}
        fields = [f.name for f in dataclasses.fields(Sample)]
        with open(paths["samples"], "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for sample in self.samples:
                writer.writerow(dataclasses.asdict(sample))
        counts, errors = self.tally.snapshot()
        summary = {
            "config": dataclasses.asdict(self.config),
            "broker": self.broker.description,
            "prefix": self.prefix,
            "traffic_seconds": round(self.traffic_seconds, 1),
            "counts": counts,
            "errors": dict(self.tally.errors),
            "error_texts": self.tally.error_texts,
            "baseline": self.baseline,
            "settled_after": self.settled_after,
            "left_at_end": self.left_at_end,
            "management_api_failures": self.broker_errors,
            "kills_skipped": self.kills_skipped,
            "bounds": [dataclasses.asdict(b) for b in bounds],
            "passed": all(b.ok for b in bounds),
        }
        paths["summary"] = os.path.join(out, "summary.json")
        with open(paths["summary"], "w") as handle:
            json.dump(summary, handle, indent=2, sort_keys=True)
        chart = Chart.draw(self, os.path.join(out, "soak.png"))
        if chart:
            paths["chart"] = chart
        else:
            self.say("no chart: matplotlib is not installed (pip install matplotlib)")
        return paths

    def table(self, bounds: List[Bound]) -> str:
        """The summary table: the traffic's totals, then each bound."""
        counts, _ = self.tally.snapshot()
        seconds = max(self.traffic_seconds, 1e-9)
        lines = [
            "traffic: %.1f min, %d direct sends (%.0f/s), %d received, %d group_add, "
            "%d group_discard, %d send_group, %d short-lived channels (%d read, %d left to "
            "expire), %d connection kills"
            % (
                self.traffic_seconds / 60.0,
                counts.get("direct sent", 0),
                counts.get("direct sent", 0) / seconds,
                counts.get("direct received", 0),
                counts.get("group_add", 0),
                counts.get("group_discard", 0),
                counts.get("send_group", 0),
                counts.get("short sent", 0),
                counts.get("short received", 0),
                counts.get("short left to expire", 0),
                counts.get("connection kills", 0),
            ),
            "",
        ]
        rows = [("bound", "limit", "observed", "")] + [
            (b.name, b.limit, b.observed, "ok" if b.ok else "FAILED") for b in bounds
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for row in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
        return "\n".join(lines)


# -- the command line -------------------------------------------------------------------------


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive, not %s" % text)
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> SoakConfig:
    defaults = SoakConfig()
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.soak",
        description=doc.split("\n\n")[0],
        epilog="Bounds" + doc.split("\nBounds", 1)[1] if "\nBounds" in doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--minutes",
        type=_positive,
        default=defaults.minutes,
        help="traffic time (30; 2: a smoke run)",
    )
    add(
        "--out",
        default=None,
        help="where samples.csv, summary.json, soak.png go (soak-results/UTC time)",
    )
    add("--rate", type=_positive, default=defaults.rate, help="direct sends per second (200)")
    add("--expiry", type=_positive, default=defaults.expiry, help="the layer's expiry (10 s)")
    add("--group-expiry", type=_positive, default=defaults.group_expiry, help="group_expiry (20 s)")
    add(
        "--consumer-idle-timeout",
        type=_positive,
        default=defaults.consumer_idle_timeout,
        help="the layer's consumer_idle_timeout (10 s)",
    )
    add(
        "--kill-every",
        type=_positive,
        default=defaults.kill_every,
        help="seconds between kills (30)",
    )
    add("--no-kills", action="store_true", help="do not kill connections")
    add("--sample-every", type=_positive, default=defaults.sample_every, help="seconds (10)")
    add("--warmup", type=float, default=defaults.warmup, help="warm-up share of the run (0.2)")
    add("--rss-growth-mib", type=float, default=defaults.rss_growth_mib, help="RSS bound (20)")
    add("--thread-margin", type=int, default=defaults.thread_margin, help="threads bound (4)")
    add("--fd-margin", type=int, default=defaults.fd_margin, help="fds bound (8)")
    add("--seed", type=int, default=None, help="random seed of the traffic's choices")
    args = parser.parse_args(argv)
    out = args.out or os.path.join("soak-results", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    return SoakConfig(
        minutes=args.minutes,
        out=out,
        rate=args.rate,
        expiry=args.expiry,
        group_expiry=args.group_expiry,
        consumer_idle_timeout=args.consumer_idle_timeout,
        kill_every=args.kill_every,
        kills=not args.no_kills,
        sample_every=args.sample_every,
        warmup=args.warmup,
        rss_growth_mib=args.rss_growth_mib,
        thread_margin=args.thread_margin,
        fd_margin=args.fd_margin,
        seed=args.seed,
    )


@contextlib.contextmanager
def soak_broker() -> Iterator[Broker]:
    """``$AMQP_URL``'s broker, else a private node of this run's own (never Docker:
    the kills need ``rabbitmqctl`` on the node)."""
    with provide_broker(allow_docker=False) as broker:
        yield broker


def run_soak(
    config: SoakConfig, say: Callable[[str], None] = print
) -> Tuple[List[Bound], Dict[str, str], str]:
    """A whole soak: the broker, the run, the files; (bounds, paths, table)."""
    with soak_broker() as broker:
        say("broker: %s" % broker.description)
        soak = Soak(config, broker, broker.owner, say)
        bounds = soak.run()
        paths = soak.write(bounds)
        return bounds, paths, soak.table(bounds)


def main(argv: Optional[Sequence[str]] = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # every kill logs a page otherwise

    def say(text: str) -> None:
        print("soak: " + text, flush=True)

    say("%g min of traffic, results in %s" % (config.minutes, config.out))
    bounds, paths, table = run_soak(config, say)
    print(table)
    for kind, path in sorted(paths.items()):
        say("%s: %s" % (kind, path))
    failed = [b for b in bounds if not b.ok]
    if failed:
        say(
            "FAILED: %s"
            % "; ".join("%s (%s, limit %s)" % (b.name, b.observed, b.limit) for b in failed)
        )
        return 1
    say("passed: every bound held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
