"""The whole Channels stack through broker faults (short versions).

daphne, two runworkers and 20 WebSocket clients in 4 rooms, on a private
node of this test's own. In ``kills`` the broker closes every connection
every 3 s; in ``restart`` it also restarts its application once in the
middle. The node-loss test runs the stack on a 3-node cluster of its own
and stops the node the processes are on. ``make faults-stack`` and ``make
faults`` run the long versions, and ``tests/project/stackfaults.py`` says
what is counted and asserted.

This short version guards fault handling, not throughput: its clients
send 5 messages/s each, not 10. At 10/s the stack's fan-out (1,000 member
deliveries/s) is at or past what daphne and one runworker pair carry on a
2-core machine, and a backlog makes the silences and pings measure it
rather than the faults: with quorum queues, measured on one quiet machine,
the landed 987c685 failed 3 of 63 pings with 0 lost and 66 s to work
through the backlog. With classic queues, 10/s passed on a faster machine,
then failed a CI run of ``make test`` on a slower one with a 2.25 s kill
silence, 0 lost and 93.6 s to work through the backlog; on that slower
machine, even with daphne draining its replies on the reactor thread, a
kills run ended 20 s behind, and a 60 s run without any fault 21 s behind.
At 5/s every target holds (kills: 0 lost, 0.5 s longest silence, settled
in 0.4 s). ``make faults-stack`` keeps 10/s.

Around the restart a client may be silent for 5 s beyond the broker's own
outage, which a probe measures, and a ``/ping/`` may go unanswered only if
its 10 s ended within that time (``stackfaults.targets``). The node runs
without the management plugin, which before RabbitMQ 3.13 would keep it
away 10.8 s rather than 5.9 s for the 5 s pause (``stackfaults.run``).
"""

import pytest
import stackfaults
from e2e_support import chatstack  # noqa: F401  (puts tests/project on sys.path)

pytestmark = [pytest.mark.slow, pytest.mark.faults]


# The alarm run's clients send 5 messages/s each, as the quorum runs do, for
# the same reason: this guards what an alarm costs, not throughput. At 10/s
# the stack's pace on 2 cores varied from run to run (4.3k to 9.3k of 11.9k
# deliveries in 24 s, the same code), and a backlog at the alarm's start loses
# messages sent seconds before it, which the report cannot tell from others.
ALARM_RATE = 5.0


def _meets_its_targets(report, restart_pause=5.0):
    print("\n" + stackfaults.format_report(report))
    failed = [what for what, ok in stackfaults.targets(report, restart_pause) if not ok]
    assert not failed, "%s\n%s\nlogs: %s" % (
        failed,
        stackfaults.format_report(report),
        report.get("logs"),
    )


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("scenario", ["kills", "restart"])
def test_the_stack_rides_through_broker_faults(scenario, queue_type):
    restart = scenario == "restart"
    report = stackfaults.run(
        queue_type=queue_type,
        duration=24.0 if restart else 16.0,
        rate=5.0,
        restart_pause=5.0,
        restart=restart,
    )
    _meets_its_targets(report, restart_pause=5.0)
    # Kills come every 3 s, each through rabbitmqctl (0.35 s idle, seconds on
    # a loaded machine): at least 3 in 16 s, and 2 around a restart that
    # takes 10-13 s of the 24.
    if restart:
        assert report["kills"] >= 2 and report["restart_seconds"] is not None
    else:
        assert report["kills"] >= 3 and report["restart_seconds"] is None


# After the clients stop, the last delivery of a restart run with one
# WebSocket runworker may come this late (seconds). Measured on a quiet
# 2-core machine: 0.0 s after a 180 s run at 5 messages/s (quorum); two
# runworkers competing for the WebSocket channels needed 98 s after a 60 s
# run, and never finished a 180 s one.
BACKLOG_SETTLE = 20.0
# Messages/s per client of that test. The one WebSocket runworker must work
# through the outage's backlog within the 5 s the restart target allows
# beyond the outage, while the clients keep sending: the rate must leave it
# room. At 5/s that held on a faster machine and on this project's slower
# 2-core CI machine in one fresh-clone run of two; the other failed on a
# 23.77 s restart silence against 17.5 s (broker away 12.5 s, backlog
# drained 17.8 s after the restart began, 0 lost). At 3/s on that machine:
# 14.5 s against 17.3 s (away 12.3 s, drained 13.7 s).
WEBSOCKET_WORKER_RATE = 3.0


def test_one_websocket_runworker_works_through_the_backlog_of_a_restart():
    """The docs' deployment for riding through an outage under Channels'
    ``enforce_ordering``: one runworker alone takes the ``websocket.*``
    channels, the other the rest. With both workers competing for a
    socket's frames, the frames the clients sent during the outage are
    parked and sent back behind the backlog over and over, and the stack
    falls further behind while the clients keep sending (docs: "One
    runworker for the WebSocket channels"). 60 s at
    ``WEBSOCKET_WORKER_RATE`` messages/s with quorum queues, the restart at
    30 s: every target holds, and the backlog is worked through within
    ``BACKLOG_SETTLE`` of the clients' stop.

    The silence around a kill is among the targets: a silence that
    begins while the workers still work through what was sent during the
    outage is the restart's (``stackfaults._drained_at``); a kill in those
    seconds once left a client silent 2.2 s, counted as a kill's before."""
    report = stackfaults.run(
        queue_type="quorum",
        duration=60.0,
        rate=WEBSOCKET_WORKER_RATE,
        restart_pause=5.0,
        restart=True,
        websocket_worker=True,
    )
    _meets_its_targets(report, restart_pause=5.0)
    assert report["websocket_worker"] and report["restart_seconds"] is not None
    assert report["settle_seconds"] <= BACKLOG_SETTLE, stackfaults.format_report(report)


def test_the_stack_survives_a_memory_alarm():
    """An 8 s memory alarm in the middle of the chat (no kills): every
    process lives (when sends raised at once, both runworkers died of
    Channels' send_and_flush 2 s into it), /ping/ answers outside it, every
    lost delivery is explained by a socket daphne closed for the alarm, and
    a new client chats afterwards."""
    report = stackfaults.run(queue_type="classic", duration=24.0, alarm=8.0, rate=ALARM_RATE)
    _meets_its_targets(report)
    assert report["kills"] == 0 and report["alarm_seconds"] >= 8.0


# The node-loss tests' rate (messages/s per client). They run two runworkers
# on every channel, as the other short tests do, and at 5/s that fell
# behind on a loaded machine (``stackfaults.NODE_LOSS_RATE``, which the
# command line uses with one WebSocket runworker).
NODE_LOSS_TEST_RATE = 1.0


def test_the_stack_rides_through_the_loss_of_its_cluster_node():
    """A 3-node cluster with quorum queues: every process is given the three
    nodes' URLs, kills every 3 s, and 5 s in the node the processes are
    connected to stops for 3 s. Nothing may be lost (the quorum queues'
    promise), every process lives, no client is silent for long, and the
    groups empty afterwards. The clients send ``NODE_LOSS_TEST_RATE``
    messages/s each."""
    report = _node_loss()
    assert report["node_loss_seconds"] is not None and report["kills"] >= 1


def test_the_loss_of_the_first_node_loses_no_group_message():
    """The node stopped is the first one: where the processes connected
    first and made the clients' memberships, and which usually holds the
    quorum leader of daphne's process-local queue. Memberships made of
    queues on that node lost every group message sent while it was down
    (measured before leases at 40 s: 1,100 of 4,000 deliveries), and a
    mirroring policy, the only cure on RabbitMQ 3.x, does not exist on 4.0.
    A membership is now a binding, held by every node, and a group message
    goes straight to daphne's quorum queue: nothing may be lost, with no
    policy, on every broker version."""
    report = _node_loss(stop_first=True)
    assert report["lost"] == 0, stackfaults.format_report(report)


def _node_loss(**options):
    """24 s on a cluster of its own with quorum queues; a node stops for 3 s,
    5 s in. The report, once it meets every target."""
    report = stackfaults.run(
        queue_type="quorum",
        duration=24.0,
        rate=NODE_LOSS_TEST_RATE,
        restart_pause=3.0,
        node_loss=True,
        node_loss_at=5.0,
        **options,
    )
    _meets_its_targets(report, restart_pause=3.0)
    return report


# A restart whose pause (15 s, the broker away longer still) outlasts the
# processes' operation_timeout (5 s): the layer reconnects, so every
# runworker must outlive it. Before, a blocking receive raised
# OperationTimeout once the outage passed operation_timeout, and so did the
# replies Channels flushes in a ``finally``; either ended the runworker.
LONG_OUTAGE_PAUSE = 15.0
LONG_OUTAGE_OPERATION_TIMEOUT = 5.0


def test_every_runworker_outlives_an_outage_longer_than_operation_timeout():
    report = stackfaults.run(
        queue_type="quorum",
        duration=40.0,
        rate=3.0,
        restart_pause=LONG_OUTAGE_PAUSE,
        restart=True,
        websocket_worker=True,
        operation_timeout=LONG_OUTAGE_OPERATION_TIMEOUT,
    )
    _meets_its_targets(report, restart_pause=LONG_OUTAGE_PAUSE)
    assert report["restart_seconds"] is not None
    assert report["broker_outage_seconds"] > LONG_OUTAGE_OPERATION_TIMEOUT
