"""What each AMQP method of group membership costs the broker, one by one.

    AMQP_URL=amqp://... python -m benchmarks.broker_costs [--count 300]

For every method ``group_add`` and ``group_discard`` use (with the layer's
names and arguments, ``asgi_amqp.naming.Topology``), ``--count`` fresh
objects are made twice on one pika channel:

* **synchronous**: one RPC at a time, each waiting for its ``-ok``: the
  client's round trip plus the broker's work (p50 and mean per call);
* **pipelined**: every call sent with ``nowait`` (pika: ``callback=None``),
  then one synchronous ``basic.qos``; the wall time over the count is what
  the broker itself needs per call, since nothing waits in between.

When the pipelined cost of a method is close to its synchronous cost, the
broker, not the client's waiting, sets the pace. The last rows do a whole
membership the same ways: the layer's chain of eight steps and the marker's
confirmed publish, synchronous step by step; each membership pipelined with
one wait (the ``raw-pika-membership`` ceiling); and all memberships pipelined
with a single wait at the end (the broker's own limit for this topology on
one channel). With ``--broker-pid`` (the broker's ``beam.smp`` on this
machine) each row also gives the broker's CPU time per call, from
``/proc/PID/stat``. Everything lives under a prefix of its own and is
deleted at the end. Prints a Markdown table.
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
        self.broker_pid = broker_pid
        self.topology = naming.Topology(prefix, EXPIRY, GROUP_EXPIRY, lambda _c: CAPACITY)
        self.connection = pika.BlockingConnection(connection_parameters(url))
        self.channel = self.connection.channel()
        self.confirmed = self.connection.channel()
        self.confirmed.confirm_delivery()
        self.queues = set()
        self.exchanges = set()
        self.rows = []
        self.serial = 0
        topology = self.topology
        self.channel.exchange_declare(topology.dead_letter_exchange, "fanout", durable=True)
        self.channel.exchange_declare(topology.group_router, "direct", durable=True)
        self.exchanges.update([topology.dead_letter_exchange, topology.group_router])

    # -- names ----------------------------------------------------------------------

    def fresh(self, what):
        names = []
        for _ in range(self.count):
            self.serial += 1
            names.append("bench.costs!%s%06d" % (what, self.serial))
        return names

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

    # -- the methods -----------------------------------------------------------------

    def run(self):
        topology = self.topology
        count = self.count

        def new_queues(label, arguments_for, durable=True):
            made = []

            def calls(nowait):
                names = [topology.local_member_queue(c) for c in self.fresh("q")]
                made[:] = names
                return [
                    self.rpc(
                        nowait, "queue_declare", n, durable=durable, arguments=arguments_for(n)
                    )
                    for n in names
                ]

            self.measure(label, calls, cleanup=lambda: self.delete(made))

        new_queues(
            "queue.declare, new member queue (l:, durable, x-max-length 0)",
            lambda n: topology.local_member_queue_arguments("a.b!c"),
        )
        new_queues(
            "queue.declare, new marker queue (k:, durable, 4 arguments)",
            lambda n: topology.marker_queue_arguments(),
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
        group = topology.group_exchange("costs-room")
        self.channel.exchange_declare(group, "fanout", durable=True, auto_delete=False)
        self.exchanges.add(group)
        self.measure(
            "exchange.declare, existing (g:, again)",
            lambda nowait: [
                self.rpc(nowait, "exchange_declare", group, exchange_type="fanout", durable=True)
                for _ in range(count)
            ],
        )

        # Bindings: the objects are made untimed, the bindings timed.
        pairs = []

        def make_pairs():
            members = self.fresh("b")
            pairs[:] = [
                (topology.member_exchange(c), topology.local_member_queue(c)) for c in members
            ]
            impl = self.channel._impl
            for exchange, queue in pairs:
                impl.exchange_declare(
                    exchange, exchange_type="fanout", durable=True, auto_delete=True, callback=None
                )
                impl.queue_declare(
                    queue,
                    durable=True,
                    arguments=topology.local_member_queue_arguments("a.b!c"),
                    callback=None,
                )
            self.channel.basic_qos(prefetch_count=0)

        def drop_pairs():
            self.delete([q for _x, q in pairs], [x for x, _q in pairs])

        self.measure(
            "queue.bind, new (l: to m:)",
            lambda nowait: [self.rpc(nowait, "queue_bind", q, x, routing_key="") for x, q in pairs],
            prepare=make_pairs,
            cleanup=drop_pairs,
        )
        self.measure(
            "exchange.bind, new (m: from g:)",
            lambda nowait: [
                self.rpc(nowait, "exchange_bind", x, group, routing_key="") for x, _q in pairs
            ],
            prepare=make_pairs,
            cleanup=drop_pairs,
        )

        def bound_pairs():
            make_pairs()
            impl = self.channel._impl
            for exchange, _queue in pairs:
                impl.exchange_bind(exchange, group, routing_key="", callback=None)
            self.channel.basic_qos(prefetch_count=0)

        self.measure(
            "exchange.unbind (m: from g:)",
            lambda nowait: [
                self.rpc(nowait, "exchange_unbind", x, group, routing_key="") for x, _q in pairs
            ],
            prepare=bound_pairs,
            cleanup=drop_pairs,
        )
        self.measure(
            "exchange.bind, existing (g: from the router, again)",
            lambda nowait: [
                self.rpc(nowait, "exchange_bind", group, topology.group_router, routing_key="r")
                for _ in range(count)
            ],
        )

        markers = []

        def make_markers():
            markers[:] = [topology.local_member_queue(c) for c in self.fresh("k")]
            impl = self.channel._impl
            for queue in markers:
                impl.queue_declare(
                    queue,
                    durable=True,
                    arguments=topology.marker_queue_arguments(),
                    callback=None,
                )
            self.channel.basic_qos(prefetch_count=0)

        self.measure(
            "queue.delete (k: marker queue)",
            lambda nowait: [self.rpc(nowait, "queue_delete", q) for q in markers],
            prepare=make_markers,
        )

        # The confirmed publish cannot be pipelined on a BlockingChannel: only sync.
        make_markers()
        properties = pika.BasicProperties(delivery_mode=1, headers={"asgi-kind": "marker"})
        durations = []
        cpu0 = process_cpu(self.broker_pid)
        begin = time.perf_counter_ns()
        for queue in markers:
            start = time.perf_counter_ns()
            self.confirmed.basic_publish("", queue, b"", properties, mandatory=True)
            durations.append(time.perf_counter_ns() - start)
        wall = (time.perf_counter_ns() - begin) / 1e9
        cpu = self.cpu(cpu0, markers)
        self.delete(markers)
        p50, mean = statistics.median(durations) / 1e6, sum(durations) / len(durations) / 1e6
        self.rows.append(
            (
                "basic.publish + confirm (marker, to k:)",
                p50,
                mean,
                count / wall,
                cpu,
                None,
                None,
                None,
            )
        )
        print("%-58s sync p50 %6.2f ms mean %6.2f ms" % (self.rows[-1][0], p50, mean))

        self.whole_memberships()

    def whole_memberships(self):
        """A whole group_add, three ways (see the module's docstring)."""
        topology = self.topology
        count = self.count
        rooms = [topology.group_exchange("costs-r%d" % k) for k in range(4)]
        self.exchanges.update(rooms)
        base = "bench.costs!"
        properties = pika.BasicProperties(delivery_mode=1, headers={"asgi-kind": "marker"})

        def steps(channel, member, group_name, nowait):
            kw = {"callback": None} if nowait else {}
            target = channel._impl if nowait else channel
            group = topology.group_exchange(group_name)
            member_x = topology.member_exchange(member)
            local = topology.local_member_queue(member)
            marker = topology.marker_queue(group_name, member)
            target.queue_declare(
                topology.channel_queue(member),
                durable=True,
                arguments=topology.channel_queue_arguments(member),
                **kw,
            )
            target.queue_declare(
                local, durable=True, arguments=topology.local_member_queue_arguments(member), **kw
            )
            target.exchange_declare(
                group, exchange_type="fanout", durable=True, auto_delete=True, **kw
            )
            target.exchange_bind(group, topology.group_router, routing_key=group_name, **kw)
            target.exchange_declare(
                member_x, exchange_type="fanout", durable=True, auto_delete=True, **kw
            )
            target.queue_bind(local, member_x, routing_key="", **kw)
            target.exchange_bind(member_x, group, routing_key="", **kw)
            target.queue_declare(
                marker, durable=True, arguments=topology.marker_queue_arguments(), **kw
            )
            return marker, local, member_x

        def run(label, mode):
            members = ["%s%s" % (base, c.partition("!")[2]) for c in self.fresh("w")]
            made_q, made_x = [], []
            cpu0 = process_cpu(self.broker_pid)
            begin = time.perf_counter_ns()
            # "all": unconfirmed marker publishes on a channel without confirms
            # (a BlockingChannel in confirm mode must wait for each), then one
            # synchronous basic.qos on the same channel.
            channel = self.channel if mode == "all" else self.confirmed
            for i, member in enumerate(members):
                group_name = "costs-r%d" % (i % 4)
                marker, local, member_x = steps(channel, member, group_name, mode != "sync")
                made_q += [marker, local]
                made_x.append(member_x)
                if mode == "all":
                    channel._impl.basic_publish("", marker, b"", properties)
                else:
                    channel.basic_publish("", marker, b"", properties, mandatory=True)
            if mode == "all":
                channel.basic_qos(prefetch_count=0)
            wall = (time.perf_counter_ns() - begin) / 1e9
            cpu = self.cpu(cpu0, members)
            self.delete(made_q, made_x)
            self.rows.append((label, None, wall / count * 1e3, count / wall, cpu, None, None, None))
            print(
                "%-58s %6.2f ms per membership (%6.0f/s)"
                % (label, wall / count * 1e3, count / wall)
            )

        run("group_add chain, every step synchronous", "sync")
        run("group_add chain, nowait steps, one wait per membership", "each")
        run("group_add chains of all memberships, one wait at the end (markers unconfirmed)", "all")

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
