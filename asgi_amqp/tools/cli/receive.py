"""``asgi-amqp receive``: print messages as JSON lines."""

import os
import sys
import time

from ..jsonbytes import dumps
from .base import (
    EPILOG,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    _LayerErrors,
    cli,
    click,
)

# -- receive ----------------------------------------------------------------------------


@cli.command(epilog=EPILOG)
@click.argument("channels", nargs=-1, required=True, metavar="CHANNEL...")
@click.option(
    "-n", "--count", type=click.IntRange(min=1), metavar="N", help="Stop after N messages."
)
@click.option(
    "-t",
    "--timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Stop once no message has arrived for SECONDS; 0 takes only what is "
    "waiting now, 'inf' waits for ever.",
)
@click.pass_obj
def receive(settings, channels, count, timeout):
    """Receive messages from CHANNEL... and print them as JSON Lines.

    Each line is {"channel": ..., "message": {...}}. A process-local
    channel is given as "name!" and receives for every "name!..." channel.
    Exit status 1 when --count was given and fewer messages arrived.
    """
    layer = settings.layer()
    with _LayerErrors():
        for channel in channels:
            layer.valid_channel_name(channel, receive=True)
    try:
        received = _receive_loop(layer, list(channels), count, timeout)
    except KeyboardInterrupt:
        received = None
    if received is None:
        sys.exit(EXIT_OK if count is None else EXIT_PARTIAL)
    if count is not None and received < count:
        click.echo("%s: received %d of %d messages" % (PROG, received, count), err=True)
        sys.exit(EXIT_PARTIAL)


def _receive_loop(layer, channels, count, timeout):
    """Receive and print; the number of messages printed."""
    received = 0
    deadline = time.monotonic() + timeout
    with _LayerErrors():
        while count is None or received < count:
            if timeout == 0:
                channel, message = layer.receive(channels, block=False)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                layer.receive_timeout = max(0.05, min(1.0, remaining))
                channel, message = layer.receive(channels, block=True)
            if channel is None:
                if timeout == 0:
                    break
                continue
            received += 1
            deadline = time.monotonic() + timeout
            try:
                click.echo(dumps({"channel": channel, "message": message}))
                sys.stdout.flush()
            except BrokenPipeError:
                # The reader went away (`| head`): stop quietly.
                _quiet_stdout()
                sys.exit(EXIT_OK if count is None or received >= count else EXIT_PARTIAL)
    return received


def _quiet_stdout():
    # Python would complain about the closed pipe again when it flushes at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
