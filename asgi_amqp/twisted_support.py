"""The ``twisted`` extension: ``receive_twisted`` for daphne's native mode.

Daphne 1.x reads its replies on the reactor when the layer lists ``twisted``,
and polls ``receive`` every 50 ms otherwise. A held message is taken on the
reactor thread (a lock, no wait), and its Deferred fires on the reactor's next
turn: daphne asks again as soon as a Deferred fires, and the reactor must read
its sockets in between. Only when none is held does a blocking receive run on
the reactor's thread pool, whose round trip costs two thread wake-ups per
message (tests/test_twisted.py::test_daphne_drains_what_was_pushed_without_a_pool_thread_each).
Either way the Deferred fires on the reactor thread, with ``(None, None)`` on
a timeout. Twisted is optional: without it the extension is not listed.
"""

import collections.abc
from typing import TYPE_CHECKING, Iterable, Optional, Tuple, TypeVar

try:
    from twisted.internet import defer, threads
except ImportError:  # pragma: no cover - exercised by installs without Twisted
    defer = threads = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from .receiving import Receiver
    from .serialization import Message

    # What the Deferred fires with: receive()'s (channel, message).
    Received = Tuple[Optional[str], Optional[Message]]

_T = TypeVar("_T")

AVAILABLE = threads is not None


def receive_twisted(receiver: "Receiver", channels: Iterable[str]) -> "Deferred[Received]":
    """``receiver.receive(channels, block=True)`` as a Twisted Deferred."""
    if threads is None:
        raise RuntimeError("receive_twisted needs Twisted: pip install twisted")
    # Validated here, so bad names raise now, not in the Deferred; an iterator is read once.
    if isinstance(channels, collections.abc.Iterator):
        channels = list(channels)
    _, names = receiver.queues(channels)
    if not names:
        nothing: Received = (None, None)
        return defer.succeed(nothing)
    held = receiver.take_held(names)
    if held is not None:
        return _on_next_turn(held)
    return threads.deferToThread(receiver.receive, channels, True)


def _on_next_turn(result: _T) -> "Deferred[_T]":
    """A Deferred that fires with ``result`` on the reactor's next iteration."""
    from twisted.internet import reactor  # the running one: daphne installed it

    deferred: Deferred[_T] = defer.Deferred()
    # Without the mypy-zope plugin mypy reads IReactorTime.callLater's delay as self.
    reactor.callLater(0, deferred.callback, result)  # type: ignore[arg-type]
    return deferred
