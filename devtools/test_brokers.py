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

With ``AMQP_URL`` set the suite runs once, on that broker only. Before each
run the kind's node is started once to read its version; a kind that
cannot start is named with the reason and skipped, unless
``ASGI_AMQP_REQUIRE_BROKERS`` (major versions, e.g. ``"3 4"``, as CI sets
it) asks for it: then the run fails. Nothing falls back to one version
silently: the last lines name every version run, with its counts and time,
and every one that was not.

Usage: ``python -m devtools.test_brokers [PYTEST_ARGS...]``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

SERVER_DIR_VARIABLE = "ASGI_AMQP_RABBITMQ_SERVER_DIR"
ERLANG_VARIABLE = "ASGI_AMQP_ERLANG_ROOT"
REQUIRE_VARIABLE = "ASGI_AMQP_REQUIRE_BROKERS"
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


def run_pytest(env: Mapping[str, str], args: Sequence[str]) -> Tuple[int, Dict[str, int], float]:
    """Run the suite; echo its output; (exit status, counts, seconds)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    summary = ""
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if " in " in line and _COUNT.search(line):
            summary = line
    status = process.wait()
    counts: Dict[str, int] = {}
    for number, word in _COUNT.findall(summary):
        word = "errors" if word.startswith("error") else word
        counts[word] = counts.get(word, 0) + int(number)
    return status, counts, time.monotonic() - started


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join("%d %s" % (n, word) for word, n in counts.items()) or "no test ran"


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
        print("\n=== the test suite on %s\n" % name, flush=True)
        status, counts, seconds = run_pytest(kind.environ(), args)
        failed |= status != 0
        for word in totals:
            totals[word] += counts.get(word, 0)
        totals["failed"] += counts.get("errors", 0)
        lines.append(
            "ran on %s: %s in %d min %02d s (exit status %d)"
            % (name, _describe(counts), seconds // 60, seconds % 60, status)
        )
    for major in sorted(required - majors):
        lines.append("required but not run: RabbitMQ %s.x (%s)" % (major, REQUIRE_VARIABLE))
        failed = True
    print("\n" + "\n".join(lines))
    print(
        "brokers: %d passed, %d failed, %d skipped"
        % (totals["passed"], totals["failed"], totals["skipped"])
    )
    return 1 if failed or not any(kind for kind, _, why in runs if why is None) else 0


if __name__ == "__main__":
    sys.exit(main())
