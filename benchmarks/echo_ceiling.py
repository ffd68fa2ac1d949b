"""The echo suite: how fast can one worker process echo messages, layer by
layer, without Django? (``python -m benchmarks --only echo``, ``make bench-echo``)

``--echo-drain COUNT`` messages are queued first (untimed); then one worker
process is timed through them, each thread looping "blocking receive from
``echo.w``, send a reply to ``echo.r``" until it takes a stop message of its
own. Contestants and checks: benchmarks/README.md. Each drain runs in a child
process (``--child KIND``; asgi_redis's in its own virtualenv), so module level
imports only the standard library. Writes ``results/echo_ceiling.md``.
"""

import argparse
import collections
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

from . import common

ROOT = common.ROOT
DEFAULT_ROUNDS = 5
BASELINE = "asgi_amqp@baseline"

MESSAGE = {"reply_channel": "echo.r", "path": "/echo/", "text": "x" * 64, "order": 0}
PIPELINED = "raw-pika-pipelined"
KINDS = ("raw-pika", PIPELINED, "asgi_amqp", "asgi_redis")
SINGLE_THREADED = ("raw-pika",)  # BlockingConnection: one thread only
TARGET = 1.2  # best asgi_amqp worker process over best asgi_redis worker process


# -- the contestants' two sides (run in child processes) ---------------------------------


def _layer(kind, prefix, redis_url, capacity=100):
    if kind == "asgi_redis":
        sys.path.insert(0, common.PROJECT_DIR)
        from chatproject.redis_layer import RedisChannelLayer

        return RedisChannelLayer(hosts=[redis_url], prefix=prefix, capacity=capacity)
    from asgi_amqp import AMQPChannelLayer

    return AMQPChannelLayer(url=os.environ["AMQP_URL"], prefix=prefix, capacity=capacity)


class LayerSide(object):
    def __init__(self, kind, prefix, redis_url, capacity=100):
        self.layer = _layer(kind, prefix, redis_url, capacity)

    def serve(self, handled):
        while True:
            channel, message = self.layer.receive(["echo.w"], block=True)
            if channel is None:
                continue
            if message.get("stop"):
                return
            handled.tick()
            message["text"] = message["text"][::-1]
            self.layer.send(message["reply_channel"], message)

    def send(self, message):
        self.layer.send("echo.w", message)

    def feed(self, messages):
        """Queue ``messages`` (untimed): many in flight where the layer can."""
        if hasattr(self.layer, "send_many"):
            for outcome in self.layer.send_many(("echo.w", m) for m in messages):
                if outcome is not None:
                    raise outcome
        else:
            for message in messages:
                self.send(message)

    def close(self):
        if hasattr(self.layer, "flush"):
            self.layer.flush()
        if hasattr(self.layer, "close"):
            self.layer.close()


def _raw_queues(prefix):
    """Per-round queues that vanish a minute after their last use."""
    return (prefix + ".w", prefix + ".r")


RAW_QUEUE_ARGUMENTS = {"x-expires": 60000}


class RawSide(object):
    """pika's BlockingConnection, one thread."""

    def __init__(self, prefix):
        import msgpack
        import pika

        self.msgpack = msgpack
        self.connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.queues = _raw_queues(prefix)
        for queue in self.queues:
            self.channel.queue_declare(queue, arguments=RAW_QUEUE_ARGUMENTS)

    def serve(self, handled):
        self.channel.basic_qos(prefetch_count=1)
        for method, _properties, body in self.channel.consume(self.queues[0]):
            self.channel.basic_ack(method.delivery_tag)
            message = self.msgpack.unpackb(body)
            if message.get("stop"):
                return
            handled.tick()
            message["text"] = message["text"][::-1]
            self.channel.basic_publish(
                "", self.queues[1], self.msgpack.packb(message), mandatory=True
            )

    def send(self, message):
        self.channel.basic_publish("", self.queues[0], self.msgpack.packb(message), mandatory=True)

    def feed(self, messages):
        for message in messages:
            self.send(message)

    def close(self):
        self.connection.close()


class PipelinedSide(object):
    """The layer's broker work, thread shape and promises, with no layer code
    (worker side only), for any number of threads.

    One I/O thread owns two SelectConnections on one loop, as the layer does (an
    alarm blocks only the one that publishes): a consumer with the layer's window
    (2T - 1 for T threads, 16 at most) puts deliveries in a local queue; the other
    publishes with confirms, with the layer's properties. A worker thread takes
    its next delivery from that queue, hands its ack over at once (settled when
    taken: at most once), then its reply's publish, and waits on a lock for that
    confirm. Hand-offs go through one list under a lock, with one
    ``add_callback_threadsafe`` per batch.
    """

    ACK, PUBLISH = 0, 1

    def __init__(self, prefix, threads=1):
        import queue

        import msgpack
        import pika

        self.msgpack = msgpack
        self.pika = pika
        self.is_ack = pika.spec.Basic.Ack
        self.queues = _raw_queues(prefix)
        self.prefetch = min(16, 2 * threads - 1)  # the layer's window
        self.ids = itertools.count()
        self.deliveries = queue.SimpleQueue()
        self.work_lock = threading.Lock()
        self.work = []  # (kind, argument, waiter) for the I/O thread
        self.scheduled = False  # a callback for the list is on its way
        self.sequence = 0  # the last publish's delivery tag (I/O thread)
        self.waiters = {}  # delivery tag -> [lock, confirmed], in order (I/O thread)
        self.returned = 0
        self.channel = self.publish_channel = None  # the consumer's, the publisher's
        self.opened = threading.Event()
        parameters = pika.URLParameters(os.environ["AMQP_URL"])
        self.connection = pika.SelectConnection(
            parameters,
            on_open_callback=lambda conn: conn.channel(on_open_callback=self._on_channel),
        )
        self.publishing = pika.SelectConnection(
            parameters,
            on_open_callback=lambda conn: conn.channel(on_open_callback=self._on_publishing),
            custom_ioloop=self.connection.ioloop,
        )
        self.thread = threading.Thread(target=self.connection.ioloop.start, daemon=True)
        self.thread.start()
        if not self.opened.wait(10):
            raise RuntimeError("the I/O thread's channels did not open")

    # I/O thread
    def _on_channel(self, channel):
        self.channel = channel
        channel.basic_qos(prefetch_count=self.prefetch, callback=lambda _: self._consume())

    def _on_publishing(self, channel):
        self.publish_channel = channel
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _: self._consume())

    def _consume(self):
        if self.channel is None or self.publish_channel is None:
            return  # the other channel is not ready yet
        for queue in self.queues:
            self.channel.queue_declare(queue, arguments=RAW_QUEUE_ARGUMENTS)
        self.channel.basic_consume(self.queues[0], self._on_message, auto_ack=False)
        self.opened.set()

    def _on_message(self, _channel, method, _properties, body):
        self.deliveries.put((method.delivery_tag, body))

    def _on_return(self, *_):
        self.returned += 1  # unroutable: the round fails

    def _on_confirm(self, frame):
        method = frame.method
        done = [method.delivery_tag]
        if method.multiple:
            done = []
            for tag in self.waiters:  # in publish order
                if tag > method.delivery_tag:
                    break
                done.append(tag)
        confirmed = isinstance(method, self.is_ack)
        for tag in done:
            waiter = self.waiters.pop(tag)
            waiter[1] = confirmed
            waiter[0].release()

    def _run_work(self):
        with self.work_lock:
            work, self.work = self.work, []
            self.scheduled = False
        for kind, argument, waiter in work:
            if kind == self.ACK:
                self.channel.basic_ack(argument)
            else:
                self.sequence += 1
                self.waiters[self.sequence] = waiter
                properties = self.pika.BasicProperties(
                    delivery_mode=1,
                    content_type="application/x-msgpack",
                    message_id="%s.%d" % (self.queues[1], next(self.ids)),
                    timestamp=int(time.time()),
                )
                self.publish_channel.basic_publish(
                    "", self.queues[1], argument, properties, mandatory=True
                )

    # the worker's threads
    def _hand_over(self, kind, argument, waiter=None):
        with self.work_lock:
            self.work.append((kind, argument, waiter))
            if self.scheduled:
                return
            self.scheduled = True
        self.connection.ioloop.add_callback_threadsafe(self._run_work)

    def serve(self, handled):
        """One worker thread's loop, until it takes a stop message."""
        while True:
            tag, body = self.deliveries.get(timeout=30)  # queue.Empty after 30 s
            self._hand_over(self.ACK, tag)
            message = self.msgpack.unpackb(body)
            if message.get("stop"):
                return
            handled.tick()
            message["text"] = message["text"][::-1]
            waiter = [threading.Lock(), None]
            waiter[0].acquire()
            self._hand_over(self.PUBLISH, self.msgpack.packb(message), waiter)
            if not waiter[0].acquire(timeout=10):
                raise RuntimeError("no publisher confirm within 10 s")
            if not waiter[1] or self.returned:
                raise RuntimeError("a reply was refused (nacked or returned)")

    def close(self):
        for connection in (self.publishing, self.connection):
            self.connection.ioloop.add_callback_threadsafe(connection.close)
        self.connection.ioloop.add_callback_threadsafe(self.connection.ioloop.stop)
        self.thread.join(5)


class Handled(object):
    """Messages echoed, and the CPU they took (start-up and imports left out);
    shared by a worker's threads."""

    def __init__(self):
        self.count = 0
        self.cpu_from = None
        self.lock = threading.Lock()

    def tick(self):
        with self.lock:
            if self.cpu_from is None:
                self.cpu_from = time.process_time()
            else:
                self.count += 1

    def cpu_us(self):
        return (time.process_time() - self.cpu_from) * 1e6 / max(1, self.count)


def serve(side, handled, threads):
    """``side.serve`` in ``threads`` threads, each until it takes a stop message."""
    if threads == 1:
        return side.serve(handled)
    errors = []

    def loop():
        try:
            side.serve(handled)
        except BaseException as exc:  # raised below, after the others stopped
            errors.append(exc)

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def count_replies(side, count, timeout):
    """How many of ``count`` replies are in the reply channel, each order once."""
    orders = set()
    if isinstance(side, RawSide):  # the broker's own count
        queue = side.queues[1]
        return side.channel.queue_declare(queue, passive=True).method.message_count
    deadline = time.monotonic() + timeout
    while len(orders) < count and time.monotonic() < deadline:
        channel, message = side.layer.receive(["echo.r"], block=True)
        if channel is None:
            break  # nothing for a whole receive timeout: the rest is lost
        orders.add(message["order"])
    return len(orders)


def child_drain(kind, prefix, redis_url, count, threads=1):
    """Queue ``count`` messages and a stop per thread, then time one worker
    process of ``threads`` threads through them; then count its replies."""
    if kind == BASELINE:
        kind = "asgi_amqp"
    if kind.startswith("raw-pika"):
        feeder = RawSide(prefix)
        worker = RawSide(prefix) if kind == "raw-pika" else PipelinedSide(prefix, threads)
    else:
        feeder = LayerSide(kind, prefix, redis_url, capacity=count + threads + 10)
        worker = LayerSide(kind, prefix, redis_url, capacity=count + threads + 10)
    feeder.feed([dict(MESSAGE, order=order) for order in range(count)])
    feeder.feed([{"stop": True}] * threads)  # after the others: send_many keeps the order
    handled = Handled()
    handled.tick()  # the clock and the CPU count start now, not at the first message
    started = time.perf_counter()
    serve(worker, handled, threads)
    elapsed = time.perf_counter() - started
    cpu_us = handled.cpu_us()  # before the count below, which is not the worker's work
    # Every send was confirmed (or, on Redis, written) before its thread went on.
    delivered = count_replies(feeder, count, 60 + count / 200.0)
    print(
        json.dumps(
            {
                "rate": handled.count / elapsed,
                "cpu_us": cpu_us,
                "handled": handled.count,
                "delivered": delivered,
                "threads": threads,
            }
        ),
        flush=True,
    )
    worker.close()
    feeder.close()


# -- the run ---------------------------------------------------------------------------


def _cleanup(admin, kind, prefix):
    """Delete what a round made on the broker (its private node may be shared)."""
    if kind == "asgi_redis":
        return
    from asgi_amqp.naming import Topology

    topology = Topology(prefix, 60, 86400, lambda _channel: 100)
    admin.delete_layer(topology, ("echo.w", "echo.r"), _raw_queues(prefix))


def _child_argv(kind, python, prefix, redis_url):
    return [
        python,
        "-m",
        "benchmarks.echo_ceiling",
        "--child",
        kind,
        "--prefix",
        prefix,
        "--redis-url",
        redis_url or "",
    ]


def _drain_round(kind, python, count, redis_url, env, admin, threads=1):
    prefix = "drain-%s" % uuid.uuid4().hex[:8]
    argv = _child_argv(kind, python, prefix, redis_url) + [
        "--drain",
        str(count),
        "--threads",
        str(threads),
    ]
    try:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, cwd=ROOT, timeout=120 + count / 50.0, check=True, env=env
        )
    finally:
        _cleanup(admin, kind, prefix)
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    for what in ("handled", "delivered"):
        if report[what] != count:
            raise RuntimeError(
                "the %s worker (%d threads) %s %d of %d messages"
                % (kind, threads, what, report[what], count)
            )
    return report


def _median(reports, key="rate"):
    return statistics.median(r[key] for r in reports)


def _best(sweep, kind):
    """(median msg/s, threads) of ``kind``'s best thread count, or None."""
    rates = [(_median(reports), threads) for (k, threads), reports in sweep.items() if k == kind]
    return max(rates) if rates else None


def _ratio_line(sweep, name, over, target=None):
    a, b = _best(sweep, name), _best(sweep, over)
    if not a or not b:
        return None
    line = "best %s / best %s: %.2fx (%.0f msg/s with %d threads / %.0f with %d)" % (
        name,
        over,
        a[0] / b[0],
        a[0],
        a[1],
        b[0],
        b[1],
    )
    if target:
        line += ", target >= %.1fx: %s" % (target, "met" if a[0] / b[0] >= target else "SHORT")
    return line


def sweep_table(sweep, kinds, thread_counts):
    """Drain msg/s per thread count (median round), the best and its CPU."""
    redis = _best(sweep, "asgi_redis")
    lines = [
        "| worker | %s | best (threads) | vs best asgi_redis | worker CPU per message at best "
        "| rounds at best |"
        % " | ".join("%d thread%s" % (n, "s" if n > 1 else "") for n in thread_counts),
        "|---|" + "---|" * (len(thread_counts) + 4),
    ]
    for kind in kinds:
        best = _best(sweep, kind)
        if best is None:
            continue
        cells = [
            "%.0f" % _median(sweep[kind, n]) if sweep.get((kind, n)) else "-" for n in thread_counts
        ]
        reports = sweep[kind, best[1]]
        lines.append(
            "| %s | %s | %.0f (%d) | %s | %.0f us | %s |"
            % (
                kind,
                " | ".join(cells),
                best[0],
                best[1],
                "%.2fx" % (best[0] / redis[0]) if redis else "-",
                _median(reports, "cpu_us"),
                ", ".join("%.0f" % r["rate"] for r in reports),
            )
        )
    ratios = [
        _ratio_line(sweep, "asgi_amqp", "asgi_redis", TARGET),
        _ratio_line(sweep, "asgi_amqp", PIPELINED),
        _ratio_line(sweep, PIPELINED, "asgi_redis"),
    ]
    if BASELINE in kinds:
        ratios.append(_ratio_line(sweep, BASELINE, "asgi_redis", TARGET))
    return "\n".join(lines) + "\n\n" + "".join("* %s\n" % r for r in ratios if r)


def run(args, ctx):
    rounds = args.rounds or DEFAULT_ROUNDS
    kinds = list(KINDS)
    pythons = dict.fromkeys(KINDS, sys.executable)
    envs = dict.fromkeys(KINDS, None)
    notes = []
    redis_url = None
    python, reason = ctx.redis_python()
    if python:
        redis_url = ctx.redis.url
        reason = ctx.redis.reason
    if python and redis_url:
        pythons["asgi_redis"] = python
    else:
        kinds.remove("asgi_redis")
        notes.append("asgi_redis left out: %s" % reason)
        common.say("echo: asgi_redis left out: %s" % reason)
    if ctx.baseline is not None:
        kinds.insert(kinds.index("asgi_amqp") + 1, BASELINE)
        pythons[BASELINE] = sys.executable
        envs[BASELINE] = ctx.baseline.environ()
        notes.append("%s: the layer from %s" % (BASELINE, ctx.baseline.describe()))
    from .broker import Admin

    admin = Admin(ctx.amqp_url)
    thread_counts = list(args.echo_threads)
    drained = collections.defaultdict(list)  # (kind, threads) -> reports
    try:
        for number in range(rounds):
            for threads in thread_counts:
                kinds_now = [k for k in kinds if threads == 1 or k not in SINGLE_THREADED]
                for kind in common.rotate(kinds_now, number):
                    report = _drain_round(
                        kind, pythons[kind], args.echo_drain, redis_url, envs[kind], admin, threads
                    )
                    drained[kind, threads].append(report)
                    common.say(
                        "  drain %d %-20s %d thread%s %6.0f msg/s  worker CPU %4.0f us/message"
                        % (
                            number + 1,
                            kind,
                            threads,
                            "s" if threads > 1 else " ",
                            report["rate"],
                            report["cpu_us"],
                        )
                    )
    finally:
        admin.close()
    headline = sweep_table(drained, kinds, thread_counts)
    common.say()
    common.say(headline)
    text = (
        "## Drain: %d messages queued first, one worker process of N threads timed "
        "through them\n\nEach thread loops blocking receive -> send reply; every reply "
        "was counted in its queue afterwards. Drain msg/s, median of %d rounds.\n\n%s\n"
        % (args.echo_drain, rounds, headline)
    )
    if notes:
        text += "\n" + "".join("* %s\n" % n for n in notes)
    paths = common.write_result(
        ctx.results,
        "echo_ceiling",
        "One worker echoing, without Django",
        text,
        {
            "drain": {"%s@%d" % key: reports for key, reports in drained.items()},
            "notes": notes,
        },
        ctx.command,
    )
    return common.SuiteResult(0, headline, paths, "; ".join(notes))


def child_main(argv=None):
    parser = argparse.ArgumentParser(description="one drain of the echo suite (a child process)")
    parser.add_argument("--child", required=True, choices=KINDS + (BASELINE,))
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--drain", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    common.apply_layer_source()
    if args.child == BASELINE:
        common.check_layer_source()
    child_drain(args.child, args.prefix, args.redis_url, args.drain, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
