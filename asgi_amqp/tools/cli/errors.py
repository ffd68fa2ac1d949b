"""The command's exit statuses and errors: one line on stderr, never a traceback."""

from types import TracebackType
from typing import IO, Any, Literal, Optional, Type

import click

from ...errors import (
    AuthenticationError,
    BrokerBlocked,
    BrokerConnectionError,
    BrokerOperationError,
    ManagementAPIError,
    QueueSettingsMismatch,
)

EXIT_OK = 0
EXIT_PARTIAL = 1  # some messages were skipped or failed (or fewer than --count received)
EXIT_ERROR = 2  # usage, configuration or connection error, or a message left unread

PROG = "asgi-amqp"


class CLIError(click.ClickException):
    """One line on stderr and an exit status (2 unless said otherwise)."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super(CLIError, self).__init__(message)
        # click declares exit_code a ClassVar; each CLIError carries its own.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Optional[IO[Any]] = None) -> None:
        click.echo("%s: error: %s" % (PROG, self.format_message()), err=True)


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _error_for(exc: BaseException) -> Optional[CLIError]:
    """A CLIError for an exception the layer raised, or None for anything else."""
    if isinstance(exc, BrokerBlocked):  # names the alarm; a ChannelFull otherwise
        return CLIError(_one_line(exc))
    if isinstance(exc, QueueSettingsMismatch):  # names the setting and the fix
        return CLIError(_one_line(exc), EXIT_PARTIAL)
    if isinstance(exc, AuthenticationError):
        return CLIError(_one_line(exc))
    if isinstance(exc, BrokerConnectionError):
        return CLIError("cannot reach the broker: %s" % _in_command_terms(_one_line(exc)))
    if isinstance(exc, ManagementAPIError):
        return CLIError(_in_command_terms(_one_line(exc)))
    if isinstance(exc, BrokerOperationError):
        return CLIError("%s%s" % (_one_line(exc), _mismatch_hint(exc)), EXIT_PARTIAL)
    if isinstance(exc, (TypeError, ValueError, ImportError)):
        return CLIError(_one_line(exc))
    return None


# The library's words for a library's user -> the command's, for its user.
_COMMAND_TERMS = (
    ("pass management_url= pointing at it", "give --management-url (or AMQP_MANAGEMENT_URL)"),
    ("check management_url", "check --management-url (or AMQP_MANAGEMENT_URL)"),
    # The command exits with this error: nothing goes on reconnecting.
    ("; the layer keeps reconnecting", ""),
)


def _in_command_terms(text: str) -> str:
    for library, command in _COMMAND_TERMS:
        text = text.replace(library, command)
    return text


def _mismatch_hint(exc: BaseException) -> str:
    if getattr(exc, "reply_code", None) == 406:
        return (
            " (load the application's settings with --django-settings or --config, "
            "or give the same --expiry, --capacity and --queue-type)"
        )
    return ""


class _LayerErrors(object):
    """Turns the layer's exceptions into one-line CLI errors."""

    def __enter__(self) -> "_LayerErrors":
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Literal[False]:
        if exc is None or isinstance(exc, click.exceptions.Exit):
            return False
        error = _error_for(exc)
        if error is None:
            return False
        raise error from None
