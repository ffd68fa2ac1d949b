"""The engine: everything that runs on, or waits for, the I/O thread.

``Engine`` is the layer's one door to the broker: the layer says what it
wants, the engine does it on the I/O thread and waits for the answer with a
timeout. The layer never touches pika, a thread or a ``Pending``; the engine
never imports the layer. This ``__init__`` only re-exports what the layer uses.

* ``engine``: ``Engine``, and ``InFlight``, publishes submitted together;
* ``io``: the I/O thread and what it owns;
* ``session``: the parts of one connection pair;
* ``work``: what callers hand the I/O thread;
* ``futures``: ``Pending``, the one wait protocol;
* ``publisher``, ``declares``, ``consumers``, ``getter``: the parts (confirmed
  publishes, topology steps, blocking and non-blocking receives);
* ``reopening_channel``: the one AMQP channel each part owns;
* ``deliveries``: receive state (held messages, the hand-off log, known queues);
* ``deadletter``: the dead-letter worker, on its own thread and connection;
* ``outages``: what callers do while the broker is away.
"""

from .consumers import ConsumerSettings
from .declares import (
    Step,
    exchange_bind,
    exchange_declare,
    exchange_delete,
    exchange_unbind,
    queue_bind,
    queue_declare,
    queue_delete,
    queue_purge,
)
from .deliveries import Delivery
from .engine import Engine, InFlight, PublishRequest
from .futures import OnDone
from .outages import PARKED
from .publisher import ACKED, NACKED, RETURNED
from .work import Queues

__all__ = [
    "ConsumerSettings",
    "InFlight",
    "PublishRequest",
    "Engine",
    "Delivery",
    "Queues",
    "Step",
    "ACKED",
    "NACKED",
    "RETURNED",
    "PARKED",
    "OnDone",
    "exchange_bind",
    "exchange_declare",
    "exchange_delete",
    "exchange_unbind",
    "queue_bind",
    "queue_declare",
    "queue_delete",
    "queue_purge",
]
