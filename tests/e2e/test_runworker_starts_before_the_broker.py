"""daphne and a runworker started 20 s before their broker serve once it is up.

The usual start of a container deployment: the processes come up before
RabbitMQ accepts connections. A layer that had never connected failed its
first call, so the runworker exited at once. Now the wait for the first
connection is an outage (``first_connect_timeout``, 60 s by default).
"""

import json
import time

import pytest
from e2e_support import chatstack

from helpers import at_moment

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.heavy]

BROKER_LATE = 20.0  # seconds between the processes' start and the broker's
WAITING_LINE = "no connection to the broker yet"


def test_a_runworker_started_before_the_broker_serves_the_first_request():
    from devtools.rabbitmq import RabbitNode

    node = RabbitNode()  # its ports are chosen now: the processes get its URL first
    stack = chatstack.ChatStack(node.amqp_url, node.management_url, prefix="e2e-late", workers=1)
    try:
        start = time.monotonic()
        stack.start_daphne()
        worker = stack.start_worker()
        # The worker's blocking receives wait for the broker, and say so once.
        worker.wait_for_line(WAITING_LINE, BROKER_LATE - 5)
        line = next(line for line in worker.lines() if WAITING_LINE in line)
        assert "127.0.0.1:%d" % node.amqp_port in line and "guest" not in line, line
        assert "WARNING" in line, line

        at_moment(start, BROKER_LATE)
        assert worker.alive(), "the runworker exited before the broker started:\n" + worker.tail()
        assert stack.daphne.alive(), "daphne exited before the broker started:\n" + (
            stack.daphne.tail()
        )
        node.start()
        stack.wait_daphne(30)
        served = stack.wait_http(30)  # the first request, through daphne and the worker
        assert served["worker"] == worker.pid, served
        status, body = chatstack.http_get(stack.base_url + "/hello/")
        assert status == 200 and json.loads(body.decode("utf-8"))["worker"] == worker.pid
        assert worker.alive() and stack.workers == [worker]
    finally:
        stack.stop()
        stack.cleanup()
        node.cleanup(graceful=False)
