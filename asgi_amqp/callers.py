"""Who makes a call, and so what it may wait for: decided here for every part.

- ``Caller.REACTOR``, daphne's reactor thread: every socket of daphne waits with it,
  so it waits for one broker round trip at most. A refused send, or one in an outage,
  is parked (``parked_sends``); an alarm, a full channel or any other call in an
  outage raises at once (``BrokerBlocked``, ``ChannelFull``, ``BrokerUnreachable``).
- ``Caller.WORKER``, a thread that made a blocking receive (a runworker's): Channels
  1.x catches nothing around its sends, and ``enforce_ordering`` receives without
  blocking, so all its calls but blocking receives wait through an outage
  (``Engine._ride_out``).
- ``Caller.PLAIN``, any other thread: waits up to ``operation_timeout``, then raises.
"""

import enum
import sys
import threading


class Caller(enum.Enum):
    REACTOR = "daphne's reactor thread"
    WORKER = "a worker thread"
    PLAIN = "a thread"


def on_reactor_thread() -> bool:
    """Whether the caller runs on a Twisted reactor's own thread (daphne's).
    Twisted is not imported for this; a process without it has no reactor."""
    threadable = sys.modules.get("twisted.python.threadable")
    # ``ioThread``: None until a reactor runs (a runworker's case), then its thread.
    if threadable is None or getattr(threadable, "ioThread", None) is None:
        return False
    return bool(threadable.isInIOThread())


class Callers(object):
    """The kind of each calling thread. Owned by the layer; every caller's
    thread reads and writes its own entry (a thread-local)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def receives_blocking(self) -> None:
        """This thread made a blocking receive: from now on it is a ``WORKER``."""
        self._local.worker = True

    def kind(self) -> Caller:
        if on_reactor_thread():
            return Caller.REACTOR
        if getattr(self._local, "worker", False):
            return Caller.WORKER
        return Caller.PLAIN
