"""Every benchmark of asgi_amqp, through one entry point.

    python -m benchmarks                                  # all four suites (make bench)
    python -m benchmarks --only echo                      # one suite
    python -m benchmarks --only send,receive --rounds 7   # layer scenarios by name
    python -m benchmarks --skip group,bulk
    python -m benchmarks --only layer --baseline-src ../before   # + layer@baseline
    python -m benchmarks --list

The suites (``SUITES``, each the module of ``MODULES``) run in that order,
on one broker and one Redis (``common``); the headline of every suite is
printed at the end and written to ``results/bench.md``. Exit status: 0, 1
when a suite's checks failed, 2 when the broker cannot be reached, 130 after
Ctrl-C. ``benchmarks/README.md`` says the rest.
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402  (standard library only)

SUITES = ("layer", "bulk", "channels", "echo")
MODULES = {
    "layer": "layer_bench",
    "bulk": "bulk_bench",
    "channels": "channels_bench",
    "echo": "echo_ceiling",
}
TITLES = {
    "layer": "Layer scenarios (a)-(m)",
    "bulk": "Bulk sends",
    "channels": "Channels 1.x end to end",
    "echo": "One worker echoing, without Django",
}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        epilog="See benchmarks/README.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("what to run")
    run.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAMES",
        help="suites (%s) and/or layer scenarios to run, comma-separated or "
        "repeated" % ", ".join(SUITES),
    )
    run.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAMES",
        help="suites and/or layer scenarios to leave out",
    )
    run.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds for every suite (default: layer 5, bulk 1, channels 5, echo 5)",
    )
    run.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="another checkout: adds layer@baseline (the layer imported from "
        "DIR) and layer@current (this tree's), both in worker processes, to "
        "the layer suite, and asgi_amqp@baseline to the echo suite",
    )
    run.add_argument(
        "--list", action="store_true", help="list suites, scenarios and contestants, then exit"
    )
    shared = parser.add_argument_group("shared")
    shared.add_argument(
        "--redis-url",
        help="the Redis for asgi_redis (default: $BENCH_REDIS_URL"
        ", $REDIS_URL, 127.0.0.1:6379, else a private redis-server)",
    )
    shared.add_argument(
        "--redis-python",
        help="Python of asgi_redis's virtualenv (default: $BENCH_REDIS_PYTHON, "
        "else .venv-redis, made on first use)",
    )
    shared.add_argument("--results", default=common.RESULTS, help="where results go")
    shared.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    layer = parser.add_argument_group("layer suite")
    layer.add_argument(
        "--ops",
        type=int,
        default=3000,
        help="operations per round (group 200, wakeup 60 unless --set-ops)",
    )
    layer.add_argument(
        "--set-ops",
        action="append",
        default=[],
        metavar="SCENARIO=N",
        help="operations per round of one scenario, e.g. group=100",
    )
    layer.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="operations of the unrecorded warm-up round (0 for none)",
    )
    layer.add_argument(
        "--contestants",
        default="",
        metavar="NAMES",
        help="comma-separated contestants (default: all)",
    )
    layer.add_argument(
        "--engine",
        choices=("spark", "python"),
        default="spark",
        help="aggregate with PySpark or plain Python",
    )
    layer.add_argument(
        "--master", default=os.environ.get("SPARK_MASTER", "local[2]"), help="Spark master"
    )
    bulk = parser.add_argument_group("bulk suite")
    bulk.add_argument("--bulk-rows", type=int, default=100000, help="rows per sender")
    channels = parser.add_argument_group("channels suite")
    channels.add_argument(
        "--channels-layers",
        default="",
        metavar="NAMES",
        help="asgi_amqp and/or asgi_redis (default: both)",
    )
    channels.add_argument(
        "--channels-latency-ops",
        type=int,
        default=500,
        help="sequential WebSocket round trips per round",
    )
    channels.add_argument(
        "--channels-duration",
        type=float,
        default=3.0,
        help="seconds per throughput round",
    )
    channels.add_argument(
        "--channels-clients", type=int, default=4, help="WebSocket clients of the throughput round"
    )
    channels.add_argument(
        "--channels-window", type=int, default=8, help="frames in flight per client"
    )
    channels.add_argument(
        "--channels-drain-count",
        type=int,
        default=3000,
        help="messages queued for the runworker drain",
    )
    channels.add_argument(
        "--channels-threads",
        default="1,2,4,8",
        metavar="COUNTS",
        help="runworker --threads N of the threads table, comma-separated (1 reuses the "
        "rounds' drain; each other N restarts both workers)",
    )
    echo = parser.add_argument_group("echo suite")
    echo.add_argument(
        "--echo-drain",
        type=int,
        default=3000,
        metavar="COUNT",
        help="messages per drain round",
    )
    echo.add_argument(
        "--echo-threads",
        default="1,2,4,8",
        metavar="COUNTS",
        help="worker threads of the raw-pika-pipelined, asgi_amqp and asgi_redis "
        "workers, comma-separated",
    )
    return parser


def _thread_counts(parser, option, text):
    try:
        counts = [int(n) for n in _names([text])]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        parser.error("%s takes thread counts such as 1,2,4,8, not %r" % (option, text))
    return sorted(set(counts))


def _names(items):
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        return parser, args
    from benchmarks import layer_bench
    from benchmarks.harness import SCENARIOS

    known = list(SUITES) + list(SCENARIOS)
    only, skip = _names(args.only), _names(args.skip)
    unknown = [n for n in only + skip if n not in known]
    if unknown:
        parser.error(
            "unknown suite or scenario %s; known: %s" % (", ".join(unknown), ", ".join(known))
        )
    args.scenarios = [n for n in only if n in SCENARIOS]
    args.skip_scenarios = [n for n in skip if n in SCENARIOS]
    chosen = [n for n in only if n in SUITES]
    if args.scenarios and "layer" not in chosen:
        chosen.append("layer")
    args.suites = [s for s in SUITES if (not only or s in chosen) and s not in skip]
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.channels_layers = _names([args.channels_layers])
    if set(args.channels_layers) - {"asgi_amqp", "asgi_redis"}:
        parser.error("--channels-layers takes asgi_amqp and/or asgi_redis")
    if args.echo_drain < 1:
        parser.error("--echo-drain must be at least 1")
    args.echo_threads = _thread_counts(parser, "--echo-threads", args.echo_threads)
    args.channels_threads = _thread_counts(parser, "--channels-threads", args.channels_threads)
    layer_bench.check_args(parser, args)
    args.baseline = None
    if args.baseline_src:
        try:
            args.baseline = common.LayerSource(args.baseline_src, "baseline")
        except ValueError as exc:
            parser.error("--baseline-src: %s" % exc)
    return parser, args


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(signum)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, args = parse_args(argv)
    if args.list:
        from benchmarks import layer_bench

        print("suites: %s" % ", ".join(SUITES))
        layer_bench.list_all()
        return 0
    if not args.suites:
        parser.error("nothing to run")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)

    import importlib
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = " ".join(["python -m benchmarks"] + argv)
    started = time.monotonic()
    results = {}
    status = 0
    ctx = None
    try:
        with common.provide_broker() as broker:
            common.say("broker: %s, %s" % (broker.description, common.redact(broker.amqp_url)))
            ctx = common.Context(args, broker, command)
            for suite in args.suites:
                common.say("\n=== %s (%s) ===" % (TITLES[suite], suite))
                module = importlib.import_module("benchmarks." + MODULES[suite])
                begin = time.monotonic()
                try:
                    result = module.run(args, ctx)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    import traceback

                    traceback.print_exc()
                    result = common.SuiteResult(1, note="%s: %s" % (type(exc).__name__, exc))
                result.elapsed = time.monotonic() - begin
                results[suite] = result
                status = max(status, result.status)
                if result.status == 2:
                    break
    except KeyboardInterrupt:
        common.say("\ninterrupted: cleaned up, no report")
        return 130
    except Exception as exc:  # the broker could not be provided
        common.say("cannot provide a broker: %s: %s" % (type(exc).__name__, exc))
        return 2
    finally:
        if ctx is not None:
            ctx.close()
    elapsed = time.monotonic() - started
    _headline(results, command, elapsed, args.results)
    return status


def _headline(results, command, elapsed, results_dir):
    lines = []
    for suite, result in results.items():
        lines += [
            "## %s (`%s`): %s, %.0f s"
            % (
                TITLES[suite],
                suite,
                {0: "ok", 1: "CHECKS FAILED", 2: "no broker"}.get(
                    result.status, "status %d" % result.status
                ),
                result.elapsed or 0,
            ),
            "",
        ]
        if result.headline:
            lines += [result.headline, ""]
        if result.note:
            lines += [result.note, ""]
        if result.paths:
            lines += ["Written: %s" % ", ".join(os.path.relpath(p, ROOT) for p in result.paths), ""]
    lines.append("Wall time of the whole run: %.0f s (%.1f min)." % (elapsed, elapsed / 60))
    text = "\n".join(lines)
    common.say("\n" + "=" * 78 + "\nHEADLINES\n" + "=" * 78 + "\n" + text)
    common.write_result(
        results_dir, "bench", "asgi_amqp benchmarks: headlines", text, command=command
    )


if __name__ == "__main__":
    sys.exit(main())
