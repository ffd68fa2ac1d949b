"""The copy guard (``engine.deliveries.HandedOff``) without a broker.

A publish whose confirm was lost with its connection is sent again, marked
(``naming.REPUBLISHED_HEADER``). The broker may deliver the copy before or
after the original, and either may be pushed (held), taken by a
``basic_get`` wave and not yet handed out, or handed out already. Whichever
comes second is a duplicate; each test puts the first in one of those
states and offers the second.
"""

import types

import pika
import pytest

from asgi_amqp.engine.deliveries import Delivery, HandedOff, HeldMessages
from asgi_amqp.naming import REPUBLISHED_HEADER

QUEUE = "p:q:chan"


def _delivery(marked):
    headers = {REPUBLISHED_HEADER: 1} if marked else {}
    return Delivery(QUEUE, headers, b"x", False, "token.1")


def _offer(log, delivery):
    method = types.SimpleNamespace(redelivered=delivery.redelivered)
    properties = pika.BasicProperties(
        message_id=delivery.message_id, headers=dict(delivery.headers) or None
    )
    return log.is_duplicate(delivery.queue, method, properties)


def _log():
    log = HandedOff()
    log.held = HeldMessages()
    return log


@pytest.mark.parametrize("state", ["handed out", "being taken by a wave"])
@pytest.mark.parametrize("first_marked", [False, True], ids=["original-first", "copy-first"])
def test_the_second_is_dropped(first_marked, state):
    log = _log()
    first, second = _delivery(first_marked), _delivery(not first_marked)
    assert not _offer(log, first)
    if state == "handed out":
        log.add(first)
    else:  # a basic_get wave took it and has not handed it out yet
        log.taking(first)
    assert _offer(log, second)


def test_an_original_alone_is_never_dropped():
    log = _log()
    assert not _offer(log, _delivery(False))
    log.taking(_delivery(False))
    log.taken(_delivery(False))
    log.add(_delivery(False))
    other = Delivery(QUEUE, {}, b"x", False, "token.2")
    assert not _offer(log, other)
