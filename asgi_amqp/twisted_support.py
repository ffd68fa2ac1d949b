"""The ``twisted`` extension: ``receive_twisted`` for daphne's native mode.

Daphne 1.x runs its reply reader natively on the reactor when the layer
lists ``twisted`` in its extensions; otherwise it polls ``receive`` every
50 ms. ``receive_twisted`` first takes a message the consumer behind daphne's
queue was already pushed (its prefetch window keeps several there under
load): that costs a lock, so it runs on the reactor thread, and the
Deferred fires on the reactor's next turn. Only when none is there does it
run an ordinary blocking receive on the reactor's thread pool, so the
reactor thread never blocks, and the Deferred fires on the reactor thread
as soon as the I/O thread hands a message over (the consumer is kept
between calls, see ``consumers``). When the blocking receive times out it
fires with ``(None, None)`` and daphne simply asks again.

Why not always the thread pool: daphne reads its replies one at a time,
and a trip through a pool thread and back costs two thread wake-ups per
message, which bound how fast daphne drains every WebSocket reply of the
process (docs/benchmarks.rst, "Measurements behind the code").

Why the next turn and not at once: daphne's loop asks again as soon as its
Deferred fires, so a Deferred that fired at once would drain every held
message without letting the reactor read its sockets in between.

Twisted is optional: without it the extension is not listed.
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

    # What receive_twisted's Deferred fires with: receive()'s (channel, message).
    Received = Tuple[Optional[str], Optional[Message]]

_T = TypeVar("_T")

AVAILABLE = threads is not None


def receive_twisted(receiver: "Receiver", channels: Iterable[str]) -> "Deferred[Received]":
    """``receiver.receive(channels, block=True)`` as a Twisted Deferred."""
    if threads is None:
        raise RuntimeError("receive_twisted needs Twisted: pip install twisted")
    # Validate in the caller so bad names fail the Deferred's creation, not
    # later. A one-shot iterator is read once, before validating.
    if isinstance(channels, collections.abc.Iterator):
        channels = list(channels)
    queues = receiver.queues(channels)
    if not queues:
        nothing: Received = (None, None)
        return defer.succeed(nothing)
    held = receiver.take_held(queues)
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
