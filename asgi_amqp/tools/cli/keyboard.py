"""Keys from a terminal, one at a time, for the interactive ``asgi-amqp top``.

A full-screen view needs single key presses (Tab, arrows, ``q``) without
Enter and without echo, and must hear that the window changed size.
:class:`Keyboard` puts the terminal in cbreak mode (Ctrl-C still
interrupts) for the time of a ``with`` block, and :meth:`Keyboard.read`
waits, with a timeout, for keys or a resize (SIGWINCH, through a pipe so
that the wait wakes up). The terminal's mode and the previous SIGWINCH
handler are restored on the way out, whatever ends the block.

Only POSIX terminals: :func:`interactive` says whether stdin and stdout are
both terminals and the platform has ``termios``; otherwise ``top`` draws
without keys.
"""

import os
import select
import signal
import sys
from types import FrameType, TracebackType
from typing import IO, Any, Callable, List, Optional, Type, Union

try:
    import termios
    import tty
except ImportError:  # Windows: no keys, the view refreshes without them
    termios = None  # type: ignore[assignment]
    tty = None  # type: ignore[assignment]

RESIZE = "resize"
CLOSED = "closed"  # the terminal went away: the view ends
ESCAPE = "\x1b"
# Escape sequences of the keys the view knows, in the forms xterm, the
# Linux console and screen/tmux send (normal and application cursor mode).
SEQUENCES = {
    "[A": "up",
    "OA": "up",
    "[B": "down",
    "OB": "down",
    "[C": "right",
    "OC": "right",
    "[D": "left",
    "OD": "left",
    "[5~": "pgup",
    "[6~": "pgdn",
    "[H": "home",
    "OH": "home",
    "[1~": "home",
    "[7~": "home",
    "[F": "end",
    "OF": "end",
    "[4~": "end",
    "[8~": "end",
    "[Z": "backtab",
}
NAMED = {"\t": "tab", "\r": "enter", "\n": "enter", " ": "space", "\x7f": "backspace"}


def interactive() -> bool:
    """Whether keys can be read: stdin and stdout are terminals on a POSIX system."""
    return termios is not None and sys.stdin.isatty() and sys.stdout.isatty()


def parse(text: str) -> List[str]:
    """The keys in what the terminal sent: names (``up``, ``tab``) or the characters.

    An unknown escape sequence is skipped whole; a lone Escape is ``escape``.
    """
    keys: List[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        index += 1
        if char != ESCAPE:
            keys.append(NAMED.get(char, char))
            continue
        rest = text[index:]
        known = [s for s in SEQUENCES if rest.startswith(s)]
        if known:
            sequence = max(known, key=len)
            keys.append(SEQUENCES[sequence])
            index += len(sequence)
        elif rest[:1] in ("[", "O"):
            # An unknown sequence: CSI parameters up to the final byte (@ to ~).
            index += 1
            while index < len(text) and not "@" <= text[index] <= "~":
                index += 1
            index += 1
        else:
            keys.append("escape")
    return keys


# What signal.signal returns: a function, SIG_DFL or SIG_IGN, or None (set outside Python).
SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class Keyboard(object):
    """Key presses and resizes of the terminal on ``stream`` (stdin), in cbreak mode."""

    def __init__(self, stream: Optional[IO[Any]] = None) -> None:
        self._fd = (stream or sys.stdin).fileno()
        self._saved: Optional[List[Any]] = None
        self._wake_read = self._wake_write = -1
        self._previous_handler: SignalHandler = None

    def __enter__(self) -> "Keyboard":
        self._saved = termios.tcgetattr(self._fd)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._previous_handler = signal.signal(signal.SIGWINCH, self._resized)
        tty.setcbreak(self._fd, termios.TCSANOW)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            if self._saved is not None:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
        finally:
            signal.signal(signal.SIGWINCH, self._previous_handler or signal.SIG_DFL)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _resized(self, signum: int, frame: Optional[FrameType]) -> None:
        try:
            os.write(self._wake_write, b"w")
        except BlockingIOError:  # a wake-up is already waiting
            pass

    def read(self, timeout: float) -> List[str]:
        """The keys pressed (and ``RESIZE`` for a resize) within ``timeout`` s; [] if none."""
        readable, _, _ = select.select([self._fd, self._wake_read], [], [], max(0.0, timeout))
        keys: List[str] = []
        if self._wake_read in readable:
            os.read(self._wake_read, 1024)
            keys.append(RESIZE)
        if self._fd in readable:
            data = os.read(self._fd, 1024)
            keys.extend(parse(data.decode("utf8", "replace")) if data else [CLOSED])
        return keys
