"""``asgi-amqp top``: a live view of one prefix's channels, groups and dead letters.

The figures come from :mod:`asgi_amqp.tools.snapshot` (the management API);
this module only draws them: a refreshing ``rich`` view, or with ``--once``
one snapshot as text or (``--json``) as JSON.
"""

import json
import sys
import time
from typing import Any, Callable, List, Optional

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ...errors import ManagementAPIError
from ..snapshot import KINDS, SORT_KEYS, ChannelView, Collector, Snapshot, sort_channels
from .base import EPILOG, _LayerErrors, cli, click

BAR_WIDTH = 10
PLAIN_WIDTH = 200  # columns of --once text when stdout is not a terminal
# box.SIMPLE_HEAD in ASCII: --once text is for scripts and e-mails too.
PLAIN_BOX = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
KIND_TITLES = {
    "normal": "normal channels",
    "single-reader": "single-reader channels (?)",
    "process-local": "process-local channels (!), one queue per process",
}


# -- cells ----------------------------------------------------------------------------------


def _age(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)


def _rate(value: float) -> str:
    return "%.1f" % value


def _bar(channel: ChannelView) -> Text:
    """The queue's fill (waiting and unacknowledged over capacity) as a bar."""
    if not channel.capacity:
        return Text("?" * BAR_WIDTH, style="dim")
    filled = int(round(channel.fill * BAR_WIDTH))
    if channel.depth + channel.unacked and not filled:
        filled = 1  # a queue with anything in it never looks empty
    style = "green" if channel.fill < 0.5 else "yellow" if channel.fill < 0.9 else "bold red"
    bar = Text("#" * filled, style=style)
    bar.append("." * (BAR_WIDTH - filled), style="dim")
    return bar


def _depth(channel: ChannelView) -> str:
    held = channel.depth + channel.unacked
    return "%d/%s" % (held, channel.capacity if channel.capacity else "?")


# -- tables ---------------------------------------------------------------------------------


def _table(title: str, *columns: str, plain: bool = False) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=PLAIN_BOX if plain else box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right", no_wrap=index == 0)
    return table


def _channel_table(kind: str, channels: List[ChannelView], plain: bool) -> Table:
    columns = ["channel", "fill", "held/cap", "unacked", "in/s", "out/s", "oldest", "readers"]
    columns += ["taken in", "expired"]
    local = kind == "process-local"
    if local:
        columns.append("in groups")
    table = _table("%s: %d" % (KIND_TITLES[kind], len(channels)), *columns, plain=plain)
    for channel in channels:
        row: List[Any] = [
            channel.name,
            _bar(channel),
            _depth(channel),
            str(channel.unacked),
            _rate(channel.in_rate),
            _rate(channel.out_rate),
            _age(channel.oldest_age),
            str(channel.readers),
            str(channel.taken_in),
            str(channel.expired),
        ]
        if local:
            row.append(str(channel.local_members))
        table.add_row(*row)
    return table


def _groups_table(snapshot: Snapshot, plain: bool) -> Table:
    table = _table("groups: %d" % len(snapshot.groups), "group", "members", "lapsed", plain=plain)
    for group in sorted(snapshot.groups, key=lambda g: (-g.members, g.name)):
        table.add_row(group.name, str(group.members), str(group.lapsed))
    return table


def _dead_letter_table(snapshot: Snapshot, plain: bool) -> Table:
    dead = snapshot.dead_letters
    table = _table(
        "dead letters (group expiry, dropped members)",
        "waiting",
        "taken in",
        "in/s",
        "handled/s",
        "workers",
        "expired messages",
        "lapsed memberships",
        plain=plain,
    )
    if not dead.exists:
        table.title = "dead letters: no dead-letter queue yet (no group was used)"
    table.add_row(
        str(dead.pending),
        str(dead.taken_in),
        _rate(dead.in_rate),
        _rate(dead.handled_rate),
        str(dead.workers),
        str(dead.expired_messages),
        str(dead.lapsed_memberships),
    )
    return table


def render(snapshot: Snapshot, sort: str, note: str = "", plain: bool = False) -> RenderableType:
    """The whole view of one snapshot (the live view and --once text alike);
    ``plain`` draws the tables in ASCII."""
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    header = Text("asgi-amqp top: prefix %r at %s" % (snapshot.prefix, taken), style="bold")
    header.append("  (%s, sorted by %s)" % (snapshot.management_url, sort), style="dim")
    parts: List[RenderableType] = [header]
    if note:
        parts.append(Text(note, style="bold red"))
    for kind in KINDS:
        parts.append(_channel_table(kind, sort_channels(snapshot.by_kind(kind), sort), plain))
    parts.append(_groups_table(snapshot, plain))
    parts.append(_dead_letter_table(snapshot, plain))
    return Group(*parts)


def as_json(snapshot: Snapshot, sort: str) -> str:
    body = snapshot.as_dict()
    order = {c.name: i for i, c in enumerate(sort_channels(snapshot.channels, sort))}
    body["channels"].sort(key=lambda c: order[c["name"]])
    body["sort"] = sort
    return json.dumps(body)


def print_once(snapshot: Snapshot, sort: str) -> None:
    """The view on stdout: in colour on a terminal, else plain text without trailing blanks."""
    if sys.stdout.isatty():
        Console().print(render(snapshot, sort))
        return
    console = Console(width=PLAIN_WIDTH, color_system=None)
    with console.capture() as capture:
        console.print(render(snapshot, sort, plain=True))
    for line in capture.get().splitlines():
        click.echo(line.rstrip())


# -- the command ----------------------------------------------------------------------------


class LiveView(object):
    """Refreshes the view every ``interval`` s, ``iterations`` times (0: until Ctrl-C).

    A refresh that fails keeps the last snapshot on screen under the error,
    and the next one tries again: the broker may be restarting.
    """

    def __init__(
        self,
        collect: Callable[[], Snapshot],
        sort: str,
        interval: float,
        iterations: int,
        console: Optional[Console] = None,
    ) -> None:
        self._collect = collect
        self._sort = sort
        self._interval = interval
        self._iterations = iterations
        self._console = console or Console()

    def run(self, first: Snapshot) -> None:
        snapshot, done = first, 0
        with Live(render(first, self._sort), console=self._console, auto_refresh=False) as live:
            while True:
                done += 1
                if self._iterations and done >= self._iterations:
                    return
                time.sleep(self._interval)
                note = ""
                try:
                    snapshot = self._collect()
                except ManagementAPIError as exc:
                    note = "refresh failed, showing the last snapshot: %s" % exc
                live.update(render(snapshot, self._sort, note), refresh=True)


@cli.command(epilog=EPILOG)
@click.option(
    "--sort",
    type=click.Choice(SORT_KEYS),
    default="depth",
    show_default=True,
    help="Order of the channels: waiting messages, in+out rate, oldest message "
    "(largest first), or name.",
)
@click.option(
    "--filter",
    "pattern",
    metavar="GLOB",
    help="Show only channels and groups whose name matches GLOB (e.g. 'http.*').",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between refreshes (the broker samples every 5 s by default).",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Stop after N refreshes (0: run until Ctrl-C).",
)
@click.option("--once", is_flag=True, help="Print one snapshot as text and exit.")
@click.option("--json", "as_json_output", is_flag=True, help="With --once: print JSON instead.")
@click.pass_obj
def top(settings, sort, pattern, interval, iterations, once, as_json_output):
    """A live view of the prefix: channels by kind, groups and dead letters.

    Each channel shows its messages against its capacity as a bar, the
    broker's in and out rates, the age of its oldest message, its readers,
    what its queue took in and how many of those expired. Groups show their
    members and the memberships that lapsed (group_expiry passed); dead
    letters the events the dead-letter workers handle. Needs the management
    API; the broker refreshes its figures every 5 s by default.
    """
    if as_json_output and not once:
        raise click.UsageError("--json needs --once")
    layer = settings.layer()
    collector = Collector(layer.management_client(), layer.topology)

    def collect() -> Snapshot:
        return collector(pattern)

    with _LayerErrors():
        snapshot = collect()
    if as_json_output:
        click.echo(as_json(snapshot, sort))
        return
    if once:
        print_once(snapshot, sort)
        return
    try:
        LiveView(collect, sort, interval, iterations).run(snapshot)
    except KeyboardInterrupt:
        pass
