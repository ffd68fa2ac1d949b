"""One ``Session`` per connection pair: a part, on a channel of its own, for each kind of work.

The publisher has the publishing connection, which an alarm blocks; the
admin channels, consumers and getter share the main one, which goes on.
Callers never touch a session: their work calls the part it needs
(``work``). A session and its parts are the I/O thread's alone.
"""

from typing import FrozenSet, Optional, Protocol, Tuple

import pika

from .consumers import ConsumerPool, ConsumerSettings
from .consumers.acks import TakenAcks
from .declares import AdminChannels
from .deliveries import HandedOff, HeldMessages, Liveness
from .getter import Getter
from .publisher import Publisher


class Part(Protocol):
    """What a session asks of each of its parts when the connection ends."""

    def shutdown(self) -> None:
        """Stop reopening channels and listening on them."""

    def forget(self) -> None:
        """The connection was lost: drop all state, answering nobody."""

    def fail_all(self, error: BaseException) -> None:
        """The layer is closing: fail every caller still waiting."""


class Session(object):
    """What lives on one connection: a channel for each kind of work."""

    def __init__(
        self,
        connection: pika.SelectConnection,
        publishing: pika.SelectConnection,
        liveness: Liveness,
        handed_off: HandedOff,
        held: HeldMessages,
        consumer_settings: ConsumerSettings,
        taken: Optional[TakenAcks] = None,
        resumed: bool = False,
        reclaimed: FrozenSet[str] = frozenset(),
    ) -> None:
        self.connection = connection
        self.liveness = liveness
        # On the publishing connection, which an alarm may block.
        self.publisher = Publisher(publishing)
        self.declares = AdminChannels(connection)
        self.consumers = ConsumerPool(
            connection,
            self.declares,
            liveness,
            handed_off,
            held,
            consumer_settings,
            taken,
            resumed,
            reclaimed,
        )
        self.getter = Getter(connection, liveness, handed_off, self.consumers)
        self._parts: Tuple[Part, ...] = (
            self.publisher,
            self.declares,
            self.consumers,
            self.getter,
        )

    # -- the connection's life ------------------------------------------------

    def close(self, error: BaseException) -> None:
        """The layer is closing: fail what is still in flight."""
        for part in self._parts:
            part.shutdown()
            part.fail_all(error)

    def lose(self) -> None:
        """The connection dropped: every part forgets, failing nobody."""
        for part in self._parts:
            part.shutdown()
            part.forget()
