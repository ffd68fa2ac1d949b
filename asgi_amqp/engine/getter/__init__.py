"""Non-blocking receives: ``basic_get`` asked in waves through lanes of their own.

``waves.Getter`` serves the requests, one at a time, in waves; it owns
its ``lanes.Lane`` objects, each one ``basic_get`` channel. It asks the
consumers' ``Polls`` (``consumers/polls.py``) which queues their
consumers serve instead. Everything here runs on the I/O thread.
"""

from .waves import LANES, PUSH_WAIT, RECHECK_EMPTY, Getter

__all__ = ["LANES", "PUSH_WAIT", "RECHECK_EMPTY", "Getter"]
