"""Non-blocking receives: ``basic_get`` through the lanes, in waves.

A queue not used within half its ``x-expires`` lease is declared before its
get, so a 404 is rare; one that happens anyway (a flush) counts as empty. A
message is acked once its caller's ``Pending`` accepts it, else nacked back.
Why waves of lanes: with one lane, bench rows (d) receive-10 and (m) poll-10 fall.

Broker fact: a get renews a queue's ``x-expires`` lease, and so does a
declare, but not on a quorum queue
(``test_quorum_queue_lease_is_not_renewed_by_a_redeclare``).

``Getter`` owns its lanes, requests and empty-queue times; I/O thread only.
"""

import collections
import functools
import itertools
import logging
import operator
import time
from typing import TYPE_CHECKING, Callable, Deque, Dict, List, Optional, Set, Tuple

import pika

from ..consumers import ConsumerPool
from ..deliveries import HandedOff, Liveness
from ..futures import Pending
from ..work import Queues, Work
from .lanes import EMPTY, Answer, Lane, Taken

if TYPE_CHECKING:
    from ..session import Session

logger = logging.getLogger(__name__)

LANES = 16  # basic.get channels, i.e. queues asked at once by one receive
PUSH_WAIT = 0.05  # seconds a poll waits at most for a push on its way (``_after_count``)
# Seconds before a queue found empty is in a first wave again (``Getter``).
RECHECK_EMPTY = 0.01


class Poll(Work):
    """A non-blocking receive, the work of ``Engine.get``: a Delivery from one
    of ``queues``, or None at once."""

    __slots__ = ("queues",)

    def __init__(self, pending: Pending, queues: Queues) -> None:
        super().__init__(pending)
        self.queues = queues

    def __call__(self, session: "Session") -> None:
        session.getter.get(self.pending, self.queues)


class _GetRequest(object):
    __slots__ = (
        "pending",
        "entries",
        "asked",
        "queues",
        "queue_names",
        "index",
        "fresh",
        "outstanding",
        "results",
        "round_trips",
    )

    def __init__(self, pending: Pending, queues: Queues, fresh: int) -> None:
        self.pending = pending
        self.entries = queues  # every (queue, arguments) of the call
        self.asked: Set[str] = set()  # queues asked with basic.get
        self.queues = queues  # those to ask with basic.get, in the order to prefer
        self.queue_names = [q for q, _ in queues]  # all of them, asked or covered
        self.fresh = fresh  # queues[:fresh] were not found empty just now
        self.index = 0  # queues before this one have been asked
        self.outstanding = 0
        self.results: List[Tuple[int, Answer]] = []  # (position in queues, answer) this wave
        self.round_trips = 0  # times it let pushes land

    def leave_out(self, consumed: Callable[[str], bool]) -> None:
        """Ask with ``basic.get`` only the queues not ``consumed``."""
        kept = [(i, entry) for i, entry in enumerate(self.queues) if not consumed(entry[0])]
        self.fresh = sum(1 for i, _ in kept if i < self.fresh)
        self.queues = [entry for _, entry in kept]

    def unasked(self, consumed: Callable[[str], bool]) -> Queues:
        """Queues neither asked nor consumed now (a consumer went meanwhile)."""
        return [e for e in self.entries if e[0] not in self.asked and not consumed(e[0])]

    def ask(self, entries: Queues) -> None:
        self.queues = entries
        self.fresh = len(entries)
        self.index = 0


class Getter(object):
    """Serves non-blocking receives, one request at a time, in waves.

    A wave asks up to ``LANES`` queues at once, one lane each; the first
    queue (in the caller's shuffled order) with a message wins, and the
    others' messages go back with a nack, to the head of their queue. The
    first wave leaves out queues found empty within ``RECHECK_EMPTY``, so
    a busy queue does not cost a get of every quiet one; they are asked
    before the answer is None, and so are pushes let land.
    """

    def __init__(
        self,
        connection: pika.SelectConnection,
        liveness: Liveness,
        handed_off: HandedOff,
        consumers: ConsumerPool,
        lanes: int = LANES,
    ) -> None:
        self._consumers = consumers
        self._polls = consumers.polls
        self._handed_off = handed_off
        self._requests: Deque[_GetRequest] = collections.deque()
        self._current: Optional[_GetRequest] = None
        self._barriers = 0  # barriers not yet passed; no new wave until 0
        self._empty_at: Dict[str, float] = {}  # queue -> monotonic time it last answered empty
        self._lanes = [
            Lane(connection, liveness, handed_off, self._on_lane_ready) for _ in range(lanes)
        ]

    def get(self, pending: Pending, queues: Queues) -> None:
        now = time.monotonic()
        fresh, quiet = [], []
        for entry in queues:
            quiet_since = self._empty_at.get(entry[0])
            if quiet_since is not None and now - quiet_since < RECHECK_EMPTY:
                quiet.append(entry)
            else:
                fresh.append(entry)
        self._requests.append(_GetRequest(pending, fresh + quiet, len(fresh)))
        self._next()

    def _on_lane_ready(self) -> None:
        if self._barriers:
            return
        if self._current is None:
            self._next()
        elif self._current.outstanding == 0:
            self._ask_next_wave()  # it was waiting for a lane

    def _next(self) -> None:
        while self._current is None and not self._barriers and self._requests:
            request = self._requests.popleft()
            if not request.pending.wanted:
                continue
            if self._consumers.hand_over_held(request.pending, request.queue_names):
                continue
            # No basic.get is out now, so consumers may start (``Polls.keep``).
            self._polls.keep(request.queues)
            request.leave_out(self._polls.consumes)
            self._current = request
            self._ask_next_wave()

    def _ask_next_wave(self) -> None:
        request = self._current
        if request is None:  # an invariant, checked under -O too
            raise RuntimeError("request is None: called for the current request")
        if request.index >= len(request.queues):
            self._let_pushes_land(request)
            return
        end = request.fresh if request.index < request.fresh else len(request.queues)
        idle = filter(operator.attrgetter("idle"), self._lanes)
        lanes = list(itertools.islice(idle, end - request.index))
        if not lanes:
            return  # the session is (re)opening channels; _on_lane_ready resumes
        end = request.index + len(lanes)
        wave = list(enumerate(request.queues[request.index : end], request.index))
        request.index = end
        request.outstanding = len(wave)
        request.results = []
        for lane, (position, (queue, arguments)) in zip(lanes, wave):
            request.asked.add(queue)
            lane.fetch(queue, arguments, functools.partial(self._on_answer, request, position))

    def _on_answer(self, request: _GetRequest, position: int, result: Answer) -> None:
        if result is EMPTY:
            if len(self._empty_at) > 4096:  # forget the stale ones: names come and go
                horizon = time.monotonic() - RECHECK_EMPTY
                self._empty_at = {q: t for q, t in self._empty_at.items() if t > horizon}
            self._empty_at[request.queues[position][0]] = time.monotonic()
        else:
            self._empty_at.pop(request.queues[position][0], None)
        request.results.append((position, result))
        request.outstanding -= 1
        if request.outstanding == 0 and request is self._current:
            self._conclude_wave(request)

    def _conclude_wave(self, request: _GetRequest) -> None:
        every_taken = sorted((p, r) for p, r in request.results if isinstance(r, Taken))
        taken = [r for _, r in every_taken if r.still_held]
        errors = [r for _, r in request.results if isinstance(r, Exception)]
        request.results = []
        if taken:
            winner = taken[0]
            if request.pending.resolve(winner.delivery):
                self._handed_off.add(winner.delivery)
                winner.settle(True)
                losers = taken[1:]
            else:
                losers = taken
            put_back = [loser.lane for loser in losers if loser.settle(False)]
        for _, result in every_taken:  # handed out (logged), held, or put back
            self._handed_off.taken(result.delivery)
        if taken:
            self._current = None
            for lane in put_back:
                self._barriers += 1
                lane.barrier(self._barrier_passed)
            self._next()
        elif errors:
            request.pending.fail(errors[0])
            self._done()
        else:
            self._ask_next_wave()

    def _done(self) -> None:
        self._current = None
        self._next()

    def _barrier_passed(self) -> None:
        self._barriers -= 1
        if not self._barriers:
            self._next()

    def _let_pushes_land(self, request: _GetRequest) -> None:
        request.round_trips += 1
        self._polls.let_pushes_land(request.queue_names, lambda: self._after_landing(request))

    def _after_landing(self, request: _GetRequest) -> None:
        """Nothing was in the queues; a consumer may have been pushed one meanwhile."""
        if request is not self._current:
            return  # the connection went: the I/O thread asks again on the next one
        names = request.queue_names
        if self._consumers.hand_over_held(request.pending, names):
            pass
        elif request.round_trips == 1 and self._polls.behind(names):
            behind = self._polls.behind_queues(names)
            self._polls.count_ready(behind, lambda ready: self._after_count(request, behind, ready))
            return
        else:
            missed = request.unasked(self._polls.consumes)
            if missed:
                self._ask_again(request, missed)
                return
            self._polls.checked(names)
            request.pending.resolve(None)
        self._current = None
        self._next()

    def _ask_again(self, request: _GetRequest, missed: Queues) -> None:
        """Ask the queues whose consumer was cancelled during the call."""
        request.ask(missed)
        self._ask_next_wave()

    def _after_count(self, request: _GetRequest, behind: List[str], ready: int) -> None:
        """A consumer is behind (``Polls.behind``) and nothing came: if the broker
        says messages wait, wait ``PUSH_WAIT`` at most for the push; otherwise
        let pushes land once more.
        """
        if request is not self._current:
            return
        if ready and request.pending.wanted and all(map(self._polls.consumes, behind)):
            self._current = None
            self._consumers.await_push(
                request.pending, request.queue_names, time.monotonic() + PUSH_WAIT
            )
            self._next()
        else:
            self._let_pushes_land(request)

    def shutdown(self) -> None:
        for lane in self._lanes:
            lane.shutdown()

    def forget(self) -> None:
        """The connection is gone; the I/O thread retries the requests."""
        for lane in self._lanes:
            lane.forget()
        self._handed_off.forget_taking()
        self._current = None
        self._barriers = 0
        self._requests.clear()

    def fail_all(self, error: BaseException) -> None:
        requests = ([self._current] if self._current else []) + list(self._requests)
        self._current = None
        self._barriers = 0
        self._requests.clear()
        for request in requests:
            request.pending.fail(error)
