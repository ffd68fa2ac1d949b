"""Who makes a call, and so what it may wait for: decided here for every part.

- ``Caller.REACTOR``, daphne's reactor thread: every socket of daphne waits
  with it, so it never waits beyond one broker round trip. A send the
  broker refuses, or that meets an outage, is parked (``parked_sends``);
  a resource alarm raises ``BrokerBlocked`` at once, a full channel
  ``ChannelFull`` at once, and any other call in an outage
  ``BrokerUnreachable``.
- ``Caller.WORKER``, a thread that has made a blocking receive (a Channels
  runworker's): Channels 1.x catches nothing around a worker's sends, and
  its ``enforce_ordering`` empties a socket's wait channel with a
  non-blocking receive, so a worker's calls but its blocking receives wait
  through an outage until the broker is back (``Engine._ride_out``).
  ``AMQPChannelLayer.receive`` says so.
- ``Caller.PLAIN``, any other thread: it waits up to ``operation_timeout``,
  then raises an error that names the cause.
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
    return threadable is not None and bool(threadable.isInIOThread())


class Callers(object):
    """The kind of each calling thread. Owned by the layer; every caller's
    thread reads and writes its own entry (a thread-local)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def receives_blocking(self) -> None:
        """This thread made a blocking receive: from now on it is a ``WORKER``."""
        self._local.worker = True

    def kind(self) -> Caller:
        """The calling thread's kind."""
        if on_reactor_thread():
            return Caller.REACTOR
        if getattr(self._local, "worker", False):
            return Caller.WORKER
        return Caller.PLAIN
