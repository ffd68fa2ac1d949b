"""What Channels' ``enforce_ordering`` needs survives a broker restart on classic queues.

At default settings (``persistent=False``) a classic queue loses transient
messages at ``stop_app``. A socket's frames (its shard) and the frames
``enforce_ordering`` parks out of turn (``__wait__.<reply channel>``) are
published persistent anyway: one lost frame leaves the socket's next order
behind, and every later frame parks until its ``__wait__`` channel is full
(docs/channels.rst). Other messages stay transient, and are lost.
"""

import time

import pytest

from helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

REPLY = "daphne.response.restart!socket1"
WAIT = "__wait__.daphne.response.restart?socket1"  # channels.sessions.wait_channel_name


def _receive_after_the_return(layer, channel, timeout=20.0):
    """The first message of ``channel`` once the layer is back, or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got, message = layer.receive([channel], block=True)
        if got is not None:
            return message
    return None


def test_what_enforce_ordering_needs_survives_stop_app(node, new_layer):
    layer = new_layer(node, receive_timeout=1.0, operation_timeout=10.0)
    frame = {"reply_channel": REPLY, "order": 1, "path": "/chat/", "text": "a"}
    layer.send("websocket.receive", frame)
    parked = dict(frame, order=2, original_channel="websocket.receive")
    layer.send(WAIT, parked)
    layer.send("restart.plain", {"n": 1})  # transient: the restart drops it
    node.stop_app()
    node.start_app()
    wait_until(lambda: layer.connection_statistics()["connected"], 30, message="the layer is back")
    assert _receive_after_the_return(layer, "websocket.receive") == frame
    assert _receive_after_the_return(layer, WAIT) == parked
    # The contrast: a transient message is lost, so the node did drop what it held.
    assert layer.receive(["restart.plain"], block=True) == (None, None)
