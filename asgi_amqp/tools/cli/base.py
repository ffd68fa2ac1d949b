"""The ``asgi-amqp`` command's group, and what its command modules share.

Every command module registers itself on ``cli`` (``@cli.command``); the
group gives each command the shared options (``options``), so that they
are accepted before the command and after it. ``settings.Settings`` turns
them into the layer; ``errors`` turns the layer's exceptions into one line
on stderr and an exit status.
"""

import sys
from typing import Any, Dict, Optional, Sequence

import click

from ... import __version__
from ..jsonbytes import loads
from . import options
from .errors import (  # noqa: F401  (the command modules import them from here)
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    CLIError,
    _error_for,
    _LayerErrors,
    _mismatch_hint,
    _one_line,
)
from .options import _GIVEN
from .settings import Settings

MAX_REPORTED_ERRORS = 20

EPILOG = """\b
Exit status:
  0  everything was sent (received, done)
  1  some lines were not sent (refused, in doubt, or not sent);
     receive: fewer than --count messages arrived; flush: not confirmed;
     requeue: a destination channel was full
  2  usage or configuration error, invalid name, a message that cannot
     be decrypted or decoded (left in its queue), or the broker (or its
     management API) cannot be reached

\b
JSON: {"__bytes__": "<base64>"} stands for bytes and {"__float__": "nan"}
("inf", "-inf") for floats JSON cannot carry, in messages given to send
and in the output of receive and peek.

Settings, highest first: options (before or after the command),
ASGI_AMQP_* environment variables, --config FILE, the Django settings'
CHANNEL_LAYERS, the layer's defaults. Give the password in AMQP_URL rather
than --url: a command line is visible to other users of the machine.
"""


def no_queue_note(channel: str) -> None:
    """Say on stderr that ``channel`` has no queue: a mistyped name or prefix, often."""
    click.echo(
        "note: channel %s has no queue (never sent to, expired when unused, or "
        "flushed): check the name and --prefix" % channel,
        err=True,
    )


def confirm_or_stop(question: str, refused: str) -> None:
    """Ask ``question``; unless answered yes, say ``refused`` and exit 1."""
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.Abort:  # end of input or Ctrl-C
        confirmed = False
    if not confirmed:
        click.echo("%s: %s" % (PROG, refused), err=True)
        sys.exit(EXIT_PARTIAL)


def _message_argument(text: str) -> Dict[str, Any]:
    try:
        message = loads(text)
    except ValueError as exc:
        raise click.BadParameter("not valid JSON: %s" % exc, param_hint="MESSAGE_JSON")
    if not isinstance(message, dict):
        raise click.BadParameter("must be a JSON object", param_hint="MESSAGE_JSON")
    return message


# -- the group: one-line usage errors -------------------------------------------------


class _Group(click.Group):
    """click's group, with every error as one line on stderr.

    click prints a usage error as the usage, a hint and the error on
    separate lines; here it is one line that ends with the hint to --help.
    Its commands' --help leave out the shared options (``options.SharedHelp``).
    """

    command_class = options.SharedHelp

    def main(
        self,
        args: Optional[Sequence[str]] = None,
        prog_name: Optional[str] = None,
        complete_var: Optional[str] = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super(_Group, self).main(args, prog_name, complete_var, False, **extra)
        try:
            code = super(_Group, self).main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else PROG
            click.echo(
                "%s: error: %s (see '%s --help')" % (PROG, _one_line(exc.format_message()), where),
                err=True,
            )
            sys.exit(EXIT_ERROR)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("%s: aborted" % PROG, err=True)
            sys.exit(EXIT_PARTIAL)
        except ImportError as exc:  # an optional package a setting needs
            click.echo("%s: error: %s" % (PROG, _one_line(exc)), err=True)
            sys.exit(EXIT_ERROR)
        sys.exit(code if isinstance(code, int) else EXIT_OK)

    def add_command(self, cmd: click.Command, name: Optional[str] = None) -> None:
        """Every command takes the shared options, after its own."""
        options.add_shared(cmd)
        super(_Group, self).add_command(cmd, name)


@click.group(
    cls=_Group,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "-V", "--version", prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Send, receive, inspect and move ASGI 1.0 messages on RabbitMQ through asgi_amqp.

    Load the application's layer settings (--django-settings, --config, or
    the options): a command that creates a channel's queue creates it with
    them. A queue that exists is used with the arguments it has.
    """
    settings = Settings(ctx.meta.setdefault(_GIVEN, {}))
    ctx.obj = settings
    ctx.call_on_close(settings.close)


cli.params[0:0] = options.shared()
