"""``Work``: what a caller hands the I/O thread, the base of every kind of work.

A caller hands a piece of work to ``IOThread.submit`` and waits on its
``pending``; the I/O thread calls it with the current ``session.Session``,
and it calls the one part that serves it, by name, so that a reader (and
mypy) can follow a request to its code. Each kind lives in that part's
module (the glossary's *work* lists them).

Built by a caller's thread; once submitted, touched by the I/O thread only.
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
    retry = True  # carried over if its connection drops before it finished
    maybe_delivered = False  # a publish in doubt (``publisher``)

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def __call__(self, session: "Session") -> None:
        raise NotImplementedError


class Pause(Work):
    """A timer for work without a caller (``parked_sends``): ``pending`` resolves ``seconds``
    after the I/O thread runs it. Carried over, it starts again; nothing resolves twice."""

    __slots__ = ("seconds",)

    def __init__(self, pending: Pending, seconds: float) -> None:
        super().__init__(pending)
        self.seconds = seconds

    def __call__(self, session: "Session") -> None:
        session.connection.ioloop.call_later(self.seconds, self._end)

    def _end(self) -> None:
        self.pending.resolve(None)
