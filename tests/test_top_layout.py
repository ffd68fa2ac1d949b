"""How ``asgi-amqp top`` lays a snapshot out on a screen, without a broker.

The pseudo-terminal tests (``test_top_on_a_terminal``) run the command
against a real broker at two sizes; these draw made-up snapshots at every
width from 40 to 240 columns, which a broker run cannot afford: no header
cut, no line longer than the screen, columns left out in the stated order,
and the keys read from a terminal's escape sequences.
"""

import pytest
from rich.console import Console

from asgi_amqp.tools.cli import keyboard, top
from asgi_amqp.tools.snapshot import ChannelView, DeadLetterView, GroupView, Snapshot


def _channel(name, kind="normal", depth=1):
    return ChannelView(
        name=name,
        kind=kind,
        depth=depth,
        unacked=0,
        capacity=200,
        in_rate=12.5,
        out_rate=3.0,
        oldest_age=75.0,
        readers=2,
        taken_in=123456,
        expired=7,
        local_members=3 if kind == "process-local" else 0,
    )


def _snapshot(channels=201):
    views = [_channel("http.request.%03d" % n, depth=n % 200) for n in range(channels)]
    views.append(_channel("http.response?8f2a1c", "single-reader"))
    views.append(_channel("daphne.response.Qx7k!", "process-local"))
    dead = DeadLetterView(True, 0, 5, 0.5, 0.1, 2, 7, 1)
    groups = [GroupView("room-%d" % n, n, 0) for n in range(30)]
    return Snapshot("shop", 1795619718.9, "http://127.0.0.1:15672", views, groups, dead)


def _screen(snapshot, section, width, height):
    console = Console(width=width, height=height, color_system=None, legacy_windows=False)
    screen = top.Screen("name")
    screen.press(str(section + 1))
    with console.capture() as capture:
        console.print(screen.draw(snapshot, "", console))
    return screen, capture.get().splitlines()


@pytest.mark.parametrize("width", range(40, 241, 8))
def test_channel_headers_are_whole_and_columns_go_in_the_stated_order(width):
    columns = top._channel_columns("process-local")
    rows = _snapshot().by_kind("normal")
    layout = top.fit(columns, rows, width)
    kept = [c.header for c in layout.columns]
    dropped = {c.header for c in columns if c.header not in kept}
    order = [header for header in top.DROP_ORDER if header in [c.header for c in columns]]
    assert dropped == set(order[: len(dropped)])
    for column, cell_width in zip(layout.columns, layout.widths):
        assert cell_width >= len(column.header)
    bar = layout.widths[kept.index("fill")]
    assert top.BAR_WIDTHS[0] <= bar <= top.BAR_WIDTHS[1]
    if width >= 60:  # room for the name, the bar, held/cap
        assert sum(layout.widths) + top.GAP * (len(kept) - 1) <= width


@pytest.mark.parametrize("width,height", [(80, 24), (100, 30), (132, 43), (200, 50)])
@pytest.mark.parametrize("section", range(len(top.SECTION_NAMES)))
def test_every_screen_fits_and_cuts_nothing(width, height, section):
    _, lines = _screen(_snapshot(), section, width, height)
    assert len(lines) == height
    assert all(len(line) <= width for line in lines), lines
    assert "…" not in "\n".join(lines[1:]), "\n".join(lines)  # line 1 may cut the API's URL


def test_the_widest_screen_shows_every_column():
    _, lines = _screen(_snapshot(), 1, 200, 50)
    headers = lines[3].split()
    for header in ("held/cap", "unacked", "in/s", "out/s", "oldest", "readers", "expired"):
        assert header in headers
    assert "taken" in headers


def test_scrolling_stops_at_both_ends():
    snapshot = _snapshot()
    screen, lines = _screen(snapshot, 1, 80, 24)
    assert lines[-1].endswith("rows 1-18 of 201")
    console = Console(width=80, height=24, color_system=None)
    for key, footer in [
        ("end", "rows 184-201 of 201"),
        ("down", "rows 184-201 of 201"),
        ("pgup", "rows 166-183 of 201"),
        ("k", "rows 165-182 of 201"),
        ("home", "rows 1-18 of 201"),
        ("up", "rows 1-18 of 201"),
        ("space", "rows 19-36 of 201"),
    ]:
        assert screen.press(key)
        with console.capture() as capture:
            console.print(screen.draw(snapshot, "", console))
        assert capture.get().splitlines()[-1].endswith(footer), key


def test_section_keys():
    screen = top.Screen("depth")
    assert [screen.press("tab") and screen.section for _ in range(6)] == [1, 2, 3, 4, 5, 0]
    assert screen.press("backtab") and screen.section == 5
    assert screen.press("3") and screen.section == 2
    assert screen.press("9") and screen.section == 2  # no such section
    assert screen.press("s") and screen.sort == "rate"
    assert not screen.press("q")
    assert not screen.press(keyboard.CLOSED)


def test_keys_from_escape_sequences():
    assert keyboard.parse("\t\x1b[Z\x1b[A\x1bOB\x1b[5~\x1b[6~\x1b[H\x1b[F\x1b[1~q") == [
        "tab",
        "backtab",
        "up",
        "down",
        "pgup",
        "pgdn",
        "home",
        "end",
        "home",
        "q",
    ]
    assert keyboard.parse("\x1b[1;5A2") == ["2"]  # an unknown sequence (Ctrl-Up) is skipped
    assert keyboard.parse("\x1b") == ["escape"]


@pytest.mark.parametrize("section", range(len(top.SECTION_NAMES)))
def test_an_empty_prefix_draws_every_section(section):
    empty = Snapshot(
        "shop",
        1795619718.9,
        "http://127.0.0.1:15672",
        [],
        [],
        DeadLetterView(False, 0, 0, 0.0, 0.0, 0, 0, 0),
    )
    _, lines = _screen(empty, section, 80, 24)
    assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
    if section in (0, 5):
        assert any(line.startswith(top.NO_DEAD_LETTERS) for line in lines)
