"""A message a caller takes from what its process holds is acked at once.

The caller notes the ack and wakes the I/O thread (``IOThread.take_pushed``):
no later call of the caller's is needed, nor the consumers' sweep, which
``linger`` makes rare here. The broker shows it: a consumer whose window is
one message is pushed the next only once the ack of the last is in.
"""

import uuid

import pika

from helpers import wait_until


def test_a_taken_message_is_acked_without_another_call(broker, new_layer):
    layer = new_layer(broker, flush=True, linger=60, consumer_idle_timeout=60)
    channel = "taken-%s" % uuid.uuid4().hex[:8]
    queue = layer.topology.channel_queue(channel)
    for n in range(3):
        layer.send(channel, {"n": n})
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        probe = connection.channel()

        def ready():
            return probe.queue_declare(queue, passive=True).method.message_count

        # The first receive waits for its message; the consumer is then pushed
        # the second, which this process holds (one ready message is left).
        assert layer.receive([channel], block=True) == (channel, {"n": 0})
        wait_until(lambda: ready() == 1, 10, message="the second message held")
        # Taken from what is held; its ack alone lets the broker push the third.
        assert layer.receive([channel], block=True) == (channel, {"n": 1})
        wait_until(lambda: ready() == 0, 5, message="the taken message acked")
    finally:
        connection.close()
    assert layer.receive([channel], block=True) == (channel, {"n": 2})
