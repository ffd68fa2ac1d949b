"""Why a connection failed or a channel closed, named for the caller and the log.

pika reports a failed connection attempt as a chain of workflow exceptions
around the socket or TLS error, and a closed connection or channel as a
reply code and text. A caller needs one line that names the cause (refused
credentials, an unknown vhost, an unreachable node, a broker that closed
the connection) and the node, without its credentials. ``broker_reply``
is the one reading of a close reason; ``describe_reason`` the one line
made of it (``broker_reply`` lives with the channels, in
``reopening_channel``, which the I/O thread's modules may import and not
the other way round). ``retry_may_help`` sorts a failed first attempt
into an outage (the broker is not up yet) or a mistake (no retry fixes it).
"""

import ssl
from typing import Any

import pika
import pika.connection
import pika.exceptions
from pika.adapters.utils.connection_workflow import AMQPConnectorStackTimeout

from ...errors import AuthenticationError, BrokerConnectionError
from ...urls import describe_parameters
from ..reopening_channel import broker_reply


def root_cause(error: Any) -> Any:
    """pika wraps socket and TLS errors in workflow exceptions; dig the cause out."""
    for _ in range(6):
        if (
            isinstance(error, pika.exceptions.AMQPConnectionError)
            and error.args
            and isinstance(error.args[0], BaseException)
        ):
            error = error.args[0]
        elif getattr(error, "exceptions", None):
            error = error.exceptions[-1]
        elif isinstance(getattr(error, "exception", None), BaseException):
            error = error.exception
        else:
            break
    return error


def describe_reason(reason: Any) -> str:
    """Why a connection closed or failed, as one line: the broker's reply code
    and text, or the root exception; never credentials."""
    reason = root_cause(reason)
    code, text = broker_reply(reason)
    if code is not None:
        return "%s %s" % (code, text)
    return type(reason).__name__ + (": %s" % reason if str(reason) else "")


def retry_may_help(error: Any) -> bool:
    """Whether a failed connection attempt may succeed later, unchanged.

    True when the node refused the TCP connection, did not answer it, reset
    it, timed out in the handshake, or its name does not resolve yet: a
    broker that is still starting (a container started with the process)
    looks like this. False for refused credentials, a denied vhost, a TLS
    failure (certificate verification included) and a server that does not
    speak AMQP 0-9-1: settings no retry can fix.
    """
    if isinstance(
        error,
        (
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.AuthenticationError,
            pika.exceptions.ProbableAccessDeniedError,
        ),
    ):
        return False
    cause = root_cause(error)
    if isinstance(cause, ssl.SSLError):  # an OSError too: checked first
        return False
    return isinstance(cause, (OSError, AMQPConnectorStackTimeout))


def connection_error(error: Any, parameters: pika.connection.Parameters) -> Exception:
    """The error a caller gets for a failed connection attempt: refused
    credentials and a denied vhost are ``AuthenticationError`` (retrying
    cannot help), anything else ``BrokerConnectionError`` naming the node."""
    where = describe_parameters(parameters)
    if isinstance(
        error, (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)
    ):
        return AuthenticationError("the broker at %s refused the credentials" % where)
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return AuthenticationError("the broker at %s denied access to the vhost" % where)
    reason = describe_reason(error)
    if isinstance(root_cause(error), pika.exceptions.IncompatibleProtocolError):
        # Something answered, but not in AMQP 0-9-1: usually the URL names
        # the management API's port (15672) or another service.
        reason += (
            " (the server there does not speak AMQP 0-9-1: is the port the management "
            "API's, 15672, or another service's? RabbitMQ's AMQP port is 5672, 5671 with TLS)"
        )
    return BrokerConnectionError("cannot connect to %s: %s" % (where, reason))
