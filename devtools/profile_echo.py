"""Where one echo worker's CPU goes: a py-spy profile of a drain, per thread.

    python -m devtools.profile_echo --kind asgi_amqp --threads 4 --count 20000

Needs ``AMQP_URL`` (``python -m devtools.rabbitmq start`` makes a private node)
and py-spy (``pip install py-spy``, or ``--py-spy PATH``). It queues ``--count``
messages untimed, as ``benchmarks/echo_ceiling.py`` does, then attaches py-spy
for the drain alone. py-spy samples only the threads that hold the GIL
(``--gil``), without pausing the process (``--nonblocking``), so a thread that
waits for a lock or a socket is not counted. Prints the drain's rate and CPU
per message, then for each thread the functions whose own lines held the GIL
most. ``--kind raw-pika-pipelined`` profiles the ceiling contestant the same way.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Counter, Dict, List, Optional

KINDS = ("asgi_amqp", "raw-pika-pipelined")


def _thread(frame: str) -> str:
    name = frame.split(": ", 1)[-1]
    return "worker threads" if re.search(r"Thread-\d+ \(loop\)", name) else name


def summarize(raw_path: str, top: int) -> List[str]:
    """py-spy's raw output as lines: per thread, samples holding the GIL and the top functions."""
    totals: Counter[str] = collections.Counter()
    own: Dict[str, Counter[str]] = collections.defaultdict(collections.Counter)
    with open(raw_path) as raw:
        for line in raw:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            thread = _thread(frames[0])
            leaf = re.sub(r" \((.*?):\d+\)", r" (\1)", frames[-1]) if len(frames) > 1 else "?"
            totals[thread] += int(count)
            own[thread][leaf] += int(count)
    lines = []
    for thread, total in totals.most_common():
        lines.append("%s: %d samples holding the GIL" % (thread, total))
        for function, count in own[thread].most_common(top):
            lines.append("  %5.1f%%  %s" % (100.0 * count / total, function))
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="asgi_amqp")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", help="keep py-spy's raw output here")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    args = parser.parse_args(argv)
    if "AMQP_URL" not in os.environ:
        parser.error("AMQP_URL is not set (python -m devtools.rabbitmq start makes a node)")
    from benchmarks import echo_ceiling as echo

    prefix = "profile-%d" % os.getpid()
    size = args.count + args.threads + 10
    if args.kind == "asgi_amqp":
        feeder = echo.LayerSide(args.kind, prefix, "", capacity=size)
        worker = echo.LayerSide(args.kind, prefix, "", capacity=size)
    else:
        feeder, worker = echo.RawSide(prefix), echo.PipelinedSide(prefix, args.threads)
    feeder.feed([dict(echo.MESSAGE, order=order) for order in range(args.count)])
    feeder.feed([{"stop": True}] * args.threads)
    raw_path = args.out or tempfile.mkstemp(suffix=".txt")[1]
    spy = subprocess.Popen(
        [args.py_spy, "record", "--pid", str(os.getpid()), "--threads", "--gil"]
        + ["--nonblocking", "--rate", str(args.rate), "--format", "raw", "-o", raw_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    handled = echo.Handled()
    handled.tick()
    started = time.perf_counter()
    echo.serve(worker, handled, args.threads)
    elapsed = time.perf_counter() - started
    cpu_us = handled.cpu_us()
    spy.send_signal(signal.SIGINT)
    spy.wait(30)
    print(
        "%s, %d threads: %.0f msg/s, %.0f us CPU per message"
        % (args.kind, args.threads, handled.count / elapsed, cpu_us)
    )
    print("\n".join(summarize(raw_path, args.top)))
    worker.close()
    feeder.close()
    if args.out is None:
        os.unlink(raw_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
