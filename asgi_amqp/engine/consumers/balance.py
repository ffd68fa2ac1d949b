"""Spreading an ordered channel's shards over the processes that receive it.

Each shard is a single-active-consumer queue (``naming``) with one consumer
at a time: a process consumes a shard only when the declare before its
``basic.consume`` counts no consumer (``consumed_elsewhere``), and a shard
another process consumes is asked about again after ``ELSEWHERE_RECHECK``
seconds. No consumer waits behind another
(``test_no_consumer_ever_waits_behind_another_on_a_shard``), because a
waiting one is what breaks:

* on RabbitMQ 3.10, a classic queue whose active consumer's channel closes
  while another consumer waits and messages are ready stops delivering,
  and crashes at the next publish it takes, with every frame in it
  (rabbitmq-server#5460; 4.0 does not crash);
* as the broker closes connections one by one, a waiting consumer is
  pushed the frames of a connection that went a moment earlier, while that
  process still holds the frame before them.

So the first process to receive takes every shard, and the others get
theirs as it gives them back: every ``BALANCE_EVERY`` seconds a process
counts the processes receiving the channel (the consumers of the
channel's own queue, which every blocking receive consumes) and, when it
serves more than its share of the shards, cancels its consumers of the
extra ones; a process below its share consumes the shards nobody
consumes. A shard counts as served once the broker pushed this process a
message from it. A process that serves its share is *full*: it cancels
its consumers of the shards it does not serve and subscribes to no more.

A shard goes only when giving it back cannot put a socket's frames out
of order. No thread here handles a frame of it (until the thread's next
blocking receive, ``HeldMessages.handling``: Channels' enforce_ordering
counts a frame done before its replies go out). What it holds, and what
reaches it after ``basic.cancel`` (pika rejects that), goes back to the
queue: a classic queue, and a quorum queue from RabbitMQ 4.0, put it back
in its place (``pool.requeues_in_place``), so such a shard goes at once,
busy or not. A quorum queue on 3.10 puts it behind the later frames
(measured on 3.10.8), so there a shard goes only when it holds nothing and
a declare finds no frame ready in it, with none handed out meanwhile
(``_give_back_if_empty``): a frame still on its way finds no later one to
go behind.

A process that cannot keep up gives a busy shard back too: when
``BEHIND`` frames wait in one it serves at two looks in a row, and no
thread here handles one of its frames, it cancels the deepest, if its
queue requeues in place, and a process below its share takes it
(``test_a_worker_that_falls_behind_gives_busy_shards_to_an_idle_one``:
without it the idle worker took 0 of 960 frames).

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
# Seconds, give or take half, before a shard another process consumed is
# asked about again (the jitter parts two processes that asked together).
ELSEWHERE_RECHECK = 1.0
# Frames waiting in a served shard, at two looks in a row, that make this
# process give the shard back though it is not quiet: the process is behind.
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
        """After ``basic.consume-ok``: if another process subscribed to the
        same shard between this one's declare and its consume, the one that
        was pushed nothing goes (a classic queue counts a waiting consumer;
        a quorum queue does not, and cannot crash)."""

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
        """A passive declare of ``queue`` on an admin channel: its
        ``declare-ok`` counts the consumers and the ready frames."""
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
                if receivers > 1 and served > 1:
                    self._measure_depths(channel_queue)

        self._count(channel_queue, "receivers", counted)

    def _fill(self, channel_queue: str) -> None:
        """This process serves its share: it stops waiting for the other shards."""
        self._full.add(channel_queue)
        for consumer in self._pool.consumers():
            if consumer.queue.partition(SHARD_MARK)[0] != channel_queue:
                continue
            if consumer.active and not consumer.served and not consumer.unacked:
                self._pool.cancel(consumer)

    def _measure_depths(self, channel_queue: str) -> None:
        """Count the frames waiting in each shard served here; if one held
        ``BEHIND`` or more at this look and the last, this process cannot keep
        up with its shards while another process receives the channel: it
        gives the deepest back, though it is not quiet (``_give_back_behind``)."""
        served = [c for c in self._served(channel_queue) if c.requeues_in_place]
        if not served:
            return  # the others go only when empty (3.10's quorum queues): nothing to measure
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
        """Give back the deepest shard that was deep at the last look too. Its
        pushed frames go back to the queue, which puts them back in their
        place (only such shards are measured: a quorum queue on 3.10 would
        put them behind the whole backlog). Not a shard whose frame a thread
        here handles: its replies may not be out yet."""
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
        """Give back a shard whose queue requeues behind the later frames
        once a declare finds no frame ready in it, and none reached this
        process meanwhile: nothing is then on its way here, or if one is,
        no frame waits in the queue for it to go behind."""
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
