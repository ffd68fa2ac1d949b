"""Topology operations (declare, bind, unbind, delete) on admin channels.

An operation is a list of ``Step``s, plain data the layer states; the
executor alone deals with callbacks and channel errors. Its steps are
pipelined: they go out with ``nowait`` up to the next step that must be
answered, whose answer vouches for them all. If that pass fails, the
operation runs again one step at a time (every step is idempotent) to find
the failing step and apply its rules (a 404 is fine for something already
gone). ``AdminChannels`` spreads operations over up to ``ADMIN_CHANNELS``, so
calls from several threads overlap: with one, bench row (l) group-discard-8t falls.

Broker facts:

* a channel runs its methods in the order they arrive
  (``test_a_normal_channels_group_add_is_two_round_trips``);
* a ``queue.declare`` sent with ``nowait`` does not renew the queue's
  ``x-expires`` lease, so it is always answered (``tests/test_group_renewal.py``);
* a failed ``nowait`` step closes the channel naming no step, and the broker
  drops the steps after it
  (``test_group_add_names_the_step_of_its_chain_that_differs``);
* AMQP 0-9-1 gives ``queue.unbind`` no ``nowait`` and pika holds the channel's
  later calls until its answer, so no run unbinds a queue.

Everything here runs on the I/O thread; each ``DeclareExecutor`` owns its
channel and operations, ``AdminChannels`` its executors.
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

ADMIN_CHANNELS = 8  # per connection, at most
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

    Named, not bound, as the channel may not exist yet. ``answered``: never
    sent with ``nowait``.
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
    """Always answered: a ``nowait`` re-declare does not renew the queue's lease."""
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
    """Run topology ``steps`` in order on an admin channel: the work of ``Engine.declare``."""

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
    """An operation in progress. ``careful``: one step at a time, after its
    pipelined pass failed."""

    __slots__ = ("pending", "steps", "index", "result", "careful", "sent_ahead")

    def __init__(self, pending: Pending, steps: Sequence[Step]) -> None:
        self.pending = pending
        self.steps = list(steps)
        self.index = 0
        self.result: Any = None
        self.careful = False
        self.sent_ahead = False  # its steps went out together: a refusal names none

    def run_end(self) -> int:
        """The index of the step whose answer ends the run from ``index``: the
        next step that must be answered, or the last."""
        if self.careful:
            return self.index
        end = self.index
        while end < len(self.steps) - 1 and not self.steps[end].answered:
            end += 1
        return end

    def run_carefully(self) -> None:
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
        """Send the steps before ``end`` with ``nowait``."""
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
            # Which of the steps sent together failed is unknown: find it step by step.
            logger.debug(
                "%s: %s %s; running it step by step", step.describe(), reply_code, reply_text
            )
            operation.run_carefully()
            self._queue.appendleft(operation)
        elif reply_code == NOT_FOUND and step.not_found_ok:
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
    """Up to ``most`` admin channels; each operation goes to the least busy, and
    a new one opens only when every open one is busy."""

    def __init__(self, connection: pika.SelectConnection, most: int = ADMIN_CHANNELS) -> None:
        self._connection = connection
        self._most = max(1, most)
        self._executors = [DeclareExecutor(connection)]

    def run(self, pending: Pending, steps: Sequence[Step]) -> None:
        """Run ``steps`` in order on one channel (``DeclareExecutor.run``)."""
        executor = min(self._executors, key=DeclareExecutor.busy)
        if executor.busy() and len(self._executors) < self._most:
            executor = DeclareExecutor(self._connection)
            self._executors.append(executor)
        executor.run(pending, steps)

    # The session's part protocol, passed to every executor.

    def shutdown(self) -> None:
        for executor in self._executors:
            executor.shutdown()

    def forget(self) -> None:
        for executor in self._executors:
            executor.forget()

    def fail_all(self, error: BaseException) -> None:
        for executor in self._executors:
            executor.fail_all(error)
