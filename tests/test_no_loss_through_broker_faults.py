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

import time

import pytest

from helpers import Traffic, at_moment, drain, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.heavy]

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


def _traffic(node, new_layer):
    """Senders and receivers of numbered messages on a layer of their own."""
    layer = new_layer(
        node,
        expiry=60,
        capacity=100000,
        operation_timeout=OPERATION_TIMEOUT,
        receive_timeout=RECEIVE_TIMEOUT,
    )
    return Traffic(layer, CHANNELS, senders=3, blocking_receivers=2, polling_receivers=2)


def _finish(traffic):
    traffic.finish(
        sender_join=LIMITS["send"] * 6 + 5,
        receiver_join=LIMITS["blocking receive"] + 5,
        timeout=15.0,
    )


def _recovery(traffic, when):
    """Seconds until a send and a receive succeeded after ``when`` (None: not within RECOVERY)."""
    return traffic.recovery(when, within=RECOVERY + 5)


def _report(name, counts, recoveries, traffic):
    print("\nfault suite, %s: %s" % (name, counts))
    print(
        "fault suite, %s: recovery (s to first send, first receive) after each disruption: %s"
        % (name, [tuple(None if x is None else round(x, 2) for x in r) for r in recoveries])
    )
    for text, count in traffic.errors.most_common(6):
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


def test_connection_churn(node, new_layer):
    """Connections closed every 2 s, 5 times, with traffic between them (the
    schedule is the scenario: messages in flight at each close are the ones
    that may come back as copies): nothing confirmed may be lost or duplicated."""
    traffic = _traffic(node, new_layer).start()
    recoveries = []
    try:
        wait_until(lambda: len(traffic.received) >= 50, timeout=15, message="traffic")
        start = time.monotonic()
        for kill in range(1, 6):
            at_moment(start, 2.0 * kill)  # the schedule's next close
            node.close_all_connections("fault suite")
            recoveries.append(_recovery(traffic, time.monotonic()))
            traffic.wait_flowing(50, timeout=15)
        at_moment(start, 11.0)  # a second of traffic after the last close
    finally:
        _finish(traffic)
    counts = traffic.counts()
    _report("connection churn", counts, recoveries, traffic)
    _check(counts, recoveries)


def _restart_test(node, new_layer, name, go_down, come_back):
    traffic = _traffic(node, new_layer).start()
    probe = "suite.probe"
    try:
        wait_until(lambda: len(traffic.received) >= 50, timeout=15, message="traffic")
        # Messages nobody reads: do they survive the restart?
        for i in range(20):
            traffic.layer.send(probe, {"n": i})
        assert traffic.pause(15.0), "not everything confirmed arrived before the restart"
        traffic.resume()
        going = time.monotonic()
        go_down()
        down = time.monotonic()
        at_moment(down, 1.0)  # the broker stays away 1 s: calls are made meanwhile
        come_back()
        back = time.monotonic()
        recoveries = [_recovery(traffic, back)]
        traffic.wait_flowing(50, timeout=15, after=back)
        at_moment(back, 2.0)  # two seconds of traffic after the broker's return
        kept = len(drain(traffic.layer, [probe]))
    finally:
        _finish(traffic)
    counts = traffic.counts(restart_window=(going, back))
    counts["unread messages kept through the restart"] = "%d of 20" % kept
    _report(name, counts, recoveries, traffic)
    _check(counts, recoveries)
    return counts, kept


def test_stop_app_and_start_app(node, new_layer):
    counts, kept = _restart_test(
        node, new_layer, "stop_app/start_app", node.stop_app, node.start_app
    )
    # Measured on 3.10.8: the application restart drops transient messages.
    assert kept == 0


def test_kill_and_start(node, new_layer):
    counts, kept = _restart_test(node, new_layer, "kill -9 and start", node.kill, node.start)
    assert kept == 0
