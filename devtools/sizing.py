"""What the layer costs the broker: memory, file descriptors and CPU per object.

``python -m devtools.sizing`` (``make sizing``) starts a private RabbitMQ
node of its own (:mod:`devtools.rabbitmq`; a shared broker's other tenants
would be counted too), drives it through the layer itself and measures the
node's beam process after each step:

* **layers**: 0 and then more ``AMQPChannelLayer`` instances, each what one
  runworker or daphne process opens (its connections and AMQP channels,
  a consumer on a shared channel); every layer sends, receives with and
  without blocking, so all of its connections are open;
* **channels**: 0, then more channel queues (classic), each made by a
  ``send`` and holding that one small message;
* **members**: 0, then more process-local channels (``daphne.response!N``,
  the shape of a daphne reply channel) each joined to one of 10 groups
  (``group_add``), then as many more memberships of the same channels in
  a second set of 10 groups. A membership makes no queue: it is a binding
  from the group's exchange to the process's member exchange and a lease
  message in the lease queue; the join notices are read from the
  process's queue, as daphne reads them. Once with classic queues, once
  with ``queue_type="quorum"`` (a quorum lease queue and process queue);
* **quorum**: 0, then more channel queues with ``queue_type="quorum"``;
* **cpu**: the beam's CPU time (``/proc/PID/stat``) for confirmed sends,
  blocking and non-blocking receives, ``send_many`` and group fan-out
  (to ordinary and to process-local members), less the idle node's own
  rate; and the idle node's CPU at the end, holding every queue made;
* **cluster** (``--cluster``): a 3-node cluster, quorum channels on it, the
  memory of each node, and the CPU of all three per confirmed send.

After each step one ``rabbitmqctl eval`` counts the node's connections,
AMQP channels and queues and collects the garbage of every Erlang process;
then it reads the node's memory breakdown (management API
``/api/nodes/NAME/memory``: what the Erlang VM allocated, by category), the
beam's RSS (``VmRSS``: what the memory alarm compares with the watermark,
RabbitMQ's default ``rss`` strategy) and its open file descriptors and
sockets (``/proc/PID/fd``, so run it as root or as the node's user).
Figures per object are least-squares slopes over the steps. It writes
``sizing.json`` and ``sizing.md`` to ``--out`` (default
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from asgi_amqp import AMQPChannelLayer
from devtools.rabbitmq import RabbitNode

__all__ = ["NodeProbe", "Sizing", "main", "slope"]

KIB = 1024
MIB = 1024 * 1024
CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Long enough that nothing the run makes expires while it runs.
LONG = 3600.0
#: RabbitMQ 3.x internals, evaluated on the node: what it holds, then a full collection.
COUNT_AND_COLLECT = (
    "R = {length(rabbit_networking:local_connections()), length(rabbit_channel:list_local()),"
    " length(rabbit_amqqueue:list())}, [erlang:garbage_collect(P) || P <- erlang:processes()], R."
)
#: Memory categories of the breakdown shown in the report.
CATEGORIES = (
    "connection_readers",
    "connection_writers",
    "connection_channels",
    "connection_other",
    "queue_procs",
    "quorum_queue_procs",
    "quorum_ets",
    "binary",
    "mnesia",
    "mgmt_db",
    "metrics",
    "other_ets",
    "other_proc",
    "other_system",
    "allocated_unused",
)


def slope(points: Sequence[Tuple[float, float]]) -> float:
    """The least-squares slope of ``(x, y)`` points (0 for fewer than 2 distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def _repeat(times: int, function: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """A function that calls ``function(*args)`` ``times`` times."""

    def run() -> None:
        for _ in range(times):
            function(*args)

    return run


def _poll_new_channels(layer: AMQPChannelLayer, count: int) -> None:
    for i in range(count):
        layer.receive(["__wait__.sizing.send?%d" % i])


def _check_sent(outcomes: Sequence[Optional[BaseException]]) -> None:
    failed = [o for o in outcomes if o is not None]
    if failed:
        raise RuntimeError("%d of %d sends failed: %r" % (len(failed), len(outcomes), failed[0]))


def _sent_all(layer: AMQPChannelLayer, items: List[Tuple[str, Dict[str, Any]]]) -> None:
    _check_sent(layer.send_many(items))


def _channel_maker(layer: AMQPChannelLayer) -> Callable[[int], None]:
    """make(i): channel i's queue, by a send of one small message."""

    def make(i: int) -> None:
        layer.send("sizing.ch%d" % i, {"text": "x" * 100})

    return make


def _member_maker(layer: AMQPChannelLayer, groups: str) -> Callable[[int], None]:
    """make(i): the process-local channel i joins one of 10 groups named ``groups``N.

    Every 50 memberships the process's queue is read, as daphne reads it all
    the time: the join notices are the process's, not the broker's, to keep.
    """

    def make(i: int) -> None:
        layer.group_add("%s%d" % (groups, i % 10), "daphne.response.x!%d" % i)
        if i % 50 == 49:
            _read_notices(layer)

    return make


def _read_notices(layer: AMQPChannelLayer) -> None:
    """Read the process queue ``daphne.response.x!`` until it is empty (join notices)."""
    deadline = time.monotonic() + 30
    while layer.receive(["daphne.response.x!"], block=False) != (None, None):
        if time.monotonic() > deadline:
            raise RuntimeError("the process queue did not empty within 30 s")


def _mem_total() -> int:
    """The machine's memory (MemTotal), what the memory watermark is a fraction of."""
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) * KIB


def _steps(text: str) -> List[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("steps must be counts of 0 or more")
    return sorted(set([0] + values))


class NodeProbe(object):
    """Reads one private node: its beam through /proc, its memory through the API."""

    def __init__(self, node: RabbitNode) -> None:
        self.node = node
        parts = urllib.parse.urlsplit(node.management_url)
        self._base = "http://%s:%s/api/" % (parts.hostname, parts.port)
        token = "%s:%s" % (parts.username or "guest", parts.password or "guest")
        self._auth = "Basic " + base64.b64encode(token.encode()).decode()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def pid(self) -> int:
        pid = self.node.pid
        if pid is None:
            raise RuntimeError("node %s is not running" % self.node.nodename)
        return pid

    def api(self, path: str) -> Any:
        request = urllib.request.Request(self._base + path)
        request.add_header("Authorization", self._auth)
        with self._opener.open(request, timeout=30) as response:
            return json.loads(response.read().decode("utf-8"))

    def cpu_seconds(self) -> float:
        with open("/proc/%d/stat" % self.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime, stime

    def rss(self) -> int:
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * KIB
        return 0

    def descriptors(self) -> Tuple[int, int]:
        """(open file descriptors, of which sockets) of the beam process."""
        fd_dir = "/proc/%d/fd" % self.pid
        fds = sockets = 0
        for entry in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fd_dir, entry))
                fds += 1
                sockets += target.startswith("socket:")
        return fds, sockets

    def fd_limit(self) -> Optional[int]:
        with open("/proc/%d/limits" % self.pid) as f:
            for line in f:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
        return None

    def collect_and_count(self) -> Tuple[int, int, int]:
        """Count the node's connections, AMQP channels and queues, then collect the
        garbage of every Erlang process: one ``rabbitmqctl eval``."""
        out = self.node.ctl("eval", COUNT_AND_COLLECT).strip()
        connections, channels, queues = (int(v) for v in out.strip("{}").split(","))
        return connections, channels, queues

    def memory(self) -> Dict[str, Any]:
        name = urllib.parse.quote(self.node.nodename, safe="")
        return self.api("nodes/%s/memory" % name)["memory"]

    def sample(self, label: str, count: int) -> Dict[str, Any]:
        """Count and collect garbage, then read everything once."""
        connections, channels, queues = self.collect_and_count()
        memory = self.memory()
        total = memory.get("total", {})
        fds, sockets = self.descriptors()
        return {
            "queues": queues,
            "label": label,
            "count": count,
            "rss": self.rss(),
            "erlang": int(total.get("erlang", 0)),
            "allocated": int(total.get("allocated", 0)),
            "fds": fds,
            "sockets": sockets,
            "connections": connections,
            "amqp_channels": channels,
            "breakdown": {k: int(memory[k]) for k in CATEGORIES if k in memory},
        }


def _family(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Slopes per object of every figure of ``samples`` (one family's steps)."""
    keys = (
        "rss",
        "erlang",
        "allocated",
        "fds",
        "sockets",
        "connections",
        "amqp_channels",
        "queues",
    )
    slopes: Dict[str, Any] = {k: slope([(s["count"], s[k]) for s in samples]) for k in keys}
    slopes["breakdown"] = {
        k: slope([(s["count"], s["breakdown"].get(k, 0)) for s in samples])
        for k in samples[0]["breakdown"]
    }
    return {"samples": samples, "per_object": slopes}


class Sizing(object):
    """One run: the families on one private node, and the cluster if asked."""

    def __init__(self, args: argparse.Namespace, say: Callable[[str], None] = print) -> None:
        self.args = args
        self.say = say
        self.results: Dict[str, Any] = {}
        self._layers: List[AMQPChannelLayer] = []

    # -- helpers ------------------------------------------------------------------------

    def layer(self, node: RabbitNode, prefix: str, **config: Any) -> AMQPChannelLayer:
        config.setdefault("expiry", LONG)
        config.setdefault("group_expiry", LONG)
        config.setdefault("consumer_idle_timeout", LONG)
        config.setdefault("receive_timeout", 5.0)
        layer = AMQPChannelLayer(
            url=node.amqp_url, management_url=node.management_url, prefix=prefix, **config
        )
        self._layers.append(layer)
        return layer

    def close_layers(self) -> None:
        layers, self._layers = self._layers, []
        for layer in reversed(layers):
            with contextlib.suppress(Exception):
                layer.close()

    def _timed(self, what: str, function: Callable[[], Any]) -> float:
        started = time.monotonic()
        function()
        took = time.monotonic() - started
        self.say("  %s: %.1f s" % (what, took))
        return took

    # -- the families -------------------------------------------------------------------

    def family_layers(self, probe: NodeProbe) -> Dict[str, Any]:
        self.say("layers (processes): %s" % self.args.layers)
        samples = [probe.sample("layers", 0)]
        idle = {0: self._idle_cpu(probe)}
        opened: List[AMQPChannelLayer] = []
        prefix = "sz-l"
        for target in self.args.layers[1:]:
            while len(opened) < target:
                layer = self.layer(probe.node, prefix, capacity=1000)
                channel = "sizing.shared"
                layer.send(channel, {"n": len(opened)})
                layer.receive([channel], block=True)
                layer.receive([channel], block=False)
                opened.append(layer)
            samples.append(probe.sample("layers", target))
        idle[len(opened)] = self._idle_cpu(probe)
        self.close_layers()
        result = _family(samples)
        result["idle_cpu_percent"] = idle
        return result

    def _grow(
        self,
        probes: Sequence[NodeProbe],
        label: str,
        steps: Sequence[int],
        make: Callable[[int], None],
        first: Optional[List[List[Dict[str, Any]]]] = None,
    ) -> List[List[Dict[str, Any]]]:
        """Call ``make(i)`` for i = 0, 1, ... up to each count of ``steps``, and
        sample every probe at the start (unless ``first`` is given) and after each step."""
        per_probe = first or [[probe.sample(label, 0)] for probe in probes]
        made = 0
        for target in steps[1:]:
            started = time.monotonic()
            while made < target:
                make(made)
                made += 1
            self.say("  %d %s: %.1f s" % (target, label, time.monotonic() - started))
            for probe, samples in zip(probes, per_probe):
                samples.append(probe.sample(label, target))
        return per_probe

    def _idle_cpu(self, probe: NodeProbe) -> float:
        """The beam's CPU use over ``--idle-seconds`` with nothing sent, in % of one core."""
        before = probe.cpu_seconds()
        started = time.monotonic()
        time.sleep(self.args.idle_seconds)
        return 100.0 * (probe.cpu_seconds() - before) / (time.monotonic() - started)

    def family_channels(self, probe: NodeProbe, quorum: bool = False) -> Dict[str, Any]:
        steps = self.args.quorum if quorum else self.args.channels
        name = "quorum" if quorum else "channels"
        self.say("%s: %s" % (name, steps))
        config: Dict[str, Any] = {"queue_type": "quorum"} if quorum else {}
        layer = self.layer(probe.node, "sz-q" if quorum else "sz-c", **config)
        layer.send("sizing.warm", {"n": 0})  # the layer's own objects are in the baseline
        (samples,) = self._grow([probe], name, steps, _channel_maker(layer))
        self.close_layers()
        return _family(samples)

    def family_members(self, probe: NodeProbe, quorum: bool = False) -> Dict[str, Any]:
        steps = self.args.members
        name = "members (quorum)" if quorum else "members"
        self.say("%s: %s, then as many again in other groups" % (name, steps))
        config: Dict[str, Any] = {"queue_type": "quorum"} if quorum else {}
        layer = self.layer(probe.node, "sz-gq" if quorum else "sz-g", **config)
        # The process's queue and the lease queue are in the baseline too.
        layer.group_add("warm", "daphne.response.x!warm")
        _read_notices(layer)
        (samples,) = self._grow([probe], name, steps, _member_maker(layer, "room"))
        second = [dict(samples[-1], label="second group", count=0)]
        (again,) = self._grow(
            [probe], "second group", steps, _member_maker(layer, "hall"), [second]
        )
        self.close_layers()
        return {"first_group": _family(samples), "second_group": _family(again)}

    def family_cpu(self, probe: NodeProbe) -> Dict[str, Any]:
        n = self.args.messages
        members = self.args.group_members
        self.say("cpu: %d messages, group of %d" % (n, members))
        idle = self._idle_cpu(probe) / 100.0  # core-seconds per second
        results: Dict[str, Any] = {"idle_cpu_percent": 100.0 * idle}

        def measure(what: str, count: int, function: Callable[[], Any]) -> None:
            before = probe.cpu_seconds()
            took = self._timed(what, function)
            used = probe.cpu_seconds() - before
            net = max(0.0, used - idle * took)
            results[what] = {
                "count": count,
                "seconds": took,
                "rate_per_s": count / took if took else 0.0,
                "beam_cpu_s": used,
                "beam_cpu_us_each": 1e6 * net / count,
            }

        message = {"text": "x" * 100}
        bulk = 5 * n  # send_many is fast: more messages for the CPU clock's 10 ms ticks
        for kind in ("classic", "quorum"):
            layer = self.layer(
                probe.node, "sz-%s" % kind[:2], capacity=bulk + n + 10, queue_type=kind
            )
            layer.send("sizing.a", {"n": -1})
            layer.receive(["sizing.a"], block=True)
            layer.send("sizing.b", {"n": -1})
            layer.receive(["sizing.b"], block=False)
            measure("send (%s)" % kind, n, _repeat(n, layer.send, "sizing.a", message))
            measure(
                "blocking receive (%s)" % kind,
                n,
                _repeat(n, layer.receive, ["sizing.a"], True),
            )
            if kind == "classic":
                _check_sent(layer.send_many([("sizing.b", message)] * n))
                measure(
                    "non-blocking receive (%s)" % kind,
                    n,
                    _repeat(n, layer.receive, ["sizing.b"], False),
                )
            measure(
                "send_many (%s)" % kind,
                bulk,
                _repeat(1, _sent_all, layer, [("sizing.c", message)] * bulk),
            )
            if kind == "classic":
                # Channels' enforce_ordering polls a socket's wait channel after each
                # frame: the first poll makes its queue, and expiry deletes it.
                measure("poll that makes its queue", n, _repeat(1, _poll_new_channels, layer, n))
                measure("flush, per queue it deletes", n, layer.flush)
        layer = self.layer(probe.node, "sz-fan", capacity=n + 10)
        for i in range(members):
            layer.group_add("fan", "sizing.member%d" % i)
            layer.group_add("local", "sizing.local!m%d" % i)
        sends = max(1, 10 * n // members)
        measure(
            "group delivery (classic)",
            sends * members,
            _repeat(sends, layer.send_group, "fan", message),
        )
        sends = max(1, n // members)
        measure(
            "group delivery (process-local)",
            sends * members,
            _repeat(sends, layer.send_group, "local", message),
        )
        measure(
            "blocking receive (process-local)",
            sends * members,
            _repeat(sends * members, layer.receive, ["sizing.local!"], True),
        )
        self.close_layers()
        return results

    def cluster(self) -> Dict[str, Any]:
        """Quorum channels on a 3-node cluster: memory on each node, CPU of all three."""
        steps = self.args.quorum
        self.say("cluster: 3 nodes, quorum channels %s" % steps)
        tag = uuid.uuid4().hex[:6]
        nodes = [RabbitNode(name="asgiamqp-sz%d-%s" % (i + 1, tag)) for i in range(3)]
        try:
            threads = [threading.Thread(target=node.start) for node in nodes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for node in nodes[1:]:
                node.join_cluster(nodes[0])
            probes = [NodeProbe(node) for node in nodes]
            layer = self.layer(nodes[0], "sz-cl", queue_type="quorum", capacity=10000)
            layer.send("sizing.warm", {"n": 0})
            per_node = self._grow(probes, "cluster", steps, _channel_maker(layer))
            n = self.args.messages
            message = {"text": "x" * 100}
            before = [p.cpu_seconds() for p in probes]
            took = self._timed(
                "%d sends to a quorum channel" % n,
                _repeat(n, layer.send, "sizing.hot", message),
            )
            used = [p.cpu_seconds() - b for p, b in zip(probes, before)]
            self.close_layers()
            return {
                "nodes": [
                    dict(_family(samples), node=node.nodename)
                    for node, samples in zip(nodes, per_node)
                ],
                "send": {
                    "count": n,
                    "seconds": took,
                    "rate_per_s": n / took if took else 0.0,
                    "beam_cpu_us_each_per_node": [1e6 * u / n for u in used],
                },
            }
        finally:
            self.close_layers()
            for node in nodes:
                with contextlib.suppress(Exception):
                    node.cleanup(graceful=False)

    # -- the run ------------------------------------------------------------------------

    def run(self) -> Dict[str, Any]:
        """Start a private node, measure on it, stop it; then the cluster if asked."""
        started = time.time()
        node = RabbitNode()
        try:
            node.start()
            self.measure(node)
        finally:
            self.close_layers()
            node.cleanup(graceful=False)
        if self.args.cluster and len(self.args.quorum) > 1:
            self.results["cluster"] = self.cluster()
        self.results["run"] = self._run_record(started)
        return self.results

    def measure(self, node: RabbitNode) -> Dict[str, Any]:
        """Every single-node family on ``node``, a private node nothing else uses."""
        probe = NodeProbe(node)
        overview = probe.api("overview")
        self.results["broker"] = {
            "rabbitmq": overview.get("rabbitmq_version"),
            "erlang": overview.get("erlang_version"),
            "node": node.nodename,
            "fd_limit": probe.fd_limit(),
            "memory_strategy": probe.memory().get("strategy"),
            "mem_total": _mem_total(),
            "limits": self._limits(probe),
            "empty_node": probe.sample("empty node", 0),
        }
        try:
            if len(self.args.layers) > 1:
                self.results["layers"] = self.family_layers(probe)
            if self.args.messages:
                self.results["cpu"] = self.family_cpu(probe)
            if len(self.args.channels) > 1:
                self.results["channels"] = self.family_channels(probe)
            if len(self.args.members) > 1:
                self.results["members"] = self.family_members(probe)
                self.results["members_quorum"] = self.family_members(probe, quorum=True)
            if len(self.args.quorum) > 1:
                self.results["quorum"] = self.family_channels(probe, quorum=True)
            self.results["idle_at_end"] = {
                "queues": probe.sample("end", 0)["queues"],
                "cpu_percent": self._idle_cpu(probe),
            }
        finally:
            self.close_layers()
        return self.results

    def _limits(self, probe: NodeProbe) -> Dict[str, Any]:
        """The node's own limits, from /api/nodes once its first statistics are in."""
        deadline = time.monotonic() + 30
        while True:
            node = probe.api("nodes/%s" % urllib.parse.quote(probe.node.nodename, safe=""))
            if "fd_total" in node and "mem_limit" in node or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        keys = ("fd_total", "sockets_total", "mem_limit", "disk_free_limit", "proc_total")
        return {k: node.get(k) for k in keys}

    def _run_record(self, started: float) -> Dict[str, Any]:
        commit = ""
        with contextlib.suppress(Exception):
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            ).stdout.strip()
        mem_total = _mem_total()
        return {
            "command": "python -m devtools.sizing " + " ".join(self.args.argv),
            "started_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
            .replace(microsecond=0)
            .isoformat(),
            "seconds": round(time.time() - started, 1),
            "commit": commit,
            "machine": "%s, %d cores, %.1f GiB"
            % (platform.platform(), os.cpu_count() or 0, mem_total / 1024**3),
            "load_average": os.getloadavg(),
            "python": platform.python_version(),
        }


# -- the report ---------------------------------------------------------------------------


def _kib(value: float) -> str:
    return "%.1f" % (value / KIB)


def _mib(value: float) -> str:
    return "%.1f" % (value / MIB)


def markdown(results: Dict[str, Any]) -> str:
    broker = results["broker"]
    run = results.get("run")
    where = "RabbitMQ %s (Erlang %s), a private node with the management plugin." % (
        broker["rabbitmq"],
        broker["erlang"],
    )
    if run:
        where = "`%s`, %s (UTC), %.0f s, asgi_amqp git %s; %s, load average %s; %s" % (
            run["command"].strip(),
            run["started_utc"],
            run["seconds"],
            run["commit"],
            run["machine"],
            " ".join("%.2f" % v for v in run["load_average"]),
            where,
        )
    lines = [
        "# What the layer costs one RabbitMQ node",
        "",
        where,
        "",
        "Memory is read after a garbage collection of every Erlang process: `erlang` is what the"
        " VM allocated (the management API's memory breakdown), `RSS` the beam's VmRSS. Per"
        " object: the least-squares slope over the steps.",
        "",
        "| node limit | value |",
        "|---|---:|",
        "| open files (beam's ulimit) | %s |" % broker["fd_limit"],
    ]
    limits = broker["limits"]
    for key in ("fd_total", "sockets_total", "mem_limit", "disk_free_limit", "proc_total"):
        value = limits.get(key)
        shown = "%s MiB" % _mib(value) if key.startswith(("mem", "disk")) and value else value
        lines.append("| %s | %s |" % (key, shown))
    lines.append(
        "| memory watermark | %.2f of %s MiB, `%s` strategy |"
        % (
            (limits.get("mem_limit") or 0) / broker["mem_total"],
            _mib(broker["mem_total"]),
            broker["memory_strategy"],
        )
    )
    empty = broker["empty_node"]
    lines += [
        "",
        "Empty node: erlang %s MiB, RSS %s MiB, %d file descriptors (%d sockets)."
        % (_mib(empty["erlang"]), _mib(empty["rss"]), empty["fds"], empty["sockets"]),
        "",
    ]

    def family_table(title: str, family: Dict[str, Any], unit: str) -> None:
        lines.extend(
            [
                "## " + title,
                "",
                "| %s | queues | erlang MiB | RSS MiB | fds | sockets | connections |"
                " AMQP channels |" % unit,
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
        )
        for s in family["samples"]:
            lines.append(
                "| %d | %d | %s | %s | %d | %d | %d | %d |"
                % (
                    s["count"],
                    s["queues"],
                    _mib(s["erlang"]),
                    _mib(s["rss"]),
                    s["fds"],
                    s["sockets"],
                    s["connections"],
                    s["amqp_channels"],
                )
            )
        per = family["per_object"]
        top = sorted(per["breakdown"].items(), key=lambda kv: -kv[1])[:4]
        lines.extend(
            [
                "",
                "Per %s: %.2f queues, erlang %s KiB, RSS %s KiB, %.2f fds, %.2f sockets,"
                " %.2f connections, %.2f AMQP channels; largest categories: %s."
                % (
                    unit,
                    per["queues"],
                    _kib(per["erlang"]),
                    _kib(per["rss"]),
                    per["fds"],
                    per["sockets"],
                    per["connections"],
                    per["amqp_channels"],
                    ", ".join("%s %s KiB" % (k, _kib(v)) for k, v in top),
                ),
                "",
            ]
        )

    if "layers" in results:
        family_table("Layers (one per runworker or daphne process)", results["layers"], "layer")
        idle = results["layers"]["idle_cpu_percent"]
        lines += [
            "Idle broker CPU: %s."
            % ", ".join("%.2f %% of a core with %s layers" % (v, k) for k, v in idle.items()),
            "",
        ]
    if "channels" in results:
        family_table(
            "Channels (classic queues, one small message each)", results["channels"], "channel"
        )
    for key, queues in (("members", "classic queues"), ("members_quorum", "quorum queues")):
        if key in results:
            for part, title in (("first_group", "first group"), ("second_group", "a second group")):
                family_table(
                    "Group members (process-local channels, %s, %s)" % (queues, title),
                    results[key][part],
                    "membership",
                )
    if "quorum" in results:
        family_table(
            "Channels with queue_type=quorum (one small message each)",
            results["quorum"],
            "quorum channel",
        )
    if "cpu" in results:
        cpu = results["cpu"]
        lines += [
            "## Broker CPU per operation",
            "",
            "The beam's CPU time (user + system) during each run, less the idle node's"
            " %.2f %% of a core (RabbitMQ starts the VM with `+sbwt none`: its schedulers do not"
            " spin, so this is work). One client thread at a time: a busier broker batches more"
            " per wake-up." % cpu["idle_cpu_percent"],
            "",
            "| operation | count | rate/s | broker CPU µs each |",
            "|---|---:|---:|---:|",
        ]
        for what, figures in cpu.items():
            if isinstance(figures, dict):
                lines.append(
                    "| %s | %d | %.0f | %.0f |"
                    % (what, figures["count"], figures["rate_per_s"], figures["beam_cpu_us_each"])
                )
        lines.append("")
    if "idle_at_end" in results:
        idle_end = results["idle_at_end"]
        lines += [
            "Idle broker CPU at the end, with %d queues on the node: %.2f %% of a core."
            % (idle_end["queues"], idle_end["cpu_percent"]),
            "",
        ]
    if "cluster" in results:
        cluster = results["cluster"]
        lines += ["## 3-node cluster, quorum channels", ""]
        for node in cluster["nodes"]:
            per = node["per_object"]
            lines.append(
                "* %s: per quorum channel erlang %s KiB, RSS %s KiB (%s)"
                % (
                    node["node"],
                    _kib(per["erlang"]),
                    _kib(per["rss"]),
                    ", ".join(
                        "%d: %s MiB" % (s["count"], _mib(s["erlang"])) for s in node["samples"]
                    ),
                )
            )
        send = cluster["send"]
        lines += [
            "",
            "%d confirmed sends to one quorum channel: %.0f/s; beam CPU per send on each node: %s"
            " µs (no idle rate subtracted)."
            % (
                send["count"],
                send["rate_per_s"],
                ", ".join("%.0f" % v for v in send["beam_cpu_us_each_per_node"]),
            ),
            "",
        ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.sizing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default="benchmarks/results", help="where sizing.json/.md go")
    parser.add_argument("--layers", type=_steps, default=_steps("10,20"))
    parser.add_argument("--channels", type=_steps, default=_steps("1000,2000"))
    parser.add_argument("--members", type=_steps, default=_steps("250,500"))
    parser.add_argument("--quorum", type=_steps, default=_steps("100,200"), help="0: skip")
    parser.add_argument("--messages", type=int, default=3000, help="per CPU run; 0: skip")
    parser.add_argument("--group-members", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--cluster", action="store_true", help="also a 3-node cluster")
    args = parser.parse_args(list(argv))
    args.argv = list(argv)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizing = Sizing(args, say=lambda text: print(text, flush=True))
    results = sizing.run()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sizing.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    report = markdown(results)
    with open(os.path.join(args.out, "sizing.md"), "w") as f:
        f.write(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
