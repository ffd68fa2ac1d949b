"""The I/O thread and what it owns: the one thread that touches the pika connections.

``thread.IOThread`` owns the pieces here, each an object with one job:

``inbox.Inbox``
    where callers' threads hand work over (any thread, under a lock);
``carry_over.Dispatched``
    the work in flight on the current connection pair, run again on the
    next one if the pair is lost (I/O thread);
``alarms.AlarmGate``
    whether a resource alarm blocks publishing (set by the I/O thread,
    read and waited on by callers);
``connection_errors``
    why a connection failed, named for the caller.
"""

from .thread import IOThread

__all__ = ["IOThread"]
