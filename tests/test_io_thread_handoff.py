"""The caller/I-O-thread hand-off (asgi_amqp.engine.futures.Pending), without a broker."""

import signal
import threading
import time

import pytest

from asgi_amqp.engine.futures import Pending
from asgi_amqp.errors import OperationTimeout


def test_a_result_that_arrived_first_is_returned_at_once_and_again():
    pending = Pending()
    assert pending.resolve("value") is True
    assert pending.result(1) == "value"
    assert pending.result(1) == "value"  # a second wait does not block
    assert pending.result_or(0, "default") == "value"


def test_a_result_from_another_thread_wakes_the_caller():
    pending = Pending()
    timer = threading.Timer(0.05, pending.resolve, args=("late",))
    timer.start()
    started = time.monotonic()
    assert pending.result(10) == "late"
    assert time.monotonic() - started < 2
    timer.join()


@pytest.mark.parametrize("wait", [Pending.result, Pending.arrived])
def test_a_wait_without_a_timeout_is_refused(wait):
    """A lock acquired with no timeout waits forever: every wait needs one."""
    pending = Pending()
    with pytest.raises(ValueError, match="timeout"):
        wait(pending, None)
    with pytest.raises(ValueError, match="timeout"):
        pending.result_or(None, "default")
    assert pending.wanted is True  # refused before it began: nothing was abandoned


def test_a_timeout_abandons_so_a_late_result_is_refused():
    pending = Pending("send to foo")
    with pytest.raises(OperationTimeout, match="send to foo"):
        pending.result(0.01)
    assert pending.wanted is False
    assert pending.resolve("too late") is False  # the I/O thread puts it back


def test_result_or_returns_the_default_on_timeout():
    pending = Pending()
    assert pending.result_or(0.01, "nothing") == "nothing"
    assert pending.resolve(1) is False


def test_a_negative_remaining_time_is_an_immediate_timeout():
    pending = Pending()
    assert pending.result_or(-0.5, "expired") == "expired"
    ready = Pending()
    ready.resolve(2)
    assert ready.result(-1.0) == 2


def test_failure_is_raised_in_the_caller():
    pending = Pending()
    assert pending.fail(ValueError("broker said no")) is True
    with pytest.raises(ValueError, match="broker said no"):
        pending.result(1)
    assert pending.resolve("after") is False


def test_only_the_first_outcome_counts():
    pending = Pending()
    assert pending.resolve(1) is True
    assert pending.fail(RuntimeError()) is False
    assert pending.abandon() is False  # the caller learns a result is there
    assert pending.result(0) == 1


def test_an_interrupted_wait_abandons_first():
    """runworker's SIGTERM handler raises SystemExit inside a blocking receive."""
    pending = Pending()

    def handler(signum, frame):
        raise SystemExit(0)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(SystemExit):
            pending.result(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert pending.resolve("message") is False  # so it goes back to the queue


def test_a_blocking_receive_queued_before_the_consumers_channel_opened_is_answered_at_close():
    """A wait handed to the consumers before their channel opened sits in a
    backlog; closing the layer then answers it (None) instead of failing to
    unpack the backlog's entries, which ended the I/O loop with the other
    parts' callers unanswered. The connection here was never opened, so the
    channel never opens and nothing reaches a broker."""
    import pika
    from pika.adapters.select_connection import IOLoop

    from asgi_amqp.engine.consumers import ConsumerPool, ConsumerSettings
    from asgi_amqp.engine.deliveries import HandedOff, HeldMessages, Liveness
    from asgi_amqp.errors import LayerClosed

    ioloop = IOLoop()
    connection = pika.SelectConnection(
        pika.ConnectionParameters("127.0.0.1", port=9), custom_ioloop=ioloop
    )
    try:
        assert not connection.is_open
        pool = ConsumerPool(
            connection,
            None,
            Liveness(),
            HandedOff(),
            HeldMessages(),
            ConsumerSettings(0.25, 30.0, 16),
        )
        pending = Pending("blocking receive")
        pool.add_waiter(pending, [("q", None)], time.monotonic() + 30, threads=1)
        assert not pending.arrived(0)
        pool.fail_all(LayerClosed("the layer is closed"))
        assert pending.result(0) is None
    finally:
        ioloop.close()
