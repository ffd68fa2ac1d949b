"""A message given back many times is never lost to a quorum queue's delivery limit.

RabbitMQ 4.0 gives quorum queues a default delivery limit of 20 and
dead-letters a message at its 21st delivery, with reason
``delivery_limit``; 3.x has no limit. The layer gives messages back with
``basic.nack(requeue=True)`` (held messages after ``linger``, those of a
closed channel), so the dead-letter worker sends such a message back to
its queue and logs it (``engine.deadletter``). Here a raw client takes the
message and gives it back 25 times; the layer must still receive it once.
"""

import logging

import pika
import pytest

from helpers import Management, wait_until

pytestmark = pytest.mark.slow

GIVEN_BACK = 25


def _give_back(broker, queue, times):
    """Take the message from ``queue`` and nack it with requeue, ``times`` times."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        for attempt in range(times):
            # After its 21st delivery on RabbitMQ 4 the broker dead-letters it
            # and the layer's worker sends it back: it is away for a moment.
            method = wait_until(
                lambda: channel.basic_get(queue)[0],
                timeout=10,
                interval=0.02,
                message="the message back in %s (attempt %d)" % (queue, attempt + 1),
            )
            channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        connection.close()


@pytest.mark.parametrize(
    "channel, receive_from", [("limit.normal", "limit.normal"), ("limit!local", "limit!")]
)
def test_a_message_given_back_25_times_is_still_received(
    broker, new_layer, caplog, channel, receive_from
):
    caplog.set_level(logging.WARNING, logger="asgi_amqp")
    layer = new_layer(broker, flush=True, queue_type="quorum", expiry=60)
    layer.send(channel, {"given": "back"})
    _give_back(broker, layer.topology.channel_queue(channel), GIVEN_BACK)
    assert layer.receive([receive_from], block=True) == (channel, {"given": "back"})
    assert layer.receive([receive_from]) == (None, None)
    told = [r for r in caplog.records if "delivery limit" in r.getMessage()]
    if Management(broker).overview()["rabbitmq_version"].startswith("3."):
        assert not told  # 3.x has no default limit: nothing to send back
    else:
        assert told and "sent back" in told[0].getMessage(), [r.getMessage() for r in told]


def test_a_group_message_to_a_local_member_given_back_25_times_is_still_received(broker, new_layer):
    """It names no channel, only its group, which its process copies to its
    members: sent back, it must still name the group. (The process reads its
    join notice first: a quorum queue puts a message given back at its end,
    so giving back the notice would put it behind the group message.)"""
    layer = new_layer(broker, flush=True, queue_type="quorum", expiry=60, group_expiry=60)
    layer.group_add("limited", "member!one")
    assert layer.receive(["member!"]) == (None, None)  # the join notice, applied
    layer.send_group("limited", {"to": "group"})
    _give_back(broker, layer.topology.channel_queue("member!one"), GIVEN_BACK)
    assert layer.receive(["member!"], block=True) == ("member!one", {"to": "group"})
