"""What non-blocking receives ask of the consumers' channel.

A non-blocking receive starts no consumer but a shard's (a ``basic.get``
would take a frame from under the process that holds its shard). What a
blocking receive's consumer was pushed, the polls take: a poll over consumed
queues costs one round trip (``let_pushes_land``; without it
``test_a_message_sent_is_found_by_the_next_poll`` fails), not a ``basic.get``
each. Polls keep no messages from other processes: Channels' enforce_ordering
polls a wait channel once, from any worker
(``test_a_frame_parked_after_a_poll_in_one_worker_is_found_by_the_next_in_another``).

Broker facts:

* a ``basic.get`` racing the pushes to a consumer of the same queue can take
  a message ahead of one on its way, so a consumed queue is never asked with
  one (``test_a_polled_channel_keeps_its_order_and_loses_nothing``);
* a quorum shard refuses ``basic.get`` and closes the channel
  (``test_peek_says_a_quorum_queues_shard_cannot_be_read``).

Owned by ``pool.ConsumerPool``; called by the getter; I/O thread only. Owns
the callbacks waiting for a round trip.
"""

import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

from ...naming import is_shard_queue
from .. import declares
from ..futures import Pending
from ..work import Queues

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import ConsumerPool


class Polls(object):
    """What the getter asks of the consumers: keep, count, let pushes land."""

    def __init__(
        self,
        pool: "ConsumerPool",
        declares: "AdminChannels",
    ) -> None:
        self._pool = pool
        self._declares = declares
        # Callbacks waiting for a basic.qos answer, oldest first.
        self._round_trips: List[Callable[[], None]] = []

    def keep(self, queues: Queues) -> None:
        """Mark the consumers of ``queues`` wanted, and consume their shards.

        Called between two requests, never with a ``basic.get`` out: a
        consumer started under it could be pushed the next message before the
        get's answer arrives.
        """
        pool = self._pool
        if not pool.ready:
            return
        now = time.monotonic()
        for queue, arguments in queues:
            consumer = pool.consumer(queue)
            if consumer is not None:
                consumer.wanted_at = now
            elif is_shard_queue(queue):
                pool.start_shard(queue, arguments)

    def consumes(self, queue: str) -> bool:
        """Whether ``queue`` has a consumer of ours, so no ``basic.get``.

        Always for a shard: a get would take a frame from under the process
        that holds it."""
        if is_shard_queue(queue):
            return True
        consumer = self._pool.consumer(queue)
        return consumer is not None and consumer.active

    def count_ready(self, queues: Sequence[str], callback: Callable[[int], None]) -> None:
        """``callback(total)`` of the messages ready in ``queues``; a gone one counts 0.

        Passive declares on an admin channel, never the consumers'."""
        counts: List[int] = []

        def counted(method: Any, error: Optional[BaseException]) -> None:
            counts.append(getattr(method, "message_count", 0) if error is None else 0)
            if len(counts) == len(queues):
                callback(sum(counts))

        for queue in queues:
            self._declares.run(
                Pending("count %s" % queue, on_done=counted),
                [declares.queue_declare(queue, None, passive=True, not_found_ok=True)],
            )

    def behind_queues(self, queues: Sequence[str]) -> List[str]:
        return [queue for queue in queues if self.behind([queue])]

    def behind(self, queues: Sequence[str]) -> bool:
        """Whether a push for one of ``queues`` may still be on its way after one round trip.

        Broker: a consumer just started, or whose window filled, is pushed
        again once the broker has taken the consume or our acks in, which can
        be after a ``basic.qos`` answer.
        """
        for queue in queues:
            consumer = self._pool.consumer(queue)
            if consumer is not None and consumer.active:
                if not consumer.confirmed or consumer.fills != consumer.checked:
                    return True
            elif consumer is not None and is_shard_queue(queue):
                return True  # being declared: its first pushes are still to come
        return False

    def checked(self, queues: Sequence[str]) -> None:
        """A poll of ``queues`` let pushes land and found nothing: they are not behind."""
        for queue in queues:
            consumer = self._pool.consumer(queue)
            if consumer is not None and consumer.confirmed:
                consumer.checked = consumer.fills

    def let_pushes_land(self, queues: Sequence[str], callback: Callable[[], None]) -> None:
        """Call ``callback`` once deliveries already pushed for ``queues`` have arrived,
        so a message sent before the poll is not missed (a ``basic.qos`` round trip)."""
        if not any(self.consumes(q) for q in queues) or not self._pool.ready:
            callback()
            return
        self._round_trip(callback)

    def _round_trip(self, callback: Callable[[], None]) -> None:
        self._round_trips.append(callback)
        self._pool.same_qos(self._on_round_trip)

    def _on_round_trip(self, _frame: Any) -> None:
        # Replies on one channel arrive in order: the oldest waiter is done.
        if self._round_trips:
            self._round_trips.pop(0)()

    def channel_gone(self) -> None:
        """Nothing more will arrive on the channel: every round trip is over."""
        round_trips, self._round_trips = self._round_trips, []
        for callback in round_trips:
            callback()

    def forget(self) -> None:
        """The connection is gone: the round trips' callers are asked again."""
        self._round_trips = []
