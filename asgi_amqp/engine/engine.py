"""``Engine``, the layer's one door to the broker, and ``InFlight``.

``Engine`` hands the layer's requests to the I/O thread, waits for the
answers with a timeout, and starts and stops the threads.
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
    """This process's id and a module lock, both renewed in every forked child
    (os.register_at_fork): every call asks which process it runs in, without a
    system call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def renew(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()


_fork_guard = _ForkGuard()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fork_guard.renew)


# exchange, routing key, body, properties, mandatory, what (for errors)
PublishRequest = Tuple[str, str, bytes, pika.BasicProperties, bool, str]


class Engine(object):
    """The I/O thread and the dead-letter worker of one layer, in this process.

    Both start on first use: a layer made in a Django settings module must not
    start threads in a process that then forks (gunicorn). A forked child
    starts its own; a thread that died is replaced on the next call.
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
        # The management API's bindings to an exchange, for the dead-letter worker.
        self._bindings_to = bindings_to
        # The dead-letter worker's names, and ``explain_mismatch`` for ``declare``.
        self._topology = topology
        # The calling thread's kind (``callers``): how long it may wait.
        self._caller = caller
        self.operation_timeout = operation_timeout
        # Seconds a process waits for its first connection (``io.thread``).
        self._first_connect_timeout = first_connect_timeout
        self._consumers = consumers
        self._run_worker = dead_letter_worker
        self._start_lock = threading.Lock()
        self._lock_pid = _fork_guard.pid  # the process whose threads can hold _start_lock
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
        if io is not None and self._pid == _fork_guard.pid and io.alive:
            return io
        with self._lock_of_this_process():
            if self._closed:  # closed while this caller was on its way here
                raise LayerClosed("the layer is closed")
            if self._io is None or self._pid != _fork_guard.pid:
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
        """The start lock, new in a forked child, where one held at fork time stays held.

        Replaced under ``_fork_guard``'s lock, itself new in every child: two
        first callers must share one lock, or each starts an I/O thread.
        """
        if self._lock_pid != _fork_guard.pid:
            with _fork_guard.lock:
                if self._lock_pid != _fork_guard.pid:
                    self._start_lock = threading.Lock()
                    self._lock_pid = _fork_guard.pid
        return self._start_lock

    def _start_threads(self) -> None:
        self._handed_off = HandedOff()  # per process: a forked child starts empty
        io = self._new_io_thread()
        worker = self._new_worker() if self._run_worker else None
        # Published only once running: other threads take the fast path above.
        self._io, self._worker, self._pid = io, worker, _fork_guard.pid

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
        return self._pid == _fork_guard.pid

    def threads(self) -> List[threading.Thread]:
        """The threads this engine runs in this process."""
        found = []
        for part in (self._io, self._worker):
            if part is not None and self.started_here and part._thread is not None:
                found.append(part._thread)
        return found

    def close(self) -> None:
        """Stop both threads; every later call raises ``LayerClosed``. Marked closed under
        the start lock, so a racing caller starts no new I/O thread."""
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
        caller: Optional[Caller] = None,
    ) -> str:
        """Publish and wait for the broker's answer: ``ACKED``, ``NACKED`` or ``RETURNED``.

        While an alarm lasts, a caller's thread waits up to ``alarm_wait`` seconds
        for it to clear and publishes again, then raises ``BrokerBlocked``: a
        Channels 1.x worker that raised at once would die of it. daphne's reactor
        thread (``Caller.REACTOR``) raises at once, or every connection of daphne
        would freeze; daphne answers 503, or closes the socket with 1013.

        ``marked``: a possible copy, which its reader drops if it has the original.
        ``parks``, on daphne's reactor thread: if the broker goes away during the
        wait, the publish is given up and ``PARKED`` returned (``parked_sends``).
        ``caller``: the calling thread's kind, if the caller knows it already.
        """
        if caller is None:
            caller = self._caller()
        deadline = None  # set at the first block: nothing extra on the usual path
        while True:
            publish = Publish(Pending(what), exchange, routing_key, body, properties, mandatory)
            publish.maybe_delivered = marked
            try:
                if parks:
                    return self._publish_or_park(publish)
                return self._submit_and_wait(publish, None, caller)
            except BrokerBlocked:
                if caller is Caller.REACTOR:
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

        Outages do not end it (carry over); ``marked`` as in ``publish``."""
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
        """Submit many publishes at once; ``InFlight.outcome`` waits for each later.

        One wake-up for the lot and one stream of confirms: the caller pays the
        round trip once per window, not once per message.
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

        A queue that exists with other settings raises ``QueueSettingsMismatch``
        naming them; any other refusal raises as it came."""
        try:
            return self._submit_and_wait(Declare(Pending(what), steps))
        except BrokerOperationError as exc:
            raise settings_mismatch(exc, self._topology.explain_mismatch) from None

    def get(self, queues: Queues) -> Optional[Delivery]:
        """A delivery from one of ``queues`` at once, or None: never waits for one.

        While the broker is away, None at once (daphne's reactor thread must not
        wait for a reconnect), except on a worker thread (``_ride_out``). Before
        the first connection, it waits only while no attempt has failed.
        """
        io = self._running_io()
        # Channels' enforce_ordering empties a socket's wait channel with a
        # worker's poll: a frame it missed in an outage stalls that socket.
        caller = self._caller()
        worker = caller is Caller.WORKER
        if io.outage() and not worker:
            return None
        poll = Poll(Pending("receive"), queues)
        if io.connected or worker:
            return self._submit_and_wait(poll, io, caller)
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

        The caller waits past the I/O thread's deadline only while connected. No
        outage raises, however long: ASGI lets a blocking receive return nothing,
        and Channels' worker loop catches nothing, so an exception would end the
        runworker the layer reconnects for. An outage past ``operation_timeout``,
        or the wait for a first connection, is logged once.
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
        """Wait for an alarm to clear, up to ``deadline`` (monotonic); True once none lasts."""
        io = self._running_io()
        return io.alarms.unblocked.wait(max(0.0, deadline - time.monotonic()))

    def asked(self, queues: Queues) -> None:
        """A blocking receive asks for ``queues`` (held messages may serve it);
        the thread's last frame is done."""
        self._running_io().asked(queues)

    def take_held(self, queues: Sequence[str]) -> Optional[Delivery]:
        """A held message for one of ``queues``, or None, taken in the caller's thread."""
        return self._running_io().take_pushed(queues)

    def forget_queues(self) -> None:
        """Forget which queues are known to exist (they were just deleted)."""
        self._submit_and_wait(ForgetQueues(Pending("flush caches")))

    def _submit_and_wait(
        self, work: Work, io: Optional[IOThread] = None, caller: Optional[Caller] = None
    ) -> Any:
        """Hand ``work`` to the I/O thread and wait up to ``operation_timeout``: only an
        outage that outlasts it raises, and not on a worker thread (``_ride_out``).
        ``io`` and ``caller``: what the calling method looked up already."""
        if io is None:
            io = self._running_io()
        io.submit(work)
        pending = work.pending
        timeout = self.operation_timeout
        if caller is None:
            caller = self._caller()
        if caller is Caller.WORKER:
            if self._ride_out(io, pending):
                return pending.answer()
            timeout = 0.0  # it has waited already: the result, or the error now
        elif caller is Caller.REACTOR:  # not through an outage
            if wait_while_reachable(io, pending, timeout):
                return pending.answer()
            if io.outage() and pending.abandon():
                raise unreachable(io, pending.description, "it was not done")
            timeout = 0.0
        try:
            return pending.result(timeout)
        except OperationTimeout as exc:
            raise self._outage_error(io, pending.description) or exc

    def _ride_out(self, io: IOThread, pending: Pending) -> bool:
        """On a worker thread, wait for ``pending`` as long as the broker is away:
        True once it arrived.

        Channels 1.x sends a consumer's replies in a ``finally`` and catches
        nothing around it, so an ``OperationTimeout`` there would end a runworker
        that outlived the outage. ``operation_timeout`` counts only while
        connected; the outage is logged once, at WARNING.
        """
        deadline = time.monotonic() + self.operation_timeout
        while not pending.arrived(min(1.0, deadline - time.monotonic())):
            if self._closed or not io.alive:
                return False
            if io.outage() > self.operation_timeout:
                self._outage_notice.once(io, "%s waits for it" % pending.description)
            if io.outage():
                deadline = time.monotonic() + self.operation_timeout
            elif time.monotonic() >= deadline:
                return False
        return True

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
    """Publishes submitted together by ``Engine.start_publishes``."""

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
        """``ACKED``, ``NACKED`` or ``RETURNED`` for publish ``index``, waiting until
        ``deadline`` (monotonic) at most; then ``OperationTimeout``, naming any
        outage, and the publish is not sent late if it had not left."""
        pending = self._publishes[index].pending
        try:
            return pending.result(max(0.0, deadline - time.monotonic()))
        except OperationTimeout:
            raise self._engine._outage_error(self._io, pending.description) or OperationTimeout(
                "%s: no answer from the broker within %.1f s"
                % (pending.description, self._engine.operation_timeout)
            ) from None
