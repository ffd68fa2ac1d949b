"""Non-blocking receives: ``basic_get`` asked in waves through lanes of their own.

``waves.Getter`` owns its ``lanes.Lane`` objects (one ``basic_get`` channel
each) and asks ``consumers.polls.Polls`` which queues consumers serve
instead. Everything here runs on the I/O thread.
"""

from .waves import LANES, PUSH_WAIT, RECHECK_EMPTY, Getter

__all__ = ["LANES", "PUSH_WAIT", "RECHECK_EMPTY", "Getter"]
