"""Sending to a channel: ``send``, ``send_many`` and the message properties.

A mixin of ``AMQPChannelLayer``, kept apart because a send is more than a
publish: a publish the broker refused (nacked) or returned is carried to
its end here, in the caller's thread, as ``ChannelFull``, a declare and a
new attempt, or an error (``SendAttempts`` says for how long). The
publishes themselves run on the I/O thread (``engine``). The message
properties built here serve every publish of the layer: ``groups`` and
``pipeline`` use them too.
"""

import os
import secrets
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Type

import pika

from . import engine, errors, naming, pipeline
from .channel_names import is_process_local
from .engine import ACKED, NACKED
from .errors import BrokerOperationError, MessageRefused
from .serialization import Message
from .twisted_support import on_reactor_thread


class Sending(object):
    """``send`` and ``send_many``, and the properties of every message."""

    # Provided by AMQPChannelLayer (layer.py).
    topology: naming.Topology
    operation_timeout: float
    ChannelFull: Type[errors.ChannelFull]
    _serializer: Any
    _stats: Any
    _id_token: str
    _id_pid: int
    _id_counter: Iterator[int]
    _delivery_mode: int
    _check_channel_name: Callable[..., bool]
    _admin: Callable[..., Any]
    _publish: Callable[..., str]
    _declare_channel_queue: Callable[..., Any]
    get_capacity: Callable[[str], int]

    def send(self, channel: str, message: Message) -> None:
        self._check_channel_name(channel)
        body = self._serializer.dumps(message)
        queue = self.topology.channel_queue(channel)
        headers = {naming.CHANNEL_HEADER: channel} if is_process_local(channel) else None
        properties = self._properties(headers)
        outcome = self._publish("", queue, body, properties, True, "send to %s" % channel)
        self._finish_send(channel, queue, body, properties, outcome)

    def _finish_send(self, channel, queue, body, properties, outcome):
        """Carry a publish the broker refused or returned to its end: sent, or raised."""
        if outcome == ACKED:
            return  # the usual case: nothing to build, no thread to ask about
        what = "send to %s" % channel
        attempts = SendAttempts(
            channel, queue, self.operation_timeout, patient=not on_reactor_thread()
        )
        marked = False
        while outcome != ACKED:
            if outcome == NACKED:
                attempts.refused(self._depth_unless_full(channel, queue))
                marked = True  # in case a refusal ever lied: the receiver drops a copy
            else:
                # Returned: the queue does not exist (new, expired or flushed).
                attempts.returned()
                self._admin([self._declare_channel_queue(channel)], "declare %s" % queue)
            outcome = self._publish("", queue, body, properties, True, what, marked)

    def _depth_unless_full(self, channel, queue):
        """After a refusal: ``ChannelFull`` if the queue is full, else its depth.

        Full means at or past ``Topology.refusing_depth``: the capacity of a
        classic queue, and for a quorum queue the mark down to which a full
        one keeps refusing. Anything less is another cause: a queue on a
        node that is going down, or a quorum queue between leaders, refuses
        messages too, and that is not ChannelFull.

        The depth comes from a passive declare, which works whatever the
        queue's arguments. A queue that is not full by this layer's
        capacity is then declared with this layer's arguments: one created
        with a smaller capacity (full below ours) makes the broker refuse
        that declare, which names the mismatch (``QueueSettingsMismatch``)
        instead of a refusal that looks like a failing node."""
        depth = self._admin(
            [engine.queue_declare(queue, None, passive=True)], "check %s" % queue
        ).message_count
        if depth >= self.topology.refusing_depth(channel):
            self._stats.count_full(channel)
            raise self.ChannelFull(
                "channel %s is full (%d of %d)" % (channel, depth, self.get_capacity(channel))
            )
        self._admin([self._declare_channel_queue(channel)], "check %s" % queue)
        return depth

    def send_many(self, items: Iterable[Tuple[str, Message]]) -> List[Optional[BaseException]]:
        """Send every ``(channel, message)`` of ``items``, many in flight at once.

        An extension for bulk senders: the same promise as ``send`` for each
        message, without a broker round trip each. Returns one outcome per
        item, in input order: None once the broker confirmed it, or the
        exception ``send`` would have raised for it (``ChannelFull``, a
        ``TypeError`` for an invalid name or message, ``MessageTooLarge``, a
        broker error). An item is validated and encoded before it is
        published; an invalid one is never published. Messages to one
        channel keep their order. Items are read as they are sent, so a
        generator of any length needs memory for the window only (4096
        messages), plus the returned list.
        """
        return pipeline.send_all(self, items, "channel")

    def _process_token(self):
        """This process's id token: a forked child gets its own, so that the
        message ids of two processes never meet in a receiver's hand-off log."""
        if self._id_pid != os.getpid():
            self._id_token, self._id_pid = secrets.token_hex(8), os.getpid()
        return self._id_token

    def _properties(self, headers=None):
        # Ids only need to be unique per process and cheap: a random
        # per-process token plus a counter (next() on it is atomic).
        return pika.BasicProperties(
            delivery_mode=self._delivery_mode,  # 2 with persistent=True
            content_type="application/x-msgpack",
            message_id="%s.%d" % (self._process_token(), next(self._id_counter)),
            headers=headers,
            timestamp=int(time.time()),
        )  # the broker's messages_max_age reads it


class SendAttempts(object):
    """How long ``send`` keeps trying after the broker said no.

    A refusal (nack) from a queue that is not full means it could not take
    the message (a quorum queue between leaders, a node going down): the
    message was not delivered. It is sent again at once, since a reader
    may have made room between the refusal and the depth check. After
    that a ``patient`` caller sends it again with a growing pause until
    ``operation_timeout``; an impatient one, daphne's reactor thread,
    which must never sleep, gets ``MessageRefused`` at once. A return
    means the queue does not exist: it is declared and the message sent
    again, three times at most.
    """

    def __init__(self, channel, queue, timeout, patient=True):
        self.channel = channel
        self.queue = queue
        self.timeout = timeout
        self.patient = patient
        self.refusals = 0
        self.declares = 0
        self.refused_until = None

    def refused(self, depth):
        """One more refusal of a queue that held ``depth`` messages, not full."""
        self.refusals += 1
        if self.refusals == 1:
            return  # again at once
        now = time.monotonic()
        if self.refused_until is None:
            self.refused_until = now + (self.timeout if self.patient else 0.0)
        if now >= self.refused_until:
            raise MessageRefused(
                "the broker refused the message for %s %d times although its queue "
                "holds %d messages, below its capacity (its node may be going down, or a "
                "quorum queue may be electing a leader); it was not delivered"
                % (self.channel, self.refusals, depth)
            )
        time.sleep(min(0.5, self.refused_until - now, 0.02 * 2 ** min(self.refusals, 4)))

    def returned(self):
        self.declares += 1
        if self.declares > 3:
            raise BrokerOperationError(
                312, "queue %s disappears as soon as it is declared" % self.queue
            )
