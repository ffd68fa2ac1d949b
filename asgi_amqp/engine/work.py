"""What callers hand the I/O thread: one small class per kind of work.

A caller's thread never touches a session: it builds one of these, hands
it to ``IOThread.submit`` and waits on its ``pending``. On the I/O thread,
``IOThread`` calls it with the current ``session.Session``, and it calls
the one session part that does the work, by name, so that a reader (and
mypy) can follow a caller's request to the code that serves it.

Every kind is safe to run again on the next connection when the one it ran
on dropped before it finished (``retry``): declares and binds are
idempotent and a receive simply asks again. Publishes are work too
(``publisher.Publish``), with what a hand-on must know about them
(``maybe_delivered``, ``fans_out``). The objects are built by a caller's
thread and, once submitted, touched by the I/O thread only.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from .declares import Step
from .futures import Pending

if TYPE_CHECKING:
    from .session import Session

# The queues of a receive: each name with the arguments it is declared with.
Queues = Sequence[Tuple[str, Optional[Dict[str, Any]]]]


class Work(object):
    """A piece of work for the I/O thread: ``work(session)``, answered through ``pending``."""

    __slots__ = ("pending",)
    retry = True  # run again on the next connection if this one drops first
    fans_out = False  # held back after a refused outage (``io.restart_hold``)
    maybe_delivered = False  # a publish whose confirm was lost (``publisher``)

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def __call__(self, session: "Session") -> None:
        raise NotImplementedError


class Declare(Work):
    """Run topology ``steps`` (see ``declares``) in order on an admin channel."""

    __slots__ = ("steps",)

    def __init__(self, pending: Pending, steps: Sequence[Step]) -> None:
        super().__init__(pending)
        self.steps = steps

    def __call__(self, session: "Session") -> None:
        session.declares.run(self.pending, self.steps)


class Poll(Work):
    """A non-blocking receive: a Delivery from one of ``queues``, or None at once."""

    __slots__ = ("queues",)

    def __init__(self, pending: Pending, queues: Queues) -> None:
        super().__init__(pending)
        self.queues = queues

    def __call__(self, session: "Session") -> None:
        session.getter.get(self.pending, self.queues)


class BlockingReceive(Work):
    """A blocking receive: a Delivery from one of ``queues``, or None at ``deadline``.

    ``deadline`` is a ``time.monotonic()`` time, so a receive handed to the
    next connection after an outage keeps its caller's limit. ``threads``:
    how many of the process's threads make blocking receives (the
    consumers' prefetch window follows it).
    """

    __slots__ = ("queues", "deadline", "threads")

    def __init__(self, pending: Pending, queues: Queues, deadline: float, threads: int) -> None:
        super().__init__(pending)
        self.queues = queues
        self.deadline = deadline
        self.threads = threads

    def __call__(self, session: "Session") -> None:
        session.consumers.add_waiter(self.pending, self.queues, self.deadline, self.threads)


class SendTakenAcks(Work):
    """Ack the held messages callers took in their own threads (``consumers.acks``).

    The I/O thread already sends them when it drains its inbox; this work
    is what wakes it for them, and finds nothing left as a rule. Nobody
    waits for it, and it never runs on a next connection: the lost
    connection's deliveries are back in their queues.
    """

    __slots__ = ()
    retry = False

    def __call__(self, session: "Session") -> None:
        session.consumers.acks.send_taken()
        self.pending.resolve(None)


class ForgetQueues(Work):
    """Forget which queues are known to exist (after a flush deleted them)."""

    __slots__ = ()

    def __call__(self, session: "Session") -> None:
        session.liveness.forget()
        self.pending.resolve(None)
