"""Exceptions raised by the layer.

Every error that reaches a caller is one of these or a TypeError/ValueError
for bad input, and none of their messages contain credentials.
"""

import re
from typing import Any, Callable, Optional, Tuple

from asgiref.base_layer import BaseChannelLayer


class ChannelFull(BaseChannelLayer.ChannelFull):
    """The channel's queue holds ``capacity`` messages already.

    Raised by ``send`` only; the message was not delivered. Also
    ``AMQPChannelLayer.ChannelFull``, and a subclass of asgiref's
    ``BaseChannelLayer.ChannelFull``, so code written for asgiref catches it.
    """


class MessageTooLarge(BaseChannelLayer.MessageTooLarge):
    """The encoded message is larger than ``max_message_size``.

    Raised before anything is sent. It is also
    ``AMQPChannelLayer.MessageTooLarge`` and a subclass of asgiref's
    ``BaseChannelLayer.MessageTooLarge``.
    """


class AMQPLayerError(Exception):
    """Base class of the layer's own runtime errors."""


class BrokerConnectionError(AMQPLayerError, ConnectionError):
    """The broker could not be reached or the connection was lost.

    A ``send`` that raises this may or may not have been delivered.
    """


class MessageRefused(BrokerConnectionError):
    """The broker refused a message although its queue was not full.

    A queue whose node is going down, or a quorum queue between leaders,
    refuses publishes; the message was not delivered. Raised on daphne's
    reactor thread at the second refusal, on any other thread after
    ``operation_timeout`` of refusals.
    """


class AuthenticationError(BrokerConnectionError):
    """The broker refused the credentials or the vhost."""


class OperationTimeout(BrokerConnectionError):
    """The broker did not answer within ``operation_timeout``."""


ACCESS_REFUSED = 403  # AMQP reply code: the user's permissions forbid it


class BrokerOperationError(AMQPLayerError):
    """The broker refused an operation (for example, mismatched queue arguments).

    ``reply_code`` and ``reply_text`` hold the broker's reply (such as
    ``406`` and its ``PRECONDITION_FAILED`` text); ``reply_code`` is
    ``None`` for a client-side call that failed. ``operation`` names the
    refused AMQP method and its object where the layer knows it. A ``403``
    (``ACCESS_REFUSED``) means the user's permissions do not allow it: the
    broker was reached.
    """

    def __init__(
        self, reply_code: Optional[int], reply_text: Optional[str], operation: Optional[str] = None
    ) -> None:
        if reply_code is None:
            message = reply_text
        else:
            message = "broker refused the operation%s: %s %s" % (
                " " + operation if operation else "",
                reply_code,
                reply_text,
            )
            if reply_code == ACCESS_REFUSED:
                message += " (the user's RabbitMQ permissions do not allow it)"
        super(BrokerOperationError, self).__init__(message)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.operation = operation


class ManagementAPIError(AMQPLayerError):
    """The RabbitMQ management HTTP API is unavailable or refused a request."""


class LayerClosed(AMQPLayerError):
    """The layer was closed."""


class QueueSettingsMismatch(BrokerOperationError):
    """A queue of the prefix exists with other settings than this layer's.

    The broker refuses (406 ``PRECONDITION_FAILED``, "inequivalent arg") to
    declare a queue that exists with other arguments, so a process whose
    ``capacity``, ``channel_capacity``, ``expiry`` or ``queue_type`` differs
    from its creator's cannot use it. The message names the channel (or the
    shared queue), the setting, both values and the fix. Attributes:

    ``queue``, ``channel``
        the queue, and its channel (None for a shared queue);
    ``argument``, ``existing``, ``requested``
        the queue argument (``x-max-length``...) and its two raw values
        (None where absent);
    ``setting``, ``existing_setting``, ``requested_setting``
        the same in the layer's terms (``capacity``, 5, 10).
    """

    def __init__(
        self,
        reply_code: int,
        reply_text: Optional[str],
        queue: str,
        argument: str,
        existing: Any,
        requested: Any,
        explained: Optional["MismatchDetails"] = None,
    ) -> None:
        super(QueueSettingsMismatch, self).__init__(reply_code, reply_text)
        self.queue = queue
        self.argument = argument
        self.existing = existing
        self.requested = requested
        details = explained or MismatchDetails("queue %r" % queue, argument, existing, requested)
        self.channel = details.channel
        self.setting = details.setting
        self.existing_setting = details.existing
        self.requested_setting = details.requested
        self.args = (details.message(),)


class MismatchDetails(object):
    """What a ``QueueSettingsMismatch`` says, in the layer's own terms."""

    def __init__(
        self,
        what: str,
        setting: str,
        existing: Any,
        requested: Any,
        channel: Optional[str] = None,
        fix: str = "use the same settings in every process that shares this queue, "
        "or delete the queue so that it is created again",
    ) -> None:
        self.what = what
        self.setting = setting
        self.existing = existing
        self.requested = requested
        self.channel = channel
        self.fix = fix

    def message(self) -> str:
        return (
            "queue settings mismatch: %s exists with %s %s, but this layer asks for %s %s: %s"
            % (
                self.what,
                self.setting,
                _shown(self.existing),
                self.setting,
                _shown(self.requested),
                self.fix,
            )
        )


def _shown(value: Any) -> str:
    return "(none)" if value is None else "%s" % (value,)


# The broker's 406 text, for each of its ways of quoting a value.
_VALUE = r"none|the value '[^']*' of type '[^']*'|'[^']*'"
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for queue '(?P<queue>[^']*)' in vhost '[^']*': "
    r"received (?P<requested>%s) but current is (?P<existing>%s)" % (_VALUE, _VALUE)
)


def parse_inequivalent(reply_text: Optional[str]) -> Optional[Tuple[str, str, Any, Any]]:
    """(queue, argument, existing, requested) from the broker's 406 text, or None.

    The text reads ``inequivalent arg 'x-max-length' for queue 'q' in vhost
    '/': received the value '5' of type 'signedint' but current is none``
    or ``received '10' but current is '5'`` (test_settings_mismatch_is_named.py).
    Numbers come back as int, ``none`` as None.
    """
    found = _INEQUIVALENT.search(reply_text or "")
    if found is None:
        return None
    return (
        found.group("queue"),
        found.group("argument"),
        _value(found.group("existing")),
        _value(found.group("requested")),
    )


def _value(text: str) -> Any:
    if text == "none":
        return None
    quoted = text.split("'")[1]
    try:
        return int(quoted)
    except ValueError:
        return quoted


def settings_mismatch(
    error: BaseException,
    explain: Optional[Callable[[str, str, Any, Any], Optional[MismatchDetails]]] = None,
) -> BaseException:
    """``error`` as a ``QueueSettingsMismatch`` if it is the broker's 406 about
    queue arguments, else ``error`` itself; ``explain(queue, argument,
    existing, requested)`` says it in the layer's terms, or None."""
    if isinstance(error, QueueSettingsMismatch) or not isinstance(error, BrokerOperationError):
        return error
    if error.reply_code != PRECONDITION_FAILED:
        return error
    parsed = parse_inequivalent(error.reply_text)
    if parsed is None:
        return error
    queue, argument, existing, requested = parsed
    explained = explain(queue, argument, existing, requested) if explain else None
    return QueueSettingsMismatch(
        error.reply_code, error.reply_text, queue, argument, existing, requested, explained
    )


PRECONDITION_FAILED = 406


class BrokerBlocked(ChannelFull, AMQPLayerError):
    """The broker blocks publishing: a resource alarm (memory or disk) is on.

    ``reason`` is the broker's own ("low on memory", "low on disk"). A send
    waits for the alarm within ``operation_timeout``, then raises this; on
    daphne's reactor thread, which must not wait, at once. The message was
    not delivered (one in flight when the alarm began may still be, once it
    clears). ``send_group`` never raises it: it drops and counts.

    A ``ChannelFull`` on purpose: the Channels 1.x stack treats that as
    "cannot take it now" (daphne answers 503 or closes a WebSocket with 1013
    "try again later", Channels' senders retry), where another exception
    would be a 500, a dropped frame or a dead runworker. Never a
    ``BrokerConnectionError``: the broker is reachable, and receives keep
    working.
    """

    def __init__(self, message: str, reason: Optional[str] = None) -> None:
        super(BrokerBlocked, self).__init__(message)
        self.reason = reason


class BrokerUnreachable(ChannelFull, BrokerConnectionError):
    """The broker is unreachable, and the caller is daphne's reactor thread.

    That thread never waits for a reconnect, since all of daphne would wait
    with it: its sends are parked until the broker is back. This is raised
    only when the parked sends fill their limit, or for a call that cannot
    be parked (the declare or the depth check after a refused send). The
    message was not delivered.

    A ``ChannelFull`` as ``BrokerBlocked`` is one (daphne answers 503 or
    1013, where another exception resets the client's connection), and a
    ``BrokerConnectionError`` because that is what happened.
    """
