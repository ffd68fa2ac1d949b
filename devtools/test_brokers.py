"""The whole test suite on every RabbitMQ version this machine can start.

``make test`` runs this. Each broker is a kind of private node
(:class:`devtools.rabbitmq.RabbitNode`), and the suite runs once per kind,
in its own pytest process, with every node of that run (the session's
broker, and the private nodes and clusters of the fault tests) of that
kind:

``debian``
    the machine's ``rabbitmq-server`` package (Debian 12: 3.10.8);
``server-dir``
    a RabbitMQ server directory plus an Erlang, given by
    ``ASGI_AMQP_RABBITMQ_SERVER_DIR`` and ``ASGI_AMQP_ERLANG_ROOT``
    (RabbitMQ's generic-unix tarball, or a distribution's package unpacked;
    ``python -m devtools.rabbitmq unpack`` prepares one).

With both kinds, the two runs share the machine in two halves: first the
tests marked ``heavy`` on the first kind beside the others on the second,
then the other way round (``run_side_by_side``), so that no two heavy tests
ever run at once. Then the tests marked ``alone`` run on each kind in turn,
with nothing beside them. ``PYTEST_ARGS`` with ``-m`` runs the kinds one
after the other, as with one kind.

With ``AMQP_URL`` set the suite runs once, on that broker only. Before each
run the kind's node is started once to read its version; a kind that
cannot start is named with the reason and skipped, unless
``ASGI_AMQP_REQUIRE_BROKERS`` (major versions, e.g. ``"3 4"``, as CI sets
it) asks for it: then the run fails. Nothing falls back to one version
silently: the last lines name every version run, with its counts and time,
and every one that was not.

Then the other Pythons (:mod:`devtools.pythons`: Debian 11's 3.9 and
Debian 13's 3.13, setup.py's oldest and newest) run, each built once in a
Debian root of its own: the broker-free tier (less the tests of the
machine's own developer tools, ``OTHER_PYTHONS_IGNORE``), then asgiref's
conformance suite, the command-line tests and the chat end-to-end test
(``OTHER_PYTHONS_TESTS``) on a private node. To fit CI's time each runs on
one broker kind, not all: the oldest Python on the first kind that ran, the
newest on the last (with both kinds, 3.9 on Debian's RabbitMQ, 3.13 on the
server directory's). ``ASGI_AMQP_PYTHONS`` chooses them (default ``"3.9
3.13"``; ``none`` for none). A Python this machine cannot build (not root,
no debootstrap, no Debian archive) is named with the reason, and fails the
run only if ``ASGI_AMQP_REQUIRE_PYTHONS`` (as CI sets it) names it.

Usage: ``python -m devtools.test_brokers [PYTEST_ARGS...]`` (PYTEST_ARGS go
to the main Python's runs only).
"""

from __future__ import annotations

import glob
import os
import platform
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from devtools import pythons, rabbitmq

SERVER_DIR_VARIABLE = "ASGI_AMQP_RABBITMQ_SERVER_DIR"
ERLANG_VARIABLE = "ASGI_AMQP_ERLANG_ROOT"
REQUIRE_VARIABLE = "ASGI_AMQP_REQUIRE_BROKERS"
PYTHONS_VARIABLE = "ASGI_AMQP_PYTHONS"
REQUIRE_PYTHONS_VARIABLE = "ASGI_AMQP_REQUIRE_PYTHONS"
#: What the other Pythons run with a broker: the (broker or extras) tests of these.
OTHER_PYTHONS_TESTS = ["conformance", "tests/test_cli*.py", "tests/e2e/test_channels_e2e.py"]
#: Left out of their broker-free tier: tests of this machine's developer
#: tools (make targets, the rabbitmq-server package, xz) and of the source's
#: import graph (grimp, a lint tool), which run on the main Python only and
#: whose tools a minimal root does not have.
OTHER_PYTHONS_IGNORE = [
    "tests/test_developer_targets.py",
    "tests/test_devtools_rabbitmq.py",
    "tests/test_imports_form_no_cycle.py",
]
#: The marker of the tests that load the machine for long (conftest.py).
HEAVY = "heavy"
#: The marker of the tests whose timing targets need the machine to themselves.
ALONE = "alone"
#: What each run of ``run_side_by_side`` selects, by its name in the output.
SELECTIONS = {
    HEAVY: "%s and not %s" % (HEAVY, ALONE),
    "rest": "not %s and not %s" % (HEAVY, ALONE),
    ALONE: ALONE,
}
NO_TESTS = 5  # pytest's exit status when the selection is empty
#: One run of a part of the suite: (kind's index, its selection, exit status, counts, seconds).
Part = Tuple[int, str, int, Dict[str, int], float]
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


class Kind(object):
    """One kind of broker node: its name and the environment that selects it."""

    def __init__(self, name: str, env: Mapping[str, Optional[str]]) -> None:
        self.name = name
        self.env = dict(env)  # None: removed from the environment

    def environ(self) -> Dict[str, str]:
        env = dict(os.environ)
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env


def kinds() -> List[Kind]:
    """The kinds of node to run the suite on, in order."""
    found = [Kind("debian", {SERVER_DIR_VARIABLE: None, ERLANG_VARIABLE: None})]
    server_dir = os.environ.get(SERVER_DIR_VARIABLE)
    erlang = os.environ.get(ERLANG_VARIABLE)
    if server_dir or erlang:
        found.append(Kind("server-dir", {SERVER_DIR_VARIABLE: server_dir, ERLANG_VARIABLE: erlang}))
    return found


def probe(kind: Kind) -> Tuple[Optional[str], Optional[str]]:
    """(version, None) of a node of ``kind`` started once, or (None, why not)."""
    code = (
        "from devtools.rabbitmq import RabbitNode\n"
        "node = RabbitNode()\n"
        "try:\n"
        "    node.start(timeout=90)\n"
        "    print('VERSION', node.version())\n"
        "finally:\n"
        "    node.cleanup(graceful=False)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=kind.environ(),
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        return None, "its node did not start within 180 s"
    for line in done.stdout.splitlines():
        if line.startswith("VERSION "):
            return line.split(None, 1)[1].strip(), None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return None, (lines[-1] if lines else "exit status %d" % done.returncode)


_echo_lock = threading.Lock()  # two runs side by side echo whole lines


def run_pytest(
    env: Mapping[str, str],
    args: Sequence[str],
    command: Optional[Sequence[str]] = None,
    prefix: str = "",
) -> Tuple[int, Dict[str, int], float]:
    """Run the suite (or ``command``, a pytest); echo its output, each line after
    ``prefix``; (exit status, counts, seconds)."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(command) if command is not None else [sys.executable, "-m", "pytest", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    summary = ""
    assert process.stdout is not None
    for line in process.stdout:
        with _echo_lock:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
        if " in " in line and _COUNT.search(line):
            summary = line
    status = process.wait()
    counts: Dict[str, int] = {}
    for number, word in _COUNT.findall(summary):
        word = "errors" if word.startswith("error") else word
        counts[word] = counts.get(word, 0) + int(number)
    return status, counts, time.monotonic() - started


def run_side_by_side(ready: Sequence[Tuple[Kind, str]], args: Sequence[str]) -> List[Part]:
    """The suite on two broker kinds at once, in two halves and a last part, each run's result.

    First the first kind's heavy tests beside the second kind's others, then the
    other way round: two heavy tests (a whole stack through a restart, a cluster,
    a storm) never share the machine, and each kind still runs every test. Last,
    each kind's ``alone`` tests, one kind after the other: their timing targets
    were set on a quiet machine (a chat at 10 messages/s per client beside the
    other broker's suite once fell 7 s behind). Each run picks its ports from its
    own share (``devtools.rabbitmq.PORTS_VARIABLE``), so neither takes the port of
    the other's stopped node."""
    low, high = rabbitmq.port_range()
    middle = (low + high) // 2
    shares = ["%d-%d" % (low, middle), "%d-%d" % (middle, high)]
    parts: List[Part] = []

    def run(index: int, selection: str) -> None:
        kind, name = ready[index]
        env = kind.environ()
        env[rabbitmq.PORTS_VARIABLE] = shares[index]
        prefix = "[%s, %s] " % (name.split(" (")[0], selection)
        marker = SELECTIONS[selection]
        try:
            result = run_pytest(env, ["-p", "no:cacheprovider", "-m", marker, *args], prefix=prefix)
        except Exception as exc:  # counted as a failed run, with its reason
            print("%scould not run: %r" % (prefix, exc), flush=True)
            result = (1, {}, 0.0)
        parts.append((index, selection, *result))  # list.append is atomic

    for selections in ((HEAVY, "rest"), ("rest", HEAVY)):
        threads = [threading.Thread(target=run, args=(i, selections[i])) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for index in (0, 1):
        run(index, ALONE)
    return parts


def _add(counts: Dict[str, int], more: Mapping[str, int]) -> None:
    for word, number in more.items():
        counts[word] = counts.get(word, 0) + number


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join("%d %s" % (n, word) for word, n in counts.items()) or "no test ran"


def _minutes(seconds: float) -> str:
    return "%d min %02d s" % (seconds // 60, seconds % 60)


def run_other_python(
    version: str, kind: Kind, broker: str, required: bool
) -> Tuple[bool, Dict[str, int], List[str]]:
    """Python ``version``'s tiers, on a node of ``kind``: (failed, counts, summary lines)."""
    started = time.monotonic()
    try:
        pythons.build(version)
        full = pythons.interpreter_version(version)
    except pythons.PythonUnavailable as exc:
        why = str(exc).splitlines()[0] if str(exc) else "unavailable"
        note = " (required by %s)" % REQUIRE_PYTHONS_VARIABLE if required else ""
        return required, {}, ["not run: Python %s: %s%s" % (version, why, note)]
    name = "Python %s (Debian's, in %s; ready in %s)" % (
        full,
        pythons.SUITES[version],
        _minutes(time.monotonic() - started),
    )
    pytest = ["python", "-m", "pytest", "-p", "no:cacheprovider"]
    in_root = [sys.executable, "-m", "devtools.pythons", "run", version, "--"]
    free = in_root + pytest + ["-m", "not broker and not extras"]
    for path in OTHER_PYTHONS_IGNORE:
        free += ["--ignore", path]
    free_env = {key: value for key, value in os.environ.items() if not key.startswith("AMQP_")}
    free_env["ASGI_AMQP_NO_BROKER"] = "1"
    paths = [
        os.path.relpath(path, pythons.HERE)  # the run's directory is the checkout
        for pattern in OTHER_PYTHONS_TESTS
        for path in sorted(glob.glob(os.path.join(pythons.HERE, pattern)))
    ]
    with_broker = in_root + pytest + ["-m", "(broker or extras) and not faults"] + paths
    if not os.environ.get("AMQP_URL"):  # a private node of that kind, for this run
        with_broker = [sys.executable, "-m", "devtools.rabbitmq", "run", "--no-docker", "--"] + (
            with_broker
        )
    tiers = [
        ("broker-free tier", free_env, free),
        (
            "conformance, command line, chat end to end on %s" % broker,
            kind.environ(),
            with_broker,
        ),
    ]
    failed = False
    counts: Dict[str, int] = {}
    lines = []
    for what, env, command in tiers:
        print("\n=== %s: %s\n" % (name, what), flush=True)
        status, tier_counts, seconds = run_pytest(env, [], command)
        failed |= status != 0
        _add(counts, tier_counts)
        lines.append(
            "ran on %s, %s: %s in %s (exit status %d)"
            % (name, what, _describe(tier_counts), _minutes(seconds), status)
        )
    return failed, counts, lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    required = set((os.environ.get(REQUIRE_VARIABLE) or "").replace(",", " ").split())
    lines: List[str] = []
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    failed = False
    if os.environ.get("AMQP_URL"):
        runs = [(Kind("AMQP_URL", {}), "the broker at AMQP_URL", None)]
    else:
        runs = []
        for kind in kinds():
            version, why = probe(kind)
            runs.append((kind, "RabbitMQ %s (%s)" % (version, kind.name) if version else "", why))
    if not os.environ.get("AMQP_URL") and not any(k.name == "server-dir" for k, _, _ in runs):
        lines.append(
            "not run: RabbitMQ 4.x: no server directory given (set %s and %s; "
            "python -m devtools.rabbitmq unpack makes them)"
            % (SERVER_DIR_VARIABLE, ERLANG_VARIABLE)
        )
    majors = set()
    for kind, name, why in runs:
        if why is not None:
            lines.append("not run: the %s broker: %s" % (kind.name, why))
            continue
        version = name.split()[1] if name.startswith("RabbitMQ ") else ""
        majors.add(version.split(".")[0])
    ready = [(kind, name) for kind, name, why in runs if why is None]
    results: List[Tuple[str, int, Dict[str, int], float]] = []
    if len(ready) == 2 and not any(arg.startswith("-m") for arg in args):
        both = (ready[0][1], ready[1][1])
        print("\n=== the test suite on %s and %s, side by side\n" % both, flush=True)
        started = time.monotonic()
        parts = run_side_by_side(ready, args)
        lines.append("both brokers, side by side: %s" % _minutes(time.monotonic() - started))
        for index, (_, name) in enumerate(ready):
            mine = [part for part in parts if part[0] == index]
            counts: Dict[str, int] = {}
            for part in mine:
                _add(counts, part[3])
            # Failed if any part failed; "no tests" only if every part selected none.
            statuses = [part[2] for part in mine if part[2] != NO_TESTS] or [NO_TESTS]
            status = next((status for status in statuses if status != 0), 0)
            half = "; heavy tests and the rest each beside the other broker's, then alone"
            results.append((name + half, status, counts, sum(part[4] for part in mine)))
    else:
        for kind, name in ready:
            print("\n=== the test suite on %s\n" % name, flush=True)
            status, counts, seconds = run_pytest(kind.environ(), args)
            results.append((name, status, counts, seconds))
    for name, status, counts, seconds in results:
        failed |= status != 0
        for word in totals:
            totals[word] += counts.get(word, 0)
        totals["failed"] += counts.get("errors", 0)
        lines.append(
            "ran on Python %s, %s: %s in %d min %02d s (exit status %d)"
            % (
                platform.python_version(),
                name,
                _describe(counts),
                seconds // 60,
                seconds % 60,
                status,
            )
        )
    for major in sorted(required - majors):
        lines.append("required but not run: RabbitMQ %s.x (%s)" % (major, REQUIRE_VARIABLE))
        failed = True
    brokers = dict(totals)
    # The other Pythons, each on one broker kind: the oldest on the first, the newest on the last.
    wanted = os.environ.get(PYTHONS_VARIABLE, " ".join(pythons.SUITES)).replace(",", " ").split()
    wanted = [] if wanted == ["none"] else wanted
    required_pythons = set(
        (os.environ.get(REQUIRE_PYTHONS_VARIABLE) or "").replace(",", " ").split()
    )
    for version in sorted(required_pythons - set(wanted)):
        lines.append("required but not run: Python %s (%s)" % (version, PYTHONS_VARIABLE))
        failed = True
    for index, version in enumerate(wanted):
        if not ready:
            lines.append("not run: Python %s: no broker ran" % version)
            failed |= version in required_pythons
            continue
        kind, name = ready[0] if index < len(wanted) - 1 or len(wanted) == 1 else ready[-1]
        python_failed, counts, python_lines = run_other_python(
            version, kind, name, version in required_pythons
        )
        failed |= python_failed
        lines.extend(python_lines)
        for word in totals:
            totals[word] += counts.get(word, 0)
        totals["failed"] += counts.get("errors", 0)
    print("\n" + "\n".join(lines))
    print(
        "brokers: %d passed, %d failed, %d skipped"
        % (brokers["passed"], brokers["failed"], brokers["skipped"])
    )
    print(
        "total: %d passed, %d failed, %d skipped"
        % (totals["passed"], totals["failed"], totals["skipped"])
    )
    return 1 if failed or not any(kind for kind, _, why in runs if why is None) else 0


if __name__ == "__main__":
    sys.exit(main())
