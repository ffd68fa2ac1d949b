"""``asgi-amqp top``: a live view of one prefix's channels, groups and dead letters.

The figures come from :mod:`asgi_amqp.tools.snapshot` (the management API);
this module only draws them, in one of three ways:

* on a terminal (stdin and stdout), a full screen like ``htop``'s: one
  section at a time (an overview of all, each kind of channel, groups,
  dead letters), chosen with Tab or a number key, long tables scrolled with
  the arrows and PgUp/PgDn, the keys listed on the last line;
* with stdout on a terminal but no keys (stdin redirected), every section
  one under the other, refreshed in place;
* with ``--once``, one snapshot as text (or ``--json``, JSON); when stdout is
  not a terminal the text is ASCII, 200 columns wide, for scripts.

A table never lets ``rich`` cut its headers: :func:`fit` lays it out to the
width itself, by shortening the fill bar, then the longest names, then
leaving out the columns that matter least (:data:`DROP_ORDER`).
"""

import dataclasses
import json
import sys
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from ...errors import ManagementAPIError
from ..snapshot import (
    KINDS,
    SORT_KEYS,
    ChannelView,
    Collector,
    DeadLetterView,
    GroupView,
    Snapshot,
    sort_channels,
)
from . import keyboard
from .base import EPILOG, _LayerErrors, cli, click
from .settings import Settings

BAR_WIDTH = 10  # the fill bar of --once text
BAR_WIDTHS = (5, 20)  # on a terminal: the narrowest and the widest bar
NAME_WIDTH = 24  # longer names are cut (with …) before a column is left out
# Between two columns: on a terminal a space and the divider (a space),
# in --once text padding, the divider and padding, as it always was.
GAP = 2
PLAIN_GAP = 3
PLAIN_WIDTH = 200  # columns of --once text when stdout is not a terminal
# box.SIMPLE_HEAD in ASCII: --once text is for scripts and e-mails too.
PLAIN_BOX = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
KIND_TITLES = {
    "normal": "normal channels",
    "single-reader": "single-reader channels (?)",
    "process-local": "process-local channels (!), one queue per process",
}
# The columns a narrow terminal leaves out, first to last: a count since
# the queue exists, a part of "held", then what went wrong and who reads.
# The name, the fill and held/cap always stay.
DROP_ORDER = (
    "taken in",
    "unacked",
    "meaning",
    "expired",
    "in groups",
    "readers",
    "out/s",
    "in/s",
    "oldest",
)


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


def _bar(channel: ChannelView, width: int) -> Text:
    """The channel's fill as a bar: its fullest queue's messages, waiting and
    unacknowledged, over the capacity (an ordered channel has 16 queues)."""
    if not channel.capacity:
        return Text("?" * width, style="dim")
    filled = int(round(channel.fill * width))
    if channel.depth + channel.unacked and not filled:
        filled = 1  # a queue with anything in it never looks empty
    style = "green" if channel.fill < 0.5 else "yellow" if channel.fill < 0.9 else "bold red"
    bar = Text("#" * filled, style=style)
    bar.append("." * (width - filled), style="dim")
    return bar


def _depth(channel: ChannelView) -> str:
    held = channel.depth + channel.unacked
    return "%d/%s" % (held, channel.capacity if channel.capacity else "?")


# -- layout ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Column:
    """A column: its header and its cell of a row (the bar's takes the bar's width too)."""

    header: str
    cell: Callable[[Any], str] = str
    bar: Optional[Callable[[Any, int], Text]] = None
    justify: str = "right"  # the first column, the name, is always on the left

    def natural(self, rows: Sequence[Any]) -> int:
        """The width of the header and the widest cell: nothing cut."""
        return max([cell_len(self.header)] + [cell_len(self.cell(row)) for row in rows])


@dataclasses.dataclass
class Layout:
    """The columns kept and their widths (the first column is the name)."""

    columns: List[Column]
    widths: List[int]


def fit(
    columns: List[Column],
    rows: Sequence[Any],
    width: int,
    bars: Tuple[int, int] = BAR_WIDTHS,
    gap: int = GAP,
) -> Layout:
    """The columns laid out in ``width`` cells without cutting a header.

    The first column (the name) and a bar column share what the others
    leave: the bar grows up to ``bars[1]``, shrinks down to ``bars[0]``, then
    names longer than :data:`NAME_WIDTH` are cut, then columns are left out
    in :data:`DROP_ORDER`. Widths come from every row, not only the rows on
    screen, so that scrolling does not move the columns.
    """
    natural = {column.header: column.natural(rows) for column in columns if not column.bar}
    name = columns[0]
    kept = list(columns)
    droppable = [h for h in DROP_ORDER if h in natural]

    def room() -> int:
        others = [natural[c.header] for c in kept[1:] if not c.bar]
        return width - sum(others) - gap * (len(kept) - 1)

    has_bar = any(c.bar for c in kept)
    least_bar = bars[0] if has_bar else 0
    least_name = min(natural[name.header], max(NAME_WIDTH, cell_len(name.header)))
    while room() < least_name + least_bar and droppable:
        header = droppable.pop(0)
        kept = [c for c in kept if c.header != header]
    space = room()
    bar = max(bars[0], min(bars[1], space - natural[name.header])) if has_bar else 0
    name_width = max(cell_len(name.header), min(natural[name.header], space - bar))
    widths = [name_width if c is name else bar if c.bar else natural[c.header] for c in kept]
    return Layout(kept, widths)


def _table(title: str, layout: Layout, rows: Sequence[Any], plain: bool) -> RenderableType:
    """The title and the rows in the layout; ``plain`` draws them in ASCII with the
    table's edges (--once text), else the title takes the whole width, not the table's."""
    table = Table(
        title=title if plain else None,
        title_justify="left",
        box=PLAIN_BOX if plain else box.SIMPLE_HEAD,
        show_edge=plain,
        pad_edge=False,
        padding=(0, 1) if plain else (0, 1, 0, 0),
    )
    for index, (column, width) in enumerate(zip(layout.columns, layout.widths)):
        table.add_column(
            column.header,
            justify="left" if index == 0 else column.justify,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="ellipsis",
            width=width,
        )
    for row in rows:
        cells: List[Any] = [
            c.bar(row, w) if c.bar else c.cell(row) for c, w in zip(layout.columns, layout.widths)
        ]
        table.add_row(*cells)
    if plain:
        return table
    return Group(Text(title, no_wrap=True, overflow="ellipsis"), table)


# -- sections -------------------------------------------------------------------------------


def _figure(attribute: str, form: Callable[[Any], str] = str) -> Callable[[Any], str]:
    return lambda item: form(getattr(item, attribute))


def _channel_columns(kind: str) -> List[Column]:
    columns = [
        Column("channel", _figure("name")),
        Column("fill", bar=_bar),
        Column("held/cap", _depth),
        Column("unacked", _figure("unacked")),
        Column("in/s", _figure("in_rate", _rate)),
        Column("out/s", _figure("out_rate", _rate)),
        Column("oldest", _figure("oldest_age", _age)),
        Column("readers", _figure("readers")),
        Column("taken in", _figure("taken_in")),
        Column("expired", _figure("expired")),
    ]
    if kind == "process-local":
        columns.append(Column("in groups", _figure("local_members")))
    return columns


GROUP_COLUMNS = [
    Column("group", _figure("name")),
    Column("members", _figure("members")),
    Column("lapsed", _figure("lapsed")),
]
# The dead-letter queue's figures: one row of a table when there is room (as
# --once prints them), else one line each.
DEAD_LETTER_FIGURES = (
    ("waiting", "pending", str, "events waiting for a worker"),
    ("taken in", "taken_in", str, "events since the queue exists"),
    ("in/s", "in_rate", _rate, "events a second into the queue"),
    ("handled/s", "handled_rate", _rate, "events a second the workers handled"),
    ("workers", "workers", str, "one per process that runs one"),
    ("expired messages", "expired_messages", str, "channel messages that expired (above)"),
    ("lapsed memberships", "lapsed_memberships", str, "memberships whose lease ended (above)"),
)
NO_DEAD_LETTERS = "dead letters: no dead-letter queue yet (no group was used)"
DEAD_LETTER_ROW = [Column(h, _figure(a, f)) for h, a, f, _ in DEAD_LETTER_FIGURES]
DEAD_LETTER_LINES = [
    Column("figure", lambda line: line[0]),
    Column("value", lambda line: line[1]),
    Column("meaning", lambda line: line[2], justify="left"),
]


@dataclasses.dataclass
class Section:
    """One part of the view: a table of rows under a title, and its tab."""

    name: str  # the tab's label
    short: str  # the label on a narrow terminal
    title: str
    rows: Sequence[Any]
    columns: List[Column]
    width: int = 0  # the width it is drawn in

    def layout(self, width: int, plain: bool = False) -> Layout:
        """Laid out in ``width``; ``plain``: as --once text, with a fixed bar and edges."""
        if plain:
            return fit(self.columns, self.rows, width - 2, (BAR_WIDTH, BAR_WIDTH), PLAIN_GAP)
        return fit(self.columns, self.rows, width)


def _dead_letter_section(dead: DeadLetterView, width: int) -> Section:
    title = "dead letters (group expiry, dropped members)" if dead.exists else NO_DEAD_LETTERS
    section = Section("dead letters", "dead", title, [dead], DEAD_LETTER_ROW, width)
    if section.layout(width).columns == DEAD_LETTER_ROW:
        return section
    lines = [(h, form(getattr(dead, a)), m) for h, a, form, m in DEAD_LETTER_FIGURES]
    return Section("dead letters", "dead", title, lines, DEAD_LETTER_LINES, width)


def sections(snapshot: Snapshot, sort: str, width: int) -> List[Section]:
    """The channels of each kind, the groups and the dead letters."""
    found: List[Section] = []
    for kind in KINDS:
        channels = sort_channels(snapshot.by_kind(kind), sort)
        title = "%s: %d" % (KIND_TITLES[kind], len(channels))
        short = "local" if kind == "process-local" else kind.split("-")[0]
        found.append(Section(kind, short, title, channels, _channel_columns(kind), width))
    groups: List[GroupView] = sorted(snapshot.groups, key=lambda g: (-g.members, g.name))
    title = "groups: %d" % len(groups)
    found.append(Section("groups", "groups", title, groups, GROUP_COLUMNS, width))
    found.append(_dead_letter_section(snapshot.dead_letters, width))
    return found


def _header(snapshot: Snapshot, sort: str, width: int) -> Text:
    """The first line: prefix and time, then (if it fits) the API and the sort."""
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    header = Text("asgi-amqp top: prefix %r at %s" % (snapshot.prefix, taken), style="bold")
    for detail in (
        "  (%s, sorted by %s)" % (snapshot.management_url, sort),
        "  (sorted by %s)" % sort,
    ):
        if header.cell_len + cell_len(detail) <= width:
            header.append(detail, style="dim")
            break
    header.truncate(width, overflow="ellipsis")
    return header


def _part(
    section: Section, width: int, shown: int, plain: bool = False, keys: bool = False
) -> RenderableType:
    """A section's title and table with its first ``shown`` rows; an empty one is its title.

    With ``keys`` the title of a section cut short names the key that shows it all.
    """
    title = section.title
    if shown < len(section.rows):
        title += " (%d more" % (len(section.rows) - shown)
        title += ": key %d)" % (SECTION_NAMES.index(section.name) + 1) if keys else ")"
    if not section.rows and not plain:
        return Text(title, no_wrap=True, overflow="ellipsis")
    return _table(title, section.layout(width, plain), section.rows[:shown], plain)


def render(
    snapshot: Snapshot, sort: str, note: str = "", plain: bool = False, width: int = PLAIN_WIDTH
) -> RenderableType:
    """Every section, one under the other, laid out in ``width`` columns;
    ``plain``: ASCII tables with a fixed bar (--once text for scripts)."""
    parts: List[RenderableType] = [_header(snapshot, sort, width)]
    if note:
        parts.append(Text(note, style="bold red"))
    for section in sections(snapshot, sort, width):
        parts.append(_part(section, width, len(section.rows), plain))
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
        console = Console()
        console.print(render(snapshot, sort, width=console.width))
        return
    print_plain(snapshot, sort)


def print_plain(snapshot: Snapshot, sort: str, note: str = "") -> None:
    """The view as ASCII text without trailing blanks, flushed at once: a file
    or a pipe has every snapshot printed so far, whenever the command ends."""
    console = Console(width=PLAIN_WIDTH, color_system=None)
    with console.capture() as capture:
        console.print(render(snapshot, sort, note, plain=True))
    for line in capture.get().splitlines():
        click.echo(line.rstrip())
    sys.stdout.flush()


# -- the full screen ------------------------------------------------------------------------

OVERVIEW = "all"
SECTION_NAMES = (OVERVIEW,) + KINDS + ("groups", "dead letters")
TABLE_LINES = 3  # a section's lines besides its rows: title, headers, rule
WIDE = 160  # from this width on, the overview has two columns,
SPLIT = 3  # this far apart
KEYS = (  # the footer, by priority: what does not fit is left out
    ("Tab/1-6", "section"),
    ("↑↓/PgUp/PgDn", "scroll"),
    ("s", "sort"),
    ("q", "quit"),
    ("Home/End", "first/last"),
)


def _dead_letter_summary(dead: DeadLetterView) -> Text:
    """The dead-letter figures as a sentence, for the overview."""
    if not dead.exists:
        return Text(NO_DEAD_LETTERS)
    return Text(
        "dead letters: %d waiting, %d taken in, %s/s in, %s/s handled, %d workers, "
        "%d expired messages, %d lapsed memberships"
        % (
            dead.pending,
            dead.taken_in,
            _rate(dead.in_rate),
            _rate(dead.handled_rate),
            dead.workers,
            dead.expired_messages,
            dead.lapsed_memberships,
        )
    )


def _share(tables: List[Section], lines: int, keys: bool) -> List[RenderableType]:
    """The sections in ``lines`` lines (or their titles): the rows shared out evenly."""
    spare = lines - sum(TABLE_LINES if s.rows else 1 for s in tables)
    shown = [0] * len(tables)
    while spare > 0 and any(n < len(s.rows) for n, s in zip(shown, tables)):
        for index, section in enumerate(tables):
            if spare > 0 and shown[index] < len(section.rows):
                shown[index] += 1
                spare -= 1
    return [_part(section, section.width, n, keys=keys) for section, n in zip(tables, shown)]


def overview(
    snapshot: Snapshot, sort: str, console: Console, lines: int, keys: bool = True
) -> List[RenderableType]:
    """Every section in ``lines`` lines, each showing its first rows (``keys``: and
    the key that shows the rest).

    From :data:`WIDE` columns on, the groups and the dead letters go to the
    right of the channels, a third of the width; on a narrower terminal
    they go under them, the dead letters as a sentence.
    """
    width = console.width
    if width < WIDE:
        tables = sections(snapshot, sort, width)[:-1]
        summary = _dead_letter_summary(snapshot.dead_letters)
        return _share(tables, lines - len(summary.wrap(console, width)), keys) + [summary]
    right = width // 3
    left = width - right - SPLIT
    found = sections(snapshot, sort, left)
    groups = dataclasses.replace(found[3], width=right)
    dead = dataclasses.replace(_dead_letter_section(snapshot.dead_letters, right), width=right)
    dead_lines = TABLE_LINES + len(dead.rows)
    grid = Table.grid(padding=(0, 0, 0, SPLIT), pad_edge=False)
    grid.add_column(width=left, no_wrap=True)
    grid.add_column(width=right + SPLIT, no_wrap=True)  # the padding is in the width
    grid.add_row(
        Group(*_share(found[:3], lines, keys)),
        Group(*(_share([groups], lines - dead_lines, keys) + [_part(dead, right, len(dead.rows))])),
    )
    return [grid]


class Screen(object):
    """What the full screen shows and the keys that change it: the section, its scroll, the sort."""

    def __init__(self, sort: str) -> None:
        self.sort = sort
        self.section = 0  # an index into SECTION_NAMES; 0 is the overview
        self.offsets = dict.fromkeys(range(len(SECTION_NAMES)), 0)
        self._page = 1
        self._rows = 0

    def press(self, key: str) -> bool:
        """Apply a key; False when it ends the view."""
        if key in ("q", "Q", keyboard.CLOSED):
            return False
        count = len(SECTION_NAMES)
        moves = {
            "up": -1,
            "k": -1,
            "down": 1,
            "j": 1,
            "pgup": -self._page,
            "b": -self._page,
            "pgdn": self._page,
            "space": self._page,
            "home": -self._rows,
            "g": -self._rows,
            "end": self._rows,
            "G": self._rows,
        }
        if key in ("tab", "right", "l"):
            self.section = (self.section + 1) % count
        elif key in ("backtab", "left", "h"):
            self.section = (self.section - 1) % count
        elif key.isdigit() and 1 <= int(key) <= count:
            self.section = int(key) - 1
        elif key == "s":
            self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
        elif key in moves:
            offset = self.offsets[self.section] + moves[key]
            self.offsets[self.section] = max(0, min(offset, self._rows - self._page))
        return True

    def draw(self, snapshot: Snapshot, note: str, console: Console) -> RenderableType:
        """The screen: header, tabs, (the note), the section, the keys."""
        width, height = console.size
        found = sections(snapshot, self.sort, width)
        lines: List[RenderableType] = [_header(snapshot, self.sort, width)]
        lines.append(self._tabs(found, width))
        if note:
            lines.append(Text(note, style="bold red", no_wrap=True, overflow="ellipsis"))
        body = max(1, height - len(lines) - 1)
        position = ""
        if self.section == 0:
            self._rows = self._page = 0
            parts = overview(snapshot, self.sort, console, body)
        else:
            section = found[self.section - 1]
            self._rows, self._page = len(section.rows), max(1, body - TABLE_LINES)
            offset = self.offsets[self.section] = max(
                0, min(self.offsets[self.section], self._rows - self._page)
            )
            shown = section.rows[offset : offset + self._page]
            parts = [_table(section.title, section.layout(width), shown, plain=False)]
            if shown:
                position = "rows %d-%d of %d" % (offset + 1, offset + len(shown), self._rows)
        drawn = console.render_lines(Group(*parts), console.options.update(width=width), pad=False)
        blank = [Segment("\n")]
        lines.extend(Segments(line + blank) for line in drawn[:body])
        lines.extend(Text("") for _ in range(body - len(drawn)))
        lines.append(self._keys(position, width))
        return Group(*lines)

    def _tabs(self, found: List[Section], width: int) -> Text:
        """The sections' keys, names and sizes; the one shown in brackets (and reversed)."""
        counts = [""] + [" %d" % len(s.rows) for s in found[:-1]] + [""]
        for labels in (
            [OVERVIEW] + [s.name for s in found],
            [OVERVIEW] + [s.short for s in found],
        ):
            tabs = Text(no_wrap=True, overflow="ellipsis")
            for index, (label, count) in enumerate(zip(labels, counts)):
                tab = "%d %s%s" % (index + 1, label, count)
                if index == self.section:
                    tabs.append("[%s]" % tab, style="reverse bold")
                else:
                    tabs.append(" %s " % tab)
            if tabs.cell_len <= width:
                break
        return tabs

    def _keys(self, position: str, width: int) -> Text:
        """The last line: the keys that fit, then where the rows shown are."""
        footer = Text(no_wrap=True, overflow="ellipsis")
        room = width - cell_len(position) - 1
        for key, label in KEYS:
            if footer.cell_len + cell_len("%s %s " % (key, label)) > room:
                break
            footer.append(key, style="reverse bold")
            footer.append(" %s " % label)
        footer.append(" " * max(1, width - footer.cell_len - cell_len(position)))
        footer.append(position, style="dim")
        footer.truncate(width)
        return footer


# -- the command ----------------------------------------------------------------------------


class LiveView(object):
    """Refreshes the view every ``interval`` s, ``iterations`` times (0: until q or Ctrl-C).

    With ``keys`` (a :class:`keyboard.Keyboard`) it is the full screen and
    a key redraws at once; without, every section one under the other.
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
        keys: Optional[keyboard.Keyboard] = None,
    ) -> None:
        self._collect = collect
        self._screen = Screen(sort)
        self._interval = interval
        self._iterations = iterations
        self._console = console or Console()
        self._keys = keys

    def _draw(self, snapshot: Snapshot, note: str) -> RenderableType:
        """The full screen with keys; else on a terminal the overview in its height
        (a line spare, so that the terminal does not scroll); else everything."""
        console, sort = self._console, self._screen.sort
        if self._keys:
            return self._screen.draw(snapshot, note, console)
        if not console.is_terminal:
            return render(snapshot, sort, note, width=console.width)
        parts: List[RenderableType] = [_header(snapshot, sort, console.width)]
        if note:
            parts.append(Text(note, style="bold red", no_wrap=True, overflow="ellipsis"))
        lines = console.height - len(parts) - 1
        return Group(*(parts + overview(snapshot, sort, console, lines, keys=False)))

    def run(self, first: Snapshot) -> None:
        if self._keys is None and not self._console.is_terminal:
            self._print_each(first)  # a file or a pipe: no redrawing, text as --once
            return
        screen = self._keys is not None
        try:
            with Live(
                self._draw(first, ""), console=self._console, auto_refresh=False, screen=screen
            ) as live:
                self._refresh(live, first)
        finally:
            if screen:
                self._console.show_cursor(True)  # once more, after the alternate screen

    def _print_each(self, snapshot: Snapshot) -> None:
        """Every snapshot one after the other, a blank line between them."""
        print_plain(snapshot, self._screen.sort)
        for _ in self._refreshes():
            click.echo("")
            note = ""
            try:
                snapshot = self._collect()
            except ManagementAPIError as exc:
                note = "refresh failed, showing the last snapshot: %s" % exc
            print_plain(snapshot, self._screen.sort, note)

    def _refreshes(self) -> Iterator[int]:
        """Waits ``interval`` s before each refresh after the first, as many as allowed."""
        done = 1
        while not self._iterations or done < self._iterations:
            time.sleep(self._interval)
            done += 1
            yield done

    def _refresh(self, live: Live, snapshot: Snapshot) -> None:
        """Until the last refresh or ``q``: a new snapshot every interval, keys at once."""
        note, done = "", 1
        next_at = time.monotonic() + self._interval
        while not self._iterations or done < self._iterations:
            wait = next_at - time.monotonic()
            if self._keys:
                if not all(self._screen.press(key) for key in self._keys.read(wait)):
                    return
            else:
                time.sleep(max(0.0, wait))
            if time.monotonic() >= next_at:
                done += 1
                note = ""
                try:
                    snapshot = self._collect()
                except ManagementAPIError as exc:
                    note = "refresh failed, showing the last snapshot: %s" % exc
                next_at = time.monotonic() + self._interval
            live.update(self._draw(snapshot, note), refresh=True)


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
    help="Stop after N refreshes (0: run until q or Ctrl-C).",
)
@click.option("--once", is_flag=True, help="Print one snapshot as text and exit.")
@click.option("--json", "as_json_output", is_flag=True, help="With --once: print JSON instead.")
@click.pass_obj
def top(
    settings: Settings,
    sort: str,
    pattern: Optional[str],
    interval: float,
    iterations: int,
    once: bool,
    as_json_output: bool,
) -> None:
    """A live view of the prefix: channels by kind, groups and dead letters.

    Each channel shows its messages against its capacity as a bar, the
    broker's in and out rates, the age of its oldest message, its readers,
    what its queue took in and how many of those expired. Groups show their
    members and the memberships that lapsed (group_expiry passed); dead
    letters the events the dead-letter workers handle. Needs the management
    API; the broker refreshes its figures every 5 s by default.

    On a terminal it takes the whole screen, like htop: Tab or 1-6 choose
    the section (1 is an overview of all), the arrows, PgUp/PgDn and
    Home/End (or j/k, space/b, g/G) scroll, s changes the sort, q quits.
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
        if keyboard.interactive():
            with keyboard.Keyboard() as keys:
                LiveView(collect, sort, interval, iterations, keys=keys).run(snapshot)
        else:
            LiveView(collect, sort, interval, iterations).run(snapshot)
    except KeyboardInterrupt:
        pass
