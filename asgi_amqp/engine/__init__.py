"""The engine: everything that runs on, or waits for, the I/O thread.

``Engine`` is the layer's one door to the broker. The layer says what it
wants (publish this, run these declares, get or wait for a delivery from
these queues) and the engine does it on the I/O thread, waiting for the
answer with a timeout. The layer never touches pika, a thread or a
``Pending``; the engine never imports the layer.

Inside, by module (this ``__init__`` only re-exports what the layer uses):

``engine``
    ``Engine`` itself, and ``InFlight``, the publishes it handed over
    together;
``io``
    the I/O thread (``io.thread``): connect, reconnect, hand unfinished
    work on, close; and the objects it owns (inbox, carry-over, alarm
    gate);
``session``
    the parts of one connection pair: a channel for each kind of work;
``work``
    ``Work``, what callers hand the I/O thread; each kind lives with the
    part that serves it (``publisher.Publish``, ``declares.Declare``...);
``futures``
    ``Pending``, the one wait protocol between a caller and the I/O thread;
``publisher``, ``declares``, ``consumers``, ``getter``
    the channels a session uses: confirmed publishes, topology steps,
    blocking receives (the ``consumers`` package: the pool and the acks,
    polls and sweep it owns), non-blocking receives (the ``getter``
    package: the waves and their lanes);
``reopening_channel``
    the one AMQP channel each of those parts owns, reopened after an error;
``deliveries``
    receive state: held messages, the hand-off log, known queues;
``deadletter``
    the dead-letter worker, on its own thread and connection;
``outages``
    what callers do while the broker is away: which threads are workers,
    and the one WARNING per outage.
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
