"""The ``asgi-amqp`` command run in a pseudo-terminal, for the tests of what it draws.

``top`` draws differently on a terminal (in place, in colour, full screen
with keys) than into a pipe, so its tests give it a real one: a pty whose
other end the test reads, and writes keys to.
"""

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Terminal(object):
    """``python -m asgi_amqp ARGS`` with a pty as its terminal.

    ``size`` (columns, lines) sets the pty's window size, which the command
    reads and follows (:meth:`resize`); without it, the terminal says
    nothing of its size and ``COLUMNS=160``, ``LINES=60`` stand in.
    ``stdin_terminal=False`` gives the command no input (``/dev/null``).
    """

    def __init__(self, args, env, size=None, stdin_terminal=True):
        self._master, slave = pty.openpty()
        full_env = dict(os.environ, TERM="xterm-256color", **env)
        self.size = size
        if size:
            self._set_size(slave)
            for name in ("COLUMNS", "LINES"):  # the terminal's size, not the environment's
                full_env.pop(name, None)
        else:
            full_env.update(COLUMNS="160", LINES="60")
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, full_env.get("PYTHONPATH")] if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "asgi_amqp"] + list(args),
            stdin=slave if stdin_terminal else subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            env=full_env,
            close_fds=True,
        )
        os.close(slave)
        self.output = ""

    def _set_size(self, fd):
        columns, lines = self.size
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))

    def resize(self, columns, lines):
        """A new window size, and the SIGWINCH a terminal sends with it."""
        self.size = (columns, lines)
        self._set_size(self._master)
        self.process.send_signal(signal.SIGWINCH)

    def type(self, text):
        os.write(self._master, text.encode("utf8"))

    def read_until(self, predicate, timeout):
        """Read the output until ``predicate(output)`` or the process ended; the output."""
        deadline = time.monotonic() + timeout
        while not predicate(self.output) and time.monotonic() < deadline:
            readable, _, _ = select.select([self._master], [], [], 0.1)
            if readable:
                try:
                    chunk = os.read(self._master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    break
                self.output += chunk.decode("utf8", "replace")
            elif self.process.poll() is not None:
                break
        return self.output

    def wait(self, timeout):
        """The exit status, once the output is read to the end."""
        self.read_until(lambda output: False, timeout)
        return self.process.wait(timeout=timeout)

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._master)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
