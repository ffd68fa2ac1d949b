"""Group messages for process-local members: the process copies them itself.

A process-local channel ``foo!bar`` is read through its process's queue ``q:foo!``,
and its membership is a binding to the member exchange ``m:foo!`` bound to that
queue, so a group message reaches the queue once and this object makes one copy
per member. Broker facts (tests/test_memberships_are_bindings.py):

* a message routed to one queue through several bindings is delivered once
  (``test_a_group_message_reaches_a_process_queue_once_for_all_its_members``);
* a notice confirmed before ``group_add`` returns is queued ahead of any group
  message sent after it, quorum queues included
  (``test_a_receive_right_after_send_group_sees_it_with_quorum_queues``).

Members come from notices in that queue: a join notice (with the lease's end)
before ``group_add`` binds, a leave notice beside ``group_discard``'s unbinds; a
member counts until the end its latest join notice named. Copies wait here for a
receive of their queue, ``expiry`` seconds and the channel's capacity at most
(ASGI: ``send_group`` never fails for one member). One layer instance reads a
process-local queue, as daphne does: two would split the notices.

State: ``_members`` and ``_waiting`` belong to this object, shared by the
callers' threads under ``_lock``; nothing here runs on the I/O thread.
"""

import collections
import enum
import logging
import random
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Literal, Mapping, Optional, Tuple, Union

from . import naming

logger = logging.getLogger(__name__)

# A copy waiting for a receive: (channel, body, give up at (the clock's s)).
_Copy = Tuple[str, bytes, float]


class _Notice(enum.Enum):
    """What ``members_of`` says of a notice: applied, nothing to hand out."""

    NOTICE = "notice"


NOTICE = _Notice.NOTICE
# members_of's answer: None, the member channels, or NOTICE.
Members = Union[None, List[str], Literal[_Notice.NOTICE]]


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf8", "replace")
    return value if isinstance(value, str) else ""


class LocalGroups(object):
    """Process-local members, by queue and group, and the copies waiting for them."""

    def __init__(
        self,
        topology: naming.Topology,
        capacity_for: Callable[[str], int],
        on_full: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._topology = topology
        self._capacity_for = capacity_for
        self._on_full = on_full  # counts a copy a full member missed (thread-safe)
        self._clock = clock
        self._lock = threading.Lock()
        # (queue, group) -> {member channel: its lease's end (s since the epoch)}
        self._members: Dict[Tuple[str, str], Dict[str, float]] = {}
        # queue -> copies of group messages waiting for a receive, oldest first
        self._waiting: Dict[str, Deque[_Copy]] = {}
        self._waiting_for: "collections.Counter[str]" = collections.Counter()  # by channel

    # -- what arrives through a process-local queue ---------------------------

    def members_of(self, queue: str, headers: Mapping[str, Any]) -> Members:
        """For a delivery from a process-local ``queue``: ``NOTICE`` for a notice (applied
        here), the member channels for a group message (maybe none: they left), else None."""
        kind = _text(headers.get(naming.KIND_HEADER))
        if kind in naming.NOTICE_KINDS:
            self._apply(queue, kind, headers)
            return NOTICE
        group = _text(headers.get(naming.GROUP_HEADER))
        if not group or naming.CHANNEL_HEADER in headers:
            return None
        return self._current(queue, group)

    def _apply(self, queue: str, kind: str, headers: Mapping[str, Any]) -> None:
        group = _text(headers.get(naming.GROUP_HEADER))
        member = _text(headers.get(naming.MEMBER_HEADER))
        if kind == naming.DROP_KIND and member:
            self._drop(queue, member)
            return
        if not group or not member:
            logger.warning("a %s notice in %s names no group or member; ignored", kind, queue)
            return
        with self._lock:
            members = self._members.setdefault((queue, group), {})
            if kind == naming.JOIN_KIND:
                ends = headers.get(naming.LEASE_ENDS_HEADER)
                ends_at = ends / 1000.0 if isinstance(ends, int) else 0.0
                members[member] = max(members.get(member, 0.0), ends_at)
            else:
                members.pop(member, None)
            if not members:
                del self._members[(queue, group)]

    def _drop(self, queue: str, member: str) -> None:
        """A message of ``member`` expired unread: it leaves every group."""
        with self._lock:
            for key in [key for key in self._members if key[0] == queue]:
                members = self._members[key]
                members.pop(member, None)
                if not members:
                    del self._members[key]

    def _current(self, queue: str, group: str) -> List[str]:
        now = self._clock()
        with self._lock:
            members = self._members.get((queue, group))
            if not members:
                return []
            ended = [member for member, ends in members.items() if ends <= now]
            for member in ended:
                del members[member]
            if not members:
                del self._members[(queue, group)]
            return sorted(members)

    # -- copies ---------------------------------------------------------------

    def keep(self, queue: str, channels: List[str], body: bytes) -> None:
        """Keep a copy of ``body`` for each of ``channels`` until a receive takes it."""
        if not channels:
            return
        until = self._clock() + self._topology.expiry
        full = []
        with self._lock:
            waiting = self._waiting.setdefault(queue, collections.deque())
            for channel in channels:
                if self._waiting_for[channel] >= self._capacity_for(channel):
                    full.append(channel)
                    continue
                waiting.append((channel, body, until))
                self._waiting_for[channel] += 1
        for channel in full:  # as for a member's full queue (groups.py)
            self._on_full()
            logger.warning("send_group: %s is full: the group message is dropped for it", channel)

    @property
    def waiting(self) -> bool:
        """Whether any copy waits (read without the lock: a copy kept now is seen next call)."""
        return bool(self._waiting)

    def take(self, queues: Tuple[str, ...]) -> Optional[Tuple[str, str, bytes]]:
        """``(queue, channel, body)`` of the oldest copy waiting for one of ``queues``,
        tried in random order, so that no queue starves another."""
        if not self._waiting:
            return None
        now = self._clock()
        with self._lock:
            for queue in random.sample(queues, len(queues)) if len(queues) > 1 else queues:
                waiting = self._waiting.get(queue)
                while waiting:
                    channel, body, until = waiting.popleft()
                    self._waiting_for[channel] -= 1
                    if self._waiting_for[channel] <= 0:
                        del self._waiting_for[channel]
                    if until > now:
                        if not waiting:
                            del self._waiting[queue]
                        return queue, channel, body
                    logger.debug("group message copy for %s expired unread", channel)
                if waiting is not None:
                    self._waiting.pop(queue, None)
        return None

    def forget(self) -> None:
        """``flush``: the members and copies of every queue go."""
        with self._lock:
            self._members.clear()
            self._waiting.clear()
            self._waiting_for.clear()
