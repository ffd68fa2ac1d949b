"""Non-blocking receives on the consumers' channel: the polling half of ``ConsumerPool``.

Non-blocking receives use the same consumers (see ``PolledQueues.keep``). A queue that
only this process reads (a process-local ``foo!`` queue, such as daphne's
reply channels) and that
``receive(block=False)`` polls at least ``POLLS_TO_CONSUME`` times within
``linger`` gets a consumer with the full ``prefetch`` window, so the next
polls take what it was pushed in the caller's own thread, and a poll over
queues that are all consumed costs one round trip on the consumers'
channel (``settle``) instead of one ``basic.get`` per queue. What such a
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

``PolledQueues`` is a mixin of ``consumers.ConsumerPool`` and uses its
state (``_consumers``, ``_held``, ``_start``...); it is kept apart so that
what a poll costs and why a poll never overtakes a push can be read on its
own. The getter (``getter.py``) calls these methods; everything here runs
on the I/O thread.
"""

import time

from ..naming import is_process_local_queue
from . import declares
from .deliveries import Held
from .futures import Pending

# Polls of one queue within ``linger`` after which it gets a consumer.
POLLS_TO_CONSUME = 3


class PolledQueues(object):
    """What the getter asks of the consumers: keep, count, settle, adopt."""

    def keep(self, queues):
        """Consume each of ``queues`` that a non-blocking receive polls.

        Only queues this connection knows to exist get one, started at once
        (a consume on a missing queue would close the channel under every
        other consumer); the getter asks the others with ``basic.get``,
        which declares them. The getter calls this between two requests,
        never while a ``basic.get`` is out: a consumer started under a get
        of the same queue could be pushed the message ahead of the one the
        get returns.
        """
        if not self.ready:
            return
        now = time.monotonic()
        for queue, arguments in queues:
            consumer = self._consumers.get(queue)
            if consumer is not None:
                consumer.wanted_at = now
            elif (
                is_process_local_queue(queue)
                and self._polled_often(queue, now)
                and self._liveness.alive(queue)
                and self._unavailable.get(queue, 0) <= now
            ):
                consumer = self._add_consumer(queue, self._prefetch)
                consumer.polled = True
                self._start(consumer, arguments)

    def _polled_often(self, queue, now):
        """Count a poll of ``queue``; True once it has ``POLLS_TO_CONSUME`` within ``linger``."""
        count, since = self._polls.get(queue, (0, now))
        if now - since > self._linger:
            count, since = 0, now
        count += 1
        if count >= POLLS_TO_CONSUME:
            self._polls.pop(queue, None)
            return True
        if len(self._polls) > 4096:  # names come and go: forget the stale ones
            self._polls = {q: v for q, v in self._polls.items() if now - v[1] <= self._linger}
        self._polls[queue] = (count, since)
        return False

    def consumes(self, queue):
        """Whether a consumer of ours is (being) started on ``queue``: then no basic.get."""
        consumer = self._consumers.get(queue)
        return consumer is not None and consumer.active

    def count_ready(self, queues, callback):
        """Ask the broker how many messages wait in ``queues``; ``callback(total)``.

        Passive declares, on the admin channel: they never go to a consumer.
        A queue gone since counts 0.
        """
        counts = []

        def counted(method, error):
            counts.append(getattr(method, "message_count", 0) if error is None else 0)
            if len(counts) == len(queues):
                callback(sum(counts))

        for queue in queues:
            self._declares.run(
                Pending("count %s" % queue, on_done=counted),
                [declares.queue_declare(queue, None, passive=True, not_found_ok=True)],
            )

    def behind_queues(self, queues):
        """Those of ``queues`` for which ``behind`` holds."""
        return [queue for queue in queues if self.behind([queue])]

    def behind(self, queues):
        """Whether a push for one of ``queues`` may still be on its way after one ``settle``.

        A consumer just started, or whose window filled since a poll last
        found nothing, is pushed its next messages only once the broker has
        taken our acks (or the consume) into account, and that can come
        after the answer to a ``basic.qos``; a second round trip lets them
        arrive first.
        """
        for queue in queues:
            consumer = self._consumers.get(queue)
            if consumer is not None and consumer.active:
                if not consumer.confirmed or consumer.fills != consumer.checked:
                    return True
        return False

    def checked(self, queues):
        """A poll of ``queues`` settled and found nothing: they are not behind."""
        for queue in queues:
            consumer = self._consumers.get(queue)
            if consumer is not None and consumer.confirmed:
                consumer.checked = consumer.fills

    def adopt(self, queue, channel, delivery_tag, delivery):
        """Hold a message a ``basic.get`` took from ``queue`` in front of its
        pushed ones, if this process consumes ``queue``; True if it did."""
        consumer = self._consumers.get(queue)
        if consumer is None or not consumer.active or not self.ready:
            return False
        self._held.put_back(queue, Held(channel, delivery_tag, delivery))
        return True

    def drop_adopted(self, channel):
        """A getter's lane closed: the broker put back what we adopted from it."""
        self._held.withdraw_where(lambda held: held.channel is channel and held.owner is None)

    def barrier(self, done):
        """Call ``done`` once the messages put back with a nack are in their queues again.

        A ``basic.get`` through a getter's lane could overtake the nack and
        take the message behind it (see ``lanes.Lane.barrier``); the
        answer to a ``basic.qos`` on this channel comes after the broker
        forwarded our nacks.
        """
        self.requeued = False
        if not self.ready:
            done()
            return
        self._settling.append(done)
        self.channel.basic_qos(prefetch_count=self._qos, callback=self._on_settled)

    def settle(self, queues, callback):
        """Call ``callback`` once deliveries already pushed for ``queues`` have arrived.

        A message sent before a non-blocking receive may have been pushed to
        one of our consumers instead of being in the queue for basic.get. A
        round trip on the consumers' channel (basic.qos, which changes
        nothing) lets such a push land in ``held`` first.
        """
        active = any(q in self._consumers and self._consumers[q].active for q in queues)
        if not active or not self.ready:
            callback()
            return
        self._settling.append(callback)
        # The same value: a basic.qos applies to the consumers started after it.
        self.channel.basic_qos(prefetch_count=self._qos, callback=self._on_settled)

    def _on_settled(self, _frame):
        # Replies on one channel arrive in order: the oldest waiter is done.
        if self._settling:
            self._settling.pop(0)()
