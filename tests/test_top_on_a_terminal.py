"""``asgi-amqp top`` on a real screen: every section reached by its key, nothing cut.

A module fixture puts 201 channels on a prefix of their own, with a
single-reader channel, a process's local channels in groups, two groups
and a message that expired into the dead-letter queue, and waits until the
management API's sample shows all of it. Each test then runs ``top`` in a
pseudo-terminal of 80×24 or 200×50, presses keys, and reads the screens it
draws: :class:`Screen` takes the last whole frame from the output (``rich``
draws each one from the top left corner, ``ESC [H``, in the alternate
screen) and drops the colours, which is all this view writes.
"""

import json
import re
import uuid

import pytest
from click.testing import CliRunner

from asgi_amqp.tools import cli
from helpers import wait_until
from pty_terminal import Terminal

pytestmark = pytest.mark.slow

CHANNELS = 201  # tt.c000 to tt.c200, one message each
SIZES = [(80, 24), (200, 50)]
HEADERS = ["channel", "fill", "held/cap", "unacked", "in/s", "out/s", "oldest", "readers"]
HEADERS += ["taken in", "expired"]
# What narrow terminals keep of the channel columns (top.DROP_ORDER drops the rest).
KEPT_AT_80 = ["channel", "fill", "held/cap", "in/s", "out/s", "oldest", "readers"]
SECTION_TITLES = {
    "2": "normal channels: %d" % CHANNELS,
    "3": "single-reader channels (?): 1",
    "4": "process-local channels (!), one queue per process: 1",
    "5": "groups: 2",
    "6": "dead letters (group expiry, dropped members)",
}
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HOME = "\x1b[H"
KEY_CODES = {"tab": "\t", "end": "\x1b[F", "home": "\x1b[H", "pgdn": "\x1b[6~", "pgup": "\x1b[5~"}
KEY_CODES.update({"down": "\x1b[B", "up": "\x1b[A", "backtab": "\x1b[Z"})


@pytest.fixture(scope="module")
def prefix():
    return "tt-%s" % uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def env(broker):
    return {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": broker.management_url}


def _snapshot(env, prefix):
    runner = CliRunner()
    args = ["--prefix", prefix, "top", "--once", "--json"]
    result = runner.invoke(cli.cli, args, env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def traffic(broker, module_layer, env, prefix):
    layer = module_layer(broker, flush=True, prefix=prefix, capacity=50, expiry=600)
    for n in range(CHANNELS):
        layer.send("tt.c%03d" % n, {"n": n})
    layer.send("tt.reply?abc", {"n": 0})
    for name in ("tt.proc!a", "tt.proc!b"):
        layer.send(name, {"n": 0})
        layer.group_add("tt-room", name)
    layer.group_add("tt-lobby", "tt.c000")
    brief = module_layer(broker, prefix=prefix, capacity=50, expiry=1)
    # A message that expires after a second, into the dead-letter queue; its
    # queue goes a second later (x-expires).
    brief.send("tt.stale", {"n": 0})

    def sampled():
        body = _snapshot(env, prefix)
        return (
            len(body["channels"]) == CHANNELS + 2
            and body["dead_letters"]["taken_in"] >= 1
            and len(body["groups"]) == 2
        )

    wait_until(sampled, timeout=40, interval=0.5, message="top showing the traffic")
    return layer


class Screen(Terminal):
    """``asgi-amqp --prefix PREFIX top ARGS`` in a pseudo-terminal of ``columns``×``lines``."""

    def __init__(self, prefix, env, columns, lines, args=(), stdin_terminal=True):
        args = ["--prefix", prefix, "top", "--interval", "0.5", "--sort", "name"] + list(args)
        super().__init__(args, env, (columns, lines), stdin_terminal)

    def resize(self, columns, lines):
        self.output = ""  # frame() takes only screens of the new size
        super().resize(columns, lines)

    def frame(self):
        """The last whole screen drawn, as lines of plain text (None before the first)."""
        columns, lines = self.size
        for frame in reversed(self.output.split(HOME)[1:]):
            text = CONTROL.sub("", frame).split("\r\n")
            if len(text) == lines and len(text[-1]) == columns:
                return text
        return None

    def wait_for(self, predicate, timeout=20):
        """The first screen for which ``predicate(lines)`` is true, reading until the deadline."""

        def shown(output):
            frame = self.frame()
            return frame and predicate(frame)

        if not shown(self.read_until(shown, timeout)):
            last = self.frame() or [self.output[-2000:]]
            raise AssertionError(
                "no such screen in %s s; the last:\n%s" % (timeout, "\n".join(last))
            )
        return self.frame()

    def press(self, key, predicate, timeout=20):
        """Press ``key`` and wait for a screen drawn after it that ``predicate`` accepts."""
        self.output = ""  # only screens drawn from now on
        self.type(KEY_CODES.get(key, key))
        return self.wait_for(predicate, timeout)


def _title(frame):
    """The section's title: the line under the header and the tabs."""
    return frame[2]


def _headers(frame):
    """The column headers of the section's table (the line above its rule)."""
    rule = next(i for i, line in enumerate(frame) if line.startswith("───"))
    return re.split(r"\s{2,}", frame[rule - 1].strip())


def _titled(title):
    return lambda frame: _title(frame).startswith(title)


def _footer(frame):
    return frame[-1]


@pytest.mark.parametrize("columns,lines", SIZES)
def test_every_section_is_reached_by_its_key(traffic, env, prefix, columns, lines):
    with Screen(prefix, env, columns, lines) as screen:
        first = screen.wait_for(lambda frame: "normal channels" in _title(frame))
        assert "more: key 2" in _title(first)  # the overview: 201 channels do not fit
        # Every section has its title in the overview (beside the channels at 200 columns).
        text = "\n".join(first)
        assert all(title.split(" (")[0] in text for title in SECTION_TITLES.values()), text
        for key, title in sorted(SECTION_TITLES.items()):
            frame = screen.press(key, _titled(title))
            assert len(frame) == lines and all(len(line) == columns for line in frame)
        screen.press("tab", lambda frame: "more: key 2" in _title(frame))  # round to the overview
        screen.press("backtab", lambda frame: _title(frame).startswith(SECTION_TITLES["6"]))
        screen.type("q")
        assert screen.wait(timeout=10) == 0
        assert screen.output.rstrip().endswith("\x1b[?25h")  # the cursor shown again


@pytest.mark.parametrize("columns,lines", SIZES)
def test_no_header_or_figure_is_cut(traffic, env, prefix, columns, lines):
    wanted = KEPT_AT_80 if columns == 80 else HEADERS
    with Screen(prefix, env, columns, lines) as screen:
        frame = screen.wait_for(lambda frame: "normal channels" in _title(frame))
        assert "…" not in "\n".join(frame[1:])  # the first line may cut the API's address
        frame = screen.press("2", lambda frame: _title(frame).startswith(SECTION_TITLES["2"]))
        headers = _headers(frame)
        # Whole words, in their order; the narrow terminal leaves out some.
        assert headers == [h for h in HEADERS if h in headers], headers
        assert set(wanted) <= set(headers), headers
        assert "…" not in "\n".join(frame[1:])
        bar = frame[5].split()[1]  # tt.c000: 1 message of 50
        assert set(bar) == {"#", "."} and 5 <= len(bar) <= 20, bar
        if columns == 200:
            assert "in groups" in "\n".join(screen.press("4", lambda f: "tt.proc!" in f[5]))


@pytest.mark.parametrize("columns,lines", SIZES)
def test_long_tables_scroll(traffic, env, prefix, columns, lines):
    page = lines - 3 - 3  # header, tabs, footer; title, headers, rule
    with Screen(prefix, env, columns, lines) as screen:
        screen.wait_for(lambda frame: "normal channels" in _title(frame))
        frame = screen.press("2", lambda frame: "rows 1-%d of 201" % page in _footer(frame))
        assert frame[5].startswith("tt.c000")
        frame = screen.press("end", lambda frame: "-201 of 201" in _footer(frame))
        assert frame[-2].startswith("tt.c200")
        screen.press("home", lambda frame: "rows 1-%d of 201" % page in _footer(frame))
        frame = screen.press("pgdn", lambda frame: "rows %d-" % (page + 1) in _footer(frame))
        assert frame[5].startswith("tt.c%03d" % page)
        screen.press("j", lambda frame: "rows %d-" % (page + 2) in _footer(frame))
        screen.press("up", lambda frame: "rows %d-" % (page + 1) in _footer(frame))
        screen.press("pgup", lambda frame: "rows 1-" in _footer(frame))


def test_the_screen_follows_the_terminal_size(traffic, env, prefix):
    with Screen(prefix, env, 80, 24) as screen:
        screen.wait_for(lambda frame: "normal channels" in _title(frame))
        screen.resize(200, 50)  # Screen.frame() takes only screens of the new size
        frame = screen.wait_for(lambda frame: "groups: 2" in frame[2])  # beside the channels
        assert _headers(frame) == HEADERS + ["group", "members", "lapsed"]
        screen.resize(80, 24)
        frame = screen.wait_for(lambda frame: frame[-3].startswith("dead letters: "))
        assert "taken in" not in _headers(frame)


def test_without_keys_the_overview_is_drawn_in_place(traffic, env, prefix):
    """stdin not a terminal: no full screen and no keys, the overview in the terminal's height."""
    with Screen(prefix, env, 200, 50, ["--iterations", "2"], stdin_terminal=False) as screen:
        assert screen.wait(timeout=30) == 0
    assert "\x1b[?1049h" not in screen.output  # not the alternate screen
    text = CONTROL.sub("", screen.output)
    for title in SECTION_TITLES.values():
        assert title.split(" (")[0] in text
    last = text.split("asgi-amqp top: prefix")[-1].rstrip().splitlines()
    assert len(last) < 50  # the last drawing fits the screen
    assert "more)" in last[1] and "key 2" not in text  # the rows left out, no key to show them
