"""Feed one runworker directly through the channel layer (no daphne) and
time what it handles; run by channels_bench.py with each layer's interpreter.

    python benchmarks/channels_drive.py --worker-pid PID --drain 3000
    python benchmarks/channels_drive.py --worker-pid PID --drain 3000 --worker-threads 4

The layer is the project's (settings and broker from the environment, as for
the stack). Each message is a ``websocket.receive`` for the ``/echo/`` route
from one of ``SOCKETS`` sockets in turn, as daphne sends a worker many sockets'
frames (on asgi_amqp one socket's go through one shard, one at a time),
replying to this process's own process-local channel.

``--drain COUNT`` times the worker through COUNT messages queued while it
was stopped (``drain``); the channel capacity must hold COUNT. ``--worker-threads
N`` is its ``runworker --threads``. Prints one JSON object: messages per
second, the worker's CPU share, frames lost.
"""

import argparse
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROJECT_DIR = os.path.join(ROOT, "tests", "project")
PAYLOAD = "x" * 64
WORKER_CHANNEL = "websocket.receive"
SOCKETS = 64


def cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` so far (/proc)."""
    with open("/proc/%d/stat" % pid) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))


def backlog_probe(layer, channel, messages=(None,)):
    """A function giving the number of messages waiting in ``channel``, read
    straight from the broker (not from statistics that lag by seconds), and
    how many queues that is. ``messages``: those the driver sends, which name
    the queues of an ordered channel (their reply channels' shards) on asgi_amqp."""
    topology = getattr(layer, "topology", None)
    if topology is not None:  # asgi_amqp: a passive declare on a connection of its own
        import pika

        from asgi_amqp.urls import parse_urls

        url = os.environ["AMQP_URL"]  # set by the stack, like the layer's own
        connection = pika.BlockingConnection(parse_urls(url)[0])
        pika_channel = connection.channel()
        queues = {topology.send_queue(channel, message) for message in messages}

        def amqp_depth():
            return sum(
                pika_channel.queue_declare(q, passive=True).method.message_count for q in queues
            )

        amqp_depth.close, amqp_depth.queues = connection.close, len(queues)
        return amqp_depth
    # asgi_redis: the channel is a list under the layer's prefix; a
    # process-local channel's list is named by its prefix ("foo!").
    if "!" in channel:
        channel = channel.split("!", 1)[0] + "!"
    client = layer.connection(layer.consistent_hash(channel))

    def redis_depth():
        return client.llen(layer.prefix + channel)

    redis_depth.close, redis_depth.queues = (lambda: None), 1
    return redis_depth


class Driver(object):
    def __init__(self, layer, reply_prefix):
        self.layer = layer
        self.reply_prefix = reply_prefix
        self.reply_channel = "%sp%d" % (reply_prefix, os.getpid())
        self.sent = 0
        self.received = 0

    def message(self, number):
        return {
            "reply_channel": "%s.%d" % (self.reply_channel, number % SOCKETS),
            "path": "/echo/",
            "order": number // SOCKETS,
            "text": "%d %s" % (number, PAYLOAD),
        }

    def send_one(self):
        self.sent += 1
        self.layer.send(WORKER_CHANNEL, self.message(self.sent))


def _state(pid):
    with open("/proc/%d/stat" % pid) as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def _wait_stopped(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while _state(pid) != "T":
        if time.monotonic() > deadline:
            raise RuntimeError("process %d did not stop" % pid)
        time.sleep(0.001)


def drain(layer, driver, worker_pid, count, worker_threads=1):
    """The rate at which the worker handles ``count`` messages queued while it was stopped.

    The worker is stopped (SIGSTOP, by its pid) while they are queued, then
    continued; the clock runs until all ``count`` replies are in the driver's
    queue, read with the broker's own client every 10 ms: one runworker's
    pace with a full queue in front of it. A stopped worker may hold a pushed
    message per thread and per queue (a prefetch window, a BRPOP each).
    """
    layer.receive([driver.reply_prefix], block=False)  # declares its queue, on asgi_amqp
    inbox = backlog_probe(layer, WORKER_CHANNEL, [driver.message(n) for n in range(SOCKETS)])
    replies = backlog_probe(layer, driver.reply_channel)
    try:
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            _wait_stopped(worker_pid)  # a signal is delivered later than kill() returns
            for _ in range(count):
                driver.send_one()
            deadline = time.monotonic() + 30
            while inbox() < count - max(1, worker_threads) - inbox.queues:  # pushed already
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "only %d of %d messages reached the worker's queue" % (inbox(), count)
                    )
                time.sleep(0.01)
            already = replies()
        finally:
            cpu_start = cpu_seconds(worker_pid)
            t0 = time.perf_counter()
            os.kill(worker_pid, signal.SIGCONT)
        deadline = time.monotonic() + 60 + count / 100.0
        while replies() < already + count:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the worker replied to only %d of %d messages" % (replies() - already, count)
                )
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        cpu = (cpu_seconds(worker_pid) - cpu_start) / elapsed
    finally:
        inbox.close()
        replies.close()
    deadline = time.monotonic() + 30
    while driver.received < driver.sent and time.monotonic() < deadline:
        channel, _ = layer.receive([driver.reply_prefix], block=True)
        if channel is not None:
            driver.received += 1
    return {
        "rate": count / elapsed,
        "cpu": cpu,
        "lost": driver.sent - driver.received,
        "sent": driver.sent,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-pid", type=int, required=True)
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=1,
        help="the runworker's --threads: messages it may hold while stopped",
    )
    parser.add_argument(
        "--drain",
        type=int,
        required=True,
        metavar="COUNT",
        help="time the worker through COUNT queued messages",
    )
    args = parser.parse_args()

    for path in (PROJECT_DIR, ROOT):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    from channels.asgi import get_channel_layer

    layer = get_channel_layer()
    driver = Driver(layer, "bench.drive!")  # a process-local channel: received by its prefix
    result = drain(layer, driver, args.worker_pid, args.drain, args.worker_threads)
    print(json.dumps(result))
    close = getattr(layer, "close", None)
    if close:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
