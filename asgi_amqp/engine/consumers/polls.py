"""Non-blocking receives on the consumers' channel: the polling half of ``ConsumerPool``.

Non-blocking receives use the same consumers (see ``Polls.keep``). A queue that
only this process reads (a process-local ``foo!`` queue, such as daphne's
reply channels) and that
``receive(block=False)`` polls at least ``POLLS_TO_CONSUME`` times within
``linger`` gets a consumer with the full ``prefetch`` window, so the next
polls take what it was pushed in the caller's own thread, and a poll over
queues that are all consumed costs one round trip on the consumers'
channel (``let_pushes_land``) instead of one ``basic.get`` per queue. What such a
consumer holds is kept for the poller while it polls, and the consumer is
cancelled once its queue has not been polled for ``linger``. Any other
channel is polled with ``basic.get`` only: several processes may read it
(Channels 1.x parks messages in ``__wait__...?...`` channels that every
worker reads), and a consumer there would take messages another reader is
asking for. A consumed queue
is never asked with ``basic.get``: a get racing the pushes to a consumer
of the same queue can take a message ahead of one already on its way to
us, and the channel's order would be lost. At most ``max_consumers``
consumers are kept: past that, the one wanted longest ago (and not waited
on) is cancelled.

``Polls`` is owned by ``consumers.pool.ConsumerPool``; it is kept apart
so that what a poll costs and why a poll never overtakes a push can be
read on its own. It owns the poll counts and the callbacks waiting for a
``basic.qos`` round trip on the consumers' channel, and reads and starts
the pool's consumers through the pool's public methods. The getter
(``getter/waves.py``) calls these methods; everything here runs on the I/O
thread.
"""

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...naming import is_process_local_queue, is_shard_queue
from .. import declares
from ..deliveries import Delivery, Held, HeldMessages
from ..futures import Pending
from ..work import Queues

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import ConsumerPool

# Polls of one queue within ``linger`` after which it gets a consumer.
POLLS_TO_CONSUME = 3


class Polls(object):
    """What the getter asks of the consumers: keep, count, let pushes land, adopt."""

    def __init__(
        self,
        pool: "ConsumerPool",
        held: HeldMessages,
        declares: "AdminChannels",
        linger: float,
        prefetch: int,
    ) -> None:
        self._pool = pool
        self._held = held
        self._declares = declares
        self._linger = linger
        self._prefetch = prefetch
        self._counts: Dict[str, Tuple[int, float]] = {}  # queue -> (polls, since when)
        # Callbacks waiting for a basic.qos round trip on the consumers' channel.
        self._round_trips: List[Callable[[], None]] = []

    def keep(self, queues: Queues) -> None:
        """Consume each of ``queues`` that a non-blocking receive polls.

        Only queues this connection knows to exist get one, started at once
        (a consume on a missing queue would close the channel under every
        other consumer); the getter asks the others with ``basic.get``,
        which declares them. The getter calls this between two requests,
        never while a ``basic.get`` is out: a consumer started under a get
        of the same queue could be pushed the message ahead of the one the
        get returns.
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
                # Never asked with basic.get (``consumes``): consumed from the first poll.
                pool.start_shard(queue, arguments)
            elif (
                is_process_local_queue(queue)
                and self._polled_often(queue, now)
                and pool.may_start(queue, now)
            ):
                pool.start_polled(queue, arguments, self._prefetch)

    def _polled_often(self, queue: str, now: float) -> bool:
        """Count a poll of ``queue``; True once it has ``POLLS_TO_CONSUME`` within ``linger``."""
        count, since = self._counts.get(queue, (0, now))
        if now - since > self._linger:
            count, since = 0, now
        count += 1
        if count >= POLLS_TO_CONSUME:
            self._counts.pop(queue, None)
            return True
        if len(self._counts) > 4096:  # names come and go: forget the stale ones
            self._counts = {q: v for q, v in self._counts.items() if now - v[1] <= self._linger}
        self._counts[queue] = (count, since)
        return False

    def consumes(self, queue: str) -> bool:
        """Whether a consumer of ours is (being) started on ``queue``: then no basic.get.

        Never a shard of an ordered channel: a ``basic.get`` there would take
        a message from under the process that holds the shard (on a quorum
        queue the broker refuses it, closing the channel)."""
        if is_shard_queue(queue):
            return True
        consumer = self._pool.consumer(queue)
        return consumer is not None and consumer.active

    def count_ready(self, queues: Sequence[str], callback: Callable[[int], None]) -> None:
        """Ask the broker how many messages wait in ``queues``; ``callback(total)``.

        Passive declares, on the admin channel: they never go to a consumer.
        A queue gone since counts 0.
        """
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
        """Those of ``queues`` for which ``behind`` holds."""
        return [queue for queue in queues if self.behind([queue])]

    def behind(self, queues: Sequence[str]) -> bool:
        """Whether a push for one of ``queues`` may still be on its way after one round trip.

        A consumer just started, or whose window filled since a poll last
        found nothing, is pushed its next messages only once the broker has
        taken our acks (or the consume) into account, and that can come
        after the answer to a ``basic.qos``; a second round trip lets them
        arrive first.
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

    def adopt(self, queue: str, channel: Any, delivery_tag: int, delivery: Delivery) -> bool:
        """Hold a message a ``basic.get`` took from ``queue`` in front of its
        pushed ones, if this process consumes ``queue``; True if it did."""
        consumer = self._pool.consumer(queue)
        if consumer is None or not consumer.active or not self._pool.ready:
            return False
        self._held.put_back(queue, Held(channel, delivery_tag, delivery))
        return True

    def drop_adopted(self, channel: Any) -> None:
        """A getter's lane closed: the broker put back what we adopted from it."""
        self._held.withdraw_where(lambda held: held.channel is channel and held.owner is None)

    def barrier(self, done: Callable[[], None]) -> None:
        """Call ``done`` once the messages put back with a nack are in their queues again.

        A ``basic.get`` through a getter's lane could overtake the nack and
        take the message behind it (see ``getter.lanes.Lane.barrier``); the
        answer to a ``basic.qos`` on this channel comes after the broker
        forwarded our nacks.
        """
        self._pool.acks.requeued = False
        if not self._pool.ready:
            done()
            return
        self._round_trip(done)

    def let_pushes_land(self, queues: Sequence[str], callback: Callable[[], None]) -> None:
        """Call ``callback`` once deliveries already pushed for ``queues`` have arrived.

        A message sent before a non-blocking receive may have been pushed to
        one of our consumers instead of being in the queue for basic.get. A
        round trip on the consumers' channel (basic.qos, which changes
        nothing) lets such a push land in ``held`` first.
        """
        if not any(self.consumes(q) for q in queues) or not self._pool.ready:
            callback()
            return
        self._round_trip(callback)

    def _round_trip(self, callback: Callable[[], None]) -> None:
        self._round_trips.append(callback)
        # The same value: a basic.qos applies to the consumers started after it.
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
