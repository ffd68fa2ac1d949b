"""``ReopeningChannel``: the one AMQP channel of a session's part, reopened after an error.

Each part has a channel of its own because a channel error (a 404) closes
the whole channel: a failed ``basic_get`` must not take the publisher's
confirms or the consumers' unacked deliveries with it
(test_cluster.py::test_blocking_receive_over_a_down_queue_and_a_live_one).

The part gives ``setup`` (e.g. ``confirm.select``, then ``done``),
``on_ready``, and ``on_lost``, which answers what was in flight on the
channel. All of it runs on the I/O thread.
"""

import logging
from typing import Any, Callable, Optional, Tuple

import pika
import pika.channel
import pika.exceptions

logger = logging.getLogger(__name__)

Setup = Callable[[pika.channel.Channel, Callable[..., None]], None]
OnLost = Callable[[Optional[int], Optional[str]], None]


def broker_reply(reason: Any) -> Tuple[Optional[int], Optional[str]]:
    """The broker's reply code and text in a pika close reason, else (None, its class
    name): never credentials."""
    code = getattr(reason, "reply_code", None)
    if code is None:
        return None, type(reason).__name__
    return code, getattr(reason, "reply_text", None)


def connection_lost(reason: Any, connection: pika.SelectConnection) -> bool:
    """True when a channel closed because its whole connection went."""
    return isinstance(reason, pika.exceptions.AMQPConnectionError) or not connection.is_open


def _setup_nothing(_channel: pika.channel.Channel, done: Callable[..., None]) -> None:
    done()


def _nothing(*_args: Any) -> None:
    pass


class ReopeningChannel(object):
    """``current``: the open pika channel or None; ``ready`` once ``setup`` finished on it."""

    def __init__(
        self,
        connection: pika.SelectConnection,
        name: str,
        setup: Setup = _setup_nothing,
        on_ready: Callable[[], None] = _nothing,
        on_lost: OnLost = _nothing,
    ) -> None:
        self._connection = connection
        self._name = name  # for the log: "consume", "publish", "admin", "get"
        self._setup = setup
        self._on_ready = on_ready
        self._on_lost = on_lost
        self.current: Optional[pika.channel.Channel] = None
        self.ready = False
        self._closing = False

    def open(self) -> None:
        """Ask for the channel; the part's ``setup`` runs once it is open."""
        if self._closing or not self._connection.is_open:
            return
        self._connection.channel(on_open_callback=self._on_open)

    def _on_open(self, channel: pika.channel.Channel) -> None:
        if self._closing:
            channel.close()
            return
        channel.add_on_close_callback(self._on_close)
        self.current = channel
        self._setup(channel, self._on_setup_done)

    def _on_setup_done(self, _frame: Any = None) -> None:
        if self._closing:
            return  # the session went while the channel was being set up
        self.ready = True
        self._on_ready()

    def _on_close(self, channel: pika.channel.Channel, reason: Any) -> None:
        if channel is not self.current:
            return
        self.current = None
        self.ready = False
        if connection_lost(reason, self._connection):
            # The I/O thread carries the work over: failing it here would
            # raise in callers for an outage the layer rides through.
            return
        code, text = broker_reply(reason)
        if not self._closing:
            logger.debug("%s channel closed: %s %s", self._name, code, text)
        self._on_lost(code, text)
        if self._connection.is_open and not self._closing:
            self.open()

    def shutdown(self) -> None:
        """The session is going: stop reopening and listening. The pair's other connection
        closes gracefully, and a part ignores what still arrives once ``closing``."""
        self._closing = True
        self.ready = False

    @property
    def closing(self) -> bool:
        return self._closing
