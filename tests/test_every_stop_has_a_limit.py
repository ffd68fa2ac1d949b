"""The layer's threads are stopped with a limit: ``stop(None)`` is refused (no broker).

``Thread.join(None)`` waits for ever. Every wait of the engine takes a
number of seconds (``futures.wait_seconds``), the stops of the I/O thread
and the dead-letter worker included, and refuses ``None`` before it stops
anything.
"""

import pika
import pytest

from asgi_amqp import naming
from asgi_amqp.engine.deadletter import DeadLetterWorker
from asgi_amqp.engine.io import IOThread

PARAMETERS = [pika.URLParameters("amqp://guest:guest@127.0.0.1:1/%2F")]


def test_the_io_thread_refuses_a_stop_without_a_limit():
    io = IOThread(PARAMETERS)
    with pytest.raises(ValueError, match="timeout"):
        io.stop(None)
    io.stop(1.0)  # never started: nothing to wait for


def test_the_dead_letter_worker_refuses_a_stop_without_a_limit():
    topology = naming.Topology("limits", 60, 86400, lambda channel: 100)
    worker = DeadLetterWorker(PARAMETERS, topology)
    with pytest.raises(ValueError, match="timeout"):
        worker.stop(None)
    worker.stop(1.0)
