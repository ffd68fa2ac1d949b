"""The bulk suite: the CLI's bulk mode (``python -m asgi_amqp send --from
FILE``), ``layer.send_many`` and asgi_redis's ``send`` loop over the same
rows, against the pipelined-confirm ceiling (``PipelinedPublisher``), in one
run (``python -m benchmarks --only bulk``); benchmarks/README.md says how each
round checks its rows. Only public API and pika: the layer's internal modules
differ between versions. Writes ``results/bulk.md`` and ``bulk.json``.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import msgpack
import pika

from . import common
from .broker import connection_parameters
from .scenarios import MESSAGE

CHANNELS = 100
DEFAULT_ROUNDS = 1


def rows(count):
    for i in range(count):
        yield "bulk.%d" % (i % CHANNELS), {"n": i, "text": "notification %d" % i, "pad": "x" * 120}


def _channels():
    return ["bulk.%d" % i for i in range(CHANNELS)]


def make_layer(url, prefix, capacity):
    from asgi_amqp import AMQPChannelLayer

    return AMQPChannelLayer(
        url=url, prefix=prefix, capacity=capacity, expiry=600, dead_letter_worker=False
    )


def queued(admin, layer):
    """Messages ready in the channels' queues (0 for a queue that does not exist)."""
    return sum(admin.depth(layer.topology.channel_queue(c)) or 0 for c in _channels())


def run_cli(path, prefix, capacity):
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "asgi_amqp",
            "--prefix",
            prefix,
            "--capacity",
            str(capacity),
            "--expiry",
            "600",
            "send",
            "--from",
            path,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=1800,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(
            "CLI bulk send failed (%d): %s" % (result.returncode, result.stderr[-500:])
        )
    return elapsed, (result.stderr.strip().splitlines() or [""])[-1]


# asgi_redis 1.4.3 in its virtualenv: "send" sends every row of the file with
# ``layer.send``; "count" prints how many wait in the channels, then flushes.
REDIS_LOOP = """
import json, sys
from asgi_redis import RedisChannelLayer
mode, url, path, capacity, prefix = sys.argv[1:6]
layer = RedisChannelLayer(hosts=[url], prefix=prefix, capacity=int(capacity), expiry=600)
if mode == "send":
    with open(path) as rows:
        for line in rows:
            row = json.loads(line)
            layer.send(row["channel"], row["message"])
else:
    connection = layer.connection(None)
    channels = set(json.loads(line)["channel"] for line in open(path))
    print(sum(connection.llen(prefix + channel) for channel in channels))
    layer.flush()
"""


def run_redis_loop(python, redis_url, path, capacity):
    """asgi_redis's send loop, the whole process; returns (elapsed, rows queued)."""
    prefix = "bulk-%s:" % uuid.uuid4().hex[:8]

    def loop(mode):
        result = subprocess.run(
            [python, "-c", REDIS_LOOP, mode, redis_url, path, str(capacity), prefix],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=1800,
        )
        if result.returncode != 0:
            raise RuntimeError("asgi_redis %s failed: %s" % (mode, result.stderr[-500:]))
        return result.stdout

    started = time.perf_counter()
    loop("send")
    elapsed = time.perf_counter() - started
    return elapsed, int(loop("count"))


def run_send_many(url, prefix, capacity, count):
    layer = make_layer(url, prefix, capacity)
    try:
        started = time.perf_counter()
        outcomes = layer.send_many(rows(count))
        elapsed = time.perf_counter() - started
    finally:
        layer.close()
    failed = sum(1 for outcome in outcomes if outcome is not None)
    if failed:
        raise RuntimeError("send_many: %d of %d items failed" % (failed, count))
    return elapsed, "%d sent" % count


class PipelinedPublisher(object):
    """Confirmed publishing as fast as pika goes: a ``SelectConnection`` owned
    by an I/O thread of its own, publisher confirms on, up to ``window``
    publishes unconfirmed.

    ``publish(routing_key, count)`` packs the msgpack bodies in this thread,
    in chunks of ``chunk``, and hands each chunk to the I/O thread with
    ``add_callback_threadsafe`` (the only pika call another thread may make).
    The I/O thread publishes while fewer than ``window`` are unconfirmed and
    publishes more from the confirm callback. A ``Basic.Ack``/``Basic.Nack``
    with ``multiple=True`` settles every unconfirmed tag up to and including
    its own; unconfirmed tags are kept in publish order (acks may come out
    of order), never counted by subtracting tags. The caller waits for the
    last confirm. Publishes are ``mandatory``, like the layer's: a returned
    message is counted. ``_fail`` records the first error and ends any wait.
    """

    def __init__(self, url, window=1000, chunk=1000, timeout=10.0):
        self.window = window
        self.chunk = chunk
        self.channel = None
        self.next_tag = 0
        self.unconfirmed = collections.OrderedDict()  # delivery tag -> message index
        self.pending = collections.deque()  # (index, body) handed over, not yet published
        self.routing_key = None
        self.acked = None
        self.expected = self.settled = self.returned = 0
        self.properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack"
        )
        self.ready = threading.Event()
        self.done = threading.Event()
        self.error = None
        parameters = connection_parameters(url)
        parameters.heartbeat = 60  # the I/O thread answers heartbeats itself
        self.connection = pika.SelectConnection(
            parameters,
            on_open_callback=lambda conn: conn.channel(on_open_callback=self._on_channel),
            on_open_error_callback=lambda _c, exc: self._fail("open failed: %r" % (exc,)),
            on_close_callback=lambda _c, exc: self._fail("connection closed: %r" % (exc,)),
        )
        self.thread = threading.Thread(
            target=self.connection.ioloop.start, name="bulk-ceiling-io", daemon=True
        )
        self.thread.start()
        if not self.ready.wait(timeout) or self.error:
            self.close()
            raise RuntimeError(self.error or "bulk-ceiling-io did not open in time")

    def _fail(self, text):
        if self.error is None:
            self.error = text
        self.ready.set()
        self.done.set()

    def close(self):
        if self.thread.is_alive():

            def stop():
                if self.connection.is_open or self.connection.is_opening:
                    self.connection.close()
                self.connection.ioloop.stop()

            self.error = self.error or "closed"
            try:
                self.connection.ioloop.add_callback_threadsafe(stop)
            except Exception:
                pass
            self.thread.join(10)

    # -- the I/O thread ----------------------------------------------------------------

    def _on_channel(self, channel):
        self.channel = channel
        channel.add_on_close_callback(lambda _ch, exc: self._fail("channel closed: %r" % (exc,)))
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: self.ready.set()
        )

    def _on_return(self, _channel, _method, _properties, _body):
        self.returned += 1

    def _on_confirm(self, frame):
        method = frame.method
        ack = method.NAME == "Basic.Ack"
        tag = method.delivery_tag
        unconfirmed = self.unconfirmed
        if method.multiple:
            settled = []
            while unconfirmed:
                first = next(iter(unconfirmed))
                if first > tag:
                    break
                settled.append(unconfirmed.popitem(last=False)[1])
        else:
            index = unconfirmed.pop(tag, None)
            settled = [] if index is None else [index]
        for index in settled:
            self.acked[index] = ack
        self.settled += len(settled)
        self._pump()
        if self.settled >= self.expected:
            self.done.set()

    def _submit(self, chunk):
        self.pending.extend(chunk)
        self._pump()

    def _pump(self):
        pending, unconfirmed = self.pending, self.unconfirmed
        publish, properties = self.channel.basic_publish, self.properties
        routing_key = self.routing_key
        while pending and len(unconfirmed) < self.window:
            index, body = pending.popleft()
            self.next_tag += 1
            unconfirmed[self.next_tag] = index
            publish("", routing_key, body, properties, mandatory=True)

    # -- the caller's thread ------------------------------------------------------------

    def publish(self, routing_key, count, timeout=60.0):
        """Publish ``count`` messages to ``routing_key`` (default exchange);
        returns (acked, returned, errors): acked one per message."""
        if self.error:
            raise RuntimeError(self.error)
        self.routing_key = routing_key
        self.acked = [False] * count
        self.expected, self.settled, self.returned = count, 0, 0
        self.done.clear()
        handover = self.connection.ioloop.add_callback_threadsafe
        packb, chunk = msgpack.packb, self.chunk
        for first in range(0, count, chunk):
            bodies = [
                (i, packb(MESSAGE, use_bin_type=True))
                for i in range(first, min(count, first + chunk))
            ]
            handover(lambda bodies=bodies: self._submit(bodies))
        errors = []
        if not self.done.wait(timeout):
            errors.append(
                "%d of %d confirms missing after %.0f s" % (count - self.settled, count, timeout)
            )
        if self.error:
            errors.append(self.error)
        return self.acked, self.returned, errors


def run_ceiling(url, admin, prefix, count):
    """The same number of messages through raw pika's pipelined confirms."""
    queue = "%s:ceiling" % prefix
    admin.declare(queue, None)
    publisher = PipelinedPublisher(url, window=1000, chunk=1000)
    try:
        started = time.perf_counter()
        acked, returned, errors = publisher.publish(queue, count, timeout=600)
        elapsed = time.perf_counter() - started
    finally:
        publisher.close()
    if errors or returned or not all(acked):
        raise RuntimeError("ceiling: %s" % (errors or "%d returned or nacked" % count))
    held = admin.depth(queue)
    admin.delete_tracked()
    if held != count:
        raise RuntimeError("ceiling: %d confirmed but %s queued" % (count, held))
    return elapsed, "%d acked and queued" % count


def run(args, ctx):
    from .broker import Admin

    rounds = args.rounds or DEFAULT_ROUNDS
    count = args.bulk_rows
    capacity = count // CHANNELS + 10
    admin = Admin(ctx.amqp_url)
    handle, path = tempfile.mkstemp(suffix=".jsonl")
    figures = {"cli": [], "send_many": [], "ceiling": [], "redis": []}
    summaries = {}
    status = 0
    python, reason = ctx.redis_python()
    if python and not ctx.redis.url:
        python, reason = None, ctx.redis.reason
    senders = ["cli", "send_many", "ceiling"] + (["redis"] if python else [])
    if not python:
        common.say("bulk: asgi_redis's send loop is left out: %s" % reason)
    try:
        with os.fdopen(handle, "w") as out:
            for channel, message in rows(count):
                out.write(json.dumps({"channel": channel, "message": message}) + "\n")
        for round_no in range(rounds):
            for sender in common.rotate(senders, round_no):
                prefix = "bulk-%s" % uuid.uuid4().hex[:8]
                layer = make_layer(ctx.amqp_url, prefix, capacity)
                try:
                    held = None
                    if sender == "redis":
                        elapsed, held = run_redis_loop(python, ctx.redis.url, path, capacity)
                        summary = "%d queued in Redis" % held
                    elif sender == "cli":
                        elapsed, summary = run_cli(path, prefix, capacity)
                    elif sender == "send_many":
                        elapsed, summary = run_send_many(ctx.amqp_url, prefix, capacity, count)
                    else:
                        elapsed, summary = run_ceiling(ctx.amqp_url, admin, prefix, count)
                    if held is None:
                        held = count if sender == "ceiling" else queued(admin, layer)
                    if held != count:
                        common.say("bulk: %s: %d rows sent but %d queued" % (sender, count, held))
                        status = 1
                    figures[sender].append(count / elapsed)
                    summaries[sender] = str(summary)
                    common.say(
                        "  round %d %-5s %8.0f rows/s  (%s)"
                        % (round_no + 1, sender, count / elapsed, summary)
                    )
                finally:
                    layer.close()
                    admin.delete_layer(layer.topology, _channels())
    finally:
        os.unlink(path)
        admin.close()
    best = {name: sorted(values)[len(values) // 2] for name, values in figures.items() if values}
    lines = [
        ("CLI bulk mode (`send --from`), whole process", "cli"),
        ("`layer.send_many` in this process", "send_many"),
        ("ceiling: raw pika, pipelined confirms, one queue", "ceiling"),
        ("asgi_redis 1.4.3, a `send` loop over the file, whole process", "redis"),
    ]
    table = "| sender | rows/s (median of %d) | / ceiling |\n|---|---:|---:|" % rounds
    for label, name in lines:
        if name in best:
            table += "\n| %s | %.0f | %.2fx |" % (label, best[name], best[name] / best["ceiling"])
    if "redis" in best:
        table += "\n\nCLI bulk mode / asgi_redis's send loop: %.2fx (target 2x)" % (
            best["cli"] / best["redis"]
        )
    common.say("\n" + table)
    paths = common.write_result(
        ctx.results,
        "bulk",
        "Bulk sends: %d rows, %d channels" % (count, CHANNELS),
        "%s\n\nLast summaries: %s" % (table, json.dumps(summaries)),
        {
            "rows": count,
            "rows_per_second": best,
            "rounds": figures,
            "send_many_over_ceiling": best["send_many"] / best["ceiling"],
        },
        ctx.command,
    )
    return common.SuiteResult(status, table, paths)
