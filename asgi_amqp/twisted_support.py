"""The ``twisted`` extension: ``receive_twisted`` for daphne's native mode.

Daphne 1.x runs its reply reader natively on the reactor when the layer
lists ``twisted`` in its extensions; otherwise it polls ``receive`` every
50 ms. ``receive_twisted`` runs an ordinary blocking receive on the
reactor's thread pool, so the reactor thread never blocks and the Deferred
fires on the reactor thread as soon as the I/O thread hands a message over
(the consumer behind it is kept between calls, see ``consumers``). When the
blocking receive times out it fires with ``(None, None)`` and daphne simply
asks again.

Twisted is optional: without it the extension is not listed.
"""

import collections.abc
import sys

try:
    from twisted.internet import defer, threads
except ImportError:  # pragma: no cover - exercised by installs without Twisted
    defer = threads = None  # type: ignore[assignment]

AVAILABLE = threads is not None


def on_reactor_thread() -> bool:
    """Whether the caller runs on a Twisted reactor's own thread (daphne's),
    which must never block: every connection of that process waits with it.
    Twisted is not imported for this; a process without it has no reactor."""
    threadable = sys.modules.get("twisted.python.threadable")
    return threadable is not None and bool(threadable.isInIOThread())


def receive_twisted(layer, channels):
    if threads is None:
        raise RuntimeError("receive_twisted needs Twisted: pip install twisted")
    # Validate in the caller so bad names fail the Deferred's creation, not
    # later. A one-shot iterator is read once, before validating.
    if isinstance(channels, collections.abc.Iterator):
        channels = list(channels)
    if not layer._queues_for_receive(channels):
        return defer.succeed((None, None))
    return threads.deferToThread(layer.receive, channels, True)
