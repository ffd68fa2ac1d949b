"""Benchmark asgi_amqp against raw pika, side by side, in one process.

    python benchmarks/run.py                      # every scenario, 5 rounds of 3000 ops
    python benchmarks/run.py --only send --ops 5000 --rounds 7
    python benchmarks/run.py --list

The broker is ``$AMQP_URL`` (default amqp://guest:guest@127.0.0.1:5672/%2F);
``$AMQP_MANAGEMENT_URL`` is passed to the layer if set. Everything the run
creates lives under a unique prefix and is deleted at the end.

Output: the table on stdout, ``benchmarks/results/summary.md`` and
``summary.json``, and one raw sample per operation in
``benchmarks/results/raw/samples-<timestamp>.jsonl`` (``.parquet`` when
pyarrow is importable). Exit status 1 if any check failed (an error, a
missed receive, or a message count that does not add up).
"""

import argparse
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import contestants as _contestants  # noqa: E402,F401  (registers contestants)
from benchmarks import report  # noqa: E402
from benchmarks.broker import Admin  # noqa: E402
from benchmarks.harness import CONTESTANTS, SCENARIOS, Env, Recorder, run_scenario  # noqa: E402

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=3000, help="operations per round (3000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per scenario (5)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="operations of the unrecorded warm-up round (200; 0 for none)")
    parser.add_argument("--only", action="append", default=[], metavar="SCENARIO",
                        help="run only this scenario (repeat, or comma-separate)")
    parser.add_argument("--contestants", default="", metavar="NAMES",
                        help="comma-separated contestants (default: all)")
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="directory for summary.* and raw/ (benchmarks/results)")
    parser.add_argument("--list", action="store_true", help="list scenarios and contestants")
    args = parser.parse_args(argv)
    if args.ops < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--ops and --rounds must be at least 1, --warmup at least 0")
    return args


def pick(registry, wanted, what):
    names = [n.strip() for item in wanted for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry]
    if unknown:
        sys.exit("unknown %s %s; known: %s" % (what, ", ".join(unknown), ", ".join(registry)))
    return [registry[n] for n in names] if names else list(registry.values())


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.list:
        for scenario in SCENARIOS.values():
            print("scenario   %-10s %s" % (scenario.name, scenario.title))
        for factory in CONTESTANTS.values():
            print("contestant %-10s %s" % (factory.name, factory.description))
        return 0
    scenarios = pick(SCENARIOS, args.only, "scenario")
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

    env = Env(url, prefix, admin, management_url)
    machine = report.machine_info(admin)
    print("broker %s at %s, prefix %s" % (machine["broker"], _redact(url), prefix))
    print("%s, %s cores, %s; %d rounds x %d ops per scenario, warm-up %d" % (
        machine["cpu_model"], machine["nproc"], machine["python"],
        args.rounds, args.ops, args.warmup))

    recorder = Recorder(prefix)
    contestants = []
    started = time.monotonic()
    try:
        for factory in factories:
            contestant = factory()
            contestants.append(contestant)
            contestant.setup(env)
        for scenario in scenarios:
            print("\n%s" % scenario.title)
            run_scenario(scenario, contestants, env, args.ops, args.rounds, args.warmup,
                         recorder, print)
    finally:
        for contestant in reversed(contestants):
            try:
                contestant.teardown(env)
            except Exception as exc:
                print("teardown of %s failed: %s" % (contestant.name, exc), file=sys.stderr)
        deleted = list(admin.queues), list(admin.exchanges)
        admin.delete_tracked()
        admin.close()
        print("\ncleaned up: deleted %d queues, %d exchanges under %s" % (
            len(deleted[0]), len(deleted[1]), prefix))
    elapsed = time.monotonic() - started

    import asgi_amqp
    results = report.summarize(recorder, scenarios, contestants)
    os.makedirs(os.path.join(args.results, "raw"), exist_ok=True)
    samples = report.write_samples(recorder, os.path.join(args.results, "raw"), stamp)
    meta = {
        "run_id": prefix,
        "command": " ".join(["python benchmarks/run.py"] + list(argv if argv is not None else sys.argv[1:])),
        "broker_url": _redact(url),
        "ops": args.ops, "rounds": args.rounds, "warmup_ops": args.warmup,
        "elapsed_s": round(elapsed, 1),
        "asgi_amqp_version": asgi_amqp.__version__,
        "samples_file": os.path.relpath(samples, ROOT),
        "machine": machine,
    }
    md = os.path.join(args.results, "summary.md")
    js = os.path.join(args.results, "summary.json")
    report.write_summary(md, js, meta, scenarios, results, contestants, recorder)

    names = [c.name for c in contestants]
    for scenario in scenarios:
        if results.get(scenario.name):
            print("\n" + scenario.title)
            print(report.render_text(report.detail_table(scenario, results[scenario.name], names)))
    print("\nSummary (median of %d rounds x %d ops; ratio = contestant / baseline)" % (
        args.rounds, args.ops))
    print(report.render_text(report.headline_table(scenarios, results, names)))
    print("\n%d samples -> %s\nsummary -> %s, %s\ntook %.1f s" % (
        len(recorder.samples), os.path.relpath(samples, ROOT), os.path.relpath(md, ROOT),
        os.path.relpath(js, ROOT), elapsed))

    failed = [(s, c) for s, per in results.items() for c, st in per.items()
              if st["errors"] or st["misses"] or st["problems"]]
    if failed:
        print("\nCHECKS FAILED for: %s (see summary.md)" % ", ".join(
            "%s/%s" % pair for pair in failed), file=sys.stderr)
        return 1
    return 0


def _redact(url):
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc="%s:***@%s" % (
        parts.username or "", parts.netloc.rpartition("@")[2])).geturl()


if __name__ == "__main__":
    sys.exit(main())
