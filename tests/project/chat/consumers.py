"""WebSocket consumers (Channels 1.x): chat rooms and an echo endpoint.

Chat protocol (JSON text frames):

* the client connects to ``/chat/<room>/?name=<name>``;
* it sends ``{"text": "...", "id": <optional, echoed back>}``;
* every member of the room, the sender included, receives
  ``{"type": "message", "room", "name", "text", "id", "worker"}``, where
  ``worker`` is the pid of the runworker process that handled the frame;
* on connect the new member receives ``{"type": "welcome", "room", "name",
  "channel", "worker"}`` (``channel`` is its reply channel, the name the
  layer lists in ``group_channels``), and the room gets ``{"type": "join"}``;
  on disconnect the room gets ``{"type": "leave"}``.

Ordering: daphne numbers each socket's messages (``order``);
``enforce_ordering`` makes the workers run one socket's connect, frames and
disconnect strictly in that order, whichever worker receives them, keeping
its state in the channel session (shared between workers through the
session store in ``CHAT_STATE_DIR``).
"""

import functools
import json
import logging
import os
import re
import time
from urllib.parse import parse_qs

from channels import Group
from channels.sessions import channel_session, enforce_ordering
from django.conf import settings

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[^\w .-]+")
MAX_TEXT = 2000


def room_group(room):
    """The layer group of a room (group names allow ``[A-Za-z0-9._-]``)."""
    return Group("room-" + room)


def _clean_name(raw):
    name = _NAME_RE.sub("", raw or "").strip()[:30]
    return name or "anonymous"


def _query(message):
    raw = message.content.get("query_string", b"")
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    return parse_qs(raw)


def _send_room(room, payload):
    room_group(room).send({"text": json.dumps(payload)})


# -- chat rooms ----------------------------------------------------------------


@enforce_ordering
def chat_connect(message, room):
    name = _clean_name(_query(message).get("name", [""])[0])
    # Accept now (not when the consumer returns, Channels' default), so the
    # socket is open before any room message can reach it.
    message.reply_channel.send({"accept": True}, immediately=True)
    room_group(room).add(message.reply_channel)
    message.channel_session["room"] = room
    message.channel_session["name"] = name
    message.reply_channel.send(
        {
            "text": json.dumps(
                {
                    "type": "welcome",
                    "room": room,
                    "name": name,
                    "channel": message.reply_channel.name,
                    "worker": os.getpid(),
                }
            )
        }
    )
    _send_room(room, {"type": "join", "room": room, "name": name, "worker": os.getpid()})
    logger.info("%s joined room %s (%s)", name, room, message.reply_channel.name)


def _notes_order(func):
    """Log a frame that is not next in its socket's order (to CHAT_HANDLED_LOG).

    A frame whose ``order`` has run already is a duplicate: a copy of
    daphne's send, or of a worker's requeue, whose original another worker
    took. ``enforce_ordering`` parks it in the socket's ``__wait__`` channel
    for good, and sends it back after every later frame of that socket,
    where it is parked again. A frame that comes before its turn is parked
    in ``__wait__`` until the frame before it has run. The stack fault
    report counts both.
    """

    @functools.wraps(func)
    def inner(message, *args, **kwargs):
        order = message.content.get("order")
        next_order = message.channel_session.get("__channels_next_order", 0)
        if order is not None and int(order) < next_order:
            _log_handled("stale %s %s %.3f" % (message.reply_channel.name, order, time.time()))
        elif order is not None and int(order) > next_order:
            _log_handled("early %s %s %.3f" % (message.reply_channel.name, order, time.time()))
        return func(message, *args, **kwargs)

    return channel_session(inner)


@_notes_order
@enforce_ordering
def chat_receive(message, room):
    raw = message.content.get("text")
    if raw is None:
        return  # binary frames are not part of the protocol
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        data = {"text": raw}
    text = str(data.get("text", ""))[:MAX_TEXT]
    _log_handled("%s %s %.3f" % (data.get("id"), message.content.get("order"), time.time()))
    _send_room(
        room,
        {
            "type": "message",
            "room": room,
            "name": message.channel_session.get("name", "anonymous"),
            "text": text,
            "id": data.get("id"),
            "worker": os.getpid(),
        },
    )


@_notes_order
@enforce_ordering
def chat_disconnect(message, room):
    room_group(room).discard(message.reply_channel)
    name = message.channel_session.get("name", "anonymous")
    _send_room(room, {"type": "leave", "room": room, "name": name, "worker": os.getpid()})
    logger.info("%s left room %s (%s)", name, room, message.reply_channel.name)


# -- echo ------------------------------------------------------------------------


def echo_connect(message):
    message.reply_channel.send({"accept": True})


def _log_handled(text):
    """Append ``<pid> <text>`` to CHAT_HANDLED_LOG, if set, before replying.

    One write(2) with O_APPEND: lines from several workers never interleave.
    """
    if not settings.CHAT_HANDLED_LOG:
        return
    fd = os.open(settings.CHAT_HANDLED_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, ("%d %s\n" % (os.getpid(), text)).encode("utf8"))
    finally:
        os.close(fd)


def echo_receive(message):
    """Reply ``<pid> <text>``; obey ``sleep <s>`` when CHAT_TEST_HOOKS=1."""
    text = message.content.get("text")
    if text is None:
        message.reply_channel.send({"bytes": message.content.get("bytes", b"")})
        return
    _log_handled(text)
    if settings.CHAT_TEST_HOOKS and text.startswith("sleep "):
        time.sleep(min(float(text.split()[1]), 30.0))
    message.reply_channel.send({"text": "%d %s" % (os.getpid(), text)})
