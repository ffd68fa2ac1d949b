"""A dead-lettered event whose asgi-* headers are not text is ignored, not retried.

The dead-letter worker reads the group, member and stamp of an ended lease
from its headers. AMQP tables carry other types too (an int, a table), and
a header of another type must count as missing: the event is logged,
acked and passed over. Read as it came, an int stamp raised
AttributeError out of the worker's loop, which reconnected without acking,
so the same event came back forever and stalled every event behind it.
No broker is needed: the worker's handler is called directly.
"""

import logging

import pika

from asgi_amqp import naming
from asgi_amqp.engine.deadletter import DeadLetterWorker, _text


def _worker():
    topology = naming.Topology("dlhead", 60, 86400, lambda channel: 100)
    return DeadLetterWorker([], topology)


def _lease(**headers):
    base = {
        "x-death": [{"reason": "expired", "queue": "dlhead:e:86400000", "count": 1}],
        naming.KIND_HEADER: naming.LEASE_KIND,
    }
    base.update(headers)
    return pika.BasicProperties(headers=base)


class _Actions(object):
    """Stands for the worker's channel for topology changes."""

    def __init__(self):
        self.unbinds = []

    def exchange_unbind(self, **kwargs):
        self.unbinds.append(kwargs)


def test_a_lease_whose_headers_are_not_text_is_ignored(caplog):
    worker = _worker()
    worker._actions = _Actions()
    odd = _lease(
        **{naming.GROUP_HEADER: "room", naming.MEMBER_HEADER: "chat.1", naming.LEASE_HEADER: 7}
    )
    with caplog.at_level(logging.WARNING, logger="asgi_amqp.engine.deadletter"):
        worker._handle(odd, b"")  # raised AttributeError ('int' has no 'isdigit')
    assert "names no group, member or stamp" in caplog.text
    assert worker._actions.unbinds == []


def test_a_lease_with_text_headers_still_ends_its_binding():
    worker = _worker()
    worker._actions = _Actions()
    lease = _lease(
        **{naming.GROUP_HEADER: b"room", naming.MEMBER_HEADER: "chat.1", naming.LEASE_HEADER: "7"}
    )
    worker._handle(lease, b"")
    assert worker._actions.unbinds == [
        {
            "destination": "dlhead:m:chat.1",
            "source": "dlhead:g:room",
            "routing_key": "",
            "arguments": {naming.LEASE_HEADER: "7"},
        }
    ]


def test_text_of_headers():
    assert _text(b"caf\xc3\xa9") == "café"
    assert _text("room") == "room"
    assert _text(None) == ""
    assert _text(7) == ""
    assert _text({"a": 1}) == ""
