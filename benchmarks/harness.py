"""The benchmark harness: scenarios, contestants, rounds and raw samples.

scenario
    *What* is measured (``SCENARIOS``, from ``scenarios.py``): a metric, a kind (``rate`` or
    ``latency``) and a runner that drives one round (``run_sequential``, ``run_wakeup``).
contestant
    *Who* is measured (``CONTESTANTS``, from ``contestants.py``): ``setup(env)``,
    ``teardown(env)`` and a ``scenario_<name>(env, ops)`` returning a :class:`Trial` for each
    scenario it takes part in. One in another process (``common.Worker``) gives its trial a
    ``run`` that plays the whole round there and returns the ``RoundResult``.
trial
    One round of one scenario for one contestant: ``prepare()`` (untimed, e.g. fill a queue),
    ``op(i)`` (timed; ``False`` marks a miss, raising an error) and ``finish()`` (untimed;
    returns the problems found, e.g. messages missing; may set ``trial.delivered``).

Every round runs every contestant, in an order rotating from round to round (ABC, BCA, CAB),
after one unrecorded warm-up round each. Each op's start and duration are a raw sample,
aggregated afterwards by ``report_spark.py`` or ``report.aggregate_python``.

Standard library and ``common`` only: worker processes in asgi_redis's virtualenv import it.
"""

import collections
import concurrent.futures
import queue as queue_module
import threading
import time

from .common import rotate

# -- registries -------------------------------------------------------------------

SCENARIOS = collections.OrderedDict()
CONTESTANTS = collections.OrderedDict()

MAX_ERRORS_PER_ROUND = 5  # a round with more errors than this is abandoned


class Scenario(object):
    """What is measured.

    ``kind``: ``"rate"`` (headline: median per-round ops/s, higher is
    better) or ``"latency"`` (headline: p50 per-op duration in ms, lower is
    better). ``fanout``: deliveries per op (send_group to N members),
    reported as a second rate. ``default_ops`` overrides the run's ``--ops``
    for scenarios whose ops are much slower or faster.
    """

    def __init__(
        self,
        name,
        title,
        metric,
        runner,
        baseline="raw-pika",
        kind="rate",
        description="",
        default_ops=None,
        letter="",
        fanout=None,
    ):
        self.name = name
        self.title = title
        self.metric = metric
        self.runner = runner
        self.baseline = baseline
        self.kind = kind
        self.description = description
        self.default_ops = default_ops
        self.letter = letter
        self.fanout = fanout

    @property
    def method_name(self):
        return "scenario_" + self.name.replace("-", "_")

    def describe(self):
        return {
            "name": self.name,
            "letter": self.letter,
            "title": self.title,
            "metric": self.metric,
            "kind": self.kind,
            "baseline": self.baseline,
            "fanout": self.fanout,
            "description": self.description,
        }


def register_scenario(scenario):
    SCENARIOS[scenario.name] = scenario
    return scenario


def register_contestant(factory):
    """Register a contestant class (or a zero-argument factory with a ``name``)."""
    CONTESTANTS[factory.name] = factory
    return factory


class Trial(object):
    """One round's callables. Extra keyword arguments become attributes that
    particular runners use (``receive``/``send``/``sender_init`` for
    ``run_wakeup``); ``run(ops)``, if given, replaces the scenario's runner."""

    def __init__(self, op=None, prepare=None, finish=None, run=None, **extra):
        self.op = op
        self.prepare = prepare or (lambda: None)
        self.finish = finish or (lambda: [])
        self.run = run
        self.delivered = None
        for key, value in extra.items():
            setattr(self, key, value)


class Contestant(object):
    """Base class: override ``setup``/``teardown`` and add ``scenario_<name>`` methods."""

    name = "?"
    description = ""

    def setup(self, env):
        pass

    def teardown(self, env):
        pass

    def versions(self):
        """Versions of what this contestant runs, for the summary."""
        return {}

    def trial(self, scenario, env, ops):
        method = getattr(self, scenario.method_name, None)
        return None if method is None else method(env, ops)

    def takes_part(self, scenario):
        return getattr(self, scenario.method_name, None) is not None


class Env(object):
    """What contestants share: the broker URL, the run's unique prefix, the
    housekeeping connection (``admin``, see ``broker.Admin``) and options
    (``options.redis_url`` etc.)."""

    def __init__(self, url, prefix, admin, management_url=None, options=None):
        self.url = url
        self.prefix = prefix
        self.admin = admin
        self.management_url = management_url
        self.options = options


# -- runners -----------------------------------------------------------------------


class RoundResult(object):
    """What one round produced. ``values`` is an optional per-op number (the
    send's own duration in ms for wake-ups)."""

    FIELDS = (
        "ops_done",
        "wall_s",
        "starts_ns",
        "durations_ns",
        "oks",
        "errors",
        "values",
        "problems",
        "delivered",
    )

    def __init__(self, ops_done, wall_s, starts_ns, durations_ns, oks, errors, values=None):
        self.ops_done = ops_done
        self.wall_s = wall_s
        self.starts_ns = starts_ns
        self.durations_ns = durations_ns
        self.oks = oks
        self.errors = errors  # list of "ExceptionName: text"
        self.values = values  # one per op, or None
        self.problems = []  # from trial.finish()
        self.delivered = None  # from trial.delivered

    @property
    def misses(self):
        return sum(1 for ok in self.oks if not ok)

    @property
    def good(self):
        return self.ops_done - self.misses

    @property
    def rate(self):
        return self.good / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self):
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, data):
        result = cls(
            data["ops_done"],
            data["wall_s"],
            data["starts_ns"],
            data["durations_ns"],
            data["oks"],
            data["errors"],
            data.get("values"),
        )
        result.problems = data.get("problems") or []
        result.delivered = data.get("delivered")
        return result

    @classmethod
    def failed(cls, text):
        return cls(0, 0.0, [], [], [], [text])


def _error_text(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def run_sequential(trial, ops):
    """Call ``trial.op(i)`` for i in range(ops) in this thread, timing each call."""
    perf = time.perf_counter_ns
    op = trial.op
    starts, durations, oks, errors = [], [], [], []
    begin = perf()
    for i in range(ops):
        start = perf()
        try:
            ok = op(i) is not False
        except Exception as exc:  # recorded, and the round goes on (up to a limit)
            ok = False
            errors.append(_error_text(exc))
        end = perf()
        starts.append(start)
        durations.append(end - start)
        oks.append(ok)
        if len(errors) > MAX_ERRORS_PER_ROUND:
            errors.append("round abandoned after %d errors" % len(errors))
            break
    wall = (perf() - begin) / 1e9
    return RoundResult(len(oks), wall, starts, durations, oks, errors)


def threaded_runner(threads):
    """A runner that calls ``trial.op(i)`` for i in range(ops) from ``threads`` threads
    at once; the wall time runs from the first call to the last one's end."""

    def run_threaded(trial, ops):
        perf = time.perf_counter_ns
        rows, errors = [], []  # list.append is atomic: the threads share them

        def one(i):
            start = perf()
            try:
                ok = trial.op(i) is not False
            except Exception as exc:  # recorded, as in run_sequential
                ok = False
                errors.append(_error_text(exc))
            rows.append((start, perf() - start, ok))

        begin = perf()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(ops)))
        wall = (perf() - begin) / 1e9
        rows.sort()
        starts, durations, oks = ([row[k] for row in rows] for k in range(3))
        return RoundResult(len(rows), wall, starts, durations, oks, errors)

    return run_threaded


WAKEUP_DELAY_S = 0.050


def run_wakeup(trial, ops, delay_s=WAKEUP_DELAY_S):
    """Wake-up latency of a blocking receive.

    For each op this thread calls ``trial.receive(i)`` (True when it got the message) and a
    sender thread calls ``trial.send(i)`` ``delay_s`` later. The sample runs from the *start*
    of that send to the receive's return, so it includes the send's own round trip (an upper
    bound); ``values`` holds the send's duration in ms. Optional: ``sender_init()`` (in the
    sender thread, returns the send function) and ``sender_close()``.
    """
    perf = time.perf_counter_ns
    delay_ns = int(delay_s * 1e9)
    requests, answers = queue_module.Queue(), queue_module.Queue()
    sender_init = getattr(trial, "sender_init", None)
    sender_close = getattr(trial, "sender_close", None)

    def sender():
        send = None
        try:
            send = sender_init() if sender_init else trial.send
        except Exception as exc:
            answers.put(("init", _error_text(exc)))
        while True:
            item = requests.get()
            if item is None:
                break
            i, t0 = item
            remaining = (t0 + delay_ns - perf()) / 1e9
            if remaining > 0:
                time.sleep(remaining)
            start = perf()
            error = None
            try:
                if send is None:
                    raise RuntimeError("the sender could not start")
                send(i)
            except Exception as exc:
                error = _error_text(exc)
            answers.put((start, perf(), error))
        if sender_close:
            try:
                sender_close()
            except Exception:
                pass

    thread = threading.Thread(target=sender, name="bench-sender", daemon=True)
    thread.start()
    starts, durations, oks, errors, values = [], [], [], [], []
    begin = perf()
    try:
        for i in range(ops):
            t0 = perf()
            requests.put((i, t0))
            try:
                ok = trial.receive(i) is not False
            except Exception as exc:
                ok = False
                errors.append(_error_text(exc))
            t1 = perf()
            try:
                answer = answers.get(timeout=30)
            except queue_module.Empty:
                errors.append("the sender did not answer within 30 s")
                break
            if answer[0] == "init":
                errors.append("sender: " + answer[1])
                answer = answers.get(timeout=30)
            send_start, send_end, error = answer
            if error:
                errors.append("send: " + error)
                ok = False
            starts.append(send_start)
            durations.append(max(0, t1 - send_start))
            oks.append(ok and t1 >= send_start)
            values.append((send_end - send_start) / 1e6)
            if len(errors) > MAX_ERRORS_PER_ROUND:
                errors.append("round abandoned after %d errors" % len(errors))
                break
    finally:
        requests.put(None)
        thread.join(10)
    wall = (perf() - begin) / 1e9
    return RoundResult(len(oks), wall, starts, durations, oks, errors, values)


# -- the run -------------------------------------------------------------------------


class Recorder(object):
    """Holds the run's raw samples and per-round results in memory."""

    # The raw files' columns and types, in Spark SQL's DDL: report_spark.py
    # reads with it, report.write_raw makes the Parquet schema of it.
    SAMPLES_DDL = (
        "run_id STRING, scenario STRING, contestant STRING, round INT, slot INT, "
        "seq BIGINT, t_ns BIGINT, dur_ns BIGINT, ok BOOLEAN, value DOUBLE"
    )
    ROUNDS_DDL = (
        "run_id STRING, scenario STRING, contestant STRING, round INT, slot INT, "
        "ops BIGINT, ops_done BIGINT, units BIGINT, wall_s DOUBLE, rate DOUBLE, "
        "misses BIGINT, error_count BIGINT, delivered BIGINT, problem_count BIGINT, "
        "errors STRING, problems STRING"
    )
    COLUMNS = tuple(column.split()[0] for column in SAMPLES_DDL.split(","))
    ROUND_COLUMNS = tuple(column.split()[0] for column in ROUNDS_DDL.split(","))

    def __init__(self, run_id):
        self.run_id = run_id
        self.samples = []  # tuples in COLUMNS order
        self.rounds = []  # dicts, one per (scenario, contestant, round)

    def add(self, scenario, contestant, round_no, slot, ops_asked, result, epoch_anchor):
        # perf_counter_ns is CLOCK_MONOTONIC: the same clock in worker processes.
        epoch_ns, perf_ns = epoch_anchor
        values = result.values
        for seq in range(result.ops_done):
            self.samples.append(
                (
                    self.run_id,
                    scenario.name,
                    contestant.name,
                    round_no,
                    slot,
                    seq,
                    epoch_ns + (result.starts_ns[seq] - perf_ns),
                    result.durations_ns[seq],
                    bool(result.oks[seq]),
                    float(values[seq]) if values is not None and values[seq] is not None else None,
                )
            )
        self.rounds.append(
            {
                "run_id": self.run_id,
                "scenario": scenario.name,
                "contestant": contestant.name,
                "round": round_no,
                "slot": slot,
                "ops": ops_asked,
                "ops_done": result.ops_done,
                "units": result.good,
                "wall_s": round(result.wall_s, 6),
                "rate": round(result.rate, 1),
                "misses": result.misses,
                "error_count": len(result.errors),
                "delivered": result.delivered,
                "problem_count": len(result.problems),
                "errors": result.errors[:10],
                "problems": result.problems[:10],
            }
        )


def run_scenario(scenario, contestants, env, ops, rounds, warmup_ops, recorder, log, progress=None):
    """Warm up, then run ``rounds`` interleaved rounds of ``scenario``."""
    taking_part = [c for c in contestants if c.takes_part(scenario)]
    if not taking_part:
        log("  (no contestant takes part in %s)" % scenario.name)
        return
    if warmup_ops:
        for contestant in taking_part:
            try:
                _one_round(scenario, contestant, env, min(warmup_ops, max(1, ops // 5)))
            except Exception as exc:
                log("    ! %s warm-up: %s" % (contestant.name, _error_text(exc)))
    for round_no in range(rounds):
        cells = []
        for slot, contestant in enumerate(rotate(taking_part, round_no)):
            anchor = (time.time_ns(), time.perf_counter_ns())
            try:
                result = _one_round(scenario, contestant, env, ops)
            except Exception as exc:  # in prepare/finish: the round counts as failed
                result = RoundResult.failed(_error_text(exc))
            recorder.add(scenario, contestant, round_no, slot, ops, result, anchor)
            flag = ""
            if result.errors or result.misses or result.problems:
                flag = " !"
            cells.append("%s %s%s" % (contestant.name, _fmt_result(scenario, result), flag))
            for text in result.errors[:3] + result.problems[:3]:
                log("    ! %s: %s" % (contestant.name, text))
            if progress is not None:
                progress(1)
        log("  round %d/%d: %s" % (round_no + 1, rounds, "   ".join(cells)))


def _one_round(scenario, contestant, env, ops):
    trial = contestant.trial(scenario, env, ops)
    if trial.run is not None:
        return trial.run(ops)
    trial.prepare()
    result = scenario.runner(trial, ops)
    result.problems = list(trial.finish() or [])
    result.delivered = trial.delivered
    return result


def _fmt_result(scenario, result):
    if scenario.kind == "latency":
        durs = sorted(d for d, ok in zip(result.durations_ns, result.oks) if ok)
        return "p50 %.3f ms" % (durs[len(durs) // 2] / 1e6) if durs else "-"
    text = "{:,.0f}/s".format(result.rate)
    if scenario.fanout and result.delivered is not None and result.wall_s > 0:
        text += " ({:,.0f} deliveries/s)".format(result.delivered / result.wall_s)
    return text
