"""Channels 1.x end to end: asgi_amqp against asgi_redis 1.4.3, same run, same machine.

    make bench-channels                       # venvs, broker and redis set-up included
    python benchmarks/channels_bench.py --redis-python .venv-redis/bin/python

For each layer, the chat example project (tests/project) runs as daphne +
ONE ``manage.py runworker`` (daphne in native Twisted mode on both layers:
asgi_amqp's ``receive_twisted``; asgi_redis with txredisapi). The clients are
websocket-client connections to the ``/echo/`` route, in this process:

latency
    one client, one frame at a time: send -> daphne -> websocket.receive ->
    runworker -> reply channel -> daphne -> client. p50/p95/p99 over
    ``--latency-ops`` round trips per round.
throughput through daphne
    ``--clients`` clients keeping ``--window`` frames each in flight (32 in
    all by default, under the layers' channel capacity of 100) for
    ``--duration`` seconds: echoes per second through daphne and the one
    runworker. The CPU share of the worker and of daphne during the round
    says which one was the bottleneck.
runworker drain
    the messages per second one runworker handles.
    ``benchmarks/channels_drive.py --drain``, run with the layer's own
    interpreter, stops the worker (SIGSTOP, by pid), queues
    ``--drain-count`` ``websocket.receive`` messages for it straight
    through the layer (no daphne), continues it and times it until every
    reply is in the driver's queue, read with the broker's own client
    (a passive queue.declare, a Redis LLEN). Both stacks run with a channel
    capacity of twice ``--drain-count`` so the burst fits.
runworker closed loop
    ``channels_drive.py --threads 4`` keeps 32 messages in flight and sends
    a new one for every reply: the worker with the driver and the broker
    sharing the machine's cores with it. The share of 50 ms samples that
    found the worker's queue empty says whether the worker or the driver
    set the pace (with one worker, the queue stays full on both layers).

Rounds alternate between the layers (AB, BA, ...) after a warm-up; the
table shows the median round. Every frame sent must come back: a lost frame
is reported and makes the exit status 1.

Brokers: RabbitMQ from ``$AMQP_URL``/``$AMQP_MANAGEMENT_URL`` (``make
bench-channels`` runs this under ``python -m devtools.rabbitmq run``); Redis
from ``--redis-url``/``$REDIS_URL``, else 127.0.0.1:6379 if it answers PING,
else a private ``redis-server`` on a free port (stopped at the end). The
asgi_redis side runs in its own virtualenv (``--redis-python``, default
``.venv-redis/bin/python``): asgi_redis 1.4.3 installed with ``--no-deps``
beside msgpack 1.x, see tests/project/chatproject/redis_layer.py.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROJECT_DIR = os.path.join(ROOT, "tests", "project")
for _path in (ROOT, PROJECT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import chatstack  # noqa: E402  (tests/project/chatstack.py)

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
PAYLOAD = "x" * 64
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    pass


def say(text=""):
    print(text, flush=True)


def _terminate(signum, _frame):
    raise KeyboardInterrupt(signum)


# -- redis ------------------------------------------------------------------------------


def _redis_ping(host, port, timeout=1.0):
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def find_redis(redis_url=None):
    """(url, PrivateRedis or None): ``redis_url``, else the Redis answering on
    127.0.0.1:6379, else a private redis-server the caller must stop."""
    if redis_url:
        return redis_url, None
    if _redis_ping("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0", None
    say("No Redis on 127.0.0.1:6379: starting a private redis-server ...")
    private_redis = PrivateRedis()
    return private_redis.url, private_redis


class PrivateRedis(object):
    """A throw-away redis-server on a free loopback port, in a temp dir."""

    def __init__(self):
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)
        if binary is None:
            raise BenchError("no Redis answers on 127.0.0.1:6379 and redis-server is not "
                             "installed (as root: make redis-deps, i.e. apt-get install "
                             "redis-server), or pass --redis-url")
        self.port = chatstack.free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.popen = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 20
        while not _redis_ping("127.0.0.1", self.port):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError("private redis-server did not start on port %d" % self.port)
            time.sleep(0.05)
        self.url = "redis://127.0.0.1:%d/0" % self.port

    def stop(self):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


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


def _cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / float(CLK_TCK)


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
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    threads = [threading.Thread(target=run, args=(i, ws), daemon=True)
               for i, ws in enumerate(sockets)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(duration)
    received_at_stop = sum(counts)
    elapsed = time.perf_counter() - started
    cpu = {name: (_cpu_seconds(pid) - cpu_before[name]) / elapsed for name, pid in pids.items()}
    stop.set()
    for thread in threads:
        thread.join(15)
    for ws in sockets:
        ws.close(timeout=2)
    lost = sum(sent) - sum(counts)
    if any(t.is_alive() for t in threads):
        errors.append("frames still missing 15 s after the round")
    return {"rate": received_at_stop / elapsed, "cpu": cpu, "lost": lost, "errors": errors,
            "sent": sum(sent)}


# -- contestants --------------------------------------------------------------------------


class Contestant(object):
    def __init__(self, name, stack, describe, flush):
        self.name = name
        self.stack = stack
        self.describe = describe
        self.flush = flush
        self.latencies = []   # per round: list of seconds
        self.throughput = []  # per round: result dicts
        self.loop = []        # per round: channels_drive.py closed-loop results
        self.drain = []       # per round: channels_drive.py --drain results


def _percentile(values, q):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[index]


def measure_closed_loop(contestant, duration, window, threads):
    """The runworker fed in a closed loop straight through the layer (channels_drive.py)."""
    return _drive(contestant, ["--seconds", str(duration), "--window", str(window),
                               "--threads", str(threads)], duration + 90)


def measure_drain(contestant, count):
    """Messages/s the runworker handles through a queue of ``count`` (channels_drive.py)."""
    return _drive(contestant, ["--drain", str(count)], 120 + count / 50.0)


def _drive(contestant, options, timeout):
    stack = contestant.stack
    argv = [stack.python, os.path.join(HERE, "channels_drive.py"),
            "--worker-pid", str(stack.workers[0].pid)] + options
    done = subprocess.run(argv, env=stack.environ(), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)
    if done.returncode != 0:
        raise BenchError("channels_drive.py failed for %s:\n%s" % (
            contestant.name, done.stderr.decode("utf-8", "replace")[-2000:]))
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
        "loop_rate": _median_round(contestant.loop, lambda r: r["rate"]),
        "loop_idle": _median_round(contestant.loop, lambda r: r["backlog_empty"]) * 100,
        "lost": (sum(r["lost"] for r in thr) + sum(r["lost"] for r in contestant.loop)
                 + sum(r["lost"] for r in contestant.drain)),
        "rounds_p50_ms": [round(_percentile(r, 50) * 1000, 2) for r in lat],
        "rounds_p99_ms": [round(_percentile(r, 99) * 1000, 2) for r in lat],
        "rounds_rate": [round(r["rate"], 1) for r in thr],
        "rounds_worker_rate": [round(r["rate"], 1) for r in contestant.drain],
        "rounds_loop_rate": [round(r["rate"], 1) for r in contestant.loop],
    }
    return row


def table(rows):
    header = ("| layer | daphne mode | RTT p50 ms | p95 ms | p99 ms "
              "| runworker drain msg/s (its CPU %) "
              "| closed loop msg/s (worker queue empty) "
              "| via daphne msg/s (worker CPU %, daphne CPU %) | lost |")
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append("| %s | %s | %.2f | %.2f | %.2f | %.0f (%.0f%%) | %.0f (%.0f%%) "
                     "| %.0f (%.0f%%, %.0f%%) | %d |" % (
            r["layer"], r["mode"], r["p50_ms"], r["p95_ms"], r["p99_ms"], r["worker_rate"],
            r["drain_cpu"], r["loop_rate"], r["loop_idle"], r["rate"], r["worker_cpu"],
            r["daphne_cpu"], r["lost"]))
    return "\n".join(lines)


def verdict(rows):
    by = {r["layer"]: r for r in rows}
    if "asgi_amqp" not in by or "asgi_redis" not in by:
        return []
    a, r = by["asgi_amqp"], by["asgi_redis"]
    checks = [
        ("RTT p50 no worse than asgi_redis", a["p50_ms"] <= r["p50_ms"],
         "%.2f vs %.2f ms" % (a["p50_ms"], r["p50_ms"])),
        ("RTT p99 no worse than asgi_redis", a["p99_ms"] <= r["p99_ms"],
         "%.2f vs %.2f ms" % (a["p99_ms"], r["p99_ms"])),
        ("runworker msg/s at least asgi_redis's", a["worker_rate"] >= r["worker_rate"],
         "%.0f vs %.0f msg/s (x%.2f)" % (a["worker_rate"], r["worker_rate"],
                                         a["worker_rate"] / r["worker_rate"])),
        ("msg/s through daphne at least asgi_redis's", a["rate"] >= r["rate"],
         "%.0f vs %.0f msg/s (x%.2f)" % (a["rate"], r["rate"], a["rate"] / r["rate"])),
    ]
    return checks


# -- main -----------------------------------------------------------------------------------


def _check_redis_python(python):
    if not python or not os.access(python, os.X_OK):
        raise BenchError("no interpreter for the asgi_redis side at %r: run `make redis-venv` "
                         "(or pass --redis-python)" % python)
    probe = subprocess.run(
        [python, "-c", "import asgi_redis, txredisapi, channels, daphne, msgpack; "
                       "print(asgi_redis.__version__ if hasattr(asgi_redis, '__version__') "
                       "else '?', msgpack.version)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if probe.returncode != 0:
        raise BenchError("%s cannot import asgi_redis, txredisapi, channels, daphne:\n%s" % (
            python, probe.stdout.decode("utf-8", "replace")))


def _redis_flusher(python, redis_url, prefix):
    def flush():
        code = ("import sys; sys.path.insert(0, %r); "
                "from chatproject.redis_layer import RedisChannelLayer; "
                "RedisChannelLayer(hosts=[%r], prefix=%r).flush()" % (
                    PROJECT_DIR, redis_url, prefix + ":"))
        subprocess.run([python, "-c", code], timeout=60, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return flush


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ops", type=int, default=500)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per throughput round")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--window", type=int, default=8, help="frames in flight per client")
    parser.add_argument("--drain-count", type=int, default=3000,
                        help="messages queued for the runworker drain")
    parser.add_argument("--driver-threads", type=int, default=4,
                        help="threads of the closed-loop driver")
    parser.add_argument("--redis-python",
                        default=os.path.join(ROOT, ".venv-redis", "bin", "python"))
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--only", choices=["asgi_amqp", "asgi_redis"], default=None)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "channels_summary.md"),
                        help="markdown summary to write ('' for none)")
    args = parser.parse_args(argv)
    if args.redis_python and os.sep in args.redis_python:
        # the stacks run with the example project as their working directory
        args.redis_python = os.path.abspath(args.redis_python)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)

    amqp_url = os.environ.get("AMQP_URL") or DEFAULT_AMQP_URL
    management_url = os.environ.get("AMQP_MANAGEMENT_URL") or None
    run_id = "cbench-%s" % uuid.uuid4().hex[:8]
    load_start = os.getloadavg()
    private_redis = None
    contestants = []
    status = 0
    capacity = {"CHAT_CAPACITY": str(max(100, 2 * args.drain_count))}
    try:
        if args.only != "asgi_redis":
            stack = chatstack.ChatStack(amqp_url, management_url, prefix=run_id + "-amqp",
                                        workers=1, env=capacity)
            contestants.append(Contestant("asgi_amqp", stack, "asgi_amqp on RabbitMQ",
                                          stack.flush))
        if args.only != "asgi_amqp":
            _check_redis_python(args.redis_python)
            redis_url, private_redis = find_redis(args.redis_url)
            prefix = run_id + "-redis"
            stack = chatstack.ChatStack(
                "unused", None, prefix=prefix, workers=1, python=args.redis_python,
                settings="chatproject.settings_redis",
                env=dict(capacity, REDIS_URL=redis_url))
            contestants.append(Contestant(
                "asgi_redis", stack, "asgi_redis 1.4.3 on %s" % redis_url.split("@")[-1],
                _redis_flusher(args.redis_python, redis_url, prefix)))

        for c in contestants:
            say("Starting %s: daphne + 1 runworker ..." % c.describe)
            c.stack.start(timeout=90)
            say("  daphne pid %d (%s mode), runworker pid %d" % (
                c.stack.daphne.pid, c.stack.mode, c.stack.workers[0].pid))
        for c in contestants:  # warm-up, not recorded
            measure_latency(c.stack, 100)
            measure_throughput(c.stack, args.clients, args.window, 1.0)
            measure_closed_loop(c, 1.0, args.clients * args.window, args.driver_threads)
            measure_drain(c, min(500, args.drain_count))

        for round_no in range(args.rounds):
            order = contestants if round_no % 2 == 0 else list(reversed(contestants))
            for c in order:
                lat = measure_latency(c.stack, args.latency_ops)
                thr = measure_throughput(c.stack, args.clients, args.window, args.duration)
                loop = measure_closed_loop(c, args.duration, args.clients * args.window,
                                      args.driver_threads)
                drained = measure_drain(c, args.drain_count)
                c.latencies.append(lat)
                c.throughput.append(thr)
                c.loop.append(loop)
                c.drain.append(drained)
                lost = thr["lost"] + loop["lost"] + drained["lost"]
                say("  round %d %-10s RTT p50 %6.2f ms p99 %6.2f ms | runworker drain %5.0f "
                    "msg/s (CPU %3.0f%%) | closed loop %5.0f msg/s (worker queue empty %3.0f%%) "
                    "| via daphne %5.0f msg/s (worker %3.0f%%, daphne %3.0f%%)%s" % (
                        round_no + 1, c.name, _percentile(lat, 50) * 1000,
                        _percentile(lat, 99) * 1000, drained["rate"], drained["cpu"] * 100,
                        loop["rate"], loop["backlog_empty"] * 100,
                        thr["rate"], thr["cpu"]["worker"] * 100, thr["cpu"]["daphne"] * 100,
                        "  LOST %d" % lost if lost else ""))
                if thr["errors"]:
                    say("    errors: %s" % "; ".join(thr["errors"][:3]))
                    status = 1

        rows = [summarize(c) for c in contestants]
        if any(r["lost"] for r in rows):
            status = 1
        say()
        text = table(rows)
        say(text)
        checks = verdict(rows)
        say()
        for name, ok, detail in checks:
            say("  %-45s %s  (%s)" % (name, "yes" if ok else "NO", detail))
        load_end = os.getloadavg()
        say("  load average %.2f at start, %.2f at end, %d CPUs" % (
            load_start[0], load_end[0], os.cpu_count()))
        if args.out:
            _write_summary(args, rows, checks, text, load_start, load_end)
            say("  written: %s" % os.path.relpath(args.out))
    except KeyboardInterrupt:
        say("Interrupted.")
        status = 130
    except (BenchError, chatstack.StackError) as exc:
        say("FAILED: %s" % exc)
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for c in contestants:
            c.stack.stop()
            try:
                c.flush()
            except Exception as exc:
                say("could not remove %s's objects: %s" % (c.name, exc))
            c.stack.cleanup(keep_logs=status not in (0, 130))
        if private_redis is not None:
            private_redis.stop()
    return status


def _write_summary(args, rows, checks, text, load_start, load_end):
    def version(module):
        try:
            from importlib.metadata import version as v
            return v(module)
        except Exception:
            return "?"

    lines = [
        "# Channels 1.x end to end: asgi_amqp vs asgi_redis",
        "",
        "Written by `benchmarks/channels_bench.py` (`make bench-channels`) on %s." % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
        "",
        "daphne 1.4.2 (native Twisted mode) + one `manage.py runworker` (Channels 1.1.8, "
        "Django 2.2.28) per layer, the `/echo/` route of tests/project; clients are "
        "websocket-client in one process. Latency: %d sequential round trips per round; "
        "via daphne: %d clients x %d frames in flight for %.0f s per round; runworker drain: "
        "benchmarks/channels_drive.py queues %d websocket.receive messages for the stopped "
        "worker straight through the layer (no daphne), continues it and times it until every "
        "reply is queued (channel capacity %s on both layers); closed loop: the same driver "
        "keeps %d messages in flight from %d threads for %.0f s and samples the worker's queue "
        "every 50 ms; %d rounds, alternating, median round shown." % (
            args.latency_ops, args.clients, args.window, args.duration, args.drain_count,
            max(100, 2 * args.drain_count), args.clients * args.window, args.driver_threads,
            args.duration, args.rounds),
        "",
        text,
        "",
    ]
    for name, ok, detail in checks:
        lines.append("* %s: **%s** (%s)" % (name, "yes" if ok else "no", detail))
    lines += [
        "",
        "Rounds: " + "; ".join(
            "%s p50 %s ms, p99 %s ms, runworker drain msg/s %s, closed loop msg/s %s, "
            "via daphne msg/s %s" % (
                r["layer"], r["rounds_p50_ms"], r["rounds_p99_ms"], r["rounds_worker_rate"],
                r["rounds_loop_rate"], r["rounds_rate"]) for r in rows),
        "",
        "Machine: %s, %d CPUs, Python %s, load average %.2f at start and %.2f at end "
        "(the machine is shared: compare the two layers within one run only). "
        "pika %s, Twisted %s." % (
            platform.platform(), os.cpu_count(), platform.python_version(), load_start[0],
            load_end[0], version("pika"), version("Twisted")),
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
