"""Broker resource alarms: a send waits for the alarm within operation_timeout
(at once on daphne's reactor thread) and then fails naming it, send_group
drops and counts instead of raising, receives go on, and everything resumes by
itself when the alarm clears.

Each alarm is raised on a private node with rabbitmqctl: a memory watermark
far below what the node uses, or a free-disk limit far above what the disk
has. The broker then blocks every connection that publishes.
"""

import logging
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from asgi_amqp import BrokerBlocked, BrokerConnectionError
from helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

OPERATION_TIMEOUT = 3.0
MARGIN = 1.5  # seconds a call may take beyond operation_timeout on a loaded machine

# kind: (rabbitmqctl arguments that raise it, arguments that clear it, the broker's reason)
ALARMS = {
    "memory": (
        ["set_vm_memory_high_watermark", "0.0000001"],
        ["set_vm_memory_high_watermark", "0.4"],
        "memory",
    ),
    "disk": (
        ["set_disk_free_limit", "100000GB"],
        ["set_disk_free_limit", "50MB"],
        "disk",
    ),
}


class Alarm(object):
    """Raises one kind of alarm on ``node`` and always clears it again."""

    def __init__(self, node, kind):
        self.node = node
        self.raise_args, self.clear_args, self.reason = ALARMS[kind]

    def __enter__(self):
        self.node.ctl(*self.raise_args)
        return self

    def clear(self):
        self.node.ctl(*self.clear_args)

    def __exit__(self, *exc):
        self.clear()


def _layer(new_layer, node):
    return new_layer(
        node, operation_timeout=OPERATION_TIMEOUT, receive_timeout=1, capacity=1000, expiry=60
    )


def _timed(call, *args):
    """(seconds, result or the exception raised) of ``call(*args)``."""
    started = time.monotonic()
    try:
        outcome = call(*args)
    except Exception as exc:
        outcome = exc
    return time.monotonic() - started, outcome


def _send_until_blocked(layer, channel, sent):
    """Send numbered messages until the broker blocks; every send is bounded."""

    def blocked():
        took, outcome = _timed(layer.send, channel, {"n": len(sent)})
        assert took < OPERATION_TIMEOUT + MARGIN, "a send took %.1f s" % took
        if outcome is None:
            sent.append(len(sent))
            return False
        assert not isinstance(outcome, BrokerConnectionError), outcome
        assert isinstance(outcome, BrokerBlocked), repr(outcome)
        return outcome

    # A memory alarm is raised at once; a disk alarm at the next disk check.
    return wait_until(blocked, 30, interval=0.2, message="the broker blocked publishing")


def _on_a_reactor_thread(call, *args):
    """(seconds, outcome) of ``call(*args)`` made on a thread Twisted knows as
    its reactor's, as daphne's sends are."""
    from twisted.python import threadable

    result = []

    def run():
        previous = threadable.ioThread
        threadable.registerAsIOThread()
        try:
            result.append(_timed(call, *args))
        finally:
            threadable.ioThread = previous

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(OPERATION_TIMEOUT + 30)
    return result[0]


@pytest.mark.parametrize("kind", sorted(ALARMS))
def test_an_alarm_blocks_sends_for_a_bounded_time_while_receives_go_on(
    node, new_layer, kind, caplog
):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    layer = _layer(new_layer, node)
    channel = "alarm-%s" % kind
    for n in range(3):
        layer.send(channel, {"queued": n})
    sent = []
    with Alarm(node, kind) as alarm:
        error = _send_until_blocked(layer, channel, sent)
        assert alarm.reason in str(error) and "alarm" in str(error)
        assert alarm.reason in error.reason
        assert isinstance(error, layer.ChannelFull)  # daphne: 503 / close 1013

        # A worker's send waits for the alarm within operation_timeout, then
        # raises; daphne's (on the reactor thread) raises at once.
        took, outcome = _timed(layer.send, channel, {"late": 1})
        assert isinstance(outcome, BrokerBlocked), outcome
        assert OPERATION_TIMEOUT - 0.5 <= took < OPERATION_TIMEOUT + MARGIN, took
        took, outcome = _on_a_reactor_thread(layer.send, channel, {"reactor": 1})
        assert isinstance(outcome, BrokerBlocked) and took < 0.5, (took, outcome)
        stats = layer.connection_statistics()
        assert stats["blocked"] is True and alarm.reason in stats["blocked_reason"]
        assert stats["connected"] is True
        outcomes = layer.send_many([(channel, {"many": n}) for n in range(5)])
        assert all(isinstance(o, BrokerBlocked) for o in outcomes), outcomes

        # send_group never raises ChannelFull (ASGI 1.0; Channels 1.x ends a
        # runworker on it): through an alarm longer than the timeout its
        # message is dropped and counted.
        took, outcome = _timed(layer.send_group, "alarm-group", {"g": 1})
        assert outcome is None and took < OPERATION_TIMEOUT + MARGIN, (took, outcome)
        assert layer.connection_statistics()["group_sends_dropped"] == 1
        assert any("message dropped" in r.getMessage() for r in caplog.records)

        # Receives of messages queued before the alarm work during it.
        assert layer.receive([channel]) == (channel, {"queued": 0})
        assert layer.receive([channel], block=True) == (channel, {"queued": 1})
        assert layer.receive([channel]) == (channel, {"queued": 2})
        assert any("blocks publishing" in r.getMessage() for r in caplog.records)

        # A send made during the alarm goes out once it clears.
        waiting = []
        sender = threading.Thread(
            target=lambda: waiting.append(_timed(layer.send, channel, {"waited": 1}))
        )
        sender.start()
        wait_until(lambda: sender.is_alive(), 5, message="the send started")
        alarm.clear()
        sender.join(OPERATION_TIMEOUT + MARGIN + 5)
        assert waiting and waiting[0][1] is None, waiting

    # Cleared: the same layer sends again, without a new connection.
    losses = layer.connection_statistics()["connection_losses"]

    def sends():
        _, outcome = _timed(layer.send, channel, {"after": 1})
        return outcome is None

    wait_until(sends, 30, interval=0.2, message="sending again after the alarm")
    assert layer.connection_statistics()["blocked"] is False
    assert layer.connection_statistics()["connection_losses"] == losses
    assert any("publishes again" in r.getMessage() for r in caplog.records)
    received = []
    while True:
        got, message = layer.receive([channel], block=True)
        if got is None:
            break
        received.append(message)
    assert {"after": 1} in received and {"waited": 1} in received
    # Sends that raised BrokerBlocked were never handed to the broker.
    assert {"late": 1} not in received and {"reactor": 1} not in received
    assert not any("many" in m for m in received)


def test_the_cli_names_the_alarm(node):
    env = dict(os.environ, AMQP_URL=node.amqp_url, AMQP_MANAGEMENT_URL=node.management_url)
    command = [sys.executable, "-m", "asgi_amqp", "--prefix", "cli-%s" % uuid.uuid4().hex[:8]]
    with Alarm(node, "memory") as alarm:

        def refused():
            run = subprocess.run(
                command + ["send", "alarm.cli", '{"n": 1}'],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return run if run.returncode != 0 else None

        run = wait_until(refused, 60, interval=0.2, message="the CLI refused by the alarm")
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        assert "alarm" in lines[0] and alarm.reason in lines[0], lines[0]
        assert "cannot reach" not in lines[0]


def test_a_send_parked_for_room_waits_through_an_alarm(node, new_layer):
    """daphne's frame for a full channel is parked; an alarm that comes while
    it waits holds it back until it clears. Before, the alarm's first refusal
    dropped every parked send, and their sockets were never told."""
    layer = new_layer(node, operation_timeout=OPERATION_TIMEOUT, capacity=1, expiry=60)
    parked = layer.sender.parked_sends
    layer.send("alarm.park", {"n": 0})  # the channel is full
    took, outcome = _on_a_reactor_thread(layer.send, "alarm.park", {"n": 1})
    assert outcome is None and parked.waiting(layer.topology.channel_queue("alarm.park"))
    with Alarm(node, "memory"):
        wait_until(lambda: layer.connection_statistics()["blocked"], 30, message="the alarm seen")
        # Room now, but the alarm refuses the parked send's publish.
        assert layer.receive(["alarm.park"], block=True) == ("alarm.park", {"n": 0})
        time.sleep(1.0)  # the line meets the alarm several times meanwhile
        assert parked.lost == 0 and parked.messages == 1
    assert layer.receive(["alarm.park"], block=True) == ("alarm.park", {"n": 1})
    wait_until(lambda: parked.delivered == 1, 10, message="the parked send's confirm")
    assert parked.lost == 0
