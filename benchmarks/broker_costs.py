"""What each AMQP method of group membership costs the broker, one by one.

    AMQP_URL=amqp://... python -m benchmarks.broker_costs [--count 300]

For every method ``group_add`` and ``group_discard`` use (with the layer's
names and arguments, ``asgi_amqp.naming.Topology``: a membership is a
binding from its group's exchange whose arguments carry its lease's stamp,
plus a lease message in the lease queue), ``--count`` fresh objects are
made twice on one pika channel:

* **synchronous**: one call at a time, each waiting for its ``-ok`` (a
  publish: for its confirm): the client's round trip plus the broker's
  work (p50 and mean per call);
* **pipelined**: every call sent with ``nowait`` (pika: ``callback=None``),
  then one synchronous ``basic.qos`` (publishes: all sent, then every
  confirm waited for); the wall time over the count is what the broker
  itself needs per call, since nothing waits in between. (The layer never
  sends ``queue.unbind``, which has no ``nowait`` in AMQP 0-9-1.) A
  ``queue.declare`` sent with ``nowait`` does not renew the queue's
  ``x-expires`` (the layer's are always answered).

When the pipelined cost of a method is close to its synchronous cost, the
broker, not the client's waiting, sets the pace. The last rows do whole
memberships with exactly the layer's calls (``benchmarks.membership``),
for a normal channel and for a process-local one, three ways: every call
synchronous; the ``raw-pika-membership`` ceiling's round trips (two per
``group_add``: the confirmed lease and join notice, then the declares and
bindings; one per ``group_discard``); and all memberships pipelined with a
single wait at the end (publishes unconfirmed: the broker's own limit on
one channel). The rows:

* **first membership**: as one process makes ``--count`` of them in 4
  rooms: the group exchange and its binding from the router declared
  again, the stamped binding and the lease message; a normal channel's
  member exchange and its binding to the channel's queue (and the queue's
  answered re-declare); for a process-local channel, the join notice and
  the process queue's answered re-declare, its process's member exchange
  ``m:foo!`` being made once (the layer declares a member exchange only
  when it has not made it lately: ``asgi_amqp.groups.MemberExchanges``);
* **first membership, nothing made lately**: every declare and binding
  of the membership's chain again, as after ``REMADE_AFTER``;
* **renewal**: ``group_add`` again in a later lease stamp: the same calls,
  of which only the stamped binding and the lease message are new; and
  the **renewal's own work** alone: the next stamp's binding and lease
  message (and a process-local channel's join notice);
* **group_discard**: an unbind of every live stamp (most of them not
  there), a process-local channel's leave notice.

Then the **layer itself** (``AMQPChannelLayer``, one call at a time, its
dead-letter worker off): a first membership, its ``group_discard``, and a
renewal in a later stamp, of a normal and of a process-local channel. The
model's rows say what each call costs and what pipelining could reach;
these say what the layer's own calls cost, and are the ones to hold
against a target.

The channels' queues and the groups' exchanges (bound from the router and
kept by a binding of their own) exist beforehand; memberships renewed or
discarded are made untimed. With ``--broker-pid`` (the broker's
``beam.smp`` on this machine) each row also gives the broker's CPU time per
call, from ``/proc/PID/stat``. Everything lives under a prefix of its own
and is deleted at the end. Prints a Markdown table.
"""

import argparse
import os
import statistics
import sys
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import membership  # noqa: E402
from benchmarks.broker import connection_parameters  # noqa: E402

GROUP_EXPIRY = 86400
EXPIRY = 60
CAPACITY = 1000000


def process_cpu(pid):
    """User + system CPU seconds of process ``pid`` so far (0.0 without a pid)."""
    if not pid:
        return 0.0
    with open("/proc/%d/stat" % pid) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Costs(object):
    def __init__(self, url, count, prefix, broker_pid=None):
        from asgi_amqp import naming

        self.count = count
        self.url = url
        self.broker_pid = broker_pid
        self.topology = naming.Topology(prefix, EXPIRY, GROUP_EXPIRY, lambda _c: CAPACITY)
        self.connection = pika.BlockingConnection(connection_parameters(url))
        self.channel = self.connection.channel()
        self.confirmed = membership.PipelinedChannel(self.connection)
        self.unconfirmed = membership.PipelinedChannel(self.connection, confirms=False)
        self.queues = set()
        self.exchanges = set()
        self.rows = []
        self.serial = 0
        topology = self.topology
        self.channel.exchange_declare(topology.dead_letter_exchange, "fanout", durable=True)
        self.channel.exchange_declare(topology.group_router, "direct", durable=True)
        self.channel.queue_declare(
            topology.lease_queue, durable=True, arguments=topology.lease_queue_arguments()
        )
        self.exchanges.update([topology.dead_letter_exchange, topology.group_router])
        self.queues.add(topology.lease_queue)
        # The groups, as a group with members already is: its exchange
        # (auto-delete) bound from the router, and kept by a binding to a
        # queue of its own, so that it outlives every row's unbinds.
        self.keeper = topology.channel_queue("bench.costs.keeper")
        self.channel.queue_declare(self.keeper, durable=True)
        self.queues.add(self.keeper)
        self.rooms = ["costs-r%d" % k for k in range(4)]
        for room in ["costs-room"] + self.rooms:
            group = topology.group_exchange(room)
            self.channel.exchange_declare(group, "fanout", durable=True, auto_delete=True)
            self.channel.exchange_bind(group, topology.group_router, routing_key=room)
            self.channel.queue_bind(self.keeper, group, routing_key="keep")
            self.exchanges.add(group)

    # -- names ----------------------------------------------------------------------

    def fresh(self, what):
        """``count`` fresh normal channels."""
        names = []
        for _ in range(self.count):
            self.serial += 1
            names.append("bench.costs.%s%06d" % (what, self.serial))
        return names

    def fresh_local(self, what):
        """``count`` fresh process-local channels of one fresh process, whose
        queue is made here: (its queue, the channels)."""
        self.serial += 1
        base = "bench.costs.%s%06d!" % (what, self.serial)
        queue = self.topology.channel_queue(base)
        self.channel.queue_declare(
            queue, durable=True, arguments=self.topology.channel_queue_arguments(base)
        )
        return queue, ["%sm%06d" % (base, i) for i in range(self.count)]

    def stamp(self):
        return self.topology.lease_stamp()

    # -- the two ways ---------------------------------------------------------------

    def measure(self, label, calls, prepare=None, cleanup=None):
        """``calls(channel_like, nowait)`` -> list of zero-argument callables."""
        figures = []
        for nowait in (False, True):
            if prepare is not None:
                prepare()
            ops = calls(nowait)
            cpu0 = process_cpu(self.broker_pid)
            if nowait:
                begin = time.perf_counter_ns()
                for op in ops:
                    op()
                self.channel.basic_qos(prefetch_count=0)
                wall = (time.perf_counter_ns() - begin) / 1e9
                figures.append((None, wall / len(ops) * 1e3, len(ops) / wall, self.cpu(cpu0, ops)))
            else:
                durations = []
                begin = time.perf_counter_ns()
                for op in ops:
                    start = time.perf_counter_ns()
                    op()
                    durations.append(time.perf_counter_ns() - start)
                wall = (time.perf_counter_ns() - begin) / 1e9
                figures.append(
                    (
                        statistics.median(durations) / 1e6,
                        sum(durations) / len(durations) / 1e6,
                        len(ops) / wall,
                        self.cpu(cpu0, ops),
                    )
                )
            if cleanup is not None:
                cleanup()
        self.add_row(label, figures)

    def add_row(self, label, figures):
        (sync_p50, sync_mean, sync_rate, sync_cpu), (_none, piped_ms, piped_rate, piped_cpu) = (
            figures
        )
        self.rows.append(
            (label, sync_p50, sync_mean, sync_rate, sync_cpu, piped_ms, piped_rate, piped_cpu)
        )
        print(
            "%-58s sync p50 %6.2f ms mean %6.2f ms (%6.0f/s) | pipelined %6.2f ms (%6.0f/s)"
            % (label, sync_p50, sync_mean, sync_rate, piped_ms, piped_rate),
            flush=True,
        )

    def measure_publishes(self, label, publishes, cleanup):
        """Confirmed publishes (``membership.Call``s from ``publishes()``):
        one confirm waited for at a time, then all sent and every confirm
        waited for together."""
        figures = []
        for together in (False, True):
            calls = publishes()
            cpu0 = process_cpu(self.broker_pid)
            begin = time.perf_counter_ns()
            if together:
                self.confirmed.run(calls)
                wall = (time.perf_counter_ns() - begin) / 1e9
                figures.append((None, wall / len(calls) * 1e3, len(calls) / wall))
            else:
                durations = []
                for call in calls:
                    start = time.perf_counter_ns()
                    self.confirmed.run([call])
                    durations.append(time.perf_counter_ns() - start)
                wall = (time.perf_counter_ns() - begin) / 1e9
                figures.append(
                    (
                        statistics.median(durations) / 1e6,
                        sum(durations) / len(durations) / 1e6,
                        len(calls) / wall,
                    )
                )
            figures[-1] += (self.cpu(cpu0, calls),)
            cleanup()
        self.add_row(label, figures)

    def cpu(self, since, ops):
        """The broker's CPU ms per call since ``since`` (None without a pid)."""
        if not self.broker_pid:
            return None
        return (process_cpu(self.broker_pid) - since) / len(ops) * 1e3

    def rpc(self, nowait, method, *args, **kwargs):
        """A call of ``method``: synchronous on the BlockingChannel, or nowait on its impl."""
        if nowait:
            target = getattr(self.channel._impl, method)
            return lambda: target(*args, callback=None, **kwargs)
        target = getattr(self.channel, method)
        return lambda: target(*args, **kwargs)

    def delete(self, queues=(), exchanges=()):
        impl = self.channel._impl
        for queue in queues:
            impl.queue_delete(queue, callback=None)
        for exchange in exchanges:
            impl.exchange_delete(exchange, callback=None)
        self.channel.basic_qos(prefetch_count=0)

    def purge_leases(self):
        self.channel.queue_purge(self.topology.lease_queue)

    # -- the methods -----------------------------------------------------------------

    def run(self):
        topology = self.topology
        count = self.count

        def new_queues(label, arguments_for, durable=True):
            made = []

            def calls(nowait):
                names = [topology.channel_queue(c) for c in self.fresh("q")]
                made[:] = names
                return [
                    self.rpc(
                        nowait, "queue_declare", n, durable=durable, arguments=arguments_for(n)
                    )
                    for n in names
                ]

            self.measure(label, calls, cleanup=lambda: self.delete(made))

        new_queues(
            "queue.declare, new channel queue (q:, durable, 5 arguments)",
            lambda n: topology.channel_queue_arguments("a.b"),
        )
        new_queues("queue.declare, new queue, durable, no arguments", lambda n: None)
        new_queues("queue.declare, new queue, transient, no arguments", lambda n: None, False)

        base = topology.channel_queue("bench.costs!")
        arguments = topology.channel_queue_arguments("bench.costs!")
        self.channel.queue_declare(base, durable=True, arguments=arguments)
        self.queues.add(base)
        self.measure(
            "queue.declare, existing channel queue (q:, again)",
            lambda nowait: [
                self.rpc(nowait, "queue_declare", base, durable=True, arguments=arguments)
                for _ in range(count)
            ],
        )

        made_x = []

        def new_exchanges(nowait):
            names = [topology.member_exchange(c) for c in self.fresh("x")]
            made_x[:] = names
            return [
                self.rpc(
                    nowait,
                    "exchange_declare",
                    n,
                    exchange_type="fanout",
                    durable=True,
                    auto_delete=True,
                )
                for n in names
            ]

        self.measure(
            "exchange.declare, new (m:, fanout, durable, auto-delete)",
            new_exchanges,
            cleanup=lambda: self.delete(exchanges=made_x),
        )
        group_name = "costs-room"
        group = topology.group_exchange(group_name)
        self.measure(
            "exchange.declare, existing (g:, auto-delete, again)",
            lambda nowait: [
                self.rpc(
                    nowait,
                    "exchange_declare",
                    group,
                    exchange_type="fanout",
                    durable=True,
                    auto_delete=True,
                )
                for _ in range(count)
            ],
        )
        self.measure(
            "exchange.bind, existing (g: from the router, again)",
            lambda nowait: [
                self.rpc(
                    nowait, "exchange_bind", group, topology.group_router, routing_key=group_name
                )
                for _ in range(count)
            ],
        )
        self.bindings(group_name)
        self.publishes(group_name)
        self.whole_memberships()
        self.layer_memberships()

    def bindings(self, group_name):
        """The bindings of a membership and of its member exchange, timed on
        objects made untimed: a normal channel's (member exchange, queue)
        pairs, and process-local channels of one process."""
        topology = self.topology
        group = topology.group_exchange(group_name)
        stamp = self.stamp()
        normal = []  # (member exchange, channel queue, channel)

        def stamped(channel, at):
            return topology.membership_binding(channel, at)[1]

        def make_normal(bound_to_queue=True, stamps=()):
            members = self.fresh("b")
            normal[:] = [
                (topology.member_exchange(c), topology.channel_queue(c), c) for c in members
            ]
            impl = self.channel._impl
            for exchange, queue, channel in normal:
                impl.exchange_declare(
                    exchange, exchange_type="fanout", durable=True, auto_delete=True, callback=None
                )
                impl.queue_declare(
                    queue,
                    durable=True,
                    arguments=topology.channel_queue_arguments(channel),
                    callback=None,
                )
                if bound_to_queue:
                    impl.queue_bind(queue, exchange, routing_key="", callback=None)
                for at in stamps:
                    impl.exchange_bind(
                        exchange,
                        group,
                        routing_key="",
                        arguments=stamped(channel, at),
                        callback=None,
                    )
            self.channel.basic_qos(prefetch_count=0)

        def drop_normal():
            self.delete([q for _x, q, _c in normal], [x for x, _q, _c in normal])

        self.measure(
            "queue.bind, new (q: from m:)",
            lambda nowait: [
                self.rpc(nowait, "queue_bind", q, x, routing_key="") for x, q, _c in normal
            ],
            prepare=lambda: make_normal(bound_to_queue=False),
            cleanup=drop_normal,
        )
        for label, stamps, method, at in (
            ("exchange.bind, new, stamped (m: from g:)", (), "exchange_bind", stamp),
            (
                "exchange.bind, the next stamp of a member (m: from g:)",
                (stamp,),
                "exchange_bind",
                stamp + 1,
            ),
            ("exchange.unbind, stamped (m: from g:)", (stamp,), "exchange_unbind", stamp),
            ("exchange.unbind, stamped, no such binding", (), "exchange_unbind", stamp),
        ):
            self.measure(
                label,
                lambda nowait, method=method, at=at: [
                    self.rpc(
                        nowait,
                        method,
                        x,
                        group,
                        routing_key="",
                        arguments=stamped(c, at),
                    )
                    for x, _q, c in normal
                ],
                prepare=lambda stamps=stamps: make_normal(stamps=stamps),
                cleanup=drop_normal,
            )

        local = []  # [process member exchange (m:foo!), process queue, [channels]]

        def make_local(stamps=()):
            queue, members = self.fresh_local("p")
            exchange = topology.member_exchange(queue.rpartition(":q:")[2])
            local[:] = [exchange, queue, members]
            impl = self.channel._impl
            impl.exchange_declare(
                exchange, exchange_type="fanout", durable=True, auto_delete=True, callback=None
            )
            impl.queue_bind(queue, exchange, routing_key="", callback=None)
            for channel in members:
                for at in stamps:
                    impl.exchange_bind(
                        exchange,
                        group,
                        routing_key="",
                        arguments=stamped(channel, at),
                        callback=None,
                    )
            self.channel.basic_qos(prefetch_count=0)

        def drop_local():
            self.delete([local[1]], [local[0]])

        for label, stamps, method, at in (
            ("exchange.bind, new, stamped (m:foo! from g:)", (), "exchange_bind", stamp),
            (
                "exchange.bind, the next stamp of a member (m:foo! from g:)",
                (stamp,),
                "exchange_bind",
                stamp + 1,
            ),
            ("exchange.unbind, stamped (m:foo! from g:)", (stamp,), "exchange_unbind", stamp),
            ("exchange.unbind, stamped, no such binding (m:foo!)", (), "exchange_unbind", stamp),
        ):
            self.measure(
                label,
                lambda nowait, method=method, at=at: [
                    self.rpc(
                        nowait,
                        method,
                        local[0],
                        group,
                        routing_key="",
                        arguments=stamped(c, at),
                    )
                    for c in local[2]
                ],
                prepare=lambda stamps=stamps: make_local(stamps),
                cleanup=drop_local,
            )

    def publishes(self, group_name):
        """The lease message and the join notice, confirmed."""
        topology = self.topology
        stamp = self.stamp()
        self.measure_publishes(
            "basic.publish + confirm (lease: persistent, to e:)",
            lambda: [
                membership.lease_publish(topology, group_name, c, stamp) for c in self.fresh("l")
            ],
            cleanup=self.purge_leases,
        )
        local = []

        def notices():
            queue, members = self.fresh_local("n")
            local[:] = [queue]
            return [
                membership.notice_publish(topology, "join", group_name, c, stamp) for c in members
            ]

        self.measure_publishes(
            "basic.publish + confirm (join notice, to q:foo!)",
            notices,
            cleanup=lambda: self.delete(local),
        )

    def whole_memberships(self):
        """Whole memberships, three ways (see the module's docstring)."""
        topology = self.topology
        rooms = self.rooms

        def normal_members():
            members = self.fresh("w")
            impl = self.channel._impl
            for member in members:  # channels exist before they join: made by a send
                impl.queue_declare(
                    topology.channel_queue(member),
                    durable=True,
                    arguments=topology.channel_queue_arguments(member),
                    callback=None,
                )
            self.channel.basic_qos(prefetch_count=0)
            return [topology.channel_queue(m) for m in members], members

        def local_members():
            queue, members = self.fresh_local("v")
            return [queue], members

        def joins(members, stamp, made):
            """As one process makes them: a member exchange made once (the
            layer's ``MemberExchanges``, here ``made``)."""
            return [
                membership.add_phases(topology, rooms[i % len(rooms)], member, stamp, made=made)
                for i, member in enumerate(members)
            ]

        def joins_unmade(members, stamp, _made):
            """Each as if its process had made nothing lately: every declare again."""
            return [
                membership.add_phases(topology, rooms[i % len(rooms)], member, stamp)
                for i, member in enumerate(members)
            ]

        def leases_only(members, stamp, _made):
            """The renewal's own calls: the next stamp's binding and lease (and
            a process-local channel's join notice), without the re-declares."""
            made = []
            for i, member in enumerate(members):
                room = rooms[i % len(rooms)]
                first, second = membership.add_phases(topology, room, member, stamp)
                publishes = [call for call in first if call.method == "basic_publish"]
                binding = second[-2 if "!" in member else -1]._replace(answered=True)
                made.append([publishes, [binding]])
            return made

        def discards(members, _stamp, _made):
            return [
                [membership.discard_calls(topology, rooms[i % len(rooms)], member)]
                for i, member in enumerate(members)
            ]

        stamp = self.stamp()
        for kind, make in (("normal", normal_members), ("process-local", local_members)):
            for what, build, before in (
                ("first membership", joins, None),
                ("first membership, nothing made lately", joins_unmade, None),
                ("renewal (a later stamp)", joins, stamp - 1),
                ("renewal's new binding and lease", leases_only, stamp - 1),
                ("group_discard", discards, stamp),
            ):
                for mode, how in (
                    ("sync", "every call synchronous"),
                    ("each", "the ceiling"),
                    ("all", "all pipelined, one wait"),
                ):
                    queues, members = make()
                    made = set()  # what the process made lately
                    if before is not None:  # the memberships exist: made untimed
                        for phases in joins(members, before, made):
                            for phase in phases:
                                self.confirmed.run(phase)
                    operations = build(members, stamp, made)
                    label = "%s, %s: %s" % (what, kind, how)
                    self.whole(label, mode, operations)
                    self.delete(queues, [topology.member_exchange(m) for m in members])
                    self.purge_leases()

    def layer_memberships(self):
        """The same memberships made by ``AMQPChannelLayer`` itself, one call at
        a time: what the layer's calls cost the broker, not a model of them.

        The renewal's memberships are made untimed in the previous stamp
        (the layer's ``Topology.lease_stamp`` answers one less for that), so
        that the timed ``group_add`` binds a later stamp, as the model's
        renewal rows; the layer remembers what it made, as a runworker that
        renews its own memberships does."""
        from asgi_amqp import AMQPChannelLayer

        layer = AMQPChannelLayer(
            url=self.url,
            prefix=self.topology.prefix + "-layer",
            expiry=EXPIRY,
            group_expiry=GROUP_EXPIRY,
            capacity=CAPACITY,
            dead_letter_worker=False,
        )
        rooms = self.rooms
        topology = layer.topology
        now_stamp = topology.lease_stamp

        def members(kind):
            if kind == "normal":
                names = self.fresh("n")
                for name in names:  # channels exist before they join: made by a send
                    layer.send(name, {"made": True})
                return names
            self.serial += 1
            base = "bench.costs.u%06d!" % self.serial
            layer.send(base + "made", {"made": True})
            return [base + "%d" % k for k in range(self.count)]

        def timed(label, call, names):
            cpu0 = process_cpu(self.broker_pid)
            begin = time.perf_counter_ns()
            for i, name in enumerate(names):
                call(rooms[i % len(rooms)], name)
            wall = (time.perf_counter_ns() - begin) / 1e9
            cpu = self.cpu(cpu0, names)
            count = len(names)
            ms, rate = wall / count * 1e3, count / wall
            self.rows.append((label, None, ms, rate, cpu, None, None, None))
            print("%-58s %6.2f ms per membership (%6.0f/s)" % (label, ms, rate), flush=True)

        try:
            layer.groups.ensure_infrastructure()
            for kind in ("normal", "process-local"):
                names = members(kind)
                timed("first membership, %s: the layer" % kind, layer.group_add, names)
                timed("group_discard, %s: the layer" % kind, layer.group_discard, names)
                names = members(kind)
                topology.lease_stamp = lambda now=None: now_stamp(now) - 1
                try:
                    for i, name in enumerate(names):
                        layer.group_add(rooms[i % len(rooms)], name)
                finally:
                    del topology.lease_stamp
                timed("renewal (a later stamp), %s: the layer" % kind, layer.group_add, names)
        finally:
            layer.flush()
            layer.close()

    def whole(self, label, mode, operations):
        """Time ``operations`` (each a list of phases of ``membership.Call``s)
        in ``mode``: ``sync``, ``each`` (a phase is sent together and waited
        for) or ``all`` (every call nowait, publishes unconfirmed, one
        ``basic.qos`` at the end)."""
        count = len(operations)
        cpu0 = process_cpu(self.broker_pid)
        begin = time.perf_counter_ns()
        if mode == "all":
            impl = self.unconfirmed.channel._impl
            for phases in operations:
                for phase in phases:
                    for call in phase:
                        if call.method == "basic_publish":
                            impl.basic_publish(**call.kwargs)
                        else:
                            getattr(impl, call.method)(callback=None, **call.kwargs)
            self.unconfirmed.sync()
        else:
            for phases in operations:
                for phase in phases:
                    self.confirmed.run(phase, one_by_one=mode == "sync")
        wall = (time.perf_counter_ns() - begin) / 1e9
        cpu = self.cpu(cpu0, operations)
        self.rows.append((label, None, wall / count * 1e3, count / wall, cpu, None, None, None))
        print(
            "%-58s %6.2f ms per membership (%6.0f/s)" % (label, wall / count * 1e3, count / wall),
            flush=True,
        )

    def table(self):
        lines = [
            "| method | sync p50 ms | sync mean ms | sync /s | broker CPU ms "
            "| pipelined ms per call | pipelined /s | broker CPU ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]

        def fmt(value, form):
            return "-" if value is None else form % value

        for label, p50, mean, rate, cpu, piped_ms, piped_rate, piped_cpu in self.rows:
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s | %s |"
                % (
                    label,
                    fmt(p50, "%.2f"),
                    fmt(mean, "%.2f"),
                    fmt(rate, "%.0f"),
                    fmt(cpu, "%.2f"),
                    fmt(piped_ms, "%.2f"),
                    fmt(piped_rate, "%.0f"),
                    fmt(piped_cpu, "%.2f"),
                )
            )
        return "\n".join(lines)

    def close(self):
        try:
            self.delete(sorted(self.queues), sorted(self.exchanges))
            self.channel.queue_delete(self.topology.channel_queue("bench.costs!"))
        finally:
            self.connection.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("AMQP_URL"), help="default: $AMQP_URL")
    parser.add_argument("--count", type=int, default=300, help="calls per method and way")
    parser.add_argument(
        "--broker-pid", type=int, default=None, help="the broker's beam.smp, for its CPU time"
    )
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("no broker: give --url or set AMQP_URL")
    prefix = "costs-%s-%d" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), os.getpid())
    costs = Costs(args.url, args.count, prefix, args.broker_pid)
    try:
        version = costs.connection._impl.server_properties.get("version", b"?")
        print(
            "RabbitMQ %s, %d calls per method and way, load %s"
            % (
                version.decode() if isinstance(version, bytes) else version,
                args.count,
                " ".join("%.2f" % x for x in os.getloadavg()),
            ),
            flush=True,
        )
        costs.run()
    finally:
        costs.close()
    print()
    print(costs.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
