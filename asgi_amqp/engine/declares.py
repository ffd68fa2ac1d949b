"""Topology operations (declare, bind, unbind, delete): one round trip each.

An operation is a list of ``Step``s, each one AMQP RPC. Steps are written as
plain data (see ``steps`` below) so that the layer states its intent, e.g.
"declare the group exchange, declare the member exchange, bind them", and
this executor alone deals with callbacks and channel errors.

Why pipelined. A ``group_add`` is several RPCs; run one after another, the
caller paid a broker round trip each. The broker runs a channel's methods in
the order they arrive, so steps go out with ``nowait`` (pika sends them so
when given no callback) and the caller waits for the answer of the step that
ends the run: when it comes, every step before it has succeeded. AMQP 0-9-1
gives ``queue.unbind`` no ``nowait``, and pika holds every later call of the
channel until its answer: the layer never unbinds a queue in a run (a
membership's binding goes to an exchange, see ``naming``).

What ``nowait`` costs besides the answer. A ``queue.declare`` sent with
``nowait`` does not renew the queue's ``x-expires`` lease
(``tests/test_group_renewal.py``), and the layer renews channel queues by
declaring them again: so every ``queue_declare`` step is answered, and ends
a run of nowait steps.

Why a careful pass. A ``nowait`` step that fails closes the channel and says
only the reply code and text, not which step it was; the steps after it are
dropped by the broker. So an operation whose pipelined pass failed runs again
from its first step, one step at a time (every step is idempotent), which
finds the step that fails and applies that step's rules: a 404 is fine for
deleting or unbinding something already gone; anything else fails the
operation, with an error that names the step and its object.

Why several admin channels. A channel runs its operations one after
another, so ``AdminChannels`` gives each operation to the least busy of up
to 8 channels, opening one only when every open one is busy: ``group_add``
calls from several threads overlap instead of queueing (docs/benchmarks.rst,
"Measurements behind the code").
"""

import collections
import logging
from typing import TYPE_CHECKING, Any, Deque, Dict, NamedTuple, Optional, Sequence

import pika
import pika.exceptions

from ..errors import BrokerConnectionError, BrokerOperationError
from .futures import Pending
from .reopening_channel import ReopeningChannel
from .work import Work

if TYPE_CHECKING:
    from .session import Session

logger = logging.getLogger(__name__)

# Admin channels per connection at most (see ``AdminChannels``).
ADMIN_CHANNELS = 8
NOT_FOUND = 404
STATE_ERRORS = (
    pika.exceptions.ConnectionWrongStateError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ChannelClosed,
    pika.exceptions.ConnectionClosed,
    pika.exceptions.DuplicateGetOkCallback,
)


class Step(NamedTuple):
    """One RPC on a pika channel: ``getattr(channel, method)(callback=..., **kwargs)``.

    A step is data the layer states (``groups.py`` builds lists of them),
    so it names its RPC rather than holding a bound method of a channel
    that does not exist yet. ``answered``: never sent with ``nowait``; the
    broker does what the step is for only when it answers it (a re-declare
    renews a queue's lease).
    """

    method: str
    kwargs: Dict[str, Any]
    not_found_ok: bool
    answered: bool = False

    def describe(self) -> str:
        """``queue_declare p:q:foo``: the RPC and the objects it names, for errors."""
        kwargs = self.kwargs
        names = [
            kwargs[key]
            for key in ("queue", "exchange", "source", "destination")
            if kwargs.get(key) is not None
        ]
        return " ".join([self.method] + ["'%s'" % name for name in names])


def queue_declare(
    queue: str,
    arguments: Optional[Dict[str, Any]],
    passive: bool = False,
    not_found_ok: bool = False,
) -> Step:
    """Always answered: a ``nowait`` re-declare leaves the queue's ``x-expires``
    lease where it was, and the layer renews queues by re-declaring them."""
    return Step(
        "queue_declare",
        dict(queue=queue, durable=True, arguments=arguments, passive=passive),
        not_found_ok,
        True,
    )


def queue_delete(queue: str) -> Step:
    return Step("queue_delete", dict(queue=queue), True)


def queue_purge(queue: str) -> Step:
    return Step("queue_purge", dict(queue=queue), True)


def queue_bind(queue: str, exchange: str, not_found_ok: bool = False) -> Step:
    return Step("queue_bind", dict(queue=queue, exchange=exchange, routing_key=""), not_found_ok)


def exchange_declare(
    exchange: str, auto_delete: bool = False, exchange_type: str = "fanout"
) -> Step:
    return Step(
        "exchange_declare",
        dict(exchange=exchange, exchange_type=exchange_type, durable=True, auto_delete=auto_delete),
        False,
    )


def exchange_delete(exchange: str) -> Step:
    return Step("exchange_delete", dict(exchange=exchange), True)


def exchange_bind(
    destination: str,
    source: str,
    routing_key: str = "",
    arguments: Optional[Dict[str, Any]] = None,
) -> Step:
    return Step(
        "exchange_bind",
        dict(destination=destination, source=source, routing_key=routing_key, arguments=arguments),
        False,
    )


def exchange_unbind(
    destination: str, source: str, arguments: Optional[Dict[str, Any]] = None
) -> Step:
    return Step(
        "exchange_unbind",
        dict(destination=destination, source=source, routing_key="", arguments=arguments),
        True,
    )


class Declare(Work):
    """Run topology ``steps`` in order on an admin channel: the work a caller
    hands the I/O thread for them (``Engine.declare``), which calls it with
    the session and gets the run started here (``AdminChannels.run``)."""

    __slots__ = ("steps",)

    def __init__(self, pending: Pending, steps: Sequence[Step]) -> None:
        super().__init__(pending)
        self.steps = steps

    def __call__(self, session: "Session") -> None:
        session.declares.run(self.pending, self.steps)


def broker_call_error(exc: BaseException, what: str) -> Exception:
    """The error a caller sees when a pika call on the I/O thread raised."""
    if isinstance(exc, STATE_ERRORS):
        return BrokerConnectionError("connection lost during %s (%s)" % (what, type(exc).__name__))
    return BrokerOperationError(None, "%s failed: %s" % (what, exc))


class _Operation(object):
    """An operation in progress: its steps, the next one, and how it runs.

    ``careful``: one step at a time, after its pipelined pass failed.
    """

    __slots__ = ("pending", "steps", "index", "result", "careful", "sent_ahead")

    def __init__(self, pending: Pending, steps: Sequence[Step]) -> None:
        self.pending = pending
        self.steps = list(steps)
        self.index = 0
        self.result: Any = None
        self.careful = False
        self.sent_ahead = False  # its steps went out together: a refusal names none

    def run_end(self) -> int:
        """The index of the step whose answer ends the run that starts at
        ``index``: the next step that must be answered, or the last step.
        Every step before it goes out with ``nowait``. A careful pass sends
        one step at a time."""
        if self.careful:
            return self.index
        end = self.index
        while end < len(self.steps) - 1 and not self.steps[end].answered:
            end += 1
        return end

    def run_carefully(self) -> None:
        """Start again from the first step, waiting for each one's answer."""
        self.careful = True
        self.sent_ahead = False
        self.index = 0
        self.result = None


class DeclareExecutor(object):
    """One admin channel: operations run on it one after another (I/O thread only)."""

    def __init__(self, connection: pika.SelectConnection) -> None:
        self._queue: Deque[_Operation] = collections.deque()
        self._current: Optional[_Operation] = None
        self._channel = ReopeningChannel(
            connection, "admin", on_ready=self._next, on_lost=self._on_lost
        )
        self._channel.open()

    def run(self, pending: Pending, steps: Sequence[Step]) -> None:
        """Run ``steps`` in order; ``pending`` gets the last step's method frame."""
        self._queue.append(_Operation(pending, steps))
        self._next()

    def _next(self) -> None:
        if self._current is not None or not self._channel.ready:
            return
        while self._queue:
            operation = self._queue.popleft()
            if operation.pending.wanted:
                self._current = operation
                self._issue()
                return

    def _issue(self) -> None:
        operation = self._current
        if operation is None:  # an invariant, checked under -O too
            raise RuntimeError("operation is None: called with an operation in flight")
        if operation.index >= len(operation.steps):
            self._current = None
            operation.pending.resolve(operation.result)
            self._next()
            return
        try:
            self._send_ahead(operation, operation.run_end())
            step = operation.steps[operation.index]
            getattr(self._channel.current, step.method)(callback=self._on_step_done, **step.kwargs)
        except Exception as exc:  # connection gone, or a name pika cannot encode
            step = operation.steps[operation.index]
            logger.debug("%s failed", step.method, exc_info=True)
            self._current = None
            operation.pending.fail(broker_call_error(exc, step.method))
            self._next()

    def _send_ahead(self, operation: _Operation, end: int) -> None:
        """Send the steps before ``end`` with ``nowait``; the answer of the
        step at ``end`` then vouches for them all."""
        channel = self._channel.current
        operation.sent_ahead = operation.index < end
        while operation.index < end:
            step = operation.steps[operation.index]
            getattr(channel, step.method)(callback=None, **step.kwargs)
            operation.index += 1

    def _on_step_done(self, frame: Any) -> None:
        operation = self._current
        if operation is None or self._channel.closing:
            return  # an answer on a channel closing with its session
        operation.result = frame.method
        operation.index += 1
        self._issue()

    def _on_lost(self, reply_code: Optional[int], reply_text: Optional[str]) -> None:
        operation, self._current = self._current, None
        if operation is None:
            return
        step = operation.steps[operation.index]
        if reply_code is not None and 400 <= reply_code < 500 and operation.sent_ahead:
            # Which of the steps sent together failed is unknown: find it step
            # by step. (An operation of one step, the usual passive declare,
            # is never sent ahead: its refusal is its own.)
            logger.debug(
                "%s: %s %s; running it step by step", step.describe(), reply_code, reply_text
            )
            operation.run_carefully()
            self._queue.appendleft(operation)
        elif reply_code == NOT_FOUND and step.not_found_ok:
            # Already gone is what we wanted; go on once the channel is back.
            operation.index += 1
            self._queue.appendleft(operation)
        elif reply_code is None or reply_code >= 500 or reply_code == 320:
            operation.pending.fail(
                BrokerConnectionError("connection to the broker lost during %s" % step.method)
            )
        else:
            operation.pending.fail(
                BrokerOperationError(reply_code, reply_text, operation=step.describe())
            )

    def shutdown(self) -> None:
        """The session is going away: stop reopening the channel and listening on it."""
        self._channel.shutdown()

    def forget(self) -> None:
        """The connection is gone: the I/O thread hands the operations on."""
        self._current = None
        self._queue.clear()

    def fail_all(self, error: BaseException) -> None:
        if self._current is not None:
            self._current.pending.fail(error)
            self._current = None
        for operation in self._queue:
            operation.pending.fail(error)
        self._queue.clear()

    def busy(self) -> int:
        """Operations waiting here, the one in flight included."""
        return len(self._queue) + (self._current is not None)


class AdminChannels(object):
    """Up to ``most`` admin channels; each operation goes to the least busy.

    An executor (its channel) opens only when every open one is busy, so a
    process that never declares from two threads at once keeps one admin
    channel. The session treats this like one part of its own.
    """

    def __init__(self, connection: pika.SelectConnection, most: int = ADMIN_CHANNELS) -> None:
        self._connection = connection
        self._most = max(1, most)
        self._executors = [DeclareExecutor(connection)]

    def run(self, pending: Pending, steps: Sequence[Step]) -> None:
        """Run ``steps`` in order on one channel (see ``DeclareExecutor.run``)."""
        executor = min(self._executors, key=DeclareExecutor.busy)
        if executor.busy() and len(self._executors) < self._most:
            executor = DeclareExecutor(self._connection)
            self._executors.append(executor)
        executor.run(pending, steps)

    # The session's part protocol, passed to every channel's executor.

    def shutdown(self) -> None:
        for executor in self._executors:
            executor.shutdown()

    def forget(self) -> None:
        for executor in self._executors:
            executor.forget()

    def fail_all(self, error: BaseException) -> None:
        for executor in self._executors:
            executor.fail_all(error)
