"""Blocking receives, served by consumers kept between calls.

A worker receives over the same channels in a loop; a consume and a cancel
per call would cost two round trips per channel, so consumers stay:

* a consumer's prefetch window is 2T - 1 for the T threads of this process
  that made a blocking receive in the last ``THREADS_WINDOW`` seconds, at
  most ``consumer_prefetch``, so each thread finds its next message here
  while the acks of the last ones bring more; a consumer started narrower is
  started again. A process-local queue gets the whole window (``_window_for``);
* a delivery goes to a waiting caller, acked once the caller has it; with
  nobody waiting it is *held*, unacked, for the next call; ``Sweep`` gives
  back what is held too long.

Broker fact: the unacked deliveries of a closed channel go back to their
queue, so a process that dies loses nothing it held
(``test_a_process_that_dies_holding_pushed_messages_loses_none``).

``ConsumerPool`` owns ``Acks``, ``Polls``, ``Sweep``, ``Balance`` and
``OwnerWait`` (the package docstring says what each does); all run on the
I/O thread. Only ``HeldMessages`` (callers take from it) and ``TakenAcks``
are shared with callers' threads, each under its own lock.
"""

import collections
import logging
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import pika
import pika.channel
import pika.spec
from pika.adapters.select_connection import IOLoop

from ...errors import ACCESS_REFUSED, PRECONDITION_FAILED, BrokerOperationError
from ...naming import is_process_local_queue, is_shard_queue
from .. import declares
from ..declares import AdminChannels
from ..deliveries import Delivery, HandedOff, Held, HeldMessages, Liveness
from ..futures import Pending
from ..reopening_channel import ReopeningChannel
from ..work import Queues, Work
from .acks import Acks, TakenAcks
from .balance import Balance
from .owners import OwnerWait
from .polls import Polls
from .sweep import Sweep

if TYPE_CHECKING:
    from ..session import Session

logger = logging.getLogger(__name__)


class ConsumerSettings(NamedTuple):
    """``linger`` and ``idle_timeout``: see ``Sweep``; ``prefetch``: the widest window."""

    linger: float
    idle_timeout: float
    prefetch: int
    max_consumers: int = 1000


THREADS_WINDOW = 10.0  # seconds a thread counts in the window after its last blocking receive
UNAVAILABLE_BACKOFF = 1.0  # seconds before a queue that failed to declare is tried again


def requeues_in_place(quorum: bool, server_properties: Optional[Dict[str, Any]]) -> bool:
    """Whether a nacked message goes back in its place, not behind the later ones.

    A classic queue: yes; a quorum queue: from RabbitMQ 4.0 only, and an
    unknown version counts as behind
    (``test_only_a_quorum_queue_before_rabbitmq_4_requeues_behind_the_later_messages``).
    """
    if not quorum:
        return True
    version = (server_properties or {}).get("version", b"")
    if isinstance(version, bytes):
        version = version.decode("ascii", "replace")
    major = str(version).partition(".")[0]
    return major.isdigit() and int(major) >= 4


class Consumer(object):
    """One consumer of one queue on the consumers' channel (I/O thread only)."""

    __slots__ = (
        "polled",
        "queue",
        "tag",
        "active",
        "wanted_at",
        "window",
        "prefetch",
        "confirmed",
        "unacked",
        "fills",
        "checked",
        "served",
        "handed_at",
        "quorum",
        "requeues_in_place",
    )

    def __init__(self, queue: str, window: int) -> None:
        self.queue = queue
        self.tag: Optional[str] = None
        self.active = False
        self.wanted_at = time.monotonic()
        self.window = window  # the window it is to be started with
        self.prefetch = 0  # its window, once started
        self.confirmed = False  # the broker answered basic.consume
        self.unacked = 0  # pushed to it, held, not yet settled
        self.fills = 0  # how often its window filled (the broker then holds back)
        self.checked = -1  # ``fills`` when a poll last found nothing (``Polls.checked``)
        self.polled = False  # started for non-blocking receives: see ``Sweep``
        self.served = False  # pushed a message: the active consumer of a shard (``Balance``)
        self.handed_at = 0.0  # monotonic time a message of it last went to a caller
        self.quorum = False  # a quorum queue (set when it starts)
        self.requeues_in_place = True  # ``requeues_in_place`` (set when it starts)


class BlockingReceive(Work):
    """A blocking receive: a Delivery from one of ``queues``, or None at ``deadline``.

    The work of ``Engine.wait``: it adds a waiter (``ConsumerPool.add_waiter``).
    ``threads``: how many threads make blocking receives (the prefetch window).
    """

    __slots__ = ("queues", "deadline", "threads")

    def __init__(self, pending: Pending, queues: Queues, deadline: float, threads: int) -> None:
        super().__init__(pending)
        self.queues = queues
        self.deadline = deadline
        self.threads = threads

    def __call__(self, session: "Session") -> None:
        session.consumers.add_waiter(self.pending, self.queues, self.deadline, self.threads)


class _Waiter(object):
    __slots__ = ("pending", "queues", "timer")

    def __init__(self, pending: Pending, queues: Set[str]) -> None:
        self.pending = pending
        self.queues = queues
        self.timer: Any = None


# An add_waiter call made before the channel opened.
_Backlogged = Tuple[Pending, Queues, float, int]


class ConsumerPool(object):
    """The consumers' channel and its consumers (I/O thread only)."""

    def __init__(
        self,
        connection: pika.SelectConnection,
        declare_executor: AdminChannels,
        liveness: Liveness,
        handed_off: HandedOff,
        held: HeldMessages,
        settings: ConsumerSettings,
        taken: Optional[TakenAcks] = None,
        resumed: bool = False,
        reclaimed: FrozenSet[str] = frozenset(),
    ) -> None:
        self._connection = connection
        self._declares = declare_executor
        self._held = held  # shared with callers' threads, who take from it
        self._unavailable: Dict[str, float] = {}  # queue -> time before which it is not retried
        self._liveness = liveness
        self._handed_off = handed_off
        self._prefetch = settings.prefetch
        self._max_consumers = settings.max_consumers
        self._window = 1  # the prefetch window new consumers get
        self._qos = 1  # the channel's basic.qos, which new consumers take
        self._consumers: Dict[str, Consumer] = {}
        self._by_tag: Dict[str, Consumer] = {}
        self._waiters: List[_Waiter] = []
        self._backlog: Deque[_Backlogged] = collections.deque()
        self.acks = Acks(self, taken if taken is not None else TakenAcks())
        self.polls = Polls(self, declare_executor)
        self._sweep = Sweep(self, held, settings.linger, settings.idle_timeout)
        self._balance = Balance(self, declare_executor)
        self._owners = OwnerWait(self, declare_executor, resumed, reclaimed)
        self._channel = ReopeningChannel(
            connection, "consume", self._setup, self._on_ready, self._on_lost
        )
        self._channel.open()

    def _setup(self, channel: pika.channel.Channel, done: Callable[..., None]) -> None:
        channel.add_on_cancel_callback(self._on_broker_cancel)
        self._qos = 1
        channel.basic_qos(prefetch_count=self._qos, callback=done)

    def _on_ready(self) -> None:
        while self._backlog:
            self.add_waiter(*self._backlog.popleft())
        self._sweep.schedule()
        self._balance.schedule()

    # -- what the owned objects read and do ------------------------------------

    @property
    def channel(self) -> Optional[pika.channel.Channel]:
        return self._channel.current

    @property
    def ready(self) -> bool:
        return self._channel.ready

    @property
    def ioloop(self) -> IOLoop:
        """The I/O loop, which outlives the connection (its timers must be removed)."""
        return self._connection.ioloop

    def consumer(self, queue: str) -> Optional[Consumer]:
        """Started or being started."""
        return self._consumers.get(queue)

    def consumers(self) -> List[Consumer]:
        """Every consumer, as a list (the caller may cancel some)."""
        return list(self._consumers.values())

    def shards_handled(self) -> Set[str]:
        return self._held.shards_handled()

    def served_shards(self) -> FrozenSet[str]:
        """The shards whose frames this channel gave to this process's threads
        (``owners``); a frame pushed and not given out waits for no reply."""
        handed = frozenset(
            consumer.queue
            for consumer in self._consumers.values()
            if consumer.active and consumer.handed_at and is_shard_queue(consumer.queue)
        )
        return handed | self._held.shards_handled()

    def keep_asked(self, asked: List[Queues]) -> None:
        """Keep the consumers that blocking receives served from held messages
        asked for, as a waiter would: wanted now, started if missing."""
        for queues in asked:
            for queue, arguments in queues:
                self._ensure_consumer(queue, arguments, self._window_for(queue))

    def waited_for(self) -> Set[str]:
        wanted: Set[str] = set()
        for waiter in self._waiters:
            wanted |= waiter.queues
        return wanted

    def start_shard(self, queue: str, arguments: Any) -> None:
        """Declare and consume a shard a non-blocking receive polls (``Polls.keep``)."""
        self._ensure_consumer(queue, arguments, 1, polled=True)

    def same_qos(self, callback: Callable[[Any], None]) -> None:
        """A ``basic.qos`` that changes nothing: ``callback`` gets its answer."""
        channel = self.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: callers check ``ready`` first")
        channel.basic_qos(prefetch_count=self._qos, callback=callback)

    # -- serving callers ----------------------------------------------------

    def add_waiter(
        self, pending: Pending, queues: Queues, deadline: float, threads: int = 1
    ) -> None:
        """Resolve ``pending`` with a Delivery from any of ``queues`` or None at ``deadline``.

        Returns at once. ``deadline`` is monotonic, so a wait carried over to
        the next connection keeps its caller's limit.
        """
        if not pending.wanted:
            return
        if not self.ready:
            self._backlog.append((pending, queues, deadline, threads))
            return
        # One thread finds its next message pushed during its send's confirm;
        # each further thread gets two, or it often finds none and waits here.
        self._window = min(self._prefetch, max(1, 2 * threads - 1))
        if self.await_push(pending, [queue for queue, _ in queues], deadline):
            for queue, arguments in queues:
                self._ensure_consumer(queue, arguments, self._window_for(queue))

    def _window_for(self, queue: str) -> int:
        """The prefetch window a new consumer of ``queue`` gets.

        A normal channel's follows the receiving threads, so a busy process
        keeps back no more than it will use soon. A process-local queue has no
        other reader, so it gets the whole ``consumer_prefetch``: with one,
        daphne's one reading thread waited a round trip per message
        (``test_only_a_process_local_channel_is_pushed_a_whole_window``).
        A shard's frames run one at a time (``HeldMessages``), so it gets 1:
        more would wait here, and a lost connection can put them back out of
        place (``requeues_in_place``).
        """
        if is_shard_queue(queue):
            return 1
        return self._prefetch if is_process_local_queue(queue) else self._window

    def await_push(self, pending: Pending, names: Sequence[str], deadline: float) -> bool:
        """Hand ``pending`` what is held or next pushed for ``names``, or None at ``deadline``.

        True if it now waits (nothing was held)."""
        if self.hand_over_held(pending, names):
            return False
        waiter = _Waiter(pending, set(names))
        timeout = max(0.0, deadline - time.monotonic())
        waiter.timer = self.ioloop.call_later(timeout, lambda: self._expire(waiter))
        self._waiters.append(waiter)
        return True

    def hand_over_held(self, pending: Pending, queues: Sequence[str]) -> bool:
        """Hand a held message from one of ``queues`` to ``pending``; True if one was taken."""
        if self.channel is None or not self.ready:
            return False  # the channel is gone; the broker requeues what it held
        taken = self._held.take(queues, pending.thread)
        if taken is None:
            return False
        queue, held = taken
        if not pending.resolve(held.delivery):
            # The caller left: keep it for someone else.
            self._held.put_back(queue, held, pending.thread)
            return True
        self._handed_off.add(held.delivery)
        self.acks.acknowledge(queue, held)
        return True

    def _fail_waiters(self, queue: str, error: BaseException) -> None:
        for waiter in [w for w in self._waiters if queue in w.queues]:
            self._waiters.remove(waiter)
            self.ioloop.remove_timeout(waiter.timer)
            waiter.pending.fail(error)

    def _expire(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        waiter.pending.resolve(None)

    def _hand_frames(self, shard: str) -> None:
        """Hand ``shard``'s oldest held frame to a waiter whose thread may run it."""
        for waiter in [w for w in self._waiters if shard in w.queues]:
            if self.hand_over_held(waiter.pending, (shard,)):  # taken, or its caller left
                self._waiters.remove(waiter)
                self.ioloop.remove_timeout(waiter.timer)

    # -- consumers ----------------------------------------------------------

    def _ensure_consumer(
        self, queue: str, arguments: Any, window: int, polled: bool = False
    ) -> None:
        consumer = self._consumers.get(queue)
        if consumer is not None:
            consumer.wanted_at = time.monotonic()
            if not polled:
                consumer.polled = False  # a blocking receive wants it: kept for idle_timeout
            if not (consumer.active and consumer.prefetch < window) or is_shard_queue(queue):
                return  # a shard's held frames stay: a nack could put them out of order
            self.cancel(consumer)  # more threads now: start it again with a wider window
        if self._unavailable.get(queue, 0) > time.monotonic():
            return  # its node is down: keep waiting on the other queues
        if is_shard_queue(queue) and not self._balance.may_subscribe(queue):
            return  # this process serves its share of the channel's shards
        if is_shard_queue(queue) and self._owners.holds(queue, arguments, polled):
            return  # its owner may take it back first (``owners``)
        consumer = self._add_consumer(queue, window)
        consumer.polled = polled
        # Declared first, on an admin channel: a consume of a missing queue
        # gets a 404 that closes this channel under every consumer, and a
        # queue whose node is down must not hold up the others
        # (test_blocking_receive_over_a_down_queue_and_a_live_one).
        self._declares.run(
            Pending(
                "declare %s" % queue,
                on_done=lambda result, error: self._declared(consumer, arguments, result, error),
            ),
            [declares.queue_declare(queue, arguments)],
        )

    def consume_shard(self, shard: str, arguments: Any, polled: bool) -> None:
        """Consume a shard that waited for its owner (``owners``)."""
        self._ensure_consumer(shard, arguments, 1, polled)

    def _add_consumer(self, queue: str, window: int) -> Consumer:
        """A new consumer, not yet started, within ``max_consumers`` (``_evict_one``)."""
        if len(self._consumers) >= self._max_consumers:
            self._evict_one()
        consumer = self._consumers[queue] = Consumer(queue, window)
        return consumer

    def _declared(
        self, consumer: Consumer, arguments: Any, method: Any, error: Optional[BaseException]
    ) -> None:
        if self._consumers.get(consumer.queue) is not consumer:
            return
        if error is not None and getattr(error, "reply_code", None) in (
            PRECONDITION_FAILED,
            ACCESS_REFUSED,
        ):
            # Other settings, or no permission: waiting cannot help, so fail now.
            del self._consumers[consumer.queue]
            self._fail_waiters(consumer.queue, error)
            return
        if error is not None:
            logger.warning("cannot consume from %s: %s", consumer.queue, error)
            del self._consumers[consumer.queue]
            self._unavailable[consumer.queue] = time.monotonic() + UNAVAILABLE_BACKOFF
            return
        if not self.ready or (
            is_shard_queue(consumer.queue)
            and self._balance.consumed_elsewhere(
                consumer.queue, getattr(method, "consumer_count", 0)
            )
        ):
            del self._consumers[consumer.queue]  # a shard has one consumer (``balance``)
            return
        self._start(consumer, arguments)

    def _start(self, consumer: Consumer, arguments: Any) -> None:
        channel = self.channel
        if channel is None:  # an invariant, checked under -O too
            raise RuntimeError("channel is None: callers check ``ready`` first")
        self._liveness.touch(consumer.queue, arguments)
        if self._qos != consumer.window:  # broker: applies to consumers started after it
            channel.basic_qos(prefetch_count=consumer.window)
            self._qos = consumer.window
        consumer.prefetch = consumer.window
        consumer.quorum = (arguments or {}).get("x-queue-type") == "quorum"
        consumer.requeues_in_place = requeues_in_place(
            consumer.quorum, channel.connection.server_properties
        )
        consumer.tag = channel.basic_consume(
            consumer.queue,
            self._on_message,
            auto_ack=False,
            callback=lambda _frame: self._confirmed(consumer),
        )
        consumer.active = True
        self._by_tag[consumer.tag] = consumer

    def _confirmed(self, consumer: Consumer) -> None:
        consumer.confirmed = True
        if is_shard_queue(consumer.queue) and not consumer.quorum:
            # Broker: a classic queue counts a waiting consumer, a quorum one not.
            self._balance.check_alone(consumer)

    def _evict_one(self) -> None:
        """Cancel the consumer wanted longest ago that no blocking receive waits on."""
        wanted = self.waited_for()
        idle = [c for c in self._consumers.values() if c.queue not in wanted]
        if idle:
            self.cancel(min(idle, key=lambda consumer: consumer.wanted_at))

    def cancel(self, consumer: Consumer) -> None:
        """Stop a consumer and give back what it holds."""
        self._consumers.pop(consumer.queue, None)
        if consumer.tag is not None:
            self._by_tag.pop(consumer.tag, None)
            if self.channel is not None:
                self.channel.basic_cancel(consumer.tag)
        self._requeue(consumer)

    def _requeue(self, consumer: Consumer) -> None:
        for held in self._held.withdraw(consumer.queue):
            self.acks.settle_held(held, ack=False)

    def _on_message(
        self,
        channel: pika.channel.Channel,
        method: Any,  # a Basic.Deliver, whose fields types-pika makes Optional
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        if self._channel.closing:
            return  # unacked: the broker requeues it when the channel closes
        consumer = self._by_tag.get(method.consumer_tag)
        if consumer is None:
            # Sent before our basic.cancel reached the broker.
            self.acks.nack_tag(method.delivery_tag)
            return
        consumer.served = True
        if self._handed_off.is_duplicate(consumer.queue, method, properties):
            self.acks.ack_tag(method.delivery_tag)
            return
        delivery = Delivery(
            consumer.queue,
            properties.headers or {},
            body,
            method.redelivered,
            properties.message_id,
        )
        if not is_shard_queue(consumer.queue):
            for waiter in [w for w in self._waiters if consumer.queue in w.queues]:
                self._waiters.remove(waiter)
                self.ioloop.remove_timeout(waiter.timer)
                if waiter.pending.resolve(delivery):
                    self._handed_off.add(delivery)
                    consumer.wanted_at = consumer.handed_at = time.monotonic()
                    self.acks.ack_tag(method.delivery_tag)
                    return
        consumer.unacked += 1
        if consumer.unacked >= consumer.prefetch:
            consumer.fills += 1  # the broker keeps what comes next until we ack
        self._held.add(consumer.queue, Held(channel, method.delivery_tag, delivery, consumer))
        if is_shard_queue(consumer.queue):
            self._hand_frames(consumer.queue)  # oldest first, to one thread at a time
        if consumer.unacked < 2:
            return  # what it holds counts among its unacked: one at most
        since, count = self._held.held_since(consumer.queue)
        if since is not None and count > 1:  # its allowed wait may just have shrunk
            self._sweep.due_by(since + self._sweep.allowed_wait(consumer.queue, count) + 0.002)

    def _on_broker_cancel(self, frame: Any) -> None:
        # Its queue was deleted (flush, expiry); waiters declare it again on their next call.
        consumer = self._by_tag.pop(frame.method.consumer_tag, None)
        if consumer is not None:
            self._consumers.pop(consumer.queue, None)
            self._held.withdraw(consumer.queue)  # gone with their queue: no ack
            self._liveness.forget(consumer.queue)

    def _on_lost(self, reply_code: Optional[int], reply_text: Optional[str]) -> None:
        # The broker requeues a closed channel's unacked deliveries: what was held is forgotten.
        if reply_code == ACCESS_REFUSED:
            self._fail_refused(reply_text)
        self._held.clear()
        self._consumers.clear()
        self._by_tag.clear()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self.ioloop.remove_timeout(waiter.timer)
            waiter.pending.resolve(None)
        self._sweep.stop()
        self._balance.stop()
        self._owners.stop()
        self.polls.channel_gone()  # nothing more will arrive on this channel

    def _fail_refused(self, reply_text: Optional[str]) -> None:
        """A refused basic.consume (no read permission) closed the channel: its
        waiters fail now, naming the queue, instead of waiting out their timeout
        (``test_a_user_who_may_not_read_gets_the_403_from_a_blocking_receive``)."""
        text = reply_text or ""
        for queue in [q for q in self._consumers if "'%s'" % q in text]:
            self._fail_waiters(
                queue, BrokerOperationError(ACCESS_REFUSED, text, "basic_consume '%s'" % queue)
            )

    def shutdown(self) -> None:
        """The session is going away: stop reopening the channel and listening on it."""
        self._channel.shutdown()

    def forget(self) -> None:
        """The connection is gone: remove our timers from the I/O loop and drop
        the waiters unresolved; the I/O thread carries their receives over."""
        ioloop = self.ioloop
        for waiter in self._waiters:
            ioloop.remove_timeout(waiter.timer)
        self._waiters = []
        self._sweep.stop()
        self._balance.stop()
        self._owners.stop()
        self._held.clear()
        self._consumers.clear()
        self._by_tag.clear()
        self.polls.forget()
        self._backlog.clear()

    def fail_all(self, error: BaseException) -> None:
        self._on_lost(None, None)
        for pending, *_ in self._backlog:
            pending.resolve(None)
        self._backlog.clear()
