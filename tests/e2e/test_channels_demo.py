"""``make demo``'s program, examples/chat_demo.py: the scripted part, and Ctrl-C."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from e2e_support import chatstack

pytestmark = pytest.mark.slow

DEMO = os.path.join(chatstack.REPO_ROOT, "examples", "chat_demo.py")


class _Demo(object):
    def __init__(self, broker, *args):
        env = dict(os.environ, PYTHONUNBUFFERED="1", AMQP_URL=broker.amqp_url)
        env.pop("CHAT_DEMO_ONCE", None)
        if broker.management_url:
            env["AMQP_MANAGEMENT_URL"] = broker.management_url
        self.popen = subprocess.Popen(
            [sys.executable, DEMO, "--port", "0"] + list(args),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in iter(self.popen.stdout.readline, b""):
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self):
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, text, timeout):
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(text in line for line in self.lines):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (
                    self.popen.poll() is not None and not self._reader.is_alive()
                ):
                    raise AssertionError(
                        "the demo did not print %r:\n%s" % (text, "\n".join(self.lines))
                    )
                self._cond.wait(min(remaining, 0.2))

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(
                "the demo did not exit within %.0f s:\n%s" % (timeout, self.output)
            )
        finally:
            self._reader.join(5)

    def child_pids(self):
        return [
            int(pid)
            for pid in re.findall(r"^\s+(?:daphne|worker-\d+)\s+pid (\d+)", self.output, re.M)
        ]


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_demo_once_runs_the_scripted_room_and_exits_cleanly(broker):
    demo = _Demo(broker, "--once")
    rc = demo.wait(120)
    out = demo.output
    assert rc == 0, out
    assert "native Twisted mode on the channel layer" in out
    assert "group room-demo has 2 members" in out
    assert len(re.findall(r'^  (alice|bob)\s+says ".*" +worker \d+', out, re.M)) == 6, out
    assert "bob    left: alice was told" in out
    assert "group room-demo has 1 member" in out
    assert re.search(
        r"Stopped: daphne \(pid \d+\) exit 0, worker-1 \(pid \d+\) exit 0, "
        r"worker-2 \(pid \d+\) exit 0",
        out,
    ), out
    assert "Removed the queues and exchanges" in out
    pids = demo.child_pids()
    assert len(pids) == 3 and all(_gone(pid) for pid in pids)


def test_demo_stops_everything_on_ctrl_c(broker):
    demo = _Demo(broker)
    try:
        demo.wait_for("Ctrl-C stops it", 120)
        pids = demo.child_pids()
        assert len(pids) == 3 and not any(_gone(pid) for pid in pids)
        url = re.search(r"Open (http://\S+/) in a browser", demo.output).group(1)
        status, body = chatstack.http_get(url)
        assert status == 200 and b"new WebSocket(" in body
        os.kill(demo.popen.pid, signal.SIGINT)
        rc = demo.wait(60)
    finally:
        if demo.popen.poll() is None:
            demo.popen.kill()
            demo.popen.wait(10)
    out = demo.output
    assert rc == 0, out
    assert "Interrupted: stopping." in out
    assert re.search(
        r"Stopped: daphne \(pid \d+\) exit 0, worker-1 \(pid \d+\) exit 0, "
        r"worker-2 \(pid \d+\) exit 0",
        out,
    ), out
    assert all(_gone(pid) for pid in pids)
