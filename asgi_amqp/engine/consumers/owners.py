"""After a lost connection, the shards that wait for the process that served them.

Channels' ``enforce_ordering`` counts a frame done before the worker's
replies go out, and after a lost connection those replies wait for the
new one. A socket's next frame must so run in the process that ran the
frame before, after those replies, and not in another process that
reconnected first. So a process that reconnects takes back at once the
shards whose frames it handed to its threads (``reclaimed``,
``ConsumerPool.served_shards``), and waits before it consumes any other:
``SHARD_GRACE`` seconds, then until another process consumes the shard
(its owner took it back, and keeps it: ``balance``), looked at every
``SHARD_LOOK_EVERY`` seconds, or until ``SHARD_OWNER_WAIT``, when the
owner is taken to be gone. A process that reconnects late so keeps its
sockets. A loss of this process alone (``IOThread._shared_loss``) waits
for nothing: the others kept their connections.

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
        self._admin = admin  # the channels the passive declares go on
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
        """Look at the waiting shards at the grace's end, then every
        ``SHARD_LOOK_EVERY`` seconds."""
        if self._timer is None and self._waiting:
            now = time.monotonic()
            at = max(self._grace_ends, now + SHARD_LOOK_EVERY)
            self._timer = self._pool.ioloop.call_later(
                max(0.0, min(at, self._waits_until) - now), self._look
            )

    def _look(self) -> None:
        """Stop waiting for the shards another process consumes (the pool
        then leaves them to it), and for all of them once ``SHARD_OWNER_WAIT``
        is over."""
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
        """What to do with a waiting shard's count: once another process
        consumes it, hand it to the pool, whose declare leaves it to that one."""

        def counted(method: Any, error: Optional[BaseException]) -> None:
            if getattr(method, "consumer_count", 0) and shard in self._waiting and self._pool.ready:
                arguments, polled = self._waiting.pop(shard)
                self._released.add(shard)
                self._pool.consume_shard(shard, arguments, polled)

        return counted
