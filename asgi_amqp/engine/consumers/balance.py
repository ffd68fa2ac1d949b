"""Spreading an ordered channel's shards over the processes that receive it.

Each shard is a single-active-consumer queue (``naming``): every process
that receives the channel consumes every shard, and the broker lets one
consumer per shard take its messages, the first to subscribe. Left alone,
the first process would take them all. So every ``BALANCE_EVERY`` seconds
a process counts the processes receiving the channel (the consumers of
the channel's own queue, which every blocking receive consumes, answered
by a passive declare for classic and quorum queues alike) and, when it
serves more than its share of the shards, cancels its consumers of the
extra ones. The broker hands each to the next waiting process; the next
receive here subscribes again, at the back of the line. A shard counts as
served once the broker pushed this process a message from it.

The consumers go when every receiving thread of this process waits in a
blocking receive (``on_waiting``): then no frame taken from those shards is
still being handled here while the next process takes the socket's next
one. A give-back still due after ``GIVE_BACK_WITHIN`` goes anyway.

Owned by ``pool.ConsumerPool``; everything here runs on the I/O thread.
"""

import math
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ...naming import ORDERED_SHARDS, SHARD_MARK
from .. import declares
from ..futures import Pending

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import Consumer, ConsumerPool

BALANCE_EVERY = 1.0  # seconds between two looks at the shards' spread
GIVE_BACK_WITHIN = 3.0  # seconds a give-back waits for every thread to wait


class Balance(object):
    """The timer that gives back shards this process serves beyond its share."""

    def __init__(self, pool: "ConsumerPool", declares: "AdminChannels") -> None:
        self._pool = pool
        self._declares = declares
        self._timer: Any = None
        # channel queue -> (shards to give back, monotonic time decided)
        self._due: Dict[str, Tuple[int, float]] = {}

    def schedule(self) -> None:
        if self._timer is None and self._pool.ready:
            self._timer = self._pool.ioloop.call_later(BALANCE_EVERY, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None
        self._due.clear()

    def on_waiting(self) -> None:
        """Every receiving thread of this process waits: give back what is due."""
        for channel_queue in list(self._due):
            self._give_back(channel_queue)

    def _look(self) -> None:
        self._timer = None
        if not self._pool.ready:
            return
        now = time.monotonic()
        for channel_queue, (_, since) in list(self._due.items()):
            if now - since > GIVE_BACK_WITHIN:
                self._give_back(channel_queue)
        for channel_queue, served in self._served_by_channel().items():
            # Only a process that consumes the channel's queue is among those counted.
            if len(served) > 1 and self._pool.consumer(channel_queue) is not None:
                self._count_then_give_back(channel_queue)
        self.schedule()

    def _served_by_channel(self) -> Dict[str, List["Consumer"]]:
        """Channel queue -> the consumers of its shards that the broker pushes to."""
        served: Dict[str, List["Consumer"]] = {}
        for consumer in self._pool.consumers():
            channel_queue, mark, _ = consumer.queue.partition(SHARD_MARK)
            if mark:
                shards = served.setdefault(channel_queue, [])
                if consumer.active and consumer.served:
                    shards.append(consumer)
        return served

    def _count_then_give_back(self, channel_queue: str) -> None:
        def counted(method: Any, error: Optional[BaseException]) -> None:
            receivers = getattr(method, "consumer_count", 0) if error is None else 0
            extra = len(self._served(channel_queue)) - math.ceil(ORDERED_SHARDS / max(1, receivers))
            if extra > 0 and channel_queue not in self._due:
                self._due[channel_queue] = (extra, time.monotonic())

        self._declares.run(
            Pending("count the receivers of %s" % channel_queue, on_done=counted),
            [declares.queue_declare(channel_queue, None, passive=True, not_found_ok=True)],
        )

    def _served(self, channel_queue: str) -> List["Consumer"]:
        return self._served_by_channel().get(channel_queue, [])

    def _give_back(self, channel_queue: str) -> None:
        """Cancel the consumers of the shards due to go."""
        extra, _ = self._due.pop(channel_queue)
        if not self._pool.ready:
            return
        served = self._served(channel_queue)
        # Those holding nothing first: nothing goes back to the queue for them.
        served.sort(key=lambda consumer: consumer.unacked)
        for consumer in served[:extra]:
            self._pool.cancel(consumer)
