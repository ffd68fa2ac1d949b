"""A layer's prefix as Prometheus metric families: what ``asgi-amqp metrics`` serves.

:class:`LayerCollector` is a collector for a ``prometheus_client`` registry.
Each scrape takes the current reading from
:class:`asgi_amqp.tools.metrics_refresh.Readings` (renewed at most every
``refresh`` seconds) and turns it into families (:func:`families`):

* per ASGI channel, labelled with the channel's name (an ordered channel's
  shard queues summed into it, a process-local queue named ``foo!``) and
  its kind: messages waiting and unacknowledged, capacity, how full its
  fullest queue is, consumers, the broker's publish and delivery rates,
  the age of the oldest message, what it took in and what expired;
* the channels of each kind (the process-local ones are one per process,
  daphne's ``daphne.response.X!`` among them);
* groups, their members and lapsed memberships;
* the dead-letter queue: its backlog, rates and workers;
* the broker's resource alarms;
* the exporter's own: whether the last look worked, how many looks, how
  old the figures are.

Every series carries the ``prefix`` label but the exporter's own and the
alarms (the broker's, not a prefix's). Figures are the management API's,
which samples them every 5 s by default.
"""

import threading
import time
from typing import Callable, Iterable, Iterator, List, Tuple, Union
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .metrics_refresh import Alarms, Reading, Readings
from .snapshot import KINDS, ChannelView, Snapshot

NAMESPACE = "asgi_amqp_"
CHANNEL_LABELS = ["prefix", "channel", "kind"]
Family = Union[GaugeMetricFamily, CounterMetricFamily]


def _gauge(name: str, documentation: str, labels: List[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(NAMESPACE + name, documentation, labels=labels)


def _counter(name: str, documentation: str, labels: List[str]) -> CounterMetricFamily:
    return CounterMetricFamily(NAMESPACE + name, documentation, labels=labels)


def channel_families(prefix: str, channels: Iterable[ChannelView]) -> List[Metric]:
    """Per channel: one series per family, labelled with the ASGI channel's name."""
    figures: List[Tuple[Family, str]] = [
        (_gauge("channel_messages", "Messages waiting (ready).", CHANNEL_LABELS), "depth"),
        (
            _gauge(
                "channel_messages_unacked",
                "Messages delivered to a reader and not yet acknowledged.",
                CHANNEL_LABELS,
            ),
            "unacked",
        ),
        (
            _gauge("channel_consumers", "Consumers (readers) of the channel.", CHANNEL_LABELS),
            "readers",
        ),
        (
            _gauge(
                "channel_publish_rate",
                "Messages per second published to the channel (the broker's rate).",
                CHANNEL_LABELS,
            ),
            "in_rate",
        ),
        (
            _gauge(
                "channel_deliver_rate",
                "Messages per second delivered to readers (the broker's rate).",
                CHANNEL_LABELS,
            ),
            "out_rate",
        ),
        (
            _gauge(
                "channel_queues",
                "Queues holding the channel: 1, or with an ordered channel's shards.",
                CHANNEL_LABELS,
            ),
            "queues",
        ),
        (
            _counter(
                "channel_messages_taken_in",
                "Messages the channel's queues took in since they exist.",
                CHANNEL_LABELS,
            ),
            "taken_in",
        ),
        (
            _counter(
                "channel_messages_expired",
                "Messages that left the channel's queues undelivered (expired).",
                CHANNEL_LABELS,
            ),
            "expired",
        ),
    ]
    capacity = _gauge(
        "channel_capacity",
        "Messages each of the channel's queues holds at most (absent when unknown).",
        CHANNEL_LABELS,
    )
    fill = _gauge(
        "channel_fill_ratio",
        "Messages held by the channel's fullest queue over its capacity (0 to 1).",
        CHANNEL_LABELS,
    )
    age = _gauge(
        "channel_oldest_message_age_seconds",
        "Seconds the oldest waiting message has waited (0 when none waits).",
        CHANNEL_LABELS,
    )
    members = _gauge(
        "process_local_group_members",
        "Channels of a process-local queue (one per process) that are group members.",
        CHANNEL_LABELS,
    )
    for channel in sorted(channels, key=lambda c: c.name):
        labels = [prefix, channel.name, channel.kind]
        for family, attribute in figures:
            family.add_metric(labels, getattr(channel, attribute))
        if channel.capacity:
            capacity.add_metric(labels, channel.capacity)
            fill.add_metric(labels, channel.fill)
        age.add_metric(labels, channel.oldest_age or 0.0)
        if channel.kind == "process-local":
            members.add_metric(labels, channel.local_members)
    found: List[Metric] = [family for family, _ in figures]
    return found + [capacity, fill, age, members]


def families(snapshot: Snapshot) -> List[Metric]:
    """Every family of one snapshot: channels, groups and dead letters."""
    prefix = snapshot.prefix
    found = channel_families(prefix, snapshot.channels)
    kinds = _gauge("channels", "Channels of each kind.", ["prefix", "kind"])
    for kind in KINDS:
        kinds.add_metric([prefix, kind], len(snapshot.by_kind(kind)))
    found.append(kinds)

    groups = _gauge("groups", "Groups with at least one membership.", ["prefix"])
    groups.add_metric([prefix], len(snapshot.groups))
    memberships = _gauge("group_memberships", "Memberships of every group.", ["prefix"])
    memberships.add_metric([prefix], sum(g.members for g in snapshot.groups))
    members = _gauge("group_members", "Members of the group.", ["prefix", "group"])
    lapsed = _gauge(
        "group_members_lapsed",
        "Members whose lease ended (group_expiry passed): being dropped.",
        ["prefix", "group"],
    )
    for group in sorted(snapshot.groups, key=lambda g: g.name):
        members.add_metric([prefix, group.name], group.members)
        lapsed.add_metric([prefix, group.name], group.lapsed)
    found.extend([groups, memberships, members, lapsed])

    dead = snapshot.dead_letters
    dead_figures: List[Tuple[Family, float]] = [
        (
            _gauge(
                "dead_letters_queue_exists",
                "1 once the dead-letter queue exists (the first group was used).",
                ["prefix"],
            ),
            int(dead.exists),
        ),
        (
            _gauge(
                "dead_letters_messages",
                "Dead-letter events waiting for a worker: the backlog.",
                ["prefix"],
            ),
            dead.pending,
        ),
        (
            _counter(
                "dead_letters_taken_in",
                "Dead-letter events since the queue exists.",
                ["prefix"],
            ),
            dead.taken_in,
        ),
        (
            _gauge("dead_letters_in_rate", "Dead-letter events per second in.", ["prefix"]),
            dead.in_rate,
        ),
        (
            _gauge(
                "dead_letters_handled_rate",
                "Dead-letter events per second the workers handled.",
                ["prefix"],
            ),
            dead.handled_rate,
        ),
        (
            _gauge("dead_letters_workers", "Dead-letter workers (consumers).", ["prefix"]),
            dead.workers,
        ),
    ]
    for family, value in dead_figures:
        family.add_metric([prefix], value)
        found.append(family)
    return found


def alarm_families(alarms: Alarms) -> List[Metric]:
    """The broker's resource alarms; none when the broker cannot tell."""
    if alarms is None:
        return []
    count = _gauge("broker_alarms", "Resource alarms in effect in the cluster.", [])
    count.add_metric([], len(alarms))
    each = _gauge(
        "broker_alarm",
        "1 for each resource alarm in effect (memory, disk space), by node.",
        ["node", "resource"],
    )
    for alarm in alarms:
        each.add_metric([alarm["node"], alarm["resource"]], 1)
    return [count, each]


def exporter_families(reading: Reading, readings: Readings, now: float) -> List[Metric]:
    """The exporter's own figures: ``now`` is ``time.monotonic()``."""
    values: List[Tuple[Family, float]] = [
        (
            _gauge("up", "1 when the last look at the management API worked, else 0.", []),
            0 if reading.error else 1,
        ),
        (
            _counter("collections", "Looks at the management API since the start.", []),
            readings.looks,
        ),
        (
            _counter("collection_errors", "Looks at the management API that failed.", []),
            readings.failures,
        ),
        (
            _gauge("collection_duration_seconds", "Seconds the last look took.", []),
            reading.duration,
        ),
        (
            _gauge("snapshot_age_seconds", "Seconds since the last look ended.", []),
            max(0.0, now - reading.taken_at),
        ),
        (
            _gauge(
                "refresh_interval_seconds",
                "Least seconds between two looks (--refresh).",
                [],
            ),
            readings.refresh,
        ),
    ]
    for family, value in values:
        family.add_metric([], value)
    return [family for family, _ in values]


class LayerCollector(Collector):
    """The prefix's figures for a ``prometheus_client`` registry, from ``readings``."""

    def __init__(self, readings: Readings, clock: Callable[[], float] = time.monotonic) -> None:
        self._readings = readings
        self._now = clock

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not look at the broker

    def collect(self) -> Iterator[Metric]:
        reading = self._readings.current()
        yield from exporter_families(reading, self._readings, self._now())
        if reading.snapshot is not None:
            yield from families(reading.snapshot)
            yield from alarm_families(reading.alarms)


def serve(readings: Readings, host: str, port: int) -> Tuple[WSGIServer, threading.Thread]:
    """An HTTP server for the registry of ``readings``' families on ``host:port``
    (port 0: a free one, see ``server_address``), serving in a daemon thread.
    Any path answers; Prometheus asks ``/metrics``. Stop it with
    ``shutdown()`` and ``server_close()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LayerCollector(readings))
    return start_http_server(port, addr=host, registry=registry)
