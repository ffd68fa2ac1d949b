"""The chat example (tests/project) in production shape, on asgi_amqp.

    make demo                       # broker set-up included
    python examples/chat_demo.py    # with AMQP_URL (and AMQP_MANAGEMENT_URL) set

Starts daphne (native Twisted mode on the layer) and two ``manage.py
runworker`` processes, serves the chat page at http://127.0.0.1:8000/, then
drives two scripted WebSocket users through a room so the console shows
every hop: which worker handled it and how long it took. The chat then stays
up for you to use in a browser until Ctrl-C (or SIGTERM), which stops every
process in order and removes the demo's queues and exchanges from the broker.

Options: ``--once`` (or ``CHAT_DEMO_ONCE=1``) exits after the scripted part;
``--port N`` (default 8000, 0 for a free one; a busy 8000 falls back to a
free port); ``--workers N`` (default 2).

Exit status: 0 on success (also after Ctrl-C), 1 if a step failed.
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROJECT_DIR = os.path.join(ROOT, "tests", "project")
for _path in (ROOT, PROJECT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import chatstack  # noqa: E402  (tests/project/chatstack.py)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
ROOM = "demo"
STEP_SECONDS = 15.0  # the longest any one scripted step may take


class DemoFailure(Exception):
    pass


_stopping = []


def _interrupt(signum, _frame):
    """^C, SIGTERM, SIGHUP: stop, once (a second signal while stopping is ignored)."""
    if not _stopping:
        _stopping.append(signum)
        raise KeyboardInterrupt(signum)


def say(text=""):
    print(text, flush=True)


def ms(seconds):
    return "%.1f ms" % (seconds * 1000.0)


def _port_free(host, port):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# -- the scripted part -----------------------------------------------------------------


class User(object):
    """A scripted chat user: a WebSocket in the room, every receive with a deadline."""

    def __init__(self, stack, name):
        import websocket

        self.name = name
        self._timeout_error = websocket.WebSocketTimeoutException
        started = time.perf_counter()
        self.ws = websocket.create_connection(
            stack.ws_url("/chat/%s/?name=%s" % (ROOM, name)), timeout=STEP_SECONDS
        )
        welcome = self.wait(lambda f: f["type"] == "welcome", "the welcome")
        self.elapsed = time.perf_counter() - started
        self.channel = welcome["channel"]
        self.accepted_by = welcome["worker"]

    def send(self, text, message_id):
        self.ws.send(json.dumps({"text": text, "id": message_id}))

    def wait(self, predicate, what):
        deadline = time.monotonic() + STEP_SECONDS
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DemoFailure(
                    "%s did not receive %s within %.0f s" % (self.name, what, STEP_SECONDS)
                )
            self.ws.settimeout(remaining)
            try:
                frame = json.loads(self.ws.recv())
            except self._timeout_error:
                continue
            if predicate(frame):
                return frame

    def close(self):
        try:
            self.ws.close(timeout=2)
        except Exception:
            pass


def _members(layer):
    if layer is None:
        return None
    return sorted(layer.group_channels("room-" + ROOM))


def scripted(stack, layer):
    say(
        'Scripted users in room "%s" (http://%s:%d/room/%s/):'
        % (ROOM, stack.host, stack.port, ROOM)
    )

    started = time.perf_counter()
    status, body = chatstack.http_get(stack.base_url + "/hello/")
    if status != 200:
        raise DemoFailure("GET /hello/ answered %d" % status)
    say(
        "  GET /hello/ -> %d, served by worker pid %d  (%s)"
        % (status, json.loads(body.decode("utf-8"))["worker"], ms(time.perf_counter() - started))
    )

    users = []
    try:
        for name in ("alice", "bob"):
            user = User(stack, name)
            users.append(user)
            say(
                "  %-5s connected: accepted by worker pid %d, reply channel %s  (%s)"
                % (name, user.accepted_by, user.channel, ms(user.elapsed))
            )
        alice, bob = users
        alice.wait(lambda f: f["type"] == "join" and f["name"] == "bob", "bob's join")
        members = _members(layer)
        if members is not None:
            say("  group room-%s has %d members: %s" % (ROOM, len(members), ", ".join(members)))

        lines = [
            (alice, "hi bob"),
            (bob, "hi alice, which worker are you on?"),
            (alice, "either: both workers serve the room"),
            (bob, "nice"),
            (alice, "one more"),
            (bob, "and the last one"),
        ]
        workers = {}
        latencies = []
        for n, (speaker, text) in enumerate(lines):
            message_id = "%s-%d" % (ROOM, n)
            sent = time.perf_counter()
            speaker.send(text, message_id)
            seen = []
            for user in users:
                frame = user.wait(lambda f, i=message_id: f.get("id") == i, "message %d" % n)
                seen.append(time.perf_counter() - sent)
                worker = frame["worker"]
            workers[worker] = workers.get(worker, 0) + 1
            latencies.extend(seen)
            say(
                "  %-5s says %-40s worker %d -> alice %s, bob %s"
                % (speaker.name, '"%s"' % text, worker, ms(seen[0]), ms(seen[1]))
            )
        say(
            "  %d messages, handled by %s; send -> seen by every member: median %s, max %s"
            % (
                len(lines),
                ", ".join("pid %d: %d" % item for item in sorted(workers.items())),
                ms(statistics.median(latencies)),
                ms(max(latencies)),
            )
        )

        bob.close()
        users.remove(bob)
        alice.wait(lambda f: f["type"] == "leave" and f["name"] == "bob", "bob's leave")
        say("  bob    left: alice was told")
        members = _members(layer)
        if members is not None:
            if members != [alice.channel]:
                raise DemoFailure("room-%s still lists %s after bob left" % (ROOM, members))
            say("  group room-%s has 1 member: %s" % (ROOM, members[0]))
    finally:
        for user in users:
            user.close()


# -- main ------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--once",
        action="store_true",
        default=os.environ.get("CHAT_DEMO_ONCE", "") not in ("", "0"),
        help="exit after the scripted part (env CHAT_DEMO_ONCE=1)",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("CHAT_DEMO_PORT", 8000)))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)

    from asgi_amqp import AMQPChannelLayer
    from asgi_amqp.urls import redact

    url = os.environ.get("AMQP_URL") or DEFAULT_URL
    management_url = os.environ.get("AMQP_MANAGEMENT_URL") or None
    port = args.port
    if port and not _port_free(args.host, port):
        fallback = chatstack.free_port(args.host)
        say("Port %d is busy; using %d instead (--port N to choose)." % (port, fallback))
        port = fallback
    prefix = "chat-demo-%s" % uuid.uuid4().hex[:6]
    stack = chatstack.ChatStack(
        url, management_url, prefix=prefix, workers=args.workers, host=args.host, port=port or None
    )
    layer = None
    if management_url:
        layer = AMQPChannelLayer(
            url=url, management_url=management_url, prefix=prefix, dead_letter_worker=False
        )

    status = 0
    try:
        say(
            "Broker: %s%s"
            % (
                redact(url),
                " (management %s)" % redact(management_url)
                if management_url
                else " (no management API: group listings off)",
            )
        )
        say(
            "Starting daphne on %s:%d and %d runworker processes (layer prefix %s) ..."
            % (stack.host, stack.port, args.workers, prefix)
        )
        started = time.perf_counter()
        stack.start(timeout=90)
        say(
            "  daphne     pid %-7d %s"
            % (
                stack.daphne.pid,
                {
                    "twisted": "native Twisted mode on the channel layer (receive_twisted)",
                    "busy-loop": "busy-loop mode (the layer lacks the twisted extension)",
                }[stack.mode],
            )
        )
        for worker in stack.workers:
            say("  %-10s pid %-7d runworker" % (worker.name, worker.pid))
        say("Ready in %.1f s. Logs: %s" % (time.perf_counter() - started, stack.log_dir))
        say()
        say(
            "Open http://%s:%d/ in a browser (two windows to chat with yourself;"
            % (stack.host, stack.port)
        )
        say(
            "other rooms: http://%s:%d/room/<name>/, your name: ?name=you)."
            % (stack.host, stack.port)
        )
        say()
        scripted(stack, layer)
        say()
        if args.once:
            say("Scripted part done (--once): stopping.")
        else:
            say(
                "Scripted part done. The chat stays up at http://%s:%d/ ; Ctrl-C stops it."
                % (stack.host, stack.port)
            )
            say(
                "Another worker, by hand: cd tests/project && AMQP_URL=... CHAT_LAYER_PREFIX=%s "
                "CHAT_STATE_DIR=%s python manage.py runworker" % (prefix, stack.state_dir)
            )
            say("Process output from here on:")
            for proc in stack.processes():
                proc.echo = True
            while True:
                for proc in stack.processes():
                    if not proc.alive():
                        raise DemoFailure(
                            "%s (pid %d) exited with %s:\n%s"
                            % (proc.name, proc.pid, proc.popen.returncode, proc.tail())
                        )
                time.sleep(0.5)
    except KeyboardInterrupt:
        say()
        say("Interrupted: stopping.")
    except (DemoFailure, chatstack.StackError) as exc:
        say("FAILED: %s" % exc)
        status = 1
    except Exception:
        say("FAILED:\n" + traceback.format_exc())
        status = 1
    finally:
        # From here on a signal must not leave processes behind: ignore them.
        _stopping.append(None)
        for proc in stack.processes():
            proc.echo = False
        codes = stack.stop()
        say(
            "Stopped: %s"
            % ", ".join(
                "%s (pid %d) %s"
                % (
                    proc.name,
                    proc.pid,
                    "exit 0" if codes.get(proc.name) == 0 else codes.get(proc.name),
                )
                for proc in stack.processes()
            )
        )
        if layer is not None:
            layer.close()
            try:
                stack.flush()
                say("Removed the queues and exchanges under prefix %s." % prefix)
            except Exception as exc:
                say("Could not remove the demo's broker objects: %s" % exc)
        stack.cleanup(keep_logs=status != 0)
        if status:
            say("Logs kept in %s" % stack.log_dir)
    return status


if __name__ == "__main__":
    sys.exit(main())
