"""``asgi-amqp peek``, ``requeue`` and ``purge``: look at a channel's messages,
move them, delete them.

Both read with ``tools.reader.QueueReader``: messages are taken unacked.
``peek`` puts every one back, in order; ``requeue`` acks a message only
after its copy in the destination channel was confirmed by the broker, so
an interrupted move loses nothing but may leave a message in both channels
(at-least-once).
"""

import sys
from typing import Iterator, List, Optional, Tuple

from ...channel_names import check_channel_name
from ...errors import BrokerOperationError, ChannelFull
from ..jsonbytes import dumps
from ..reader import Fetched, QueueReader, UndecodableMessage
from .base import (
    EPILOG,
    EXIT_ERROR,
    EXIT_PARTIAL,
    PROG,
    _LayerErrors,
    _one_line,
    cli,
    click,
    confirm_or_stop,
    no_queue_note,
)
from .receive import report_unreadable
from .settings import Settings

RESOURCE_LOCKED = 405  # AMQP reply code: a quorum queue's shard refuses basic.get


@cli.command(epilog=EPILOG)
@click.argument("channel")
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    metavar="N",
    help="Show at most N messages.",
)
@click.pass_obj
def peek(settings: Settings, channel: str, count: int) -> None:
    """Print the next N messages of CHANNEL as JSON Lines, without consuming them.

    The messages stay in the channel, in their order. A process-local
    channel is given as "name!". An ordered channel's shards follow its own
    queue, each in its order. A message that cannot be decrypted or decoded
    is reported on stderr (exit status 2) and stays too.
    """
    unreadable = 0
    with _LayerErrors():
        with settings.reader() as reader:
            queues = reader.queues_of(channel)
            if not reader.exists(queues[0]) and len(queues) == 1:
                no_queue_note(channel)
            taken: List[Fetched] = []
            try:
                for fetched in _waiting(reader, queues, count):
                    taken.append(fetched)
                    try:
                        name, message = reader.decode(fetched)
                    except UndecodableMessage as exc:
                        report_unreadable(channel, exc)
                        unreadable += 1
                        continue
                    click.echo(dumps({"channel": name, "message": message}))
            finally:
                if taken:
                    reader.requeue_all()
    if unreadable:
        sys.exit(EXIT_ERROR)


def _waiting(reader: QueueReader, queues: List[str], count: Optional[int]) -> Iterator[Fetched]:
    """Up to ``count`` messages waiting in ``queues``, one queue after the other.

    A quorum queue refuses ``basic.get`` on an ordered channel's shard (a
    single-active-consumer queue): that shard is skipped, and said so."""
    taken = 0
    for queue in queues:
        while count is None or taken < count:
            try:
                fetched = reader.get(queue)
            except BrokerOperationError as exc:
                if exc.reply_code != RESOURCE_LOCKED:
                    raise
                click.echo(
                    "%s: note: %s cannot be read here (a quorum queue's shard refuses "
                    "basic.get); a receive of the channel takes its messages" % (PROG, queue),
                    err=True,
                )
                break
            if fetched is None:
                break
            taken += 1
            yield fetched


@cli.command(epilog=EPILOG)
@click.argument("source", metavar="SRC")
@click.argument("destination", metavar="DST")
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    metavar="N",
    help="Move at most N messages [default: all that are waiting].",
)
@click.pass_obj
def requeue(settings: Settings, source: str, destination: str, count: Optional[int]) -> None:
    """Move the messages waiting in channel SRC to channel DST, oldest first.

    For replaying a channel nobody reads. Each message is sent to DST, and
    taken off SRC only once the broker confirmed it there: an interrupted
    move loses nothing, but a message may then be in both channels (at
    least once). Bodies move as they are, encrypted or not. SRC may be a
    process-local queue "name!"; DST is a channel name to send to. Stops
    with exit status 1 when DST is full (the message stays in SRC).
    """
    with _LayerErrors():
        check_channel_name(destination)
        with settings.reader() as reader:
            queues = reader.queues_of(source)
            moved = 0
            try:
                for fetched in _waiting(reader, queues, count):
                    try:
                        reader.publish(destination, fetched)
                    except ChannelFull as exc:
                        reader.requeue(fetched)
                        click.echo("%s: %s; moved %d" % (PROG, _one_line(exc), moved), err=True)
                        sys.exit(EXIT_PARTIAL)
                    reader.ack(fetched)
                    moved += 1
            except KeyboardInterrupt:
                pass
    settings.note("moved %d message(s) from %s to %s" % (moved, source, destination))


@cli.command(epilog=EPILOG)
@click.argument("channels", nargs=-1, required=True, metavar="CHANNEL...")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(settings: Settings, channels: Tuple[str, ...], yes: bool) -> None:
    """Delete the messages waiting in each CHANNEL; the channels stay.

    Asks for confirmation unless --yes is given. A process-local queue is
    given as "name!" (every "name!..." channel's messages). Messages a
    process took but has not acknowledged yet are not waiting, and stay.
    """
    with _LayerErrors():
        with settings.reader() as reader:
            queues = [reader.queues_of(channel) for channel in channels]
            if not yes:
                question = "Delete the messages waiting in %s (prefix %r) on %s?" % (
                    ", ".join(channels),
                    reader.topology.prefix,
                    settings.where(),
                )
                confirm_or_stop(question, "nothing was purged")
            for channel, of_channel in zip(channels, queues):
                counts = [reader.purge(queue) for queue in of_channel]
                if counts[0] is None and len(counts) == 1:
                    no_queue_note(channel)
                else:
                    purged = sum(n or 0 for n in counts)
                    settings.note("purged %d message(s) from %s" % (purged, channel))
