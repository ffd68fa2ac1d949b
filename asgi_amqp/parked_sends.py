"""Sends of daphne's reactor thread that cannot go out now: parked, never waited for.

The reactor thread waits for the broker one round trip at most: all of daphne
waits with it. A send there is *parked*, and ``send`` returns at once, when the
broker is away, when sends to its queue are parked already (a socket's frames
keep their order), or when its channel is full or an alarm holds it back. Each
queue's parked sends form a *line*, published one at a time in order (two in
flight to a full queue could be taken out of order); the lines of different
queues move side by side. A send parked past ``expiry`` is dropped as an expired
message would be; none is dropped for a full channel, since daphne accepted the
frame. Beyond ``MESSAGES`` or ``BYTES``, ``ChannelFull`` at once (daphne answers
503 or 1013); a publish on its way when the connection went cannot be taken
back, so it is parked whatever the bound, as a marked copy.
Without parking, e2e/test_stack_faults.py::test_a_30_s_outage_loses_nothing_daphne_accepted
fails.

Broker facts:

* a full queue refuses a publish, and takes it once a reader made room
  (tests/test_full_queues_and_long_outages.py,
  ``test_a_full_channel_refuses_the_reactor_and_a_full_shard_parks_its_frames``);
* a mandatory publish to a queue that expired while the broker was away is returned;
* a quorum queue between leaders refuses a publish for a moment.

State: ``ParkedSends`` is shared by the reactor thread (which parks) and the I/O
thread (which publishes and pauses), under its one lock. A line's head is in
flight, or its pause scheduled, only while the line is ``moving``; its
``declared`` and ``pause`` are the I/O thread's.
"""

import collections
import logging
import threading
import time
from typing import Callable, Deque, Dict, NamedTuple, Optional

import pika

from .engine import ACKED, RETURNED, Engine, Step
from .errors import BrokerBlocked, BrokerUnreachable, ChannelFull, LayerClosed

logger = logging.getLogger(__name__)

# At most this many sends parked at a time, of at most this many bytes in all.
MESSAGES = 10000
BYTES = 64 * 1024 * 1024
# Parked sends at most for a queue whose messages have no order (a connect, an HTTP
# request): a storm meets ChannelFull (daphne: 503), not connects run after their
# client left, while a quorum queue's refusal between leaders still passes.
SHORT_LINE = 10
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


class _Line(object):
    """The parked sends of one queue, in order."""

    __slots__ = ("queue", "sends", "moving", "declared", "pause")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.sends: Deque[ParkedSend] = collections.deque()
        self.moving = False  # its head is being published or paused
        self.declared = False  # its queue was declared after a return
        self.pause = FIRST_PAUSE  # before its head is tried again


class ParkedSends(object):
    """The parked sends of one layer: a line per queue, and their bound."""

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
        self._lines: Dict[str, _Line] = {}  # queue -> its line, while it has sends (_lock)
        self.messages = 0  # parked now (under _lock)
        self._bytes = 0  # their bodies' size (under _lock)
        self.delivered = 0  # parked sends confirmed, since the layer began
        self.expired = 0  # dropped after ``expiry``
        self.lost = 0  # not delivered for another reason (the layer closed)

    def waiting(self, queue: str) -> bool:
        """Whether sends to ``queue`` are parked: a new one goes behind them."""
        return queue in self._lines

    def park(
        self,
        channel: str,
        queue: str,
        body: bytes,
        properties: pika.BasicProperties,
        marked: bool = False,
        most: Optional[int] = None,
    ) -> None:
        """Park a send, or raise ``ChannelFull`` at once when the bound is reached or
        ``most`` sends of its queue are parked already; a ``marked`` one (on its way
        when the connection went) is parked whatever the bound."""
        send = ParkedSend(channel, queue, body, properties, marked, time.monotonic())
        with self._lock:
            line = self._lines.get(queue)
            if not marked:
                self._check_room(channel, len(body))
                if most is not None and line is not None and len(line.sends) >= most:
                    raise ChannelFull(
                        "channel %s is full, and %d sends to it wait in this process"
                        % (channel, len(line.sends))
                    )
            if line is None:
                line = self._lines[queue] = _Line(queue)
            line.sends.append(send)
            self.messages += 1
            self._bytes += len(body)
            start, line.moving = not line.moving, True
        logger.debug("send to %s parked", channel)
        if start:
            self._next(line)

    def _check_room(self, channel: str, size: int) -> None:
        """Under ``_lock``: raise unless one more send fits the bound."""
        if self.messages >= self.messages_limit or self._bytes + size > self.bytes_limit:
            why = "the sends parked on daphne's reactor thread fill their limit"
            if self.engine.broker_away():
                raise BrokerUnreachable(
                    "send to %s: the broker is unreachable, and %s" % (channel, why)
                )
            raise ChannelFull("channel %s: %s" % (channel, why))

    # -- moving a line's head: on the I/O thread, but for its first publish --------------

    def _next(self, line: _Line) -> None:
        """Publish the line's head, or end the line when nothing waits; drops expired sends."""
        while True:
            with self._lock:
                if not line.sends:
                    line.moving = False
                    self._end(line)
                    return
                head = line.sends[0]
                age = time.monotonic() - head.parked_at
                if age <= self.expiry:
                    break
                self._remove_head(line)
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
                lambda outcome, error: self._published(line, outcome, error),
                marked=head.marked,
            )
        except LayerClosed as exc:
            self._lose_all(str(exc))

    def _published(
        self, line: _Line, outcome: Optional[str], error: Optional[BaseException]
    ) -> None:
        if not line.sends:  # lost already
            return
        if isinstance(error, BrokerBlocked):
            # An alarm: wait as for room; the send may have gone, so it goes again marked.
            with self._lock:
                line.sends[0] = line.sends[0]._replace(marked=True)
            outcome, error = None, None
        if error is not None:
            self._lose_all(str(error))
            return
        head = line.sends[0]
        if outcome == ACKED:
            with self._lock:
                self._remove_head(line)
                self.delivered += 1
            line.declared, line.pause = False, FIRST_PAUSE
            self._next(line)
        elif outcome == RETURNED and not line.declared:
            # Its queue expired while the broker was away: declare it, send again.
            line.declared = True
            self._run(
                lambda: self.engine.submit_declare(
                    [self.queue_declare(head.channel, head.queue)],
                    "declare %s" % head.queue,
                    lambda _frame, error: self._then_next(line, error),
                )
            )
        else:
            # Refused (its channel is full), or returned again: wait, then again.
            line.declared = outcome != RETURNED and line.declared
            pause, line.pause = line.pause, min(2 * line.pause, LONGEST_PAUSE)
            self._run(
                lambda: self.engine.submit_pause(
                    pause, lambda _value, error: self._then_next(line, error)
                )
            )

    def _then_next(self, line: _Line, error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose_all(str(error))
            return
        self._next(line)

    def _run(self, submit: Callable[[], None]) -> None:
        try:
            submit()
        except LayerClosed as exc:
            self._lose_all(str(exc))

    def _remove_head(self, line: _Line) -> None:
        """Under ``_lock``: the line's head is done with."""
        head = line.sends.popleft()
        self.messages -= 1
        self._bytes -= len(head.body)

    def _end(self, line: _Line) -> None:
        """Under ``_lock``: an empty line goes (a new send starts a new one)."""
        if self._lines.get(line.queue) is line:
            del self._lines[line.queue]

    def _lose_all(self, why: str) -> None:
        """The layer closed: every parked send is lost, and that is said once."""
        with self._lock:
            lost = self.messages
            for line in self._lines.values():
                line.sends.clear()
                line.moving = False
            self._lines.clear()
            self.lost += lost
            self.messages = 0
            self._bytes = 0
        if lost:
            logger.warning(
                "%d sends parked on daphne's reactor thread were not delivered: %s", lost, why
            )
