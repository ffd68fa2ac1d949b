"""Why a connection failed or a channel closed, in one line naming the node, never credentials.

``describe_reason`` digs the cause out of pika's workflow exceptions or the
broker's reply (``broker_reply``, in ``reopening_channel`` for the import
order); ``retry_may_help`` tells an outage from a mistake no retry fixes.

* a broker still starting refuses or ignores the TCP connection
  (test_first_connection_waits_for_the_broker.py::
  test_a_receive_loop_started_before_the_broker_is_served_once_it_starts);
* the broker refuses bad credentials or a denied vhost the same way on every try
  (test_first_connection_waits_for_the_broker.py::test_settings_no_retry_fixes_still_fail_at_once);
* the management port answers the AMQP handshake with ``IncompatibleProtocolError``
  (test_cli.py::test_a_url_at_the_management_port_names_the_likely_mistake).
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
    """The broker's reply code and text, or the root exception, as one line."""
    reason = root_cause(reason)
    code, text = broker_reply(reason)
    if code is not None:
        return "%s %s" % (code, text)
    return type(reason).__name__ + (": %s" % reason if str(reason) else "")


def retry_may_help(error: Any) -> bool:
    """True if a failed attempt may succeed later, unchanged: the node refused, ignored or
    reset the TCP connection, or its name does not resolve yet (a broker still starting)."""
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
    """``AuthenticationError`` for refused credentials or vhost, else
    ``BrokerConnectionError`` naming the node."""
    where = describe_parameters(parameters)
    if isinstance(
        error, (pika.exceptions.ProbableAuthenticationError, pika.exceptions.AuthenticationError)
    ):
        return AuthenticationError("the broker at %s refused the credentials" % where)
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return AuthenticationError("the broker at %s denied access to the vhost" % where)
    reason = describe_reason(error)
    if isinstance(root_cause(error), pika.exceptions.IncompatibleProtocolError):
        reason += (
            " (the server there does not speak AMQP 0-9-1: is the port the management "
            "API's, 15672, or another service's? RabbitMQ's AMQP port is 5672, 5671 with TLS)"
        )
    return BrokerConnectionError("cannot connect to %s: %s" % (where, reason))
