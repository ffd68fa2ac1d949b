"""The fault-injection suite: numbered messages through connection churn, an
application restart (stop_app/start_app) and a crash (kill -9 and start).

Several threads send numbered messages and several receive them (blocking
and non-blocking receives mixed, over two channels) on a private node of
this module's own, while the node is disrupted. Each test prints one line of
counts (run pytest with ``-s`` to see them):

* ``confirmed``: sends that returned; ``raised``: sends that raised, by type;
* ``received``, ``duplicates`` (a message handed to a caller twice);
* ``lost``: confirmed but never received, when the broker kept its queues'
  contents (connection churn), or when it was confirmed outside the restart;
* ``lost to broker restart``: confirmed while the node was going down and
  never received. Messages are transient, so a restarted node has dropped
  whatever waited in its queues; to tell those apart from a layer bug the
  senders pause and everything is received before each restart, then they
  resume as it begins;
* the longest call of each kind, and how long after each disruption the
  first send and the first receive succeeded again.

Targets: no duplicates, no loss outside a restart, no call blocked beyond its
timeout, recovery within 10 s of each disruption.
"""

import collections
import threading
import time
import uuid

import pytest

from asgi_amqp import AMQPChannelLayer
from helpers import private_node, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

OPERATION_TIMEOUT = 3.0
RECEIVE_TIMEOUT = 1.0
RECOVERY = 10.0
SLACK = 1.0
CHANNELS = ["suite.a", "suite.b"]
LIMITS = {
    "send": OPERATION_TIMEOUT + SLACK,
    "receive": OPERATION_TIMEOUT + SLACK,
    "blocking receive": RECEIVE_TIMEOUT + OPERATION_TIMEOUT + SLACK,
}


@pytest.fixture(scope="module")
def node():
    with private_node() as node:
        yield node


class Suite(object):
    """Senders and receivers of numbered messages on one layer."""

    def __init__(self, node, senders=3, blocking_receivers=2, polling_receivers=2):
        self.layer = AMQPChannelLayer(
            url=node.amqp_url,
            management_url=node.management_url,
            prefix="suite-%s" % uuid.uuid4().hex[:6],
            expiry=60,
            capacity=100000,
            operation_timeout=OPERATION_TIMEOUT,
            receive_timeout=RECEIVE_TIMEOUT,
        )
        self.lock = threading.Lock()
        self.stop_sending = threading.Event()
        self.stop_receiving = threading.Event()
        self.sending = threading.Event()
        self.sending.set()
        self.confirmed = {}  # (channel, n) -> time confirmed
        self.raised = collections.Counter()
        self.received = []  # (channel, n)
        self.received_at = []
        self.longest = collections.defaultdict(float)
        self.errors = collections.Counter()
        self.threads = [
            threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(senders)
        ]
        self.threads += [
            threading.Thread(target=self._receive, args=(True,), daemon=True)
            for _ in range(blocking_receivers)
        ]
        self.threads += [
            threading.Thread(target=self._receive, args=(False,), daemon=True)
            for _ in range(polling_receivers)
        ]

    def start(self):
        for thread in self.threads:
            thread.start()

    def _timed(self, kind, function, *args):
        started = time.monotonic()
        try:
            return function(*args)
        finally:
            elapsed = time.monotonic() - started
            with self.lock:
                self.longest[kind] = max(self.longest[kind], elapsed)

    def _send(self, index):
        n = index * 10**7
        while not self.stop_sending.is_set():
            if not self.sending.wait(0.1):
                continue
            n += 1
            channel = CHANNELS[n % len(CHANNELS)]
            try:
                self._timed("send", self.layer.send, channel, {"n": n})
            except Exception as exc:  # counted by type
                with self.lock:
                    self.raised[type(exc).__name__] += 1
                    self.errors["send %s: %s" % (type(exc).__name__, str(exc)[:100])] += 1
                self.stop_sending.wait(0.05)
            else:
                with self.lock:
                    self.confirmed[(channel, n)] = time.monotonic()

    def _receive(self, block):
        kind = "blocking receive" if block else "receive"
        while not self.stop_receiving.is_set():
            try:
                channel, message = self._timed(kind, self.layer.receive, CHANNELS, block)
            except Exception as exc:  # counted by type
                with self.lock:
                    self.raised["%s %s" % (kind, type(exc).__name__)] += 1
                    self.errors["%s %s: %s" % (kind, type(exc).__name__, str(exc)[:100])] += 1
                self.stop_receiving.wait(0.05)
                continue
            if channel is None:
                if not block:
                    self.stop_receiving.wait(0.01)
                continue
            with self.lock:
                self.received.append((channel, message["n"]))
                self.received_at.append(time.monotonic())

    # -- measuring ------------------------------------------------------------

    def missing(self):
        with self.lock:
            return set(self.confirmed) - set(self.received)

    def drain(self, timeout=15.0):
        """Pause the senders and wait until everything confirmed was received."""
        self.sending.clear()
        time.sleep(0.05)
        deadline = time.monotonic() + timeout
        while self.missing() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.missing()

    def first_after(self, when, what):
        with self.lock:
            times = self.confirmed.values() if what == "send" else self.received_at
            later = [t for t in times if t > when]
        return min(later) - when if later else None

    def wait_for_recovery(self, when):
        """Seconds until a send and a receive succeeded after ``when``
        (None: not within RECOVERY)."""
        deadline = when + RECOVERY + 5
        while time.monotonic() < deadline:
            send, receive = self.first_after(when, "send"), self.first_after(when, "receive")
            if send is not None and receive is not None:
                return send, receive
            time.sleep(0.05)
        return self.first_after(when, "send"), self.first_after(when, "receive")

    def finish(self):
        self.stop_sending.set()
        self.sending.set()
        for thread in self.threads[:3]:
            thread.join(LIMITS["send"] * 6 + 5)
        self.drain(timeout=15.0)
        self.stop_receiving.set()
        for thread in self.threads:
            thread.join(LIMITS["blocking receive"] + 5)
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        self.layer.close()
        assert not alive, "threads still blocked: %s" % alive

    def counts(self, restart_window=None):
        with self.lock:
            received = collections.Counter(self.received)
            missing = set(self.confirmed) - set(received)
            in_restart = set()
            if restart_window is not None:
                start, end = restart_window
                in_restart = {key for key in missing if start <= self.confirmed[key] <= end}
            return {
                "confirmed": len(self.confirmed),
                "raised": dict(self.raised),
                "received": len(self.received),
                "duplicates": sum(c - 1 for c in received.values() if c > 1),
                "lost": len(missing - in_restart),
                "lost to broker restart": len(in_restart),
                "longest call": {k: round(v, 2) for k, v in sorted(self.longest.items())},
            }


def _report(name, counts, recoveries, suite):
    print("\nfault suite, %s: %s" % (name, counts))
    print(
        "fault suite, %s: recovery (s to first send, first receive) after each disruption: %s"
        % (name, [tuple(None if x is None else round(x, 2) for x in r) for r in recoveries])
    )
    for text, count in suite.errors.most_common(6):
        print("fault suite, %s:   %5d x %s" % (name, count, text))


def _check(counts, recoveries):
    assert counts["confirmed"] > 0 and counts["received"] > 0, counts
    assert counts["duplicates"] == 0, counts
    assert counts["lost"] == 0, counts
    for kind, longest in counts["longest call"].items():
        assert longest <= LIMITS[kind], (kind, longest, counts)
    for send, receive in recoveries:
        assert send is not None and send < RECOVERY, recoveries
        assert receive is not None and receive < RECOVERY, recoveries
    unexpected = set(counts["raised"]) - {
        "BrokerConnectionError",
        "OperationTimeout",
        "receive BrokerConnectionError",
        "receive OperationTimeout",
        "blocking receive BrokerConnectionError",
        "blocking receive OperationTimeout",
    }
    assert not unexpected, counts["raised"]


def test_connection_churn(node):
    """Connections closed every 2 s: nothing confirmed may be lost or duplicated."""
    suite = Suite(node)
    suite.start()
    recoveries = []
    try:
        wait_until(lambda: len(suite.received) >= 50, timeout=15, message="traffic")
        for _ in range(5):
            time.sleep(2.0)
            node.close_all_connections("fault suite")
            recoveries.append(suite.wait_for_recovery(time.monotonic()))
        time.sleep(1.0)
    finally:
        suite.finish()
    counts = suite.counts()
    _report("connection churn", counts, recoveries, suite)
    _check(counts, recoveries)


def _restart_test(node, name, go_down, come_back):
    suite = Suite(node)
    suite.start()
    probe = "suite.probe"
    try:
        wait_until(lambda: len(suite.received) >= 50, timeout=15, message="traffic")
        # Messages nobody reads: do they survive the restart?
        for i in range(20):
            suite.layer.send(probe, {"n": i})
        assert suite.drain(), "not everything confirmed arrived before the restart"
        suite.sending.set()
        going = time.monotonic()
        go_down()
        time.sleep(1.0)  # calls made while the broker is away
        come_back()
        back = time.monotonic()
        recoveries = [suite.wait_for_recovery(back)]
        time.sleep(2.0)
        kept = 0
        while suite.layer.receive([probe])[0] is not None:
            kept += 1
    finally:
        suite.finish()
    counts = suite.counts(restart_window=(going, back))
    counts["unread messages kept through the restart"] = "%d of 20" % kept
    _report(name, counts, recoveries, suite)
    _check(counts, recoveries)
    return counts, kept


def test_stop_app_and_start_app(node):
    counts, kept = _restart_test(node, "stop_app/start_app", node.stop_app, node.start_app)
    # Measured on 3.10.8: the application restart drops transient messages.
    assert kept == 0


def test_kill_and_start(node):
    counts, kept = _restart_test(node, "kill -9 and start", node.kill, node.start)
    assert kept == 0
