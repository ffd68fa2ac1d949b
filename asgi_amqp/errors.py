"""Exceptions raised by the layer.

Every error that reaches a caller is one of these or a TypeError/ValueError
for bad input, and none of their messages contain credentials.
"""

from asgiref.base_layer import BaseChannelLayer


class ChannelFull(BaseChannelLayer.ChannelFull):
    """The channel's queue holds ``capacity`` messages already.

    Raised by ``send`` only; the message was not delivered. It is also
    ``AMQPChannelLayer.ChannelFull`` and a subclass of asgiref's
    ``BaseChannelLayer.ChannelFull``, so code written against asgiref
    catches it.
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


class AuthenticationError(BrokerConnectionError):
    """The broker refused the credentials or the vhost."""


class OperationTimeout(BrokerConnectionError):
    """The broker did not answer within ``operation_timeout``."""


ACCESS_REFUSED = 403  # AMQP reply code: the user's permissions forbid it


class BrokerOperationError(AMQPLayerError):
    """The broker refused an operation (for example, mismatched queue arguments).

    ``reply_code`` and ``reply_text`` hold the broker's reply (such as
    ``406`` and its ``PRECONDITION_FAILED`` text); ``reply_code`` is
    ``None`` when the error is not a broker reply (a client-side call that
    failed). ``operation`` names the refused AMQP method and its object
    where the layer knows it. A ``403`` (``ACCESS_REFUSED``) means the
    user's permissions do not allow it: the broker was reached.
    """

    def __init__(self, reply_code, reply_text, operation=None):
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
