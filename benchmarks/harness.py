"""The benchmark harness: scenarios, contestants, rounds and raw samples.

Vocabulary
----------
scenario
    *What* is measured: a name, a title, the metric it reports (``send/s``),
    the contestant it is compared against (its baseline) and a *runner* that
    drives one round (``run_sequential`` calls ``trial.op`` ``ops`` times in
    one thread). Scenarios live in ``SCENARIOS`` (see ``scenarios.py``).
contestant
    *Who* is measured: an object with ``setup(env)``, ``teardown(env)`` and,
    for each scenario it takes part in, a method ``scenario_<name>(env, ops)``
    that returns a :class:`Trial`. Contestants live in ``CONTESTANTS`` (see
    ``contestants.py``). A contestant without that method sits the scenario out.
trial
    One round of one scenario for one contestant: ``prepare()`` (untimed,
    e.g. fill a queue), ``op(i)`` (timed, once per operation; returning
    ``False`` marks a miss, raising marks an error) and ``finish()`` (untimed;
    returns a list of problems found, e.g. messages missing from the queue).

Every round of every scenario runs every contestant, in an order that
rotates from round to round (AB, BA, AB, ...), after one unrecorded warm-up
round each. Each operation's start and duration are recorded as a raw
sample, so that anything (a PySpark job, pandas) can aggregate them later;
this module only computes per-round rates.
"""

import collections
import threading
import time

# -- registries -------------------------------------------------------------------

SCENARIOS = collections.OrderedDict()
CONTESTANTS = collections.OrderedDict()

MAX_ERRORS_PER_ROUND = 5  # a round with more errors than this is abandoned


class Scenario(object):
    """What is measured. ``kind`` is ``"rate"`` (headline: median per-round
    ops/s, higher is better) or ``"latency"`` (headline: median per-op
    duration in ms, lower is better)."""

    def __init__(self, name, title, metric, runner, baseline="raw-pika", kind="rate",
                 description="", default_ops=None):
        self.name = name
        self.title = title
        self.metric = metric
        self.runner = runner
        self.baseline = baseline
        self.kind = kind
        self.description = description
        self.default_ops = default_ops

    @property
    def method_name(self):
        return "scenario_" + self.name.replace("-", "_")


def register_scenario(scenario):
    SCENARIOS[scenario.name] = scenario
    return scenario


def register_contestant(factory):
    """Register a contestant class (or a zero-argument factory with a ``name``)."""
    CONTESTANTS[factory.name] = factory
    return factory


class Trial(object):
    def __init__(self, op, prepare=None, finish=None):
        self.op = op
        self.prepare = prepare or (lambda: None)
        self.finish = finish or (lambda: [])


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
    """What contestants share: the broker URL, the run's unique prefix and the
    housekeeping connection (``admin``, see ``broker.Admin``)."""

    def __init__(self, url, prefix, admin, management_url=None):
        self.url = url
        self.prefix = prefix
        self.admin = admin
        self.management_url = management_url


# -- runners -----------------------------------------------------------------------

class RoundResult(object):
    def __init__(self, ops_done, wall_s, starts_ns, durations_ns, oks, errors, thread_ids):
        self.ops_done = ops_done
        self.wall_s = wall_s
        self.starts_ns = starts_ns
        self.durations_ns = durations_ns
        self.oks = oks
        self.errors = errors          # list of "ExceptionName: text"
        self.thread_ids = thread_ids  # one per op, or None for a single thread
        self.problems = []            # from trial.finish()

    @property
    def misses(self):
        return sum(1 for ok in self.oks if not ok)

    @property
    def rate(self):
        good = self.ops_done - self.misses
        return good / self.wall_s if self.wall_s > 0 else 0.0


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
            errors.append("%s: %s" % (type(exc).__name__, exc))
        end = perf()
        starts.append(start)
        durations.append(end - start)
        oks.append(ok)
        if len(errors) > MAX_ERRORS_PER_ROUND:
            errors.append("round abandoned after %d errors" % len(errors))
            break
    wall = (perf() - begin) / 1e9
    return RoundResult(len(oks), wall, starts, durations, oks, errors, None)


# -- the run -------------------------------------------------------------------------

class Recorder(object):
    """Holds the run's raw samples and per-round results in memory."""

    COLUMNS = ("run_id", "scenario", "contestant", "round", "slot", "seq",
               "t_ns", "dur_ns", "ok", "thread")

    def __init__(self, run_id):
        self.run_id = run_id
        self.samples = []  # tuples in COLUMNS order
        self.rounds = []   # dicts, one per (scenario, contestant, round)

    def add(self, scenario, contestant, round_no, slot, ops_asked, result, epoch_anchor):
        epoch_ns, perf_ns = epoch_anchor
        main_thread = threading.get_ident()
        for seq in range(result.ops_done):
            self.samples.append((
                self.run_id, scenario.name, contestant.name, round_no, slot, seq,
                epoch_ns + (result.starts_ns[seq] - perf_ns), result.durations_ns[seq],
                result.oks[seq],
                result.thread_ids[seq] if result.thread_ids else main_thread,
            ))
        self.rounds.append({
            "scenario": scenario.name, "contestant": contestant.name, "round": round_no,
            "slot": slot, "ops": ops_asked, "ops_done": result.ops_done,
            "wall_s": round(result.wall_s, 6), "rate": round(result.rate, 1),
            "misses": result.misses, "error_count": len(result.errors),
            "errors": result.errors[:10],
            "problems": result.problems,
        })


def round_order(contestants, round_no):
    """Rotate the order each round: AB, BA, AB, ... (ABC, BCA, CAB for three)."""
    shift = round_no % len(contestants)
    return contestants[shift:] + contestants[:shift]


def run_scenario(scenario, contestants, env, ops, rounds, warmup_ops, recorder, log):
    """Warm up, then run ``rounds`` interleaved rounds of ``scenario``."""
    taking_part = [c for c in contestants if c.takes_part(scenario)]
    if not taking_part:
        log("  (no contestant takes part in %s)" % scenario.name)
        return
    for contestant in taking_part:
        if warmup_ops:
            _one_round(scenario, contestant, env, warmup_ops)
    for round_no in range(rounds):
        cells = []
        for slot, contestant in enumerate(round_order(taking_part, round_no)):
            anchor = (time.time_ns(), time.perf_counter_ns())
            try:
                result = _one_round(scenario, contestant, env, ops)
            except Exception as exc:  # in prepare/finish: the round counts as failed
                result = RoundResult(0, 0.0, [], [], [], ["%s: %s" % (type(exc).__name__, exc)],
                                     None)
            recorder.add(scenario, contestant, round_no, slot, ops, result, anchor)
            flag = ""
            if result.errors or result.misses or result.problems:
                flag = " !"
            cells.append("%s %s%s" % (contestant.name, _fmt_rate(result.rate), flag))
            for text in (result.errors[:3] + result.problems[:3]):
                log("    ! %s: %s" % (contestant.name, text))
        log("  round %d/%d: %s" % (round_no + 1, rounds, "   ".join(cells)))


def _one_round(scenario, contestant, env, ops):
    trial = contestant.trial(scenario, env, ops)
    trial.prepare()
    result = scenario.runner(trial, ops)
    result.problems = list(trial.finish() or [])
    return result


def _fmt_rate(rate):
    return "{:,.0f}/s".format(rate)
