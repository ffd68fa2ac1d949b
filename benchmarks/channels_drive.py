"""Feed one runworker directly through the channel layer (no daphne) and
count what it handles; run by channels_bench.py with each layer's interpreter.

    python benchmarks/channels_drive.py --worker-pid PID --seconds 3 --window 32

The layer is the project's (``DJANGO_SETTINGS_MODULE``, ``CHAT_LAYER_PREFIX``
and the broker variables come from the environment, as for the stack). It
keeps ``--window`` ``websocket.receive`` messages for the ``/echo/`` route in
flight, each replying to this process's own process-local channel, and
sends a new one for every reply. Prints one JSON object: replies per second,
the worker's and this process's CPU share over the timed part, and frames
lost.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROJECT_DIR = os.path.join(ROOT, "tests", "project")
PAYLOAD = "x" * 64


def _cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-pid", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--window", type=int, default=32)
    args = parser.parse_args()

    for path in (PROJECT_DIR, ROOT):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    from channels.asgi import get_channel_layer

    layer = get_channel_layer()
    reply_prefix = "bench.drive!"  # a process-local channel: received by its prefix
    reply_channel = "%sp%d" % (reply_prefix, os.getpid())
    counter = [0]

    def send_one():
        counter[0] += 1
        layer.send("websocket.receive", {
            "reply_channel": reply_channel, "path": "/echo/", "order": counter[0],
            "text": "%d %s" % (counter[0], PAYLOAD)})

    for _ in range(args.window):
        send_one()
    received = 0
    empty = 0
    started = time.perf_counter()
    timed_from = started + args.warmup
    timed_until = timed_from + args.seconds
    cpu_start = None
    received_at_start = 0
    while True:
        now = time.perf_counter()
        if cpu_start is None and now >= timed_from:
            cpu_start, received_at_start, t0 = _cpu_seconds(args.worker_pid), received, now
            own_cpu_start = time.process_time()
        if now >= timed_until:
            break
        channel, message = layer.receive([reply_prefix], block=True)
        if channel is None:
            empty += 1
            if empty > 3:
                break
            continue
        received += 1
        send_one()
    elapsed = time.perf_counter() - t0 if cpu_start is not None else 0.0
    handled = received - received_at_start
    cpu = (_cpu_seconds(args.worker_pid) - cpu_start) / elapsed if elapsed else 0.0
    own_cpu = (time.process_time() - own_cpu_start) / elapsed if elapsed else 0.0
    # Drain what is still in flight.
    deadline = time.monotonic() + 15
    while received < counter[0] and time.monotonic() < deadline:
        channel, message = layer.receive([reply_prefix], block=True)
        if channel is not None:
            received += 1
    print(json.dumps({"rate": handled / elapsed if elapsed else 0.0, "cpu": cpu,
                      "driver_cpu": own_cpu,
                      "lost": counter[0] - received, "sent": counter[0]}))
    close = getattr(layer, "close", None)
    if close:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
