"""``Engine``, the layer's one door to the broker, and ``InFlight``.

The layer says what it wants (publish this, run these declares, get or
wait for a delivery from these queues); ``Engine`` hands it to the I/O
thread and waits for the answer with a timeout, and starts and stops the
threads. The package's ``__init__`` says what each other module holds.
"""

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pika

from ..callers import Caller
from ..errors import (
    BrokerBlocked,
    BrokerOperationError,
    LayerClosed,
    OperationTimeout,
    settings_mismatch,
)
from ..naming import Topology
from .consumers import THREADS_WINDOW, ConsumerSettings
from .consumers.pool import BlockingReceive
from .deadletter import DeadLetterWorker
from .declares import Declare, Step
from .deliveries import Delivery, ForgetQueues, HandedOff
from .futures import OnDone, Pending
from .getter.waves import Poll
from .io import IOThread
from .outages import PARKED, OutageNotice, unreachable, wait_while_reachable
from .publisher import Publish
from .work import Pause, Queues, Work

logger = logging.getLogger(__name__)


class _ForkGuard(object):
    """A module lock that every forked child gets afresh (os.register_at_fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def renew(self) -> None:
        self.lock = threading.Lock()


_fork_guard = _ForkGuard()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_guard.renew)


# exchange, routing key, body, properties, mandatory, what (for errors)
PublishRequest = Tuple[str, str, bytes, pika.BasicProperties, bool, str]


class Engine(object):
    """The I/O thread and the dead-letter worker of one layer, in this process.

    Both start on first use, not in ``__init__``: a layer made in a Django
    settings module must not start threads in a process that then forks
    (gunicorn, ``runworker`` under a supervisor). A forked child starts its
    own, and a thread that died is replaced on the next call.
    """

    def __init__(
        self,
        parameters: Sequence[pika.connection.Parameters],
        topology: Topology,
        *,
        operation_timeout: float,
        consumers: ConsumerSettings,
        first_connect_timeout: float = 0.0,
        dead_letter_worker: bool = True,
        bindings_to: Optional[Callable[[str], List[Dict[str, Any]]]] = None,
        caller: Callable[[], Caller] = lambda: Caller.PLAIN,
    ) -> None:
        self._parameters = list(parameters)
        # The management API's bindings to an exchange, for the dead-letter
        # worker (see DeadLetterWorker); None without one.
        self._bindings_to = bindings_to
        # The layer's ``naming.Topology``: the dead-letter worker's names, and
        # ``explain_mismatch`` for a declare the broker refused (``declare``).
        self._topology = topology
        # The calling thread's kind (``callers``), which says how long it may
        # wait; asked on callers' threads by ``publish`` once an alarm blocks
        # it, and by ``_submit_and_wait``.
        self._caller = caller
        self.operation_timeout = operation_timeout
        # Seconds a process waits for its first connection (io.thread says how).
        self._first_connect_timeout = first_connect_timeout
        self._consumers = consumers
        self._run_worker = dead_letter_worker
        self._start_lock = threading.Lock()
        self._lock_pid = os.getpid()  # the process whose threads can hold _start_lock
        self._pid: Optional[int] = None
        self._io: Optional[IOThread] = None
        self._worker: Optional[DeadLetterWorker] = None
        self._handed_off = HandedOff()
        self._closed = False
        self._receivers: Dict[int, float] = {}  # thread -> its last blocking receive
        self._receivers_pruned = 0.0
        self._outage_notice = OutageNotice()  # any caller thread; a lock inside

    # -- lifecycle ------------------------------------------------------------

    def _running_io(self) -> IOThread:
        """The I/O thread: started on first use, in a forked child, and after a crash."""
        if self._closed:
            raise LayerClosed("the layer is closed")
        io = self._io
        if io is not None and self._pid == os.getpid() and io.alive:
            return io
        with self._lock_of_this_process():
            if self._closed:  # closed while this caller was on its way here
                raise LayerClosed("the layer is closed")
            if self._io is None or self._pid != os.getpid():
                # In a forked child the parent's threads do not exist and its
                # sockets must not be touched: start afresh.
                self._start_threads()
            elif not self._io.alive:
                logger.error("the I/O thread died; starting a new one")
                self._io = self._new_io_thread()
            if self._worker is not None and not self._worker.alive and not self._closed:
                logger.error("the dead-letter worker died; starting a new one")
                self._worker = self._new_worker()
            io = self._io
            if io is None:  # _start_threads always sets it; never under -O either
                raise RuntimeError("the I/O thread could not be started")
            return io

    def _lock_of_this_process(self) -> threading.Lock:
        """The start lock, new in a forked child.

        A lock held by some thread of the parent at fork time stays held
        forever in the child, which has only the forking thread. The lock is
        replaced once per process, under a module lock that is itself new
        in every child: two first callers racing here must share one lock,
        or each starts an I/O thread and one pair is never stopped.
        """
        if self._lock_pid != os.getpid():
            with _fork_guard.lock:
                if self._lock_pid != os.getpid():
                    self._start_lock = threading.Lock()
                    self._lock_pid = os.getpid()
        return self._start_lock

    def _start_threads(self) -> None:
        self._handed_off = HandedOff()  # per process: a forked child starts empty
        io = self._new_io_thread()
        worker = self._new_worker() if self._run_worker else None
        # Published only once running: other threads take the fast path above.
        self._io, self._worker, self._pid = io, worker, os.getpid()

    def _new_io_thread(self) -> IOThread:
        io = IOThread(
            self._parameters,
            consumer_settings=self._consumers,
            handed_off=self._handed_off,
            first_connect_timeout=self._first_connect_timeout,
        )
        io.start()
        return io

    def _new_worker(self) -> DeadLetterWorker:
        worker = DeadLetterWorker(self._parameters, self._topology, bindings_to=self._bindings_to)
        worker.start()
        return worker

    @property
    def started_here(self) -> bool:
        """Whether this process started the threads (a forked child has not yet)."""
        return self._pid == os.getpid()

    def threads(self) -> List[threading.Thread]:
        """The threads this engine runs in this process."""
        found = []
        for part in (self._io, self._worker):
            if part is not None and self.started_here and part._thread is not None:
                found.append(part._thread)
        return found

    def close(self) -> None:
        """Stop both threads; every later call raises ``LayerClosed``.

        Marked closed under the start lock, so that a caller racing the
        close cannot start a new I/O thread after the old one stopped.
        """
        if not self.started_here:  # never started here (a forked child's lock may be held)
            self._closed = True
            return
        with self._start_lock:
            self._closed = True
        io, worker = self._io, self._worker
        if worker is not None:
            worker.stop()
        if io is not None:
            io.stop()

    # -- operations -------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        mandatory: bool,
        what: str,
        marked: bool = False,
        *,
        alarm_wait: float,
        parks: bool = False,
    ) -> str:
        """Publish and wait for the broker's answer: ``ACKED``, ``NACKED`` or ``RETURNED``.

        While a resource alarm blocks publishing, a caller's thread waits for
        it to clear, ``alarm_wait`` seconds at most (the caller's
        ``operation_timeout``), and then publishes again; after that,
        ``BrokerBlocked``. A Channels worker that raised at once would die
        of it (Channels 1.x retries a full channel for 2 s in
        ``send_and_flush``, then raises). daphne's reactor thread must not
        wait (every connection of daphne would freeze): there
        (``Caller.REACTOR``) ``BrokerBlocked`` is raised at once, and daphne
        answers 503 or closes the socket with 1013, "try again later".
        ``marked``: sent as a possible copy (its reader drops it if it has
        the original).

        ``parks``, for a send on daphne's reactor thread: when the broker
        goes away during the wait, the publish is given up and ``PARKED``
        returned at once; the caller parks a marked copy of it
        (``parked_sends`` says why).
        """
        deadline = None  # set at the first block: nothing extra on the usual path
        while True:
            publish = Publish(Pending(what), exchange, routing_key, body, properties, mandatory)
            publish.maybe_delivered = marked
            try:
                if parks:
                    return self._publish_or_park(publish)
                return self._submit_and_wait(publish)
            except BrokerBlocked:
                if self._caller() is Caller.REACTOR:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + alarm_wait
                if not self.wait_unblocked(deadline):
                    raise
                # One in flight when the alarm began may still be delivered:
                # the copy is marked, so its reader drops it if it has both.
                marked = True

    def _publish_or_park(self, publish: Publish) -> str:
        """The outcome within a round trip, or ``PARKED`` once the broker went away."""
        io = self._running_io()
        pending = publish.pending
        io.submit(publish)
        if not wait_while_reachable(io, pending, self.operation_timeout) and io.outage():
            if pending.abandon():  # given up: the caller parks a marked copy
                return PARKED
        outcome: str = pending.result(0.0)  # or OperationTimeout: connected, no answer
        return outcome

    def broker_away(self) -> bool:
        """Whether the I/O thread has lost its connection and not made a new one."""
        io = self._io
        return io is not None and self.started_here and io.outage() > 0

    def submit_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        what: str,
        on_done: OnDone,
        marked: bool = False,
    ) -> None:
        """Publish (mandatory) without waiting: ``on_done(outcome, error)`` on the I/O thread.

        It waits through outages, carried to the next connection; ``marked``
        sends it as a copy its reader drops if it has the original."""
        publish = Publish(Pending(what, on_done), exchange, routing_key, body, properties, True)
        publish.maybe_delivered = marked
        self._running_io().submit(publish)

    def submit_pause(self, seconds: float, on_done: OnDone) -> None:
        """``on_done(None, None)`` on the I/O thread, ``seconds`` from now."""
        self._running_io().submit(Pause(Pending("pause", on_done), seconds))

    def submit_declare(self, steps: Sequence[Step], what: str, on_done: OnDone) -> None:
        """Run topology steps without waiting: ``on_done(frame, error)`` on the I/O thread."""
        self._running_io().submit(Declare(Pending(what, on_done), steps))

    def start_publishes(self, requests: Sequence[PublishRequest]) -> "InFlight":
        """Hand many publishes to the I/O thread at once; wait for them later.

        One hand-off and one wake-up for the lot, and the broker confirms
        them in one stream, so a caller pays the round trip once per window
        instead of once per message. ``InFlight.outcome`` gives each answer.
        """
        publishes = [
            Publish(Pending(what), exchange, routing_key, body, properties, mandatory)
            for exchange, routing_key, body, properties, mandatory, what in requests
        ]
        io = self._running_io()
        io.submit_many(publishes)
        return InFlight(self, io, publishes)

    def declare(self, steps: Sequence[Step], what: str) -> Any:
        """Run topology steps in order; the result is the last step's frame.

        A queue that exists with other settings raises
        ``QueueSettingsMismatch``, which names them (``errors.settings_mismatch``
        with the topology's ``explain_mismatch``); any other refusal raises
        as it came."""
        try:
            return self._submit_and_wait(Declare(Pending(what), steps))
        except BrokerOperationError as exc:
            raise settings_mismatch(exc, self._topology.explain_mismatch) from None

    def get(self, queues: Queues) -> Optional[Delivery]:
        """A delivery from one of ``queues`` at once, or None: never waits for one.

        While the broker is unreachable there is nothing to get: None at
        once, without waiting for the connection to come back (a poll made
        on daphne's reactor thread must not wait for a reconnect), but for
        a worker thread, which waits for it (``_ride_out``). Before the
        first connection the poll waits only while no attempt has failed:
        a broker that is not up yet has nothing to get either.
        """
        io = self._running_io()
        # Channels' enforce_ordering empties a socket's wait channel with a
        # worker's poll: a frame it missed in an outage stalls that socket.
        worker = self._caller() is Caller.WORKER
        if io.outage() and not worker:
            return None
        poll = Poll(Pending("receive"), queues)
        if io.connected or worker:
            return self._submit_and_wait(poll)
        io.submit(poll)
        pending = poll.pending
        if not wait_while_reachable(io, pending, self.operation_timeout):
            if io.outage() and pending.abandon():
                return None
        try:
            return pending.result(0.0)
        except OperationTimeout as exc:
            raise self._outage_error(io, pending.description) or exc

    def wait(self, queues: Queues, receive_timeout: float) -> Optional[Delivery]:
        """A delivery from one of ``queues``, or None after ``receive_timeout``.

        The I/O thread answers None at the deadline; the caller waits a
        little longer only while the connection is up (an I/O thread that
        is slow to answer). While the broker is away nothing is waited for
        beyond the receive's own limit, and no outage raises, however long:
        an ASGI blocking receive may return nothing at any time, and
        Channels' worker loop catches nothing, so an exception here would
        end the runworker that the layer is reconnecting for. An outage
        longer than ``operation_timeout`` is logged once, at WARNING; so is
        the wait for a first connection, at once.
        """
        deadline = time.monotonic() + receive_timeout
        pending = Pending("blocking receive")
        io = self._running_io()
        io.submit(BlockingReceive(pending, queues, deadline, self._receiving_threads()))
        if not pending.arrived(receive_timeout + 0.05) and io.outage() and pending.abandon():
            delivery = None
        else:
            delivery = pending.result_or(self.operation_timeout, None)
        if delivery is None and (
            io.outage() > self.operation_timeout or io.awaiting_first_connection
        ):
            self._outage_notice.once(io, "blocking receives return nothing until it is back")
        return delivery

    def _receiving_threads(self) -> int:
        """Threads that made a blocking receive in the last ``THREADS_WINDOW`` s,
        this one included: the consumers' prefetch window follows it."""
        now = time.monotonic()
        receivers = self._receivers
        receivers[threading.get_ident()] = now
        if len(receivers) > 1 and now - self._receivers_pruned > 1.0:
            self._receivers_pruned = now
            self._receivers = {
                ident: seen
                for ident, seen in list(receivers.items())
                if now - seen < THREADS_WINDOW
            }
        return len(receivers)

    def wait_unblocked(self, deadline: float) -> bool:
        """Wait until the broker no longer blocks publishing (a resource alarm),
        at most until ``deadline`` (``time.monotonic()``); True once it does not."""
        io = self._running_io()
        return io.alarms.unblocked.wait(max(0.0, deadline - time.monotonic()))

    def asked(self, queues: Queues) -> None:
        """A blocking receive asks for ``queues``, whether or not held messages
        serve it; the frame the thread handled before is done."""
        self._running_io().asked(queues)

    def handling(self, shard: str) -> None:
        """The calling thread was handed a frame of ``shard``: it stays here
        until the thread's next blocking receive."""
        self._running_io().handling(shard)

    def take_held(self, queues: Sequence[str]) -> Optional[Delivery]:
        """A delivery already pushed to this process for one of ``queues``, or None.

        Runs in the caller's thread, with no trip through the I/O thread.
        """
        return self._running_io().take_pushed(queues)

    def forget_queues(self) -> None:
        """Forget which queues are known to exist (they were just deleted)."""
        self._submit_and_wait(ForgetQueues(Pending("flush caches")))

    def _submit_and_wait(self, work: Work) -> Any:
        """Hand ``work`` to the I/O thread and wait up to ``operation_timeout``.

        A connection lost meanwhile is not an error: the I/O thread runs
        the work again on the next one. Only an outage that outlasts the
        timeout reaches the caller, named as such, and not even that on a
        worker thread (``_ride_out``).
        """
        io = self._running_io()
        io.submit(work)
        pending = work.pending
        timeout = self.operation_timeout
        caller = self._caller()
        if caller is Caller.WORKER:
            self._ride_out(io, pending)
            timeout = 0.0  # it has waited already: the result, or the error now
        elif caller is Caller.REACTOR:  # not through an outage
            if not wait_while_reachable(io, pending, timeout) and io.outage() and pending.abandon():
                raise unreachable(io, pending.description, "it was not done")
            timeout = 0.0
        try:
            return pending.result(timeout)
        except OperationTimeout as exc:
            raise self._outage_error(io, pending.description) or exc

    def _ride_out(self, io: IOThread, pending: Pending) -> None:
        """On a worker thread, wait for ``pending`` as long as the broker is away.

        A worker thread is one that has made a blocking receive: a Channels
        runworker's. Channels 1.x sends a consumer's queued replies in a
        ``finally`` (``send_and_flush``) and catches nothing around it, so
        an ``OperationTimeout`` from a send there ends the process, which
        outlived the outage only to die of it. So for such a thread, an
        outage extends the wait, checked every second, until the broker
        answers (the work goes out on the new connection) or the layer is
        closed, and ``operation_timeout`` counts only while connected. The
        outage
        is logged once, at WARNING. A broker that is connected but does
        not answer still times out after ``operation_timeout``, as on any
        other thread (counted from the end of the outage, if there was one).
        """
        deadline = time.monotonic() + self.operation_timeout
        while not pending.arrived(min(1.0, deadline - time.monotonic())):
            if self._closed or not io.alive:
                return
            if io.outage() > self.operation_timeout:
                self._outage_notice.once(io, "%s waits for it" % pending.description)
            if io.outage():
                deadline = time.monotonic() + self.operation_timeout
            elif time.monotonic() >= deadline:
                return

    @staticmethod
    def _outage_error(io: IOThread, what: str) -> Optional[OperationTimeout]:
        """The error for a call that failed while the broker was unreachable, or None."""
        outage = io.outage()
        if not outage:
            return None
        return OperationTimeout(
            "%s: the broker has been unreachable for %.1f s (%s); the layer keeps "
            "reconnecting" % (what, outage, io.last_error_text or "connection lost")
        )

    # -- figures ----------------------------------------------------------------

    def connection_statistics(self) -> Dict[str, Any]:
        """This process's view of its connection (see the layer's method)."""
        io = self._io if self.started_here else None
        if io is None:
            return {
                "connected": False,
                "outage_seconds": 0.0,
                "connection_losses": 0,
                "retried_operations": 0,
                "republished": 0,
                "last_error": None,
                "blocked": False,
                "blocked_reason": None,
            }
        return {
            "connected": io.connected,
            "outage_seconds": io.outage(),
            "connection_losses": io.connection_losses,
            "retried_operations": io.retried,
            "republished": io.republished,
            "last_error": io.last_error_text,
            "blocked": io.alarms.blocked is not None,
            "blocked_reason": io.alarms.blocked,
        }


class InFlight(object):
    """Publishes handed over together by ``Engine.start_publishes``."""

    def __init__(self, engine: Engine, io: IOThread, publishes: List[Publish]) -> None:
        self._engine = engine
        self._io = io
        self._publishes = publishes

    def __len__(self) -> int:
        return len(self._publishes)

    def answered(self, index: int) -> bool:
        """True once publish ``index`` has its outcome (or its error): no wait."""
        return self._publishes[index].pending.arrived(0)

    def written(self, index: int) -> bool:
        """False if publish ``index`` was never written to a channel, and never
        will be once its ``outcome`` returned or raised: the broker cannot have it."""
        return self._publishes[index].written

    def outcome(self, index: int, deadline: float) -> str:
        """``ACKED``, ``NACKED`` or ``RETURNED`` for publish ``index``.

        Waits until ``deadline`` (monotonic) at most, then raises
        ``OperationTimeout``, naming the outage if the broker is away. A
        publish given up on that way is not sent late if it had not left.
        """
        pending = self._publishes[index].pending
        try:
            return pending.result(max(0.0, deadline - time.monotonic()))
        except OperationTimeout:
            raise self._engine._outage_error(self._io, pending.description) or OperationTimeout(
                "%s: no answer from the broker within %.1f s"
                % (pending.description, self._engine.operation_timeout)
            ) from None
