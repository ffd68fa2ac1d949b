"""Channels 1.x end to end: daphne + two runworker processes on asgi_amqp.

Real processes, a real broker, real WebSocket and HTTP clients. Every wait
has a deadline.
"""

import collections
import json
import os
import threading
import time
import uuid

import pytest
import websocket
from e2e_support import Client, chatstack, diagnostics, new_stack, run_stack

from helpers import at_moment, wait_until

pytestmark = pytest.mark.slow


def _room():
    return "r%s" % uuid.uuid4().hex[:8]


# -- daphne ---------------------------------------------------------------------


def test_daphne_runs_in_native_twisted_mode(chat_stack):
    from asgi_amqp import AMQPChannelLayer

    assert "twisted" in AMQPChannelLayer.extensions
    assert chat_stack.mode == "twisted", diagnostics(chat_stack)
    assert chat_stack.daphne.has_line(chatstack.NATIVE_MODE_LINE)
    assert not chat_stack.daphne.has_line(chatstack.BUSY_LOOP_LINE)


# -- HTTP -------------------------------------------------------------------------


def test_http_through_daphne(chat_stack):
    base = chat_stack.base_url
    status, body = chatstack.http_get(base + "/")
    assert status == 200, body[:500]
    page = body.decode("utf-8")
    assert "new WebSocket(" in page and ">lobby<" in page

    status, body = chatstack.http_get(base + "/room/kitchen/")
    assert status == 200 and ">kitchen<" in body.decode("utf-8")

    status, body = chatstack.http_get(base + "/no/such/page/")
    assert status == 404

    status, body = chatstack.http_get(
        base + "/hello/?x=1",
        method="POST",
        data=b"a=b",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 200
    assert json.loads(body.decode("utf-8"))["method"] == "POST"

    # Requests are spread over both workers.
    worker_pids = {w.pid for w in chat_stack.workers}
    served = set()

    def every_worker_served():
        status, body = chatstack.http_get(base + "/hello/")
        assert status == 200
        served.add(json.loads(body.decode("utf-8"))["worker"])
        return served == worker_pids

    wait_until(every_worker_served, 20, interval=0, raise_on_timeout=False)
    assert served == worker_pids


# -- WebSockets ----------------------------------------------------------------------


def test_echo(chat_stack):
    client = Client(chat_stack.ws_url("/echo/"))
    try:
        workers = set()
        for i in range(30):
            text = "hello %d \u263a" % i
            client.send_text(text)
            pid, echoed = client.recv_text(timeout=10).split(" ", 1)
            assert echoed == text
            workers.add(int(pid))
    finally:
        client.close()
    # One socket's frames reach one worker at a time (docs/topology.rst,
    # "Ordered channels"): with nothing else going on, the same one.
    assert len(workers) == 1 and workers <= {w.pid for w in chat_stack.workers}


def test_room_broadcast_reaches_every_member(chat_stack):
    room, other_room = _room(), _room()
    members = [Client(chat_stack.ws_url("/chat/%s/?name=m%d" % (room, i))) for i in range(3)]
    outsider = Client(chat_stack.ws_url("/chat/%s/?name=outsider" % other_room))
    try:
        for member in members + [outsider]:
            member.recv_until(lambda f: f["type"] == "welcome", what="welcome")
        # Everyone has joined once the last one's join reached the first.
        members[0].recv_until(lambda f: f["type"] == "join" and f["name"] == "m2", what="join")

        sent = []
        workers = collections.defaultdict(set)  # sender -> the workers that ran its frames
        for n in range(12):
            sender = members[n % len(members)]
            message_id = "%s-%d" % (room, n)
            sender.send_json({"text": "message %d" % n, "id": message_id})
            sent.append(message_id)
            # Each member sees it, whichever worker handled it.
            for member in members:
                frame = member.recv_until(
                    lambda f, mid=message_id: f["type"] == "message" and f["id"] == mid,
                    what="message %s" % message_id,
                )
                assert frame["text"] == "message %d" % n
                assert frame["name"] == "m%d" % (n % len(members))
                workers[frame["name"]].add(frame["worker"])

        # Every member saw every message exactly once, in the order sent.
        for member in members:
            ids = [f["id"] for f in member.received if f["type"] == "message"]
            assert ids == sent
        # Messages of this room never reached the other room.
        outsider.send_json({"text": "elsewhere", "id": "outsider"})
        outsider.recv_until(lambda f: f.get("id") == "outsider", what="own message")
        assert not [f for f in outsider.received if f.get("room") == room]
        # Each member's frames ran on one worker (a socket at a time).
        assert all(len(pids) == 1 for pids in workers.values()), (workers, diagnostics(chat_stack))
    finally:
        for client in members + [outsider]:
            client.close()


def test_disconnect_removes_the_member_from_the_group(chat_stack, chat_layer):
    room = _room()
    alice = Client(chat_stack.ws_url("/chat/%s/?name=alice" % room))
    bob = Client(chat_stack.ws_url("/chat/%s/?name=bob" % room))
    try:
        alice_channel = alice.recv_until(lambda f: f["type"] == "welcome")["channel"]
        bob_channel = bob.recv_until(lambda f: f["type"] == "welcome")["channel"]
        assert alice_channel != bob_channel
        assert sorted(chat_layer.group_channels("room-" + room)) == sorted(
            [alice_channel, bob_channel]
        )

        bob.close()
        alice.recv_until(lambda f: f["type"] == "leave" and f["name"] == "bob", what="leave")
        assert chat_layer.group_channels("room-" + room) == [alice_channel]

        # The room still works for the one left.
        alice.send_json({"text": "alone", "id": "alone"})
        alice.recv_until(lambda f: f.get("id") == "alone", what="own message")
    finally:
        alice.close()
        bob.close()
    wait_until(
        lambda: chat_layer.group_channels("room-" + room) == [],
        timeout=15,
        interval=0.1,
        message="empty room after both left",
    )


# -- a worker killed mid-traffic -------------------------------------------------------


class _EchoTraffic(object):
    """Clients each sending ``rate`` frames/s to /echo/ and collecting the echoes."""

    def __init__(self, stack, clients=4, rate=40.0):
        self.clients = [Client(stack.ws_url("/echo/")) for _ in range(clients)]
        self.interval = 1.0 / rate
        self.sent = []
        self.echoes = collections.defaultdict(list)  # text -> [worker pid, ...]
        self.errors = []
        self._stop = threading.Event()
        self._drained = threading.Event()
        self._lock = threading.Lock()
        self._threads = []

    def start(self):
        for index, client in enumerate(self.clients):
            for target in (self._send_loop, self._receive_loop):
                thread = threading.Thread(target=target, args=(index, client), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _send_loop(self, index, client):
        seq = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                text = "m %d %d" % (index, seq)
                with self._lock:
                    self.sent.append(text)
                client.send_text(text)
                seq += 1
                next_at += self.interval
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:  # reported by the test
            self.errors.append("client %d send: %r" % (index, exc))

    def _receive_loop(self, index, client):
        while True:
            try:
                reply = client.recv_text(timeout=0.5)
            except websocket.WebSocketTimeoutException:
                if self._drained.is_set():
                    return
                continue
            except Exception as exc:
                if not self._drained.is_set():
                    self.errors.append("client %d receive: %r" % (index, exc))
                return
            if not reply:  # the socket closed
                if not self._drained.is_set():
                    self.errors.append("client %d closed" % index)
                return
            pid, text = reply.split(" ", 1)
            with self._lock:
                self.echoes[text].append(int(pid))

    def stop_sending(self):
        self._stop.set()
        for thread in self._threads[0::2]:
            thread.join(5)

    def missing(self):
        with self._lock:
            return [t for t in self.sent if t not in self.echoes]

    def echoed_by(self, pid):
        """How many echoes worker ``pid`` sent."""
        with self._lock:
            return sum(pids.count(pid) for pids in self.echoes.values())

    def finish(self):
        self._drained.set()
        for thread in self._threads:
            thread.join(5)
        for client in self.clients:
            client.close()


def _handled(log_path):
    """(pid, text) lines the echo consumer logged, in order."""
    if not os.path.exists(log_path):
        return []
    with open(log_path, encoding="utf-8") as handle:
        return [tuple(line.rstrip("\n").split(" ", 1)) for line in handle if line.strip()]


def test_worker_killed_and_restarted_mid_traffic_loses_nothing_it_had_not_handed_over(
    broker, tmp_path
):
    handled_log = str(tmp_path / "handled.log")
    stack = new_stack(
        broker, workers=2, env={"CHAT_TEST_HOOKS": "1", "CHAT_HANDLED_LOG": handled_log}
    )
    with run_stack(stack):
        traffic = _EchoTraffic(stack)
        control = Client(stack.ws_url("/echo/"))
        try:
            traffic.start()
            wait_until(
                lambda: any(traffic.echoed_by(w.pid) for w in stack.workers),
                timeout=15,
                interval=0.05,
                message="echoes",
            )
            # Put one worker to sleep inside a consumer, so the moment of the
            # kill is known: it has handed over exactly that message.
            control.send_text("sleep 5")
            victim_pid = wait_until(
                lambda: next(
                    (int(pid) for pid, text in _handled(handled_log) if text == "sleep 5"), None
                ),
                timeout=15,
                interval=0.01,
                message="a worker picking up the sleep",
            )
            picked_up = time.monotonic()
            victim = next(w for w in stack.workers if w.pid == victim_pid)
            survivor = next(w for w in stack.workers if w is not victim)
            # Meanwhile the broker pushes the victim's idle consumers their
            # next message (prefetch 1), which it holds, unacknowledged, for
            # ``linger`` (0.25 s): kill it while it holds them, 0.1 s after it
            # was seen taking the sleep (a step of this scenario's timeline).
            at_moment(picked_up, 0.1)
            replacement = stack.replace_worker(victim, kill=True)
            assert victim.popen.returncode == -9
            # The victim's sockets go on with the survivor or the replacement,
            # whichever consumes their shards first (a shard has one consumer:
            # docs/topology.rst), and 300 frames at least.
            killed_at = len(traffic.sent)
            living = (survivor.pid, replacement.pid)
            echoed_at_kill = sum(traffic.echoed_by(pid) for pid in living)
            wait_until(
                lambda: (
                    sum(traffic.echoed_by(pid) for pid in living) >= echoed_at_kill + 20
                    and len(traffic.sent) >= max(300, killed_at + 100)
                ),
                timeout=30,
                interval=0.05,
                message="20 echoes from the living workers, 300 frames sent",
            )
            traffic.stop_sending()
            wait_until(lambda: not traffic.missing(), 20, interval=0.2, raise_on_timeout=False)
            missing = traffic.missing()
            assert not missing, "%d of %d frames never echoed, e.g. %r\n%s" % (
                len(missing),
                len(traffic.sent),
                missing[:10],
                diagnostics(stack),
            )
            # The frame the victim was handling died with it.
            with pytest.raises(websocket.WebSocketTimeoutException):
                control.recv_text(timeout=0.5)
        finally:
            traffic.finish()
            control.close()

        assert not traffic.errors, traffic.errors
        duplicates = {t: pids for t, pids in traffic.echoes.items() if len(pids) > 1}
        assert not duplicates, duplicates
        # The only frame the victim took with it is the one it was handling.
        victim_handled = [text for pid, text in _handled(handled_log) if int(pid) == victim_pid]
        assert "sleep 5" in victim_handled
        echoed_by = collections.Counter(p for pids in traffic.echoes.values() for p in pids)
        assert echoed_by[survivor.pid] + echoed_by[replacement.pid] > 0, (
            echoed_by,
            diagnostics(stack),
        )
        assert len(traffic.sent) >= 300
        # daphne and the other worker never noticed.
        assert stack.daphne.alive() and survivor.alive()
        codes = stack.stop()
        assert codes == {"daphne": 0, survivor.name: 0, replacement.name: 0}, (
            codes,
            diagnostics(stack),
        )
