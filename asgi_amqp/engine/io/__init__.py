"""The I/O thread (``thread.IOThread``), the one thread that touches the pika connections.

It owns the objects here, each with one job and its threads:

* ``inbox.Inbox``: where callers' threads hand work over (any thread, under a lock);
* ``carry_over.Dispatched``: the work in flight on the current pair, carried
  over to the next if the pair is lost (I/O thread);
* ``alarms.AlarmGate``: whether an alarm blocks publishing (set by the I/O
  thread, read and waited on by callers);
* ``connection_errors``: why a connection failed, named for the caller.
"""

from .thread import IOThread

__all__ = ["IOThread"]
