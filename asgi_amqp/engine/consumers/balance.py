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
served once the broker pushed this process a message from it. A process
that serves its share is *full*: it cancels its consumers of the shards
it does not serve and subscribes to no more, so that the shards given back
go to the processes below their share.

A shard goes only when giving it back cannot put a socket's frames out
of order: it holds nothing, no thread here handles a frame of it (until
the thread's next blocking receive, ``HeldMessages.handling``: Channels'
enforce_ordering counts a frame done before its replies go out), and its
last frame was handed out ``QUIET`` seconds ago, so that none is on its
way to this process (pika rejects what reaches a cancelled consumer, and a
quorum queue requeues a rejected message behind the later ones: measured
on 3.10.8). A shard whose sockets keep sending stays where it is; the
shards of quiet sockets move, and every lost connection deals them anew.

Owned by ``pool.ConsumerPool``; everything here runs on the I/O thread.
"""

import logging
import math
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

from ...naming import ORDERED_SHARDS, SHARD_MARK
from .. import declares
from ..futures import Pending

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import Consumer, ConsumerPool

logger = logging.getLogger(__name__)

BALANCE_EVERY = 1.0  # seconds between two looks at the shards' spread
QUIET = 0.1  # seconds without a hand-out after which a shard may move


class Balance(object):
    """The timer that gives back shards this process serves beyond its share."""

    def __init__(self, pool: "ConsumerPool", declares: "AdminChannels") -> None:
        self._pool = pool
        self._declares = declares
        self._timer: Any = None
        self._due: Dict[str, int] = {}  # channel queue -> shards to give back
        self._full: Set[str] = set()  # channel queues whose share this process serves

    def schedule(self) -> None:
        if self._timer is None and self._pool.ready:
            self._timer = self._pool.ioloop.call_later(BALANCE_EVERY, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None
        self._due.clear()
        self._full.clear()

    def may_subscribe(self, shard: str) -> bool:
        """Whether to consume ``shard``: not when this process serves its share."""
        return shard.partition(SHARD_MARK)[0] not in self._full

    def _look(self) -> None:
        self._timer = None
        if not self._pool.ready:
            return
        for channel_queue in list(self._due):
            self._give_back(channel_queue)
        served_by_channel = self._served_by_channel()
        for channel_queue in set(served_by_channel) | self._full:
            served = served_by_channel.get(channel_queue, [])
            # Only a process that consumes the channel's queue is among those counted.
            if self._pool.consumer(channel_queue) is None:
                self._full.discard(channel_queue)
            elif len(served) > 1 or channel_queue in self._full:
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
            served = len(self._served(channel_queue))
            share = math.ceil(ORDERED_SHARDS / max(1, receivers))
            extra = served - share
            if served >= share and receivers > 1:
                self._fill(channel_queue)
            else:
                self._full.discard(channel_queue)
            logger.debug(
                "%s: %d receivers, %d shards served here", channel_queue, receivers, served
            )
            if extra > 0:
                self._due[channel_queue] = extra
                self._give_back(channel_queue)
            else:
                self._due.pop(channel_queue, None)

        self._declares.run(
            Pending("count the receivers of %s" % channel_queue, on_done=counted),
            [declares.queue_declare(channel_queue, None, passive=True, not_found_ok=True)],
        )

    def _fill(self, channel_queue: str) -> None:
        """This process serves its share: it stops waiting for the other shards."""
        self._full.add(channel_queue)
        for consumer in self._pool.consumers():
            if consumer.queue.partition(SHARD_MARK)[0] != channel_queue:
                continue
            if consumer.active and not consumer.served and not consumer.unacked:
                self._pool.cancel(consumer)

    def _served(self, channel_queue: str) -> List["Consumer"]:
        return self._served_by_channel().get(channel_queue, [])

    def _give_back(self, channel_queue: str) -> None:
        """Cancel the consumers of due shards that may go now (the module docstring)."""
        extra = self._due.get(channel_queue, 0)
        if not extra or not self._pool.ready:
            return
        quiet_since = time.monotonic() - QUIET
        handled = self._pool.shards_handled()
        for consumer in self._served(channel_queue):
            if (
                extra
                and not consumer.unacked
                and consumer.handed_at < quiet_since
                and consumer.queue not in handled
            ):
                logger.debug("%s given back", consumer.queue)
                self._pool.cancel(consumer)
                extra -= 1
        if extra:
            self._due[channel_queue] = extra
        else:
            del self._due[channel_queue]
