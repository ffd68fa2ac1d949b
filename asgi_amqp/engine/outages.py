"""What callers do while the broker is away.

A blocking receive returns nothing through an outage, and a worker thread
(``Caller.WORKER``) waits one out in its other calls too; ``OutageNotice``
says so once per outage, at WARNING. daphne's reactor thread
(``Caller.REACTOR``) waits only while the broker is reachable
(``wait_while_reachable``): the layer parks a send it made, anything else
raises ``BrokerUnreachable``.
"""

import logging
import threading
import time
from typing import Optional

from ..errors import BrokerUnreachable
from .futures import Pending
from .io import IOThread

logger = logging.getLogger(__name__)


class OutageNotice(object):
    """One WARNING per outage, told apart by ``IOThread.disconnected_since``.

    Shared by every caller thread, under ``_lock``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: Optional[float] = None  # disconnected_since of the outage told

    def once(self, io: IOThread, what: str) -> None:
        since = io.disconnected_since
        if since is None:
            return
        with self._lock:
            if self._told == since:
                return
            self._told = since
        if io.awaiting_first_connection:
            logger.warning(
                "no connection to the broker yet (%s); %s, and the layer keeps trying "
                "up to %g s after its first attempt (first_connect_timeout)",
                io.last_error_text or "connecting",
                what,
                io.first_connect_timeout,
            )
            return
        logger.warning(
            "the broker has been unreachable for %.1f s (%s); %s, and the layer keeps reconnecting",
            io.outage(),
            io.last_error_text or "connection lost",
            what,
        )


# Engine.publish's outcome for a publish given up when the broker went away.
PARKED = "parked"

# How often a wait on daphne's reactor thread looks whether the broker is away.
REACHABLE_CHECK = 0.05


def wait_while_reachable(io: IOThread, pending: Pending, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``pending`` while the broker is reachable: True once it
    arrived, False at the timeout or once the broker is away (the work is not given up)."""
    deadline = time.monotonic() + timeout
    while not io.outage():
        left = deadline - time.monotonic()
        if pending.arrived(min(REACHABLE_CHECK, max(left, 0.0))):
            return True
        if left <= 0:
            return False
    return pending.arrived(0.0)


def unreachable(io: IOThread, what: str, why: str) -> BrokerUnreachable:
    """The error of a call that daphne's reactor thread makes while the broker is away."""
    return BrokerUnreachable(
        "%s: the broker has been unreachable for %.1f s (%s); daphne's reactor thread "
        "does not wait for it, and the layer keeps reconnecting: %s"
        % (what, io.outage(), io.last_error_text or "connection lost", why)
    )
