"""Topology operations (declare, bind, unbind, delete), run one at a time.

An operation is a list of ``Step``s, each one AMQP RPC. Steps are written as
plain data (see ``steps`` below) so that the layer states its intent, e.g.
"declare the group exchange, declare the member exchange, bind them", and
this executor alone deals with callbacks and channel errors.

Operations run strictly one after another on their own channel. A channel
error (404, 406) closes that channel; the executor fails only the operation
that caused it, unless the step said a 404 is fine (deleting or unbinding
something already gone) or a 406 is (an exchange that exists with other
flags, made by an older version), reopens the channel and carries on with
the next. A failed step's error names the step and its object.
"""

import collections
import logging

import pika.exceptions

from ..errors import BrokerConnectionError, BrokerOperationError
from .channel_user import ChannelUser

logger = logging.getLogger(__name__)

NOT_FOUND = 404
PRECONDITION_FAILED = 406
STATE_ERRORS = (
    pika.exceptions.ConnectionWrongStateError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ChannelClosed,
    pika.exceptions.ConnectionClosed,
    pika.exceptions.DuplicateGetOkCallback,
)


class Step(
    collections.namedtuple("Step", "method kwargs not_found_ok inequivalent_ok", defaults=(False,))
):
    """One RPC on a pika channel: ``getattr(channel, method)(callback=..., **kwargs)``."""

    def describe(self):
        """``queue_declare p:q:foo``: the RPC and the objects it names, for errors."""
        kwargs = self.kwargs
        names = [
            kwargs[key]
            for key in ("queue", "exchange", "source", "destination")
            if kwargs.get(key) is not None
        ]
        return " ".join([self.method] + ["'%s'" % name for name in names])


def queue_declare(queue, arguments, passive=False, not_found_ok=False):
    return Step(
        "queue_declare",
        dict(queue=queue, durable=True, arguments=arguments, passive=passive),
        not_found_ok,
    )


def queue_delete(queue):
    return Step("queue_delete", dict(queue=queue), True)


def queue_purge(queue):
    return Step("queue_purge", dict(queue=queue), True)


def queue_bind(queue, exchange, not_found_ok=False):
    return Step("queue_bind", dict(queue=queue, exchange=exchange, routing_key=""), not_found_ok)


def exchange_declare(exchange, auto_delete=False, exchange_type="fanout", inequivalent_ok=False):
    """``inequivalent_ok``: an exchange of that name with other flags (406) is used as it is."""
    return Step(
        "exchange_declare",
        dict(exchange=exchange, exchange_type=exchange_type, durable=True, auto_delete=auto_delete),
        False,
        inequivalent_ok,
    )


def exchange_delete(exchange):
    return Step("exchange_delete", dict(exchange=exchange), True)


def exchange_bind(destination, source, routing_key=""):
    return Step(
        "exchange_bind",
        dict(destination=destination, source=source, routing_key=routing_key),
        False,
    )


def exchange_unbind(destination, source):
    return Step(
        "exchange_unbind", dict(destination=destination, source=source, routing_key=""), True
    )


def broker_call_error(exc, what):
    """The error a caller sees when a pika call on the I/O thread raised."""
    if isinstance(exc, STATE_ERRORS):
        return BrokerConnectionError("connection lost during %s (%s)" % (what, type(exc).__name__))
    return BrokerOperationError(None, "%s failed: %s" % (what, exc))


class _Operation(object):
    __slots__ = ("pending", "steps", "index", "result")

    def __init__(self, pending, steps):
        self.pending = pending
        self.steps = list(steps)
        self.index = 0
        self.result = None


class DeclareExecutor(ChannelUser):
    name = "admin"

    def __init__(self, connection):
        self._queue = collections.deque()
        self._current = None
        super(DeclareExecutor, self).__init__(connection)

    def run(self, pending, steps):
        """Run ``steps`` in order; ``pending`` gets the last step's method frame."""
        self._queue.append(_Operation(pending, steps))
        self._next()

    def on_ready(self):
        self._next()

    def _next(self):
        if self._current is not None or not self.ready:
            return
        while self._queue:
            operation = self._queue.popleft()
            if operation.pending.wanted:
                self._current = operation
                self._issue()
                return

    def _issue(self):
        operation = self._current
        if operation.index >= len(operation.steps):
            self._current = None
            operation.pending.resolve(operation.result)
            self._next()
            return
        step = operation.steps[operation.index]
        try:
            getattr(self.channel, step.method)(callback=self._on_step_done, **step.kwargs)
        except Exception as exc:  # connection gone, or a name pika cannot encode
            logger.debug("%s failed", step.method, exc_info=True)
            self._current = None
            operation.pending.fail(broker_call_error(exc, step.method))
            self._next()

    def _on_step_done(self, frame):
        operation = self._current
        if operation is None or self._closing:
            return  # an answer on a channel closing with its session
        operation.result = frame.method
        operation.index += 1
        self._issue()

    def on_lost(self, reply_code, reply_text):
        operation, self._current = self._current, None
        if operation is None:
            return
        step = operation.steps[operation.index]
        if reply_code == NOT_FOUND and step.not_found_ok:
            # Already gone is what we wanted; go on once the channel is back.
            operation.index += 1
            self._queue.appendleft(operation)
        elif reply_code == PRECONDITION_FAILED and step.inequivalent_ok:
            logger.debug("%s: %s; using it as it is", step.describe(), reply_text)
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

    def forget(self):
        """The connection is gone: the I/O thread hands the operations on."""
        self._current = None
        self._queue.clear()

    def fail_all(self, error):
        if self._current is not None:
            self._current.pending.fail(error)
            self._current = None
        for operation in self._queue:
            operation.pending.fail(error)
        self._queue.clear()
