"""Spreading an ordered channel's shards over the processes that receive it.

A shard (a single-active-consumer queue, ``naming``) has one consumer at a
time: a process consumes it only when the declare before its
``basic.consume`` counts none (``consumed_elsewhere``). The first process to
receive takes every shard; every ``BALANCE_EVERY`` seconds each process
counts the receivers (the consumers of the channel's own queue) and gives
back the shards it *serves* (was pushed from) beyond its share, for a process
below its share to take. A process at its share is *full*: it takes no more.

A shard goes only when no thread here handles one of its frames
(``HeldMessages.handling``: Channels' enforce_ordering counts a frame done
before its replies go out) and what it held goes back in its place
(``pool.requeues_in_place``), or else once a declare finds it empty
(``_give_back_if_empty``). A process ``BEHIND`` on a shard gives it back too
(``test_a_worker_that_falls_behind_gives_busy_shards_to_an_idle_one``).

Broker facts:

* RabbitMQ 3.10: a classic shard whose active consumer goes while another
  waits stops delivering, then crashes with its frames (rabbitmq-server#5460,
  ``test_no_consumer_ever_waits_behind_another_on_a_shard``);
* connections close one by one, so a waiting consumer is pushed frames while
  the process that went still handles the one before
  (``test_lost_connections_move_no_socket_while_a_worker_handles_its_frame``);
* what reaches a consumer after ``basic.cancel`` (pika rejects it) goes back
  like what it held (``pool.requeues_in_place``);
* a classic queue's ``consumer_count`` counts a waiting consumer, a quorum
  queue's does not (``check_alone``).

Owned by ``pool.ConsumerPool``; everything here runs on the I/O thread.
"""

import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set

from ...naming import ORDERED_SHARDS, SHARD_MARK
from .. import declares
from ..futures import Pending

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import Consumer, ConsumerPool

logger = logging.getLogger(__name__)

BALANCE_EVERY = 1.0  # seconds between two looks at the shards' spread
# Seconds, give or take half (to part two processes that asked together),
# before a shard another process consumed is asked about again.
ELSEWHERE_RECHECK = 1.0
# Frames waiting in a served shard at two looks in a row: this process is behind.
BEHIND = 20
# Seconds before this process takes again a shard it gave back for being behind.
REGAIN_AFTER = 10.0


class Balance(object):
    """The timer that gives back shards this process serves beyond its share."""

    def __init__(self, pool: "ConsumerPool", declares: "AdminChannels") -> None:
        self._pool = pool
        self._declares = declares
        self._timer: Any = None
        self._due: Dict[str, int] = {}  # channel queue -> shards to give back
        self._full: Set[str] = set()  # channel queues whose share this process serves
        self._elsewhere: Dict[str, float] = {}  # shard -> when to ask about it again
        self._deep: Set[str] = set()  # served shards that held BEHIND frames at the last look
        self._asking: Set[str] = set()  # shards whose ready frames a declare counts now

    def schedule(self) -> None:
        if self._timer is None and self._pool.ready:
            self._timer = self._pool.ioloop.call_later(BALANCE_EVERY, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None
        self._due.clear()
        self._full.clear()
        self._elsewhere.clear()
        self._deep.clear()
        self._asking.clear()

    def may_subscribe(self, shard: str) -> bool:
        """Whether to consume ``shard``: not when this process serves its
        share, nor while another process was lately found consuming it."""
        if self._elsewhere.get(shard, 0.0) > time.monotonic():
            return False
        return shard.partition(SHARD_MARK)[0] not in self._full

    def consumed_elsewhere(self, shard: str, consumers: int) -> bool:
        """Whether the declare before a ``basic.consume`` of ``shard`` counted
        ``consumers``: then it is another process's, asked about later."""
        if consumers <= 0:
            return False
        self._elsewhere[shard] = time.monotonic() + ELSEWHERE_RECHECK * (0.5 + random.random())
        return True

    def check_alone(self, consumer: "Consumer") -> None:
        """After ``basic.consume-ok``: if another process subscribed between
        this one's declare and consume, the one pushed nothing goes."""

        def counted(method: Any, error: Optional[BaseException]) -> None:
            consumers = getattr(method, "consumer_count", 0) if error is None else 0
            if (
                consumers > 1
                and self._pool.consumer(consumer.queue) is consumer
                and not consumer.served
                and not consumer.unacked
            ):
                logger.debug("%s has another consumer: given back", consumer.queue)
                self._pool.cancel(consumer)
                self.consumed_elsewhere(consumer.queue, consumers)

        self._count(consumer.queue, "consumers", counted)

    def _count(
        self, queue: str, what: str, on_done: Callable[[Any, Optional[BaseException]], None]
    ) -> None:
        """A passive declare: its answer counts consumers and ready frames."""
        self._declares.run(
            Pending("count the %s of %s" % (what, queue), on_done=on_done),
            [declares.queue_declare(queue, None, passive=True, not_found_ok=True)],
        )

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
        """Channel queue -> its served shards' consumers."""
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
                if receivers > 1 and served > 1:
                    self._measure_depths(channel_queue)

        self._count(channel_queue, "receivers", counted)

    def _fill(self, channel_queue: str) -> None:
        """This process serves its share: cancel its consumers of the others."""
        self._full.add(channel_queue)
        for consumer in self._pool.consumers():
            if consumer.queue.partition(SHARD_MARK)[0] != channel_queue:
                continue
            if consumer.active and not consumer.served and not consumer.unacked:
                self._pool.cancel(consumer)

    def _measure_depths(self, channel_queue: str) -> None:
        """Count the frames waiting in each served shard (``_give_back_behind``)."""
        served = [c for c in self._served(channel_queue) if c.requeues_in_place]
        if not served:
            return  # the others go only when empty (3.10's quorum queues)
        depths: Dict[str, int] = {}

        def counted_for(shard: str) -> Callable[[Any, Optional[BaseException]], None]:
            def counted(method: Any, error: Optional[BaseException]) -> None:
                depths[shard] = getattr(method, "message_count", 0) if error is None else 0
                if len(depths) == len(served):
                    self._give_back_behind(depths)

            return counted

        for consumer in served:
            self._count(consumer.queue, "frames", counted_for(consumer.queue))

    def _give_back_behind(self, depths: Dict[str, int]) -> None:
        """Give back the deepest shard that held ``BEHIND`` frames at the last look
        too, unless a thread here handles one of its frames."""
        deep = {shard for shard, depth in depths.items() if depth >= BEHIND}
        behind = deep & self._deep
        self._deep = (self._deep - set(depths)) | deep
        handled = self._pool.shards_handled()
        for shard in sorted(behind, key=lambda shard: -depths[shard]):
            consumer = self._pool.consumer(shard)
            if consumer is None or shard in handled or not self._pool.ready:
                continue
            logger.info(
                "%s given back: %d frames wait, more than this process keeps up with",
                shard,
                depths[shard],
            )
            self._pool.cancel(consumer)
            self._elsewhere[shard] = time.monotonic() + REGAIN_AFTER
            self._deep.discard(shard)
            return

    def _served(self, channel_queue: str) -> List["Consumer"]:
        return self._served_by_channel().get(channel_queue, [])

    def _give_back(self, channel_queue: str) -> None:
        """Cancel the consumers of due shards that may go now (the module docstring)."""
        extra = self._due.get(channel_queue, 0)
        if not extra or not self._pool.ready:
            return
        handled = self._pool.shards_handled()
        for consumer in self._served(channel_queue):
            if not extra:
                return
            if consumer.queue in handled:
                continue  # its replies may not be out yet
            if consumer.requeues_in_place:
                self._cancel_extra(channel_queue, consumer)
                extra -= 1
            elif not consumer.unacked and consumer.queue not in self._asking:
                self._give_back_if_empty(channel_queue, consumer)

    def _give_back_if_empty(self, channel_queue: str, consumer: "Consumer") -> None:
        """Give back a shard that requeues behind once a declare finds no frame
        ready and none came here meanwhile: a frame still on its way then
        has no later one to go behind."""
        asked = time.monotonic()
        self._asking.add(consumer.queue)

        def counted(method: Any, error: Optional[BaseException]) -> None:
            self._asking.discard(consumer.queue)
            ready = getattr(method, "message_count", 1) if error is None else 1
            if (
                ready == 0
                and self._due.get(channel_queue, 0) > 0
                and self._pool.ready
                and self._pool.consumer(consumer.queue) is consumer
                and consumer.active
                and not consumer.unacked
                and consumer.handed_at < asked
                and consumer.queue not in self._pool.shards_handled()
            ):
                self._cancel_extra(channel_queue, consumer)

        self._count(consumer.queue, "frames", counted)

    def _cancel_extra(self, channel_queue: str, consumer: "Consumer") -> None:
        logger.debug("%s given back", consumer.queue)
        self._pool.cancel(consumer)
        extra = self._due.get(channel_queue, 0) - 1
        if extra > 0:
            self._due[channel_queue] = extra
        else:
            self._due.pop(channel_queue, None)
