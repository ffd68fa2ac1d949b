"""Sending: ``send``, and the properties of every message of the layer.

A send is more than a publish: one the broker refused (nacked) or returned is carried to
its end here, in the caller's thread, as ``ChannelFull``, a declare and a new attempt, or
an error (``SendAttempts``). The publishes run on the I/O thread (``engine``). ``groups``
and ``pipeline`` take from the ``Sender`` what is its own: ``properties``, the queue
declares, ``encode``, ``operation_timeout`` and ``finish_send``.
"""

import itertools
import os
import secrets
import time
from typing import Any, Callable, Dict, Optional, Tuple

import pika

from . import engine, naming
from .callers import Caller
from .channel_names import check_channel_name, is_process_local
from .engine import ACKED, NACKED, PARKED, Engine, Step
from .errors import BrokerOperationError, ChannelFull, MessageRefused
from .parked_sends import SHORT_LINE, ParkedSends
from .serialization import Message, Serializer
from .statistics import Counters


class _MessageIds(object):
    """Message ids: a random token per process and a counter, shared by every layer
    of the process (callers' threads: ``next`` is atomic). A forked child makes its
    own token, so that the ids of two processes never meet in a receiver's
    hand-off log."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.counter = itertools.count()

    def renew(self) -> None:
        self.token = secrets.token_hex(8)


_ids = _MessageIds()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.renew)


class Sender(object):
    """``send``, the end of a refused publish, and the layer's message properties.

    The layer's; used from callers' threads only, several at once, daphne's reactor
    thread among them (which never waits for an alarm or a refused send: ``callers``).
    """

    def __init__(
        self,
        engine: Engine,
        topology: naming.Topology,
        serializer: Serializer,
        stats: Counters,
        operation_timeout: float,
        get_capacity: Callable[[str], int],
        persistent: bool,
        caller: Callable[[], Caller],
    ) -> None:
        # The layer's engine: publishes and declares.
        self.engine = engine
        self._topology = topology
        self._serializer = serializer
        self._stats = stats  # ChannelFull counts (thread-safe, the layer's)
        self._get_capacity = get_capacity
        # The layer's ``operation_timeout`` (callers' threads; set there only).
        self.operation_timeout = operation_timeout
        self._delivery_mode = 2 if persistent else 1
        # Valid channel names -> ``_target`` (callers' threads: a
        # dict's get and set are atomic; an entry lost to a clear is made again).
        self._targets: Dict[str, Tuple[str, bool, bool, bool]] = {}
        # The calling thread's kind, which says what it may wait for (``callers``).
        self.caller = caller
        # What daphne's reactor thread could not send at once (``parked_sends``;
        # the reactor thread parks, the I/O thread sends, under its own lock).
        self.parked_sends = ParkedSends(engine, self.queue_declare, topology.expiry)

    def send(self, channel: str, message: Message) -> None:
        try:
            target = self._targets.get(channel)
        except TypeError:  # an unhashable, hence invalid, name: ``_target`` says why
            target = None
        if target is None:
            target = self._target(channel)
        body = self._serializer.dumps(message)
        queue, ordered, local, persistent = target
        shard = False
        if ordered:
            queue = self._topology.send_queue(channel, message)
            shard = persistent = naming.is_shard_queue(queue)
        headers = {naming.CHANNEL_HEADER: channel} if local else None
        # Persistent where enforce_ordering keeps its frames (``naming.keeps_order``): a
        # classic queue's node loses transient messages when it stops
        # (test_traffic_through_the_loss_of_a_node), and a lost frame stalls its socket.
        properties = self.properties(headers, persistent=persistent)
        # Parked (``parked_sends``) instead of waiting: a reactor send while the broker is away,
        # refused, or behind earlier parked sends to its queue; and a frame for a full shard,
        # maybe enforce_ordering's requeue from its only reader, which Channels does not retry.
        # An unordered queue parks SHORT_LINE at most, then ChannelFull (daphne: 503 or 1013).
        caller = self.caller()
        reactor = caller is Caller.REACTOR
        parked = self.parked_sends
        most = None if shard else SHORT_LINE
        if reactor and self.engine.broker_away():
            parked.park(channel, queue, body, properties)
            return
        if (reactor or shard) and parked.waiting(queue):
            parked.park(channel, queue, body, properties, most=most)
            return
        outcome = self.engine.publish(
            "",
            queue,
            body,
            properties,
            True,
            "send to %s" % channel,
            alarm_wait=self.operation_timeout,
            parks=reactor,
            caller=caller,
        )
        if outcome == PARKED:  # on its way when the broker went: it may have arrived
            parked.park(channel, queue, body, properties, marked=True)
        elif outcome == NACKED and (reactor or shard):  # full, or between leaders
            parked.park(channel, queue, body, properties, most=most)
        else:
            self.finish_send(channel, queue, body, properties, outcome)

    def _target(self, channel: str) -> Tuple[str, bool, bool, bool]:
        """(queue, ordered, process-local, persistent) of a valid ``channel``, else
        ``TypeError``. Kept per name: a worker sends to the same few channels again
        and again."""
        check_channel_name(channel)
        topology = self._topology
        queue = topology.channel_queue(channel)
        target = (
            queue,
            channel in topology.ordered_channels,
            is_process_local(channel),
            naming.keeps_order(queue),
        )
        if len(self._targets) >= 10000:
            self._targets.clear()
        self._targets[channel] = target
        return target

    def encode(self, message: Message) -> bytes:
        """``message`` as a body to publish (``MessageTooLarge``, ``TypeError``)."""
        return self._serializer.dumps(message)

    def finish_send(
        self,
        channel: str,
        queue: str,
        body: bytes,
        properties: pika.BasicProperties,
        outcome: str,
    ) -> None:
        """Carry a publish the broker refused or returned to its end: sent, or raised."""
        if outcome == ACKED:
            return  # the usual case: nothing to build, no thread to ask about
        what = "send to %s" % channel
        attempts = SendAttempts(
            channel, queue, self.operation_timeout, patient=self.caller() is not Caller.REACTOR
        )
        marked = False
        while outcome != ACKED:
            if outcome == NACKED:
                attempts.refused(self._depth_unless_full(channel, queue))
                marked = True  # in case a refusal ever lied: the receiver drops a copy
            else:
                # Returned: no such queue, new, expired or flushed
                # (test_messages_count_is_what_the_queue_took_in).
                attempts.returned()
                self.engine.declare([self.queue_declare(channel, queue)], "declare %s" % queue)
            outcome = self.engine.publish(
                "", queue, body, properties, True, what, marked, alarm_wait=self.operation_timeout
            )

    def _depth_unless_full(self, channel: str, queue: str) -> int:
        """After a refusal: ``ChannelFull`` if the queue is full, else its depth.

        Full is ``Topology.refusing_depth`` or more. Below it the refusal has another
        cause, not ChannelFull: a queue whose node is down refuses too
        (test_traffic_through_the_loss_of_a_node), as does a quorum queue between leaders.
        The depth comes from a passive declare, which works whatever the queue's
        arguments; a queue not full then gets this layer's declare, which the broker
        refuses for one made with a smaller capacity: ``QueueSettingsMismatch``
        (test_a_send_to_a_queue_full_at_a_smaller_capacity), not a failing node."""
        depth: int = self.engine.declare(
            [engine.queue_declare(queue, None, passive=True)], "check %s" % queue
        ).message_count
        if depth >= self._topology.refusing_depth(channel):
            self._stats.count_full(channel)
            raise ChannelFull(
                "channel %s is full (%d of %d)" % (channel, depth, self._get_capacity(channel))
            )
        self.engine.declare([self.queue_declare(channel, queue)], "check %s" % queue)
        return depth

    # -- what every part of the layer publishes with -----------------------------

    def channel_queue_declare(self, channel: str) -> Step:
        """The step that declares ``channel``'s queue with this layer's arguments."""
        return self.queue_declare(channel, self._topology.channel_queue(channel))

    def queue_declare(self, channel: str, queue: str) -> Step:
        """The step that declares ``channel``'s queue or shard with this layer's arguments."""
        return engine.queue_declare(queue, self._topology.queue_arguments(channel, queue))

    def properties(
        self, headers: Optional[Dict[str, Any]] = None, persistent: bool = False
    ) -> pika.BasicProperties:
        """The properties of a message of this layer, with a new id."""
        return pika.BasicProperties(
            delivery_mode=2 if persistent else self._delivery_mode,  # 2 with persistent=True
            content_type="application/x-msgpack",
            message_id="%s.%d" % (_ids.token, next(_ids.counter)),
            headers=headers,
            timestamp=int(time.time()),
        )  # the broker's messages_max_age reads it


class SendAttempts(object):
    """How long ``send`` keeps trying after the broker said no.

    A refusal (nack) of a queue that is not full: the message was not delivered. It
    goes again at once (a reader may have made room before the depth check), then a
    ``patient`` caller retries with a growing pause until ``operation_timeout``;
    daphne's reactor thread, which must never sleep, gets ``MessageRefused`` at once.
    A return (no such queue): declare and send again, three times at most.
    """

    def __init__(self, channel: str, queue: str, timeout: float, patient: bool = True) -> None:
        self.channel = channel
        self.queue = queue
        self.timeout = timeout
        self.patient = patient
        self.refusals = 0
        self.declares = 0
        self.refused_until: Optional[float] = None

    def refused(self, depth: int) -> None:
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

    def returned(self) -> None:
        self.declares += 1
        if self.declares > 3:
            raise BrokerOperationError(
                312, "queue %s disappears as soon as it is declared" % self.queue
            )
