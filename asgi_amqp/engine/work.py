"""What callers hand the I/O thread: ``Work``, the base of every kind of work.

A caller's thread never touches a session: it builds a piece of work,
hands it to ``IOThread.submit`` and waits on its ``pending``. On the I/O
thread, ``IOThread`` calls it with the current ``session.Session``, and it
calls the one session part that does the work, by name, so that a reader
(and mypy) can follow a caller's request to the code that serves it.

Each kind lives in the module of the part that serves it, so that the
I/O thread's call of a piece of work lands in that part's module at once:

``publisher.Publish``
    a confirmed publish, with what a hand-on must know about it
    (``maybe_delivered``);
``declares.Declare``
    a run of topology steps on an admin channel;
``consumers.pool.BlockingReceive``
    a blocking receive, served by the consumers;
``consumers.acks.SendTakenAcks``
    the wake-up for the acks of messages callers took themselves;
``getter.waves.Poll``
    a non-blocking receive;
``deliveries.ForgetQueues``
    forget which queues exist (after a flush).

Every kind is safe to run again on the next connection when the one it ran
on dropped before it finished (``retry``): declares and binds are
idempotent and a receive simply asks again; a publish goes again as a
marked copy. The objects are built by a caller's thread and, once
submitted, touched by the I/O thread only.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from .futures import Pending

if TYPE_CHECKING:
    from .session import Session

# The queues of a receive: each name with the arguments it is declared with.
Queues = Sequence[Tuple[str, Optional[Dict[str, Any]]]]


class Work(object):
    """A piece of work for the I/O thread: ``work(session)``, answered through ``pending``."""

    __slots__ = ("pending",)
    retry = True  # run again on the next connection if this one drops first
    maybe_delivered = False  # a publish whose confirm was lost (``publisher``)

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def __call__(self, session: "Session") -> None:
        raise NotImplementedError


class Pause(Work):
    """``pending`` resolves ``seconds`` after the I/O thread runs it: a timer for
    work that waits without a caller (``parked_sends``). On a lost connection
    it runs again on the next one, and its first timer resolves nothing twice."""

    __slots__ = ("seconds",)

    def __init__(self, pending: Pending, seconds: float) -> None:
        super().__init__(pending)
        self.seconds = seconds

    def __call__(self, session: "Session") -> None:
        session.connection.ioloop.call_later(self.seconds, self._end)

    def _end(self) -> None:
        self.pending.resolve(None)
