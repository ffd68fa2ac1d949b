"""Helpers for the end-to-end tests: chat stacks and WebSocket clients with deadlines.

The rest (wait_until, layers, ...) is the tests' shared tests/helpers.py.
"""

import contextlib
import json
import os
import sys
import time
import uuid
import warnings

import websocket

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(HERE)
PROJECT_DIR = os.path.join(TESTS_DIR, "project")
for _path in (TESTS_DIR, PROJECT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import chatstack  # noqa: E402  (tests/project/chatstack.py)


def new_stack(broker, workers=2, env=None, **kwargs):
    return chatstack.ChatStack(
        broker.amqp_url,
        broker.management_url,
        prefix="e2e-%s" % uuid.uuid4().hex[:10],
        workers=workers,
        env=env,
        **kwargs,
    )


@contextlib.contextmanager
def run_stack(stack, timeout=90.0):
    """Start ``stack``; yield it; stop, flush and clean it up afterwards."""
    try:
        stack.start(timeout=timeout)
        yield stack
    finally:
        stack.stop()
        try:
            stack.flush()
        except Exception as exc:  # do not hide the test's own failure
            warnings.warn("could not flush prefix %s: %r" % (stack.prefix, exc), stacklevel=2)
        finally:
            stack.cleanup()


class Client(object):
    """A WebSocket client (websocket-client); every receive has a deadline."""

    def __init__(self, url, timeout=10.0):
        self.url = url
        self.ws = websocket.create_connection(url, timeout=timeout, enable_multithread=True)
        self.received = []  # every decoded frame, in order

    def send_json(self, payload):
        self.ws.send(json.dumps(payload))

    def send_text(self, text):
        self.ws.send(text)

    def recv_text(self, timeout=10.0):
        self.ws.settimeout(timeout)
        return self.ws.recv()

    def recv_json(self, timeout=10.0):
        data = json.loads(self.recv_text(timeout))
        self.received.append(data)
        return data

    def recv_until(self, predicate, timeout=10.0, what="a matching frame"):
        """Receive until ``predicate(frame)``; returns that frame. Others are kept in received."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    "%s: no %s within %.0f s; got %r"
                    % (self.url, what, timeout, self.received[-10:])
                )
            try:
                frame = self.recv_json(remaining)
            except websocket.WebSocketTimeoutException:
                continue
            if predicate(frame):
                return frame

    def close(self):
        try:
            self.ws.close(timeout=2)
        except Exception:
            pass


def diagnostics(stack):
    """The last lines of every process of a stack, for assertion messages."""
    parts = []
    for proc in stack.processes() + stack.retired:
        parts.append(
            "--- %s (pid %d, %s):\n%s"
            % (
                proc.name,
                proc.pid,
                "running" if proc.alive() else "rc=%s" % proc.popen.poll(),
                proc.tail(15),
            )
        )
    return "\n".join(parts)
