"""Benchmark asgi_amqp side by side with asgi_redis, asgiref.inmemory and raw pika.

    python benchmarks/run.py                      # every scenario (a)-(h), ~6-8 min
    python benchmarks/run.py --only send,receive --ops 5000 --rounds 7
    python benchmarks/run.py --full               # memory scenario up to 1M messages
    python benchmarks/run.py --list

The broker is ``$AMQP_URL`` (default amqp://guest:guest@127.0.0.1:5672/%2F);
``$AMQP_MANAGEMENT_URL`` is passed to the layer if set. Redis is
``$BENCH_REDIS_URL``, else 127.0.0.1:6379 if it answers, else a private
redis-server on a free port. Everything the run creates lives under a unique
prefix and is deleted at the end.

Output: the raw samples (``results/raw/samples-<stamp>.parquet``, one row
per timed operation; ``rounds-<stamp>.parquet``; ``run-<stamp>.json``),
then ``report_spark.py`` aggregates them with PySpark into
``results/summary.md``, ``summary.json`` and PNG charts, and prints the
targets table. Exit status 1 if any check failed (an error, a missed
receive, or a message count that does not add up), 2 if the broker cannot
be reached. A target that is not met does not change the exit status.
"""

import argparse
import logging
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import contestants as _contestants  # noqa: E402,F401  (registers contestants)
from benchmarks import remote, report  # noqa: E402
from benchmarks.broker import Admin  # noqa: E402
from benchmarks.harness import (CONTESTANTS, SCENARIOS, Env, Recorder,  # noqa: E402
                                run_scenario)
from benchmarks.scenarios import MESSAGE_SIZE, TARGETS  # noqa: E402

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

METHOD = (
    "All contestants run in one invocation, one scenario at a time: one unrecorded "
    "warm-up round each, then the measured rounds, in which the contestants take turns "
    "in an order that rotates every round (ABCDE, BCDEA, ...), so that drifting load on a "
    "shared machine spreads over all of them. asgi_redis runs in a worker process of its "
    "own virtualenv; it plays whole rounds there with the same code, and only the "
    "samples cross the pipe. Filling a channel before a receive round, purging it and "
    "counting what it holds are untimed and happen on separate connections. A round's "
    "rate is its successful operations divided by its wall time; the headline is the "
    "median round. Latencies are percentiles over every successful sample of every "
    "round. Messages are %d-byte msgpack dicts. Ratios come from this one run; absolute "
    "figures depend on the machine's load (recorded above)." % MESSAGE_SIZE)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=3000,
                        help="operations per round (3000; group 200, wakeup 60 unless --set-ops)")
    parser.add_argument("--set-ops", action="append", default=[], metavar="SCENARIO=N",
                        help="operations per round of one scenario, e.g. group=100")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per scenario (5)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="operations of the unrecorded warm-up round (200; 0 for none)")
    parser.add_argument("--only", action="append", default=[], metavar="SCENARIO",
                        help="run only this scenario (repeat, or comma-separate)")
    parser.add_argument("--skip", action="append", default=[], metavar="SCENARIO",
                        help="leave this scenario out (repeat, or comma-separate)")
    parser.add_argument("--contestants", default="", metavar="NAMES",
                        help="comma-separated contestants (default: all)")
    parser.add_argument("--memory-from", type=int, default=100000,
                        help="messages before the memory baseline checkpoint (100000)")
    parser.add_argument("--memory-to", type=int, default=300000,
                        help="messages sent and received in the memory scenario (300000)")
    parser.add_argument("--memory-step", type=int, default=10000,
                        help="messages between RSS checkpoints (10000)")
    parser.add_argument("--full", action="store_true",
                        help="memory scenario up to 1,000,000 messages (takes longer)")
    parser.add_argument("--redis-url", help="Redis for asgi_redis (default: see above)")
    parser.add_argument("--redis-python",
                        help="Python of a virtualenv with asgi_redis 1.4.3 (default: "
                             "benchmarks/.venv-redis, made on first use)")
    parser.add_argument("--engine", choices=("spark", "python"), default="spark",
                        help="aggregate with PySpark (default) or plain Python")
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"),
                        help="Spark master (local[2])")
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="directory for summary.*, charts and raw/ (benchmarks/results)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    parser.add_argument("--list", action="store_true", help="list scenarios and contestants")
    args = parser.parse_args(argv)
    if args.full:
        args.memory_to = max(args.memory_to, 1000000)
    if args.ops < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--ops and --rounds must be at least 1, --warmup at least 0")
    if not 0 < args.memory_from < args.memory_to or args.memory_step < 1:
        parser.error("need 0 < --memory-from < --memory-to and --memory-step >= 1")
    args.scenario_ops = {}
    for item in args.set_ops:
        for part in item.split(","):
            name, _, value = part.partition("=")
            if name.strip() not in SCENARIOS or not value.strip().isdigit():
                parser.error("--set-ops wants SCENARIO=N with a known scenario, not %r" % part)
            args.scenario_ops[name.strip()] = int(value)
    return args


def _names(items):
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


def pick(registry, wanted, what):
    names = _names(wanted)
    unknown = [n for n in names if n not in registry]
    if unknown:
        sys.exit("unknown %s %s; known: %s" % (what, ", ".join(unknown), ", ".join(registry)))
    return [registry[n] for n in names] if names else list(registry.values())


class Progress(object):
    """A tqdm bar over all contestant-rounds (plain prints without tqdm)."""

    def __init__(self, total, enabled):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, unit="round", dynamic_ncols=True,
                                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} rounds "
                                           "[{elapsed}<{remaining}]")
            except ImportError:
                pass

    def log(self, text):
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def step(self, n=1):
        if self.bar is not None:
            self.bar.update(n)

    def describe(self, text):
        if self.bar is not None:
            self.bar.set_description(text)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class MemoryProgress(object):
    """A tqdm bar for the memory scenario's messages (fed by the worker)."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.bar = None

    def __call__(self, done, total):
        if not self.enabled:
            return
        if self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self.enabled = False
                return
            self.bar = tqdm(total=total, unit="msg", unit_scale=True, leave=False,
                            desc="(h) messages", position=1, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()
            self.bar = None


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.list:
        for scenario in SCENARIOS.values():
            print("scenario   %-16s %s" % (scenario.name, scenario.title))
        for factory in CONTESTANTS.values():
            print("contestant %-16s %s" % (factory.name, factory.description))
        return 0
    scenarios = [s for s in pick(SCENARIOS, args.only, "scenario")
                 if s.name not in _names(args.skip)]
    factories = pick(CONTESTANTS, [args.contestants] if args.contestants else [], "contestant")

    url = os.environ.get("AMQP_URL") or DEFAULT_URL
    management_url = os.environ.get("AMQP_MANAGEMENT_URL") or None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    prefix = "bench-%s-%d" % (stamp, os.getpid())
    pika_logger = logging.getLogger("pika")
    pika_logger.setLevel(logging.CRITICAL)  # one clear line below instead of pika's traceback
    try:
        admin = Admin(url)
    except Exception as exc:
        print("cannot connect to the broker at %s (%s%s); is RabbitMQ running? "
              "Set AMQP_URL to point at it." % (_redact(url), type(exc).__name__,
                                                ": %s" % exc if str(exc) else ""),
              file=sys.stderr)
        return 2
    finally:
        pika_logger.setLevel(logging.NOTSET)

    redis = None
    if any(f.name == "asgi-redis" for f in factories):
        redis = remote.RedisServer(args.redis_url)
        args.redis_url = redis.url
        args.redis_reason = redis.reason
    progress_enabled = not args.no_progress
    args.memory_progress = MemoryProgress(progress_enabled)
    env = Env(url, prefix, admin, management_url, options=args)
    machine = report.machine_info(admin)
    print("broker %s at %s, prefix %s" % (machine["broker"], _redact(url), prefix))
    if redis is not None:
        print("redis %s%s" % (redis.url or "none: " + (redis.reason or "?"),
                              " (private redis-server)" if redis.private else ""))
    print("%s, %s cores, load %s, %s; %d rounds x %d ops per scenario (%s), warm-up %d" % (
        machine["cpu_model"], machine["nproc"], machine["loadavg_at_start"], machine["python"],
        args.rounds, args.ops, ", ".join("%s %d" % (s.name, _ops(s, args)) for s in scenarios
                                         if _ops(s, args) != args.ops), args.warmup))

    recorder = Recorder(prefix)
    contestants, skipped = [], {}
    started = time.monotonic()
    progress = None
    try:
        for factory in factories:
            contestant = factory()
            try:
                contestant.setup(env)
            except Exception as exc:
                reason = "%s: %s" % (type(exc).__name__, exc)
                print("contestant %s left out: %s" % (factory.name, reason), file=sys.stderr)
                skipped[factory.name] = reason
                try:
                    contestant.teardown(env)
                except Exception:
                    pass
                continue
            contestants.append(contestant)
        total = sum(_rounds(s, args) * sum(1 for c in contestants if c.takes_part(s))
                    for s in scenarios)
        progress = Progress(total, progress_enabled)
        for scenario in scenarios:
            progress.log("\n%s" % scenario.title)
            progress.describe("(%s) %s" % (scenario.letter, scenario.name))
            run_scenario(scenario, contestants, env, _ops(scenario, args),
                         _rounds(scenario, args), args.warmup, recorder, progress.log,
                         progress=progress.step)
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up, no report", file=sys.stderr)
        return 130
    finally:
        if progress is not None:
            progress.close()
        for contestant in reversed(contestants):
            try:
                contestant.teardown(env)
            except Exception as exc:
                print("teardown of %s failed: %s" % (contestant.name, exc), file=sys.stderr)
        deleted = admin.delete_tracked()
        admin.close()
        if redis is not None:
            redis.stop()
        print("\ncleaned up under %s: %d queues and %d exchanges deleted (or already gone)"
              % (prefix, deleted[0], deleted[1]))
    elapsed = time.monotonic() - started

    import asgi_amqp
    run = {
        "run_id": prefix,
        "command": " ".join(["python benchmarks/run.py"] + list(
            argv if argv is not None else sys.argv[1:])),
        "broker_url": _redact(url),
        "redis": ("%s%s" % (_redact(redis.url), " (private redis-server)" if redis.private
                            else "")) if redis is not None and redis.url else None,
        "elapsed_s": round(elapsed, 1),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "asgi_amqp_version": asgi_amqp.__version__,
        "machine": machine,
        "method": METHOD,
        "options": {"ops": args.ops, "rounds": args.rounds, "warmup_ops": args.warmup,
                    "scenario_ops": {s.name: _ops(s, args) for s in scenarios},
                    "scenario_rounds": {s.name: _rounds(s, args) for s in scenarios},
                    "memory_from": args.memory_from, "memory_to": args.memory_to,
                    "memory_step": args.memory_step},
        "scenarios": [s.describe() for s in scenarios],
        "targets": [t.describe() for t in TARGETS if t.scenario in {s.name for s in scenarios}],
        "contestants": [{"name": c.name, "description": c.description,
                         "versions": c.versions()} for c in contestants],
        "skipped_contestants": skipped,
    }
    raw_dir = os.path.join(args.results, "raw")
    run_path = report.write_raw(recorder, run, raw_dir, stamp)
    print("%d samples, %d rounds -> %s" % (len(recorder.samples), len(recorder.rounds),
                                          os.path.relpath(raw_dir, ROOT)))

    status = subprocess.call([sys.executable, os.path.join(HERE, "report_spark.py"),
                              "--run", run_path, "--results", args.results,
                              "--engine", args.engine, "--master", args.master])
    if status != 0:
        print("the report failed (status %d); raw files are in %s" % (status, raw_dir),
              file=sys.stderr)
    print("took %.1f s (report included: %.1f s)" % (elapsed, time.monotonic() - started))

    failed = sorted({(r["scenario"], r["contestant"]) for r in recorder.rounds
                     if r["error_count"] or r["misses"] or r["problem_count"]})
    if failed:
        print("\nCHECKS FAILED for: %s (see summary.md)" % ", ".join(
            "%s/%s" % pair for pair in failed), file=sys.stderr)
        return 1
    return 0 if status == 0 else 1


def _ops(scenario, args):
    if scenario.name in args.scenario_ops:
        return args.scenario_ops[scenario.name]
    if scenario.kind == "memory":
        return args.memory_to
    return scenario.default_ops or args.ops


def _rounds(scenario, args):
    return scenario.default_rounds or args.rounds


def _redact(url):
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc="%s:***@%s" % (
        parts.username or "", parts.netloc.rpartition("@")[2])).geturl()


if __name__ == "__main__":
    sys.exit(main())
