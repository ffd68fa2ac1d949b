"""asgi_amqp: an ASGI 1.0 channel layer on RabbitMQ."""

import logging

from .errors import (
    AMQPLayerError,
    AuthenticationError,
    BrokerBlocked,
    BrokerConnectionError,
    BrokerOperationError,
    BrokerUnreachable,
    ChannelFull,
    LayerClosed,
    ManagementAPIError,
    MessageRefused,
    MessageTooLarge,
    OperationTimeout,
    QueueSettingsMismatch,
)
from .layer import AMQPChannelLayer

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AMQPChannelLayer",
    "ChannelFull",
    "MessageTooLarge",
    "AMQPLayerError",
    "BrokerConnectionError",
    "AuthenticationError",
    "OperationTimeout",
    "MessageRefused",
    "BrokerOperationError",
    "QueueSettingsMismatch",
    "BrokerBlocked",
    "BrokerUnreachable",
    "ManagementAPIError",
    "LayerClosed",
    "__version__",
]
