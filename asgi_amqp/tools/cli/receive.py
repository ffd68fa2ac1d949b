"""``asgi-amqp receive``: print messages as JSON lines, never losing one it cannot read.

Messages are taken unacked (``tools.reader.QueueReader``) and acked only
once they were decoded and printed. A message that cannot be decrypted or
decoded is put back where it was, reported on stderr (its channel and the
reason, never the body), and the command stops with exit status 2.
"""

import os
import sys
import time
from typing import Dict, List, Optional, Set, Tuple

from ..jsonbytes import dumps
from ..reader import Fetched, QueueReader, UndecodableMessage
from .base import (
    EPILOG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PARTIAL,
    PROG,
    _LayerErrors,
    cli,
    click,
)
from .settings import Settings

# Waits between polls of empty queues: short at first, at most IDLE_MAX.
IDLE_FIRST = 0.01
IDLE_MAX = 0.2


def report_unreadable(channel: str, exc: BaseException) -> None:
    """The stderr line for a message that stays in its queue: channel and reason only."""
    click.echo(
        "%s: error: a message in channel %s cannot be read and was left in the queue: %s"
        % (PROG, channel, exc),
        err=True,
    )


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
def receive(
    settings: Settings, channels: Tuple[str, ...], count: Optional[int], timeout: float
) -> None:
    """Receive messages from CHANNEL... and print them as JSON Lines.

    Each line is {"channel": ..., "message": {...}}. A process-local
    channel is given as "name!" and receives for every "name!..." channel.
    A message is acked only after it was printed. One that cannot be
    decrypted or decoded stays in its queue, in its place: it is reported
    on stderr and the command stops with exit status 2. Exit status 1 when
    --count was given and fewer messages arrived.
    """
    with _LayerErrors():
        reader = settings.reader()
        try:
            queues = [(reader.queue_of(channel), channel) for channel in channels]
            received = _Receiver(reader, dict(queues), count, timeout).run()
        except KeyboardInterrupt:
            received = None
        finally:
            reader.close()
    if received is None:
        sys.exit(EXIT_OK if count is None else EXIT_PARTIAL)
    if count is not None and received < count:
        click.echo("%s: received %d of %d messages" % (PROG, received, count), err=True)
        sys.exit(EXIT_PARTIAL)


class _Receiver(object):
    """The receive loop: poll the queues in turn, print, then ack."""

    def __init__(
        self, reader: QueueReader, queues: Dict[str, str], count: Optional[int], timeout: float
    ) -> None:
        self.reader = reader
        self.queues = queues  # queue -> the name it was asked for
        self.count = count
        self.timeout = timeout
        self.received = 0
        self._printed_ids: Set[str] = set()  # to drop a republished copy of a message printed here
        self._order: List[str] = list(queues)

    def run(self) -> int:
        """The number of messages printed."""
        deadline = time.monotonic() + self.timeout
        idle = IDLE_FIRST
        while self.count is None or self.received < self.count:
            fetched = self._next()
            if fetched is None:
                remaining = deadline - time.monotonic()
                if self.timeout == 0 or remaining <= 0:
                    break
                self.reader.sleep(min(idle, remaining))
                idle = min(idle * 2, IDLE_MAX)
                continue
            idle = IDLE_FIRST
            if self._handle(fetched):
                self.received += 1
                deadline = time.monotonic() + self.timeout
        return self.received

    def _next(self) -> Optional[Fetched]:
        for _ in range(len(self._order)):
            queue = self._order.pop(0)
            self._order.append(queue)  # round robin: no channel starves another
            fetched = self.reader.get(queue)
            if fetched is not None:
                return fetched
        return None

    def _handle(self, fetched: Fetched) -> bool:
        """Print and ack one message; True if it was printed."""
        try:
            channel, message = self.reader.decode(fetched)
        except UndecodableMessage as exc:
            self.reader.requeue(fetched)
            report_unreadable(self.queues[fetched.queue], exc)
            sys.exit(EXIT_ERROR)
        message_id = fetched.properties.message_id
        if fetched.republished and message_id in self._printed_ids:
            self.reader.ack(fetched)  # a second copy of one printed already
            return False
        try:
            click.echo(dumps({"channel": channel, "message": message}))
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): this message was not printed.
            self.reader.requeue(fetched)
            _quiet_stdout()
            sys.exit(EXIT_OK if self.count is None else EXIT_PARTIAL)
        self.reader.ack(fetched)
        if message_id:
            self._printed_ids.add(message_id)
        return True


def _quiet_stdout() -> None:
    # Python would complain about the closed pipe again when it flushes at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
