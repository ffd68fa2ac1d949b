"""After a lost connection, the shards that wait for the process that served them.

Channels' ``enforce_ordering`` counts a frame done before its replies go
out, and those replies wait for the next connection: a socket's next frame
must run in the same process, after them
(``test_lost_connections_move_no_socket_while_a_worker_handles_its_frame``).
So a reconnected process takes back at once the shards it gave its threads
frames of (``reclaimed``), and holds off the others for ``SHARD_GRACE`` at
least: until their owner consumes them again (then they stay its), or for
``SHARD_OWNER_WAIT`` at most (the owner is taken to be gone)
(``test_a_worker_that_reconnects_late_keeps_its_sockets``). A loss of this
process alone (``IOThread._shared_loss``) waits for nothing.

Owned by ``pool.ConsumerPool``; everything here runs on the I/O thread.
"""

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Optional, Set, Tuple

from .. import declares
from ..futures import Pending

if TYPE_CHECKING:
    from ..declares import AdminChannels
    from .pool import ConsumerPool

SHARD_GRACE = 0.75
SHARD_LOOK_EVERY = 0.25
SHARD_OWNER_WAIT = 3.0


class OwnerWait(object):
    """The shards a resumed consumers' channel does not consume yet."""

    def __init__(
        self,
        pool: "ConsumerPool",
        admin: "AdminChannels",
        resumed: bool,
        reclaimed: FrozenSet[str],
    ) -> None:
        self._pool = pool
        self._admin = admin
        now = time.monotonic()
        self._grace_ends = now + SHARD_GRACE if resumed else 0.0
        self._waits_until = now + SHARD_OWNER_WAIT if resumed else 0.0
        self._reclaimed = reclaimed
        self._released: Set[str] = set()  # consumed by another process since
        self._timer: Any = None
        self._waiting: Dict[str, Tuple[Any, bool]] = {}  # shard -> (arguments, polled)

    def holds(self, shard: str, arguments: Any, polled: bool) -> bool:
        """Whether ``shard`` waits for its owner; if so it is consumed later."""
        if (
            self._waits_until <= time.monotonic()
            or shard in self._reclaimed
            or shard in self._released
        ):
            return False
        self._waiting[shard] = (arguments, polled)
        self._schedule()
        return True

    def stop(self) -> None:
        if self._timer is not None:
            self._pool.ioloop.remove_timeout(self._timer)
            self._timer = None

    def _schedule(self) -> None:
        """Look at the grace's end, then every ``SHARD_LOOK_EVERY`` seconds."""
        if self._timer is None and self._waiting:
            now = time.monotonic()
            at = max(self._grace_ends, now + SHARD_LOOK_EVERY)
            self._timer = self._pool.ioloop.call_later(
                max(0.0, min(at, self._waits_until) - now), self._look
            )

    def _look(self) -> None:
        """Stop waiting for the shards another process consumes, and for all
        once ``SHARD_OWNER_WAIT`` is over."""
        self._timer = None
        if not self._pool.ready:
            return
        if time.monotonic() >= self._waits_until:
            waiting, self._waiting = self._waiting, {}
            for shard, (arguments, polled) in waiting.items():
                self._pool.consume_shard(shard, arguments, polled)
            return
        for shard in self._waiting:
            self._admin.run(
                Pending("count the consumers of %s" % shard, on_done=self._counted_for(shard)),
                [declares.queue_declare(shard, None, passive=True, not_found_ok=True)],
            )
        self._schedule()

    def _counted_for(self, shard: str) -> Callable[[Any, Optional[BaseException]], None]:
        """Once another process consumes the shard, the pool's declare leaves it be."""

        def counted(method: Any, error: Optional[BaseException]) -> None:
            if getattr(method, "consumer_count", 0) and shard in self._waiting and self._pool.ready:
                arguments, polled = self._waiting.pop(shard)
                self._released.add(shard)
                self._pool.consume_shard(shard, arguments, polled)

        return counted
