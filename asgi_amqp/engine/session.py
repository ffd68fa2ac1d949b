"""What the I/O thread does for callers: one ``Session`` per connection.

A session holds one AMQP channel for each kind of work (publishing with
confirms, declares, consumers for blocking receives, ``basic_get`` lanes for
non-blocking ones) and offers each kind as one method. Publishing runs on a
connection of its own, which the broker blocks during a resource alarm;
everything else shares the other one and goes on. Callers never touch a
session: they hand the I/O thread a ``Work`` (or a ``publisher.Publish``)
naming the method, and wait on its ``Pending``.

Every method is safe to run again on the next connection when the one it
ran on dropped before it finished: declares and binds are idempotent, a
receive simply asks again, and a publish is sent again as a marked copy
(see ``publisher``). ``connection.IOThread`` does that hand-on.
"""

from .consumers import ConsumerPool
from .declares import DeclareLanes
from .getter import Getter
from .publisher import Publisher


class Session(object):
    """What lives on one connection: a channel for each kind of work."""

    def __init__(
        self, connection, publishing, liveness, handed_off, held, consumer_settings, taken=None
    ):
        self.connection = connection
        self.liveness = liveness
        # Its own connection, which a resource alarm may block (see ``connection``).
        self.publisher = Publisher(publishing)
        self.declares = DeclareLanes(connection)
        self.consumers = ConsumerPool(
            connection, self.declares, liveness, handed_off, held, consumer_settings, taken
        )
        self.getter = Getter(connection, liveness, handed_off, self.consumers)
        self._parts = (self.publisher, self.declares, self.consumers, self.getter)

    # -- the work callers hand over, one method each ------------------------

    def publish(self, publish):
        """Send a ``publisher.Publish``; its pending gets the broker's answer."""
        self.publisher.publish(publish)

    def declare(self, pending, steps):
        """Run topology ``steps`` (see ``declares``) in order."""
        self.declares.run(pending, steps)

    def get(self, pending, queues):
        """A non-blocking receive: a Delivery from one of ``queues``, or None."""
        self.getter.get(pending, queues)

    def wait(self, pending, queues, deadline, threads=1):
        """A blocking receive: a Delivery from one of ``queues``, or None at ``deadline``.

        ``threads``: how many of the process's threads make blocking receives.
        """
        self.consumers.wait(pending, queues, deadline, threads)

    def send_taken_acks(self, pending):
        """Ack the held messages callers took in their own threads (``acks``).

        The I/O thread already sends them when it drains its inbox; this
        work is what wakes it for them, and finds nothing left as a rule.
        """
        self.consumers.send_taken_acks()
        pending.resolve(None)

    def forget_queues(self, pending):
        """Forget which queues are known to exist (after a flush deleted them)."""
        self.liveness.forget()
        pending.resolve(None)

    # -- the connection's life ------------------------------------------------

    def close(self, error):
        """The layer is closing: fail what is still in flight."""
        for part in self._parts:
            part.shutdown()
            part.fail_all(error)

    def lose(self):
        """The connection dropped: every part forgets, failing nobody."""
        for part in self._parts:
            part.shutdown()
            part.forget()


class Work(object):
    """A call of ``session.<method>(pending, *args)`` on the I/O thread."""

    __slots__ = ("pending", "method", "args", "retry")

    def __init__(self, pending, method, args=(), retry=True):
        self.pending = pending
        self.method = method
        self.args = args
        # Run again on the next connection if this one drops first.
        self.retry = retry

    def __call__(self, session):
        getattr(session, self.method)(self.pending, *self.args)
