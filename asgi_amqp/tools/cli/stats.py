"""``asgi-amqp stats``: queue figures of channels, as a table or JSON."""

import json
from typing import List, Tuple

from ... import statistics
from .base import (
    EPILOG,
    _LayerErrors,
    cli,
    click,
    no_queue_note,
)
from .settings import Settings

# -- statistics -------------------------------------------------------------------------------

_COLUMNS = (
    ("channel", None),
    ("pending", "messages_pending"),
    ("count", "messages_count"),
    ("count/s", "messages_count_per_second"),
    ("max age", "messages_max_age"),
    ("full", "channel_full_count"),
    ("full/s", "channel_full_count_per_second"),
)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "%.1f" % value
    return str(value)


@cli.command(epilog=EPILOG)
@click.argument("channels", nargs=-1, metavar="[CHANNEL...]")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"global": {...}, "channels": {name: {...}}} as JSON.',
)
@click.pass_obj
def stats(settings: Settings, channels: Tuple[str, ...], as_json: bool) -> None:
    """Queue figures of the given channels, or of every channel of the prefix.

    From the management API, which updates them every few seconds (5 s by
    default); "full" counts only this command's own ChannelFull errors and
    is 0 here. A process-local channel "name!..." is shown as its queue "name!".
    """
    layer = settings.layer()
    with _LayerErrors():
        if channels:
            per_channel = {c: statistics.channel_statistics(layer, c) for c in channels}
            for channel in statistics.missing_channels(layer, channels):
                no_queue_note(channel)
        else:
            per_channel = statistics.all_channel_statistics(layer)
        total = statistics.global_statistics(layer)
    if as_json:
        click.echo(json.dumps({"global": total, "channels": per_channel}, sort_keys=True))
        return
    rows = [
        [name] + [_cell(per_channel[name][key]) for _, key in _COLUMNS[1:]]
        for name in sorted(per_channel)
    ]
    if not channels:  # the prefix's total: a row of the channels asked for would mislead
        rows.append(["(all channels)"] + [_cell(total[key]) for _, key in _COLUMNS[1:]])
    header = [title for title, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]

    def line(cells: List[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join([first] + rest).rstrip()

    click.echo(line(header))
    for row in rows:
        click.echo(line(row))
