"""The layer suite: scenarios (a)-(m), asgi_amqp side by side with asgi_redis
and raw pika (``python -m benchmarks --only layer``).

Everything the run creates on the broker lives under a unique prefix
(``bench-<stamp>-<pid>``; on Redis under the same key prefix) and is deleted
at the end, also after an error or Ctrl-C. The raw samples go to
``results/raw/`` (``report.write_raw``); ``report_spark.py`` aggregates them
with PySpark into ``results/summary.md`` and ``summary.json``.
"""

import json
import logging
import os
import subprocess
import sys
import time

from . import common, report
from . import contestants as _contestants  # registers the contestants
from .broker import Admin
from .harness import CONTESTANTS, SCENARIOS, Env, Recorder, run_scenario
from .scenarios import MESSAGE_SIZE, TARGETS

METHOD = (
    "All contestants run in one invocation, one scenario at a time: one unrecorded "
    "warm-up round each, then the measured rounds, in which the contestants take turns "
    "in an order that rotates every round (ABCDE, BCDEA, ...), so that drifting load on a "
    "shared machine spreads over all of them. asgi_redis runs in a worker process of its "
    "own virtualenv (and with --baseline-src, layer@baseline and layer@current in worker "
    "processes of this Python); they play whole rounds there with the same code, and only "
    "the samples cross the pipe. Filling a channel before a receive round, purging it and "
    "counting what it holds are untimed and happen on separate connections. A round's "
    "rate is its successful operations divided by its wall time; the headline is the "
    "median round. Latencies are percentiles over every successful sample of every "
    "round. Messages are %d-byte msgpack dicts. Ratios come from this one run; absolute "
    "figures depend on the machine's load (recorded above)." % MESSAGE_SIZE
)

DEFAULT_ROUNDS = 5


def check_args(parser, args):
    """Validate and complete the layer suite's options (called by the entry point)."""
    if args.ops < 1 or args.warmup < 0:
        parser.error("--ops must be at least 1, --warmup at least 0")
    args.scenario_ops = {}
    for item in args.set_ops:
        for part in item.split(","):
            name, _, value = part.partition("=")
            if name.strip() not in SCENARIOS or not value.strip().isdigit():
                parser.error("--set-ops wants SCENARIO=N with a known scenario, not %r" % part)
            args.scenario_ops[name.strip()] = int(value)


def list_all():
    for scenario in SCENARIOS.values():
        print("scenario   %-16s %s" % (scenario.name, scenario.title))
    for factory in CONTESTANTS.values():
        print("contestant %-16s %s" % (factory.name, factory.description))
    if "layer@baseline" not in CONTESTANTS:
        print(
            "contestant %-16s with --baseline-src DIR: the layer imported from DIR, in a "
            "worker process" % "layer@baseline"
        )
        print(
            "contestant %-16s with --baseline-src DIR: the layer of this tree, in a worker "
            "process of the same shape" % "layer@current"
        )


def _pick_contestants(names):
    names = [n.strip() for n in names.split(",") if n.strip()] if names else []
    unknown = [n for n in names if n not in CONTESTANTS]
    if unknown:
        raise SystemExit(
            "unknown contestant %s; known: %s" % (", ".join(unknown), ", ".join(CONTESTANTS))
        )
    return [CONTESTANTS[n] for n in names] if names else list(CONTESTANTS.values())


class Progress(object):
    """A tqdm bar over all contestant-rounds (plain prints without tqdm)."""

    def __init__(self, total, enabled):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total,
                    unit="round",
                    dynamic_ncols=True,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} rounds [{elapsed}<{remaining}]",
                )
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


def run(args, ctx):
    """Play the selected scenarios; a ``common.SuiteResult``."""
    if ctx.baseline is not None and "layer@baseline" not in CONTESTANTS:
        _contestants.register_layer_sources(ctx.baseline)
    scenarios = [
        s
        for s in SCENARIOS.values()
        if (not args.scenarios or s.name in args.scenarios) and s.name not in args.skip_scenarios
    ]
    factories = _pick_contestants(args.contestants)
    rounds = args.rounds or DEFAULT_ROUNDS
    url, management_url = ctx.amqp_url, ctx.management_url
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    prefix = "bench-%s-%d" % (stamp, os.getpid())
    pika_logger = logging.getLogger("pika")
    pika_logger.setLevel(logging.CRITICAL)  # one clear line below instead of pika's traceback
    try:
        admin = Admin(url, management_url)
    except Exception as exc:
        common.say(
            "cannot connect to the broker at %s (%s%s)"
            % (common.redact(url), type(exc).__name__, ": %s" % exc if str(exc) else "")
        )
        return common.SuiteResult(2, note="the broker cannot be reached")
    finally:
        pika_logger.setLevel(logging.NOTSET)

    redis = None
    args.redis_python_resolved = None
    if any(f.name == "asgi-redis" for f in factories):
        redis = ctx.redis
        args.redis_url_resolved, args.redis_reason = redis.url, redis.reason
        if redis.url:
            python, reason = ctx.redis_python()
            args.redis_python_resolved, args.redis_python_reason = python, reason
    options = _Options(args)
    env = Env(url, prefix, admin, management_url, options=options)
    machine = report.machine_info(admin)
    common.say("broker %s at %s, prefix %s" % (machine["broker"], common.redact(url), prefix))
    if ctx.baseline is not None:
        common.say("baseline: the layer from %s" % ctx.baseline.describe())
    common.say(
        "%s, %s cores, load %s, %s; %d rounds x %d ops per scenario (%s), warm-up %d"
        % (
            machine["cpu_model"],
            machine["nproc"],
            machine["loadavg_at_start"],
            machine["python"],
            rounds,
            args.ops,
            ", ".join(
                "%s %d" % (s.name, _ops(s, options))
                for s in scenarios
                if _ops(s, options) != args.ops
            ),
            args.warmup,
        )
    )

    recorder = Recorder(prefix)
    players, skipped = [], {}
    started = time.monotonic()
    progress = None
    try:
        for factory in factories:
            contestant = factory()
            try:
                contestant.setup(env)
            except Exception as exc:
                reason = "%s: %s" % (type(exc).__name__, exc)
                common.say("contestant %s left out: %s" % (factory.name, reason))
                skipped[factory.name] = reason
                try:
                    contestant.teardown(env)
                except Exception:
                    pass
                continue
            players.append(contestant)
        total = sum(rounds * sum(1 for c in players if c.takes_part(s)) for s in scenarios)
        progress = Progress(total, ctx.progress)
        for scenario in scenarios:
            progress.log("\n%s" % scenario.title)
            progress.describe("(%s) %s" % (scenario.letter, scenario.name))
            run_scenario(
                scenario,
                players,
                env,
                _ops(scenario, options),
                rounds,
                args.warmup,
                recorder,
                progress.log,
                progress=progress.step,
            )
    finally:
        if progress is not None:
            progress.close()
        for contestant in reversed(players):
            try:
                contestant.teardown(env)
            except Exception as exc:
                common.say("teardown of %s failed: %s" % (contestant.name, exc))
        deleted = admin.delete_tracked()
        admin.close()
        common.say(
            "\ncleaned up under %s: %d queues and %d exchanges deleted (or already "
            "gone)" % (prefix, deleted[0], deleted[1])
        )
    elapsed = time.monotonic() - started

    import asgi_amqp

    run_info = {
        "run_id": prefix,
        "command": ctx.command,
        "broker_url": common.redact(url),
        "redis": redis.describe() if redis is not None and redis.url else None,
        "baseline": ctx.baseline.describe() if ctx.baseline is not None else None,
        "elapsed_s": round(elapsed, 1),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "asgi_amqp_version": asgi_amqp.__version__,
        "machine": machine,
        "method": METHOD,
        "options": {
            "ops": args.ops,
            "rounds": rounds,
            "warmup_ops": args.warmup,
            "scenario_ops": {s.name: _ops(s, options) for s in scenarios},
        },
        "scenarios": [s.describe() for s in scenarios],
        "targets": [t.describe() for t in TARGETS if t.scenario in {s.name for s in scenarios}],
        "contestants": [
            {"name": c.name, "description": c.description, "versions": c.versions()}
            for c in players
        ],
        "skipped_contestants": skipped,
    }
    raw_dir = os.path.join(ctx.results, "raw")
    run_path = report.write_raw(recorder, run_info, raw_dir, stamp)
    common.say(
        "%d samples, %d rounds -> %s"
        % (len(recorder.samples), len(recorder.rounds), os.path.relpath(raw_dir, common.ROOT))
    )

    # PySpark in a process of its own: its JVM and threads stay out of this one.
    status = subprocess.call(
        [
            sys.executable,
            os.path.join(common.HERE, "report_spark.py"),
            "--run",
            run_path,
            "--results",
            ctx.results,
            "--engine",
            args.engine,
            "--master",
            args.master,
        ]
    )
    if status != 0:
        common.say("the report failed (status %d); raw files are in %s" % (status, raw_dir))
    common.say("took %.1f s (report included: %.1f s)" % (elapsed, time.monotonic() - started))

    headline = _headline(os.path.join(ctx.results, "summary.json"))
    failed = sorted(
        {
            (r["scenario"], r["contestant"])
            for r in recorder.rounds
            if r["error_count"] or r["misses"] or r["problem_count"]
        }
    )
    if failed:
        note = "CHECKS FAILED for: %s (see summary.md)" % ", ".join(
            "%s/%s" % pair for pair in failed
        )
        common.say("\n" + note)
        return common.SuiteResult(1, headline, [os.path.join(ctx.results, "summary.md")], note)
    return common.SuiteResult(
        0 if status == 0 else 1, headline, [os.path.join(ctx.results, "summary.md")]
    )


def _headline(summary_path):
    """The summary, the ratio table and the targets, as markdown, from summary.json."""
    try:
        with open(summary_path) as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return "(no summary.json)"
    stats, targets = document["stats"], document["targets_evaluated"]
    parts = [report.render_markdown(report.summary_table(stats, document), left=2)]
    for subject, others in report.ratio_subjects(document):
        parts.append(
            report.render_markdown(report.ratio_table(stats, document, subject, others), left=2)
        )
    parts.append(report.render_markdown(report.targets_table(targets, stats, document)))
    return "\n\n".join(parts)


class _Options(object):
    """The options contestants and scenarios read (``env.options``)."""

    def __init__(self, args):
        self.ops = args.ops
        self.scenario_ops = args.scenario_ops
        self.redis_url = getattr(args, "redis_url_resolved", None)
        self.redis_reason = getattr(args, "redis_reason", None)
        self.redis_python = getattr(args, "redis_python_resolved", None)
        self.redis_python_reason = getattr(args, "redis_python_reason", None)


def _ops(scenario, options):
    if scenario.name in options.scenario_ops:
        return options.scenario_ops[scenario.name]
    return scenario.default_ops or options.ops
