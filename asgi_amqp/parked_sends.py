"""Sends that daphne's reactor thread makes while the broker is away.

That thread never waits for the broker beyond one round trip: every
connection of daphne waits with it. Before, a send there during an outage
waited ``operation_timeout`` (5 s by default) for each frame, freezing
daphne, and then raised ``OperationTimeout`` out of daphne's ``onMessage``,
which Twisted answers by dropping the client's TCP connection: with a 16 s
broker restart, 2 of 20 chat sockets were reset that way, and their
clients heard nothing again.

So such a send is *parked*: the publish stays with the I/O thread, which
sends it on the next connection, in the order it was made, and ``send``
returns at once. A socket's frames then reach the workers after the
broker's return, none lost and none out of order (Channels'
``enforce_ordering`` would wait for a missing one for good). The parked
publish is seen to its end here, on the I/O thread, since nobody waits
for it: confirmed, it is done; returned (its queue expired during the
outage), the queue is declared and the message sent once more; refused
(its queue is full) or failed (the layer closed), it is lost, and that is
logged at WARNING with the channel and the cause. It was never a
``ChannelFull`` to daphne, which had already moved on.

Parked sends are bounded, ``MESSAGES`` and ``BYTES`` at most at a time:
once they are full, a send on the reactor thread raises
``BrokerUnreachable`` (a ``ChannelFull``) at once, and daphne answers 503
or closes the socket with 1013, "try again later". A publish that was
already on its way when the connection went is parked whatever the
bound: it cannot be taken back. ASGI's ``expiry`` is a minimum, not a
deadline: a parked message goes out however long the outage lasted, and
lives ``expiry`` in its queue from then.

Only ``send`` parks, and only on the reactor thread: any other thread
waits for an outage (``operation_timeout``, or through it on a worker
thread: ``engine.outages``), and a caller that waits learns the outcome.

State: ``ParkedSends`` counts what is parked, under its lock (the reactor
thread parks, the I/O thread ends). A ``ParkedSend`` is made on the
reactor thread and, once parked, touched on the I/O thread only.
"""

import logging
import threading
from typing import Any, Callable, Optional

import pika

from .engine import ACKED, RETURNED, Engine, OnDone, Step
from .errors import LayerClosed

logger = logging.getLogger(__name__)

# At most this many sends parked at a time, of at most this many bytes in all.
MESSAGES = 10000
BYTES = 64 * 1024 * 1024


class ParkedSends(object):
    """The parked sends of one layer: their count and size, and their ends."""

    def __init__(
        self,
        engine: Engine,
        channel_queue_declare: Callable[[str], Step],
        messages: int = MESSAGES,
        size: int = BYTES,
    ) -> None:
        self.engine = engine
        self.channel_queue_declare = channel_queue_declare  # the Sender's
        # The bound: parked sends at a time, and their bodies' bytes in all.
        self.messages_limit = messages
        self.bytes_limit = size
        self._lock = threading.Lock()  # the reactor thread parks, the I/O thread ends
        self.messages = 0  # parked now (under _lock)
        self._bytes = 0  # their bodies' size (under _lock)
        self.lost = 0  # parked sends that were not delivered, since the layer began

    def parking(
        self, channel: str, queue: str, body: bytes, properties: pika.BasicProperties
    ) -> "ParkedSend":
        """A send's ``engine.Parking``: used only if the broker is away."""
        return ParkedSend(self, channel, queue, body, properties)

    def has_room(self, size: int) -> bool:
        with self._lock:
            return self.messages < self.messages_limit and self._bytes + size <= self.bytes_limit

    def add(self, size: int) -> None:
        with self._lock:
            self.messages += 1
            self._bytes += size

    def remove(self, size: int, delivered: bool) -> None:
        with self._lock:
            self.messages -= 1
            self._bytes -= size
            if not delivered:
                self.lost += 1


class ParkedSend(object):
    """One send of the reactor thread, parked while the broker is away."""

    def __init__(
        self,
        owner: ParkedSends,
        channel: str,
        queue: str,
        body: bytes,
        properties: pika.BasicProperties,
    ) -> None:
        self._owner = owner
        self._channel = channel
        self._queue = queue
        self._body = body
        self._properties = properties
        self._declared = False

    # -- engine.Parking --------------------------------------------------------

    def has_room(self) -> bool:
        return self._owner.has_room(len(self._body))

    def park(self) -> OnDone:
        self._owner.add(len(self._body))
        logger.debug("send to %s parked until the broker is back", self._channel)
        return self._published

    # -- its end, on the I/O thread ------------------------------------------------

    def _published(self, outcome: Optional[str], error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose(str(error))
        elif outcome == ACKED:
            self._owner.remove(len(self._body), delivered=True)
        elif outcome == RETURNED and not self._declared:
            # Its queue expired while the broker was away: declare it, send again.
            self._declared = True
            self._submit(
                lambda: self._owner.engine.submit_declare(
                    [self._owner.channel_queue_declare(self._channel)],
                    "declare %s" % self._queue,
                    self._declare_done,
                )
            )
        elif outcome == RETURNED:
            self._lose("its queue %s disappears as soon as it is declared" % self._queue)
        else:
            self._lose("the broker refused it: the channel is full")

    def _declare_done(self, _frame: Any, error: Optional[BaseException]) -> None:
        if error is not None:
            self._lose("declaring its queue failed: %s" % error)
            return
        self._submit(
            lambda: self._owner.engine.submit_publish(
                "",
                self._queue,
                self._body,
                self._properties,
                "send to %s" % self._channel,
                self._published,
            )
        )

    def _submit(self, submit: Callable[[], None]) -> None:
        try:
            submit()
        except LayerClosed as exc:
            self._lose(str(exc))

    def _lose(self, why: str) -> None:
        self._owner.remove(len(self._body), delivered=False)
        logger.warning(
            "a send to %s, parked while the broker was away, was not delivered: %s",
            self._channel,
            why,
        )
