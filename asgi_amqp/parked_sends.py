"""Sends of daphne's reactor thread that wait: they never wait on the reactor.

daphne's reactor thread never waits for the broker beyond one round trip:
every connection of daphne waits with it. A send there is *parked*, and
``send`` returns at once, when it cannot be published now:

* the broker is away (the send goes out once it is back);
* sends parked before it still wait (it goes out behind them, so that a
  socket's frames keep the order daphne made them in);
* its channel refused it as full (it waits for room).

Parked sends go out one at a time on the I/O thread, in the order they were
parked, each when its channel takes it: a refusal is tried again after a
short pause, a return (the queue expired while the broker was away)
declares the queue and publishes again. One in flight at a time keeps the
order: two in flight to a full queue could be refused and taken out of
order. A send parked longer than ``expiry`` is dropped as an expired
message would be, counted in ``expired`` and logged. Nothing is dropped for
a full channel: daphne had accepted the frame, and its client would never
be told.

The bound: ``MESSAGES`` and ``BYTES`` at most at a time. Beyond it the
send raises ``ChannelFull`` at once (``BrokerUnreachable`` while the broker
is away), and daphne answers 503 or closes the socket with 1013, "try
again later". A publish that was on its way when the connection went
is parked whatever the bound, as a copy its reader drops if the original
arrived: it cannot be taken back.

State: ``ParkedSends`` is shared by the reactor thread (which parks) and
the I/O thread (which publishes and pauses), under its one lock; a publish
of the head is in flight, or its pause scheduled, only while ``_moving``.
"""

import collections
import logging
import threading
import time
from typing import Any, Callable, Deque, NamedTuple, Optional

import pika

from .engine import ACKED, RETURNED, Engine, Step
from .errors import BrokerUnreachable, ChannelFull, LayerClosed

logger = logging.getLogger(__name__)

# At most this many sends parked at a time, of at most this many bytes in all.
MESSAGES = 10000
BYTES = 64 * 1024 * 1024
# The pause before a refused send is tried again: doubled up to the longest.
FIRST_PAUSE = 0.01
LONGEST_PAUSE = 0.25


class ParkedSend(NamedTuple):
    channel: str
    queue: str
    body: bytes
    properties: pika.BasicProperties
    marked: bool  # a copy of a publish that may have arrived
    parked_at: float  # time.monotonic()


class ParkedSends(object):
    """The parked sends of one layer, in order, and the one that is moving."""

    def __init__(
        self,
        engine: Engine,
        queue_declare: Callable[[str, str], Step],
        expiry: float,
        messages: int = MESSAGES,
        size: int = BYTES,
    ) -> None:
        self.engine = engine
        self.queue_declare = queue_declare  # the Sender's
        self.expiry = expiry
        # The bound: parked sends at a time, and their bodies' bytes in all.
        self.messages_limit = messages
        self.bytes_limit = size
        self._lock = threading.Lock()
        self._waiting: Deque[ParkedSend] = collections.deque()  # in order (under _lock)
        self._bytes = 0  # their bodies' size (under _lock)
        self._moving = False  # the head is being published or paused (under _lock)
        self._declared = False  # the head's queue was declared after a return (I/O thread)
        self._pause = FIRST_PAUSE  # before the head is tried again (I/O thread)
        self.delivered = 0  # parked sends confirmed, since the layer began
        self.expired = 0  # dropped after ``expiry``
        self.lost = 0  # not delivered for another reason (the layer closed)

    @property
    def messages(self) -> int:
        return len(self._waiting)

    def waiting(self) -> bool:
        """Whether sends are parked: a new send of the reactor thread goes behind them."""
        return bool(self._waiting)

    def park(
        self,
        channel: str,
        queue: str,
        body: bytes,
        properties: pika.BasicProperties,
        marked: bool = False,
    ) -> None:
        """Park a send, or raise ``ChannelFull`` at once when the bound is reached.

        ``marked``: it was on its way when the connection went, and is parked
        whatever the bound.
        """
        send = ParkedSend(channel, queue, body, properties, marked, time.monotonic())
        with self._lock:
            if not marked:
                self._check_room(channel, len(body))
            self._waiting.append(send)
            self._bytes += len(body)
            start, self._moving = not self._moving, True
        logger.debug("send to %s parked", channel)
        if start:
            self._next()

    def _check_room(self, channel: str, size: int) -> None:
        """Under ``_lock``: raise unless one more send fits the bound."""
        if len(self._waiting) >= self.messages_limit or self._bytes + size > self.bytes_limit:
            why = "the sends parked on daphne's reactor thread fill their limit"
            if self.engine.broker_away():
                raise BrokerUnreachable(
                    "send to %s: the broker is unreachable, and %s" % (channel, why)
                )
            raise ChannelFull("channel %s: %s" % (channel, why))

    # -- moving the head, on the I/O thread -----------------------------------------

    def _next(self) -> None:
        """Publish the head, or stop moving when nothing waits; drops expired sends."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._moving = False
                    return
                head = self._waiting[0]
                age = time.monotonic() - head.parked_at
                if age <= self.expiry:
                    break
                self._remove_head()
                self.expired += 1
            logger.warning(
                "a send to %s, parked on daphne's reactor thread, expired after %.0f s "
                "without room in its channel or a broker to take it",
                head.channel,
                age,
            )
        try:
            self.engine.submit_publish(
                "",
                head.queue,
                head.body,
                head.properties,
                "send to %s" % head.channel,
                self._published,
                marked=head.marked,
            )
        except LayerClosed as exc:
            self._lose_all(str(exc))

    def _published(self, outcome: Optional[str], error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose_all(str(error))
            return
        head = self._waiting[0]
        if outcome == ACKED:
            with self._lock:
                self._remove_head()
                self.delivered += 1
            self._declared, self._pause = False, FIRST_PAUSE
            self._next()
        elif outcome == RETURNED and not self._declared:
            # Its queue expired while the broker was away: declare it, send again.
            self._declared = True
            self._run(
                lambda: self.engine.submit_declare(
                    [self.queue_declare(head.channel, head.queue)],
                    "declare %s" % head.queue,
                    self._declared_then_next,
                )
            )
        else:
            # Refused (its channel is full), or returned again: wait, then again.
            self._declared = outcome != RETURNED and self._declared
            pause, self._pause = self._pause, min(2 * self._pause, LONGEST_PAUSE)
            self._run(lambda: self.engine.submit_pause(pause, self._paused))

    def _declared_then_next(self, _frame: Any, error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose_all("declaring its queue failed: %s" % error)
            return
        self._next()

    def _paused(self, _value: Any, error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose_all(str(error))
            return
        self._next()

    def _run(self, submit: Callable[[], None]) -> None:
        try:
            submit()
        except LayerClosed as exc:
            self._lose_all(str(exc))

    def _remove_head(self) -> None:
        """Under ``_lock``: the head is done with."""
        head = self._waiting.popleft()
        self._bytes -= len(head.body)

    def _lose_all(self, why: str) -> None:
        """The layer closed: every parked send is lost, and that is said once."""
        with self._lock:
            lost = len(self._waiting)
            while self._waiting:
                self._remove_head()
            self.lost += lost
            self._moving = False
        if lost:
            logger.warning(
                "%d sends parked on daphne's reactor thread were not delivered: %s", lost, why
            )
