"""Receiving: ``receive``, ``receive_twisted`` and what they hand out.

A mixin of ``AMQPChannelLayer``, kept apart because ``receive`` is the
hottest call of a worker and does the most in the caller's thread: it maps
the channel names onto their queues (``ReceiveTargets``, cached, because a
worker names the same handful of channels thousands of times), takes a
message a consumer was already pushed without a trip to the I/O thread,
and decodes what it gets, skipping (and counting) what cannot be read. The
gets and waits themselves run on the I/O thread (``engine``).
"""

import logging
import random
from typing import Any, Callable, Iterable, Optional, Tuple

from . import naming, twisted_support
from .channel_names import check_channel_name
from .errors import BrokerOperationError
from .serialization import Message, UndecodableMessage

logger = logging.getLogger(__name__)

_MAX_SKIPPED = 100  # undecodable messages skipped in one receive call


class Receiving(object):
    """``receive`` and ``receive_twisted``."""

    # Provided by AMQPChannelLayer (layer.py).
    topology: naming.Topology
    receive_timeout: float
    _engine: Any
    _serializer: Any
    _stats: Any
    _queues_for_receive: "ReceiveTargets"
    _named: Callable[..., Exception]

    def receive(
        self, channels: Iterable[str], block: bool = False
    ) -> Tuple[Optional[str], Optional[Message]]:
        queues = self._queues_for_receive(channels)
        if not queues:
            return None, None  # as asgiref's in-memory layer and asgi_redis do
        names = [queue for queue, _ in queues]
        # A consumer of an earlier blocking receive may have been pushed one
        # already: take it here, without a trip to the I/O thread.
        found = self._first_readable(
            lambda: self._engine.take_held(names) or self._fetch(queues, block)
        )
        return (None, None) if found is None else found

    def _take_held(self, queues) -> Optional[Tuple[str, Message]]:
        """A message already pushed to this process for one of ``queues``, or None.

        Never waits and never starts the layer's threads, so that daphne's
        reactor thread may call it (``receive_twisted``): a lock, a decode,
        and the ack handed to the I/O thread without waiting for it.
        """
        if not self._engine.started_here:
            return None
        names = [queue for queue, _ in queues]
        return self._first_readable(lambda: self._engine.take_held(names))

    def _first_readable(self, next_delivery):
        """(channel, message) of the first delivery ``next_delivery()`` gives
        that decodes, skipping at most ``_MAX_SKIPPED``; None once it gives None."""
        for _ in range(_MAX_SKIPPED):
            delivery = next_delivery()
            if delivery is None:
                return None
            decoded = self._decode(delivery)
            if decoded is not None:
                return decoded
        return None

    def _fetch(self, queues, block):
        """A Delivery from the broker: waited for by consumers, or taken with basic.get."""
        try:
            if not block:
                return self._engine.get(queues)
            return self._engine.wait(queues, self.receive_timeout)
        except BrokerOperationError as exc:
            raise self._named(exc) from None

    def receive_twisted(self, channels: Iterable[str]) -> Any:
        """Like ``receive(channels, block=True)`` but returns a Twisted Deferred."""
        return twisted_support.receive_twisted(self, channels)

    def _decode(self, delivery):
        """(channel, message) for a delivery, or None for one that is skipped."""
        channel = self.topology.channel_of_delivery(delivery.queue, delivery.headers)
        try:
            if not channel:
                raise UndecodableMessage("it names no process-local channel")
            return channel, self._serializer.loads(delivery.body)
        except UndecodableMessage as exc:
            # Dropped (it was acked when taken): say so, without its body.
            self._stats.count_undecodable()
            logger.warning(
                "skipped a message of channel %s (queue %s) that cannot be read; dropped: %s",
                channel or self.topology.channel_of_queue(delivery.queue),
                delivery.queue,
                exc,
            )
            return None


class ReceiveTargets(object):
    """``receive``'s channel names -> the distinct queues behind them, validated.

    A worker receives from the same 10-20 names thousands of times: each
    name is checked and mapped once, and each set of names once. The
    queues come back in random order, so that no channel starves another.
    """

    def __init__(self, topology):
        self._topology = topology
        self._targets = {}  # channel -> (queue, arguments)
        self._sets = {}  # frozenset of names -> their distinct (queue, arguments)

    def __call__(self, channels):
        """[(queue, arguments)] in random order; empty for an empty collection."""
        # Any collection of names: Channels 1.x's worker passes a set. A bare
        # string is refused rather than read as a list of one-letter names.
        if isinstance(channels, (str, bytes, dict)) or not hasattr(channels, "__iter__"):
            raise TypeError(
                "channels must be a list of channel names, not %s" % type(channels).__name__
            )
        channels = list(channels)
        try:
            key = frozenset(channels)
        except TypeError:  # an unhashable, hence invalid, name: the full check says which
            key = None
        queues = self._sets.get(key) if key is not None else None
        if queues is None:
            queues = self._unique_targets(channels)
            if key is not None:
                if len(self._sets) >= 1000:
                    self._sets.clear()
                self._sets[key] = queues
        queues = list(queues)
        if len(queues) > 1:
            random.shuffle(queues)
        return queues

    def _unique_targets(self, channels):
        queues, seen = [], set()
        for channel in channels:
            queue, arguments = self._target(channel)
            if queue not in seen:
                seen.add(queue)
                queues.append((queue, arguments))
        return tuple(queues)

    def _target(self, channel):
        try:
            return self._targets[channel]
        except (KeyError, TypeError):  # TypeError: an unhashable, hence invalid, name
            pass
        check_channel_name(channel, receive=True)
        target = (
            self._topology.channel_queue(channel),
            self._topology.channel_queue_arguments(channel),
        )
        if len(self._targets) >= 10000:
            self._targets.clear()
        self._targets[channel] = target
        return target
