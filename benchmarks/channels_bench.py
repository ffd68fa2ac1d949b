"""The Channels suite: Channels 1.x end to end, asgi_amqp against asgi_redis
1.4.3, same run, same machine (``python -m benchmarks --only channels``,
``make bench-channels``).

daphne (native Twisted mode on both layers) and ONE ``manage.py runworker``
of the example project (tests/project) per layer; the clients are
websocket-client connections in this process. Round trips, echoes per second
through daphne (with daphne's and the worker's CPU share, which says which one
was the bottleneck), a runworker drain (``channels_drive.py --drain``) and the
same drain per ``--channels-threads`` N: benchmarks/README.md says each. Rounds
alternate between the layers (AB, BA, ...) after a warm-up; the table shows
the median round. A lost frame is reported and makes the status 1. Without
asgi_redis's virtualenv or Redis, only asgi_amqp runs. Writes
``results/channels_summary.md``.
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid

from . import common
from .channels_drive import PAYLOAD, SOCKETS, cpu_seconds

HERE = common.HERE
ROOT = common.ROOT
PROJECT_DIR = common.PROJECT_DIR
DEFAULT_ROUNDS = 5


class BenchError(Exception):
    pass


say = common.say


# -- clients ----------------------------------------------------------------------------


def _connect(stack):
    import websocket

    return websocket.create_connection(stack.ws_url("/echo/"), timeout=10)


def measure_latency(stack, ops):
    """Round-trip times (seconds) of ``ops`` sequential echoes on one socket."""
    ws = _connect(stack)
    try:
        times = []
        for i in range(ops):
            text = "%d %s" % (i, PAYLOAD)
            started = time.perf_counter()
            ws.send(text)
            reply = ws.recv()
            times.append(time.perf_counter() - started)
            if not reply.endswith(text):
                raise BenchError("echo mismatch: sent %r, got %r" % (text[:20], reply[:40]))
        return times
    finally:
        ws.close(timeout=2)


def measure_throughput(stack, clients, window, duration):
    """Echoes per second with ``clients`` x ``window`` frames in flight for ``duration`` s."""
    sockets = [_connect(stack) for _ in range(clients)]
    stop = threading.Event()
    counts = [0] * clients
    sent = [0] * clients
    errors = []

    def run(index, ws):
        try:
            for _ in range(window):
                ws.send(PAYLOAD)
                sent[index] += 1
            while counts[index] < sent[index]:
                ws.recv()
                counts[index] += 1
                if not stop.is_set():
                    ws.send(PAYLOAD)
                    sent[index] += 1
        except Exception as exc:
            errors.append("client %d: %r" % (index, exc))

    pids = {"worker": stack.workers[0].pid, "daphne": stack.daphne.pid}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    threads = [
        threading.Thread(target=run, args=(i, ws), daemon=True) for i, ws in enumerate(sockets)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(duration)
    received_at_stop = sum(counts)
    elapsed = time.perf_counter() - started
    cpu = {name: (cpu_seconds(pid) - cpu_before[name]) / elapsed for name, pid in pids.items()}
    stop.set()
    for thread in threads:
        thread.join(15)
    for ws in sockets:
        ws.close(timeout=2)
    lost = sum(sent) - sum(counts)
    if any(t.is_alive() for t in threads):
        errors.append("frames still missing 15 s after the round")
    return {
        "rate": received_at_stop / elapsed,
        "cpu": cpu,
        "lost": lost,
        "errors": errors,
        "sent": sum(sent),
    }


# -- contestants --------------------------------------------------------------------------


class Contestant(object):
    def __init__(self, name, stack, describe, flush):
        self.name = name
        self.stack = stack
        self.describe = describe
        self.flush = flush
        self.latencies = []  # per round: list of seconds
        self.throughput = []  # per round: result dicts
        self.drain = []  # per round: channels_drive.py --drain results
        self.threads = {}  # runworker --threads N -> per round: --drain results


def _percentile(values, q):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def measure_drain(contestant, count, threads=1):
    """Messages/s the runworker handles through a queue of ``count`` (channels_drive.py)."""
    options = ["--drain", str(count), "--worker-threads", str(threads)]
    return _drive(contestant, options, 120 + count / 50.0)


def _drive(contestant, options, timeout):
    stack = contestant.stack
    argv = [
        stack.python,
        os.path.join(HERE, "channels_drive.py"),
        "--worker-pid",
        str(stack.workers[0].pid),
    ] + options
    done = subprocess.run(
        argv,
        env=stack.environ(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise BenchError(
            "channels_drive.py failed for %s:\n%s"
            % (contestant.name, done.stderr.decode("utf-8", "replace")[-2000:])
        )
    return json.loads(done.stdout.decode("utf-8").strip().splitlines()[-1])


def _median_round(rounds, key):
    return statistics.median(key(r) for r in rounds)


def summarize(contestant):
    lat = contestant.latencies
    thr = contestant.throughput
    row = {
        "layer": contestant.name,
        "mode": contestant.stack.mode,
        "p50_ms": _median_round(lat, lambda r: _percentile(r, 50)) * 1000,
        "p95_ms": _median_round(lat, lambda r: _percentile(r, 95)) * 1000,
        "p99_ms": _median_round(lat, lambda r: _percentile(r, 99)) * 1000,
        "rate": _median_round(thr, lambda r: r["rate"]),
        "worker_cpu": _median_round(thr, lambda r: r["cpu"]["worker"]) * 100,
        "daphne_cpu": _median_round(thr, lambda r: r["cpu"]["daphne"]) * 100,
        "worker_rate": _median_round(contestant.drain, lambda r: r["rate"]),
        "drain_cpu": _median_round(contestant.drain, lambda r: r["cpu"]) * 100,
        "lost": (
            sum(r["lost"] for r in thr)
            + sum(r["lost"] for r in contestant.drain)
            + sum(r["lost"] for rounds in contestant.threads.values() for r in rounds)
        ),
        "threads": {
            n: {
                "rate": _median_round(rounds, lambda r: r["rate"]),
                "cpu": _median_round(rounds, lambda r: r["cpu"]) * 100,
                "rounds": [round(r["rate"], 1) for r in rounds],
            }
            for n, rounds in sorted(contestant.threads.items())
        },
        "rounds_p50_ms": [round(_percentile(r, 50) * 1000, 2) for r in lat],
        "rounds_p99_ms": [round(_percentile(r, 99) * 1000, 2) for r in lat],
        "rounds_rate": [round(r["rate"], 1) for r in thr],
        "rounds_worker_rate": [round(r["rate"], 1) for r in contestant.drain],
    }
    return row


def table(rows):
    header = (
        "| layer | daphne mode | RTT p50 ms | p95 ms | p99 ms "
        "| runworker drain msg/s (its CPU %) "
        "| via daphne msg/s (worker CPU %, daphne CPU %) | lost |"
    )
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            "| %s | %s | %.2f | %.2f | %.2f | %.0f (%.0f%%) "
            "| %.0f (%.0f%%, %.0f%%) | %d |"
            % (
                r["layer"],
                r["mode"],
                r["p50_ms"],
                r["p95_ms"],
                r["p99_ms"],
                r["worker_rate"],
                r["drain_cpu"],
                r["rate"],
                r["worker_cpu"],
                r["daphne_cpu"],
                r["lost"],
            )
        )
    return "\n".join(lines)


THREADS_TARGET = 1.2  # best asgi_amqp runworker over best asgi_redis runworker


def best_threads(row):
    """(msg/s, N) of the runworker's best --threads N, or None."""
    rates = [(figures["rate"], n) for n, figures in row["threads"].items()]
    return max(rates) if rates else None


def threads_table(rows, thread_counts):
    """runworker drain msg/s per --threads N (median round) and each layer's best."""
    lines = [
        "| layer | %s | best (threads) | lost |"
        % " | ".join("--threads %d msg/s (CPU %%)" % n for n in thread_counts),
        "|---|" + "---|" * (len(thread_counts) + 2),
    ]
    for r in rows:
        best = best_threads(r)
        if best is None:
            continue
        cells = [
            "%.0f (%.0f%%)" % (r["threads"][n]["rate"], r["threads"][n]["cpu"])
            if n in r["threads"]
            else "-"
            for n in thread_counts
        ]
        lines.append(
            "| %s | %s | %.0f (%d) | %d |"
            % (r["layer"], " | ".join(cells), best[0], best[1], r["lost"])
        )
    return "\n".join(lines)


def verdict(rows):
    by = {r["layer"]: r for r in rows}
    if "asgi_amqp" not in by or "asgi_redis" not in by:
        return []
    a, r = by["asgi_amqp"], by["asgi_redis"]
    checks = [
        (
            "RTT p50 no worse than asgi_redis",
            a["p50_ms"] <= r["p50_ms"],
            "%.2f vs %.2f ms" % (a["p50_ms"], r["p50_ms"]),
        ),
        (
            "RTT p99 no worse than asgi_redis",
            a["p99_ms"] <= r["p99_ms"],
            "%.2f vs %.2f ms" % (a["p99_ms"], r["p99_ms"]),
        ),
        (
            "runworker msg/s at least asgi_redis's",
            a["worker_rate"] >= r["worker_rate"],
            "%.0f vs %.0f msg/s (x%.2f)"
            % (a["worker_rate"], r["worker_rate"], a["worker_rate"] / r["worker_rate"]),
        ),
        (
            "msg/s through daphne at least asgi_redis's",
            a["rate"] >= r["rate"],
            "%.0f vs %.0f msg/s (x%.2f)" % (a["rate"], r["rate"], a["rate"] / r["rate"]),
        ),
    ]
    best_a, best_r = best_threads(a), best_threads(r)
    if best_a and best_r:
        checks.append(
            (
                "best runworker --threads >= %.1fx asgi_redis's best" % THREADS_TARGET,
                best_a[0] >= THREADS_TARGET * best_r[0],
                "%.0f msg/s with %d threads vs %.0f with %d (x%.2f)"
                % (best_a[0], best_a[1], best_r[0], best_r[1], best_a[0] / best_r[0]),
            )
        )
    return checks


# -- main -----------------------------------------------------------------------------------


def redis_stack(run_id, python, redis_url, capacity, workers):
    """The chat project's stack on asgi_redis: ``(stack, flusher)``."""
    chatstack = _chatstack()
    prefix = run_id + "-redis"
    stack = chatstack.ChatStack(
        "unused",
        None,
        prefix=prefix,
        workers=workers,
        python=python,
        settings="chatproject.settings_redis",
        env=dict(capacity, REDIS_URL=redis_url),
    )
    return stack, _redis_flusher(python, redis_url, prefix)


def _redis_flusher(python, redis_url, prefix):
    def flush():
        code = (
            "import sys; sys.path.insert(0, %r); "
            "from chatproject.redis_layer import RedisChannelLayer; "
            "RedisChannelLayer(hosts=[%r], prefix=%r).flush()"
            % (PROJECT_DIR, redis_url, prefix + ":")
        )
        subprocess.run(
            [python, "-c", code],
            timeout=60,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )

    return flush


def _chatstack():
    if PROJECT_DIR not in sys.path:
        sys.path.insert(0, PROJECT_DIR)
    import chatstack  # tests/project/chatstack.py

    return chatstack


def run(args, ctx):
    chatstack = _chatstack()
    rounds = args.rounds or DEFAULT_ROUNDS
    opts = _Opts(args, rounds)
    run_id = "cbench-%s" % uuid.uuid4().hex[:8]
    load_start = os.getloadavg()
    contestants = []
    status = 0
    notes = []
    headline = ""
    paths = []
    capacity = {"CHAT_CAPACITY": str(max(100, 2 * opts.drain_count))}
    layers = args.channels_layers or ["asgi_amqp", "asgi_redis"]
    try:
        if "asgi_amqp" in layers:
            stack = chatstack.ChatStack(
                ctx.amqp_url, ctx.management_url, prefix=run_id + "-amqp", workers=1, env=capacity
            )
            contestants.append(Contestant("asgi_amqp", stack, "asgi_amqp on RabbitMQ", stack.flush))
        if "asgi_redis" in layers:
            python, reason = ctx.redis_python()
            redis_url = ctx.redis.url if python else None
            if not python or not redis_url:
                reason = reason or ctx.redis.reason
                notes.append("asgi_redis left out: %s" % reason)
                say("channels: asgi_redis left out: %s" % reason)
            else:
                stack, flusher = redis_stack(run_id, python, redis_url, capacity, workers=1)
                contestants.append(
                    Contestant(
                        "asgi_redis",
                        stack,
                        "asgi_redis 1.4.3 on %s" % ctx.redis.describe(),
                        flusher,
                    )
                )

        for c in contestants:
            say("Starting %s: daphne + 1 runworker ..." % c.describe)
            c.stack.start(timeout=90)
            say(
                "  daphne pid %d (%s mode), runworker pid %d"
                % (c.stack.daphne.pid, c.stack.mode, c.stack.workers[0].pid)
            )
        for c in contestants:  # warm-up, not recorded
            measure_latency(c.stack, 100)
            measure_throughput(c.stack, opts.clients, opts.window, 1.0)
            measure_drain(c, min(500, opts.drain_count))

        for round_no in range(rounds):
            for c in common.rotate(contestants, round_no):
                lat = measure_latency(c.stack, opts.latency_ops)
                thr = measure_throughput(c.stack, opts.clients, opts.window, opts.duration)
                drained = measure_drain(c, opts.drain_count)
                c.latencies.append(lat)
                c.throughput.append(thr)
                c.drain.append(drained)
                lost = thr["lost"] + drained["lost"]
                say(
                    "  round %d %-10s RTT p50 %6.2f ms p99 %6.2f ms | runworker drain %5.0f "
                    "msg/s (CPU %3.0f%%) | via daphne %5.0f msg/s "
                    "(worker %3.0f%%, daphne %3.0f%%)%s"
                    % (
                        round_no + 1,
                        c.name,
                        _percentile(lat, 50) * 1000,
                        _percentile(lat, 99) * 1000,
                        drained["rate"],
                        drained["cpu"] * 100,
                        thr["rate"],
                        thr["cpu"]["worker"] * 100,
                        thr["cpu"]["daphne"] * 100,
                        "  LOST %d" % lost if lost else "",
                    )
                )
                if thr["errors"]:
                    say("    errors: %s" % "; ".join(thr["errors"][:3]))
                    status = 1
        sweep_threads(contestants, opts)

        rows = [summarize(c) for c in contestants]
        if any(r["lost"] for r in rows):
            status = 1
        say()
        text = table(rows)
        if opts.thread_counts:
            text += "\n\n" + threads_table(rows, opts.thread_counts)
        say(text)
        checks = verdict(rows)
        say()
        for name, ok, detail in checks:
            say("  %-45s %s  (%s)" % (name, "yes" if ok else "NO", detail))
        load_end = os.getloadavg()
        say(
            "  load average %.2f at start, %.2f at end, %d CPUs"
            % (load_start[0], load_end[0], os.cpu_count())
        )
        headline = text + "".join("\n\n" + n for n in notes)
        paths = _write_summary(ctx, opts, rows, checks, text, notes, load_start, load_end)
        say("  written: %s" % ", ".join(os.path.relpath(p) for p in paths))
    except (BenchError, chatstack.StackError) as exc:
        say("FAILED: %s" % exc)
        status = 1
        notes.append("FAILED: %s" % exc)
    finally:
        for c in contestants:
            c.stack.stop()
            try:
                c.flush()
            except Exception as exc:
                say("could not remove %s's objects: %s" % (c.name, exc))
            c.stack.cleanup(keep_logs=status != 0)
    return common.SuiteResult(status, headline, paths, "; ".join(notes))


def sweep_threads(contestants, opts):
    """The runworker drain with ``--threads N``, for each N of ``opts.thread_counts``.

    N = 1 is the worker of the rounds above, whose drain rounds it reuses;
    for another N each layer's worker is started again with ``--threads N``,
    warmed up with one drain, and the layers' drains then alternate.
    """
    for threads in opts.thread_counts:
        if threads == 1:
            for c in contestants:
                c.threads[1] = list(c.drain)
            continue
        for c in contestants:
            c.stack.worker_args = ["--threads", str(threads)]
            c.stack.replace_worker(c.stack.workers[0], kill=False)
            say("  %s: runworker --threads %d, pid %d" % (c.name, threads, c.stack.workers[0].pid))
            measure_drain(c, min(500, opts.drain_count), threads)  # warm-up, not recorded
            c.threads[threads] = []
        for round_no in range(opts.rounds):
            for c in common.rotate(contestants, round_no):
                drained = measure_drain(c, opts.drain_count, threads)
                c.threads[threads].append(drained)
                say(
                    "  round %d %-10s runworker --threads %d drain %5.0f msg/s (CPU %3.0f%%)%s"
                    % (
                        round_no + 1,
                        c.name,
                        threads,
                        drained["rate"],
                        drained["cpu"] * 100,
                        "  LOST %d" % drained["lost"] if drained["lost"] else "",
                    )
                )


class _Opts(object):
    def __init__(self, args, rounds):
        self.rounds = rounds
        self.latency_ops = args.channels_latency_ops
        self.duration = args.channels_duration
        self.clients = args.channels_clients
        self.window = args.channels_window
        self.drain_count = args.channels_drain_count
        self.thread_counts = list(args.channels_threads)


def _write_summary(ctx, opts, rows, checks, text, notes, load_start, load_end):
    versions = common.package_versions(["pika", "Twisted"])
    lines = [
        "daphne 1.4.2 (native Twisted mode) + one `manage.py runworker` (Channels 1.1.8, "
        "Django 2.2.28) per layer, the `/echo/` route of tests/project; clients are "
        "websocket-client in one process. Latency: %d sequential round trips per round; "
        "via daphne: %d clients x %d frames in flight for %.0f s per round; runworker drain: "
        "benchmarks/channels_drive.py queues %d websocket.receive frames of %d sockets for the "
        "stopped worker through the layer (no daphne), continues it and times it until every "
        "reply is queued (channel capacity %s); %d rounds, alternating, median round shown."
        % (
            opts.latency_ops,
            opts.clients,
            opts.window,
            opts.duration,
            opts.drain_count,
            SOCKETS,
            max(100, 2 * opts.drain_count),
            opts.rounds,
        ),
        "",
        text,
        "",
    ]
    if opts.thread_counts:
        lines[1:1] = [
            "",
            "Threads table: the runworker drain with `runworker --threads N` (N = %s); "
            "--threads 1 is the drain of the rounds above, each other N a worker started "
            "again with N threads, one warm-up drain, then %d alternating rounds."
            % (",".join(str(n) for n in opts.thread_counts), opts.rounds),
        ]
    for name, ok, detail in checks:
        lines.append("* %s: **%s** (%s)" % (name, "yes" if ok else "no", detail))
    lines += (
        [""]
        + ["* %s" % n for n in notes]
        + [
            "",
            "Rounds: "
            + "; ".join(
                "%s p50 %s ms, p99 %s ms, runworker drain msg/s %s, via daphne msg/s %s"
                % (
                    r["layer"],
                    r["rounds_p50_ms"],
                    r["rounds_p99_ms"],
                    r["rounds_worker_rate"],
                    r["rounds_rate"],
                )
                for r in rows
            ),
            "",
            "Machine: %s, %d CPUs, Python %s, load average %.2f at start and %.2f at end "
            "(the machine is shared: compare the two layers within one run only). "
            "pika %s, Twisted %s."
            % (
                platform.platform(),
                os.cpu_count(),
                platform.python_version(),
                load_start[0],
                load_end[0],
                versions.get("pika", "?"),
                versions.get("Twisted", "?"),
            ),
        ]
    )
    return common.write_result(
        ctx.results,
        "channels_summary",
        "Channels 1.x end to end: asgi_amqp vs asgi_redis",
        "\n".join(lines),
        {"rows": rows, "checks": checks},
        ctx.command,
    )
