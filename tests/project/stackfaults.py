"""The chat stack through broker faults, measured from the clients' side.

daphne and two ``manage.py runworker`` processes serve the chat project on a
private RabbitMQ node of their own. WebSocket clients in rooms each send
numbered messages at a steady rate while the broker closes every connection
every few seconds and, in the ``restart`` scenario, once in the middle
restarts its application (``stop_app``, a pause, ``start_app``). That node
runs without the management plugin, which before RabbitMQ 3.13 would keep
it away 5 s beyond the pause (``--management-plugin`` runs it with). Nothing
is restarted by hand. The scenarios are separate runs, so that what a
restart costs (see :func:`targets`) never hides a loss at a kill.

In the ``node-loss`` scenario the broker is a 3-node cluster of private
nodes and the queues are quorum queues. Every process is given the three
nodes' URLs; the kills go on, and once in the middle the node that the
processes' connections are on stops its application for a few seconds
(``stop_app``, a pause, ``start_app``) while the other two serve.

The report counts, per run:

* ``sent``: chat messages the clients sent; ``expected``: the deliveries
  they owe (every member of the room, the sender included, gets each one);
* ``delivered``, ``lost`` and ``duplicated`` deliveries, and of the lost ones
  how many were sent around the restart (from ``stop_app`` until the
  broker was back), when a classic queue drops what it held;
* the longest silence a connected client saw, around a kill and around the
  restart (or the node loss). The restart's lasts until everything sent up
  to the broker's return has been delivered (``restart_drained_seconds``
  after it): until then a socket's frames wait behind that backlog;
* for the node loss: the node stopped, the processes' connections per node
  before it and at the end, how long from ``stop_app`` to ``start_app``'s
  return and how long the node's listener was away;
* ``/ping/`` answers (HTTP through daphne, the layer and a worker, 10 s
  timeout) and WebSockets reset by the stack;
* whether every process is alive at the end, and whether every room's group
  is empty once the clients have left.

``python tests/project/stackfaults.py --queue-type quorum --duration 60``
runs it from the command line (``make faults-stack``; ``make faults`` runs
every scenario for 180 s); the tests call :func:`run`.
"""

import argparse
import collections
import json
import os
import shutil
import socket
import sys
import threading
import time
import uuid

import websocket

PROJECT_DIR = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(PROJECT_DIR)
REPO_ROOT = os.path.dirname(TESTS_DIR)
for _path in (PROJECT_DIR, TESTS_DIR, REPO_ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import chatstack  # noqa: E402

from asgi_amqp import naming  # noqa: E402
from helpers import (  # noqa: E402  (tests/helpers.py)
    Management,
    at_moment,
    make_layer,
    start_cluster,
    wait_until,
)

PING_TIMEOUT = 10.0


class Client(object):
    """One chat member: a reader thread that timestamps every frame."""

    def __init__(self, stack, room, name):
        self.room = room
        self.name = name
        self.ws = websocket.create_connection(
            stack.ws_url("/chat/%s/?name=%s" % (room, name)), timeout=10, enable_multithread=True
        )
        self.deliveries = collections.Counter()  # message id -> times received
        # A sender's message that came after a later one of the same sender.
        self.out_of_order = 0
        self.late = []  # (monotonic time, message id, the sender's later tick seen before it)
        self._last_tick = {}  # sender's name -> its latest message's tick received
        self.first_received = {}  # message id -> monotonic time of its first delivery
        self.frame_times = []
        self.reset = None
        self.reset_at = None  # monotonic time the stack closed it
        self.channel = None  # its reply channel, from the welcome frame
        self.welcomed = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._read, name="read-" + name, daemon=True)
        self._thread.start()

    def _read(self):
        self.ws.settimeout(1.0)
        while True:
            try:
                raw = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                if self._closing:
                    return
                continue
            except Exception as exc:  # closed under us: the stack reset this socket
                if not self._closing:
                    self._was_reset("%s: %s" % (type(exc).__name__, exc))
                return
            if not raw:
                if not self._closing:
                    self._was_reset("connection closed by the server")
                return
            frame = json.loads(raw)
            self.frame_times.append(time.monotonic())
            if frame.get("type") == "welcome":
                self.channel = frame.get("channel")
                self.welcomed.set()
            elif frame.get("type") == "message" and frame.get("id"):
                self._in_order(frame["id"])
                self.deliveries[frame["id"]] += 1
                self.first_received.setdefault(frame["id"], self.frame_times[-1])

    def _in_order(self, message_id):
        sender, _, tick = message_id.rpartition("-")
        if not tick.isdigit():
            return
        if int(tick) < self._last_tick.get(sender, -1):
            self.out_of_order += 1
            self.late.append((time.monotonic(), message_id, self._last_tick[sender]))
        else:
            self._last_tick[sender] = int(tick)

    def _was_reset(self, why):
        if self.reset is None:
            self.reset, self.reset_at = why, time.monotonic()

    def send(self, message_id):
        if self.reset is not None:
            return False
        try:
            self.ws.send(json.dumps({"text": "m", "id": message_id}))
            return True
        except Exception as exc:
            self._was_reset("%s: %s" % (type(exc).__name__, exc))
            return False

    def close(self):
        self._closing = True
        try:
            self.ws.close(timeout=2)
        except Exception:
            pass
        self._thread.join(5)


class Faults(object):
    """Kills every ``every`` seconds, and one restart at ``restart_at`` unless it is None.

    With ``cluster`` (the cluster's nodes) and ``node_loss_at``, the one
    disruption is instead the loss of the node the stack's processes are
    connected to: ``stop_app`` on it, ``pause`` seconds, ``start_app``.
    ``node`` is the node that the kills go through; on a cluster
    ``close_all_connections`` closes the vhost's connections on every node.
    """

    def __init__(
        self,
        node,
        every,
        restart_at,
        pause,
        alarm_at=None,
        alarm_seconds=0.0,
        cluster=None,
        node_loss_at=None,
        stop_first=False,
        prefix=None,
    ):
        self.node = node
        self.prefix = prefix
        self.cluster = cluster
        self.node_loss_at = node_loss_at
        self.stop_first = stop_first
        self.node_loss = None  # (stop_app issued, start_app returned)
        self.lost_node = None  # the nodename stopped
        self.connections_at_loss = None  # {nodename: the layer's connections} before it
        self.local_leaders_lost = []  # process-local queues whose quorum leader it held
        self.node_stopped_at = None  # when stop_app returned
        self.every = every  # None: no kills
        self.restart_at = restart_at
        self.pause = pause
        self.alarm_at = alarm_at
        self.alarm_seconds = alarm_seconds
        self.alarm = None  # (memory alarm raised, cleared)
        self.kills = []  # monotonic times
        self.restart = None  # (stop_app issued, broker back)
        self.depths_at_stop = None  # {queue: messages} of the prefix, just before stop_app
        self.outage = None  # (broker stopped answering AMQP, answered again)
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self):
        self.started = time.monotonic()
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(60)

    def _due(self, next_kill):
        due = next_kill
        if self.alarm_at is not None and self.alarm is None:
            due = min(due, self.started + self.alarm_at)
        return due

    def _raise_memory_alarm(self):
        """A memory alarm for ``alarm_seconds``: the broker blocks publishers."""
        began = time.monotonic()
        self.node.ctl("set_vm_memory_high_watermark", "0.0000001")
        self._stop.wait(self.alarm_seconds)
        self.node.ctl("set_vm_memory_high_watermark", "0.4")
        self.alarm = (began, time.monotonic())

    def _lose_a_node(self):
        """Stop the node that holds most of the layer's connections (with
        ``stop_first``, the first node), for ``pause`` seconds; the probe
        measures how long its listener was away."""
        # The management API lists a connection some time after it opened:
        # right after a kill, none may be listed yet.
        self.connections_at_loss = wait_until(
            lambda: layer_connections_by_node(self.node), 15, interval=0.5, raise_on_timeout=False
        )
        target = max(self.cluster, key=lambda n: self.connections_at_loss.get(n.nodename, 0))
        if self.stop_first:
            target = self.cluster[0]
        self.lost_node = target.nodename
        self.local_leaders_lost = self._process_local_leaders_on(target)
        began = time.monotonic()
        probe = OutageProbe(target.amqp_port)
        probe.start()
        try:
            target.stop_app()
            self.node_stopped_at = time.monotonic()
            self._stop.wait(self.pause)
        finally:
            target.start_app()
            self.node_loss = (began, time.monotonic())
            self.outage = probe.finish(timeout=30.0)

    def _kill(self):
        """Close every connection to the broker."""
        self.kills.append(time.monotonic())
        self.node.close_all_connections("stack fault test")

    def _restart_broker(self):
        """Restart the broker's application: ``stop_app``, ``pause`` seconds,
        ``start_app``; the probe measures how long it was away."""
        self.depths_at_stop = self._depths()
        began = time.monotonic()
        probe = OutageProbe(self.node.amqp_port)
        probe.start()
        self.node.stop_app()
        self._stop.wait(self.pause)
        self.node.start_app()
        self.restart = (began, time.monotonic())
        self.outage = probe.finish(timeout=30.0)

    def _depths(self):
        """{queue: ready and unacked messages} of the run's prefix (``rabbitmqctl``)."""
        try:
            listed = self.node.ctl(
                "list_queues", "name", "messages", "--quiet", "--no-table-headers"
            )
        except Exception as exc:
            self.errors.append("queue depths: %r" % (exc,))
            return None
        depths = {}
        for line in listed.splitlines():
            name, _, count = line.rpartition("\t")
            if self.prefix and name.startswith(self.prefix + ":q:") and count.strip().isdigit():
                depths[name] = int(count)
        return depths

    def _process_local_leaders_on(self, target):
        """The process-local base queues (``q:foo!``) whose quorum leader is
        on ``target``. A group message for a process-local member reaches
        such a queue by dead-lettering, which RabbitMQ 3.x does at most once:
        what it routes there while that leader stops is lost, though
        ``send_group`` was confirmed (docs: "Clusters and the loss of a
        node")."""
        if self.prefix is None:
            return []
        try:
            records = Management(self.node, timeout=5).queues(self.prefix + ":q:", "name,leader")
        except Exception as exc:
            self.errors.append("queue leaders: %r" % (exc,))
            return []
        return sorted(
            r["name"]
            for r in records
            if r["name"].endswith("!") and r.get("leader") == target.nodename
        )

    def _run(self):
        next_kill = self.started + (self.every if self.every else 1e9)
        while not self._stop.wait(max(0.0, self._due(next_kill) - time.monotonic())):
            try:
                if (
                    self.alarm is None
                    and self.alarm_at is not None
                    and time.monotonic() - self.started >= self.alarm_at
                ):
                    self._raise_memory_alarm()
                    continue
                if time.monotonic() < next_kill:
                    continue
                if (
                    self.node_loss is None
                    and self.node_loss_at is not None
                    and time.monotonic() - self.started >= self.node_loss_at
                ):
                    self._lose_a_node()
                elif (
                    self.restart is None
                    and self.restart_at is not None
                    and time.monotonic() - self.started >= self.restart_at
                ):
                    self._restart_broker()
                else:
                    self._kill()
            except Exception as exc:
                self.errors.append(repr(exc))
            next_kill = time.monotonic() + (self.every if self.every else 1e9)


def layer_connections_by_node(node):
    """{nodename: the layer's AMQP connections there}, from ``node``'s management API."""
    found = collections.Counter()
    for connection in Management(node, timeout=5).connections():
        name = (connection.get("client_properties") or {}).get("connection_name") or ""
        if name.startswith("asgi_amqp"):
            found[connection.get("node")] += 1
    return dict(found)


def answers_amqp(port, timeout=0.5):
    """True if the broker on *port* answers an AMQP 0-9-1 protocol header
    with a frame (its Connection.Start): the listener is up and serving."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1)[:1] == b"\x01"
    except OSError:
        return False


class OutageProbe(object):
    """How long the broker itself was away during a restart.

    ``stop_app`` and ``start_app`` take seconds of their own beyond the
    pause between them (before RabbitMQ 3.13 the management agent alone
    waits 5 s when it stops), so the broker's outage is measured, not
    assumed: from the first probe it did not answer to the first it
    answered again, one probe every 0.1 s.
    """

    def __init__(self, port, interval=0.1):
        self.port = port
        self.interval = interval
        self.down = None
        self.up = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outage-probe", daemon=True)

    def start(self):
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            checked = time.monotonic()
            if not answers_amqp(self.port):
                if self.down is None:
                    self.down = checked
            elif self.down is not None:
                self.up = checked
                return
            self._stop.wait(self.interval)

    def finish(self, timeout):
        """(down, up) monotonic times, once the broker answers again (or None)."""
        self._thread.join(timeout)
        self._stop.set()
        if self.down is None or self.up is None:
            return None
        return (self.down, self.up)


class Pinger(object):
    """GET /ping/ every ``interval`` seconds; counts answers within 10 s."""

    def __init__(self, stack, interval=0.5):
        self.stack = stack
        self.interval = interval
        self.answered = 0
        self.failed = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pinger", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(PING_TIMEOUT + 5)

    def _run(self):
        while not self._stop.wait(self.interval):
            issued = time.monotonic()
            try:
                status, _ = chatstack.http_get(self.stack.base_url + "/ping/", timeout=PING_TIMEOUT)
            except Exception as exc:
                self.failed.append((issued, repr(exc)))
                continue
            if status == 200:
                self.answered += 1
            else:
                self.failed.append((issued, "HTTP %d" % status))


def _drained_at(clients, sent_at, until):
    """When the last message sent up to ``until`` reached its last member.

    What the clients sent while the broker was away waits in daphne and in
    the queues; after the broker is back the workers work through it, and
    until they have, a socket's next frame waits behind it. A silence that
    begins before then is the restart's, not a kill's.
    """
    times = [
        client.first_received[m]
        for client in clients
        for m, (room, when) in sent_at.items()
        if room == client.room and when <= until and m in client.first_received
    ]
    return max(times, default=until)


def _silences(clients, start, end):
    """(gap, its start, the client's name) per gap between the frames a client
    received, between ``start`` and ``end``."""
    gaps = []
    for client in clients:
        times = [start] + [t for t in client.frame_times if start <= t <= end] + [end]
        for before, after in zip(times, times[1:]):
            gaps.append((after - before, before, client.name))
    return gaps


def _alarm_figures(alarm, clients, sent_at, pinger):
    """What a memory alarm cost: sockets daphne closed, pings refused, and
    which lost deliveries the closed sockets explain.

    While the broker blocks publishers daphne's ``send`` raises
    ``BrokerBlocked`` (a ``ChannelFull``): daphne 1.x closes a WebSocket
    whose frame it could not send (code 1013, "try again later") and answers
    an HTTP request with 503, and a worker's reply fails. A delivery lost
    because its sender's or its recipient's socket was closed within 2 s of
    the message, or sent during the alarm, is explained; any other is not.
    """
    if alarm is None:
        return {"alarm_seconds": None}
    began, ended = alarm
    by_name = {c.name: c for c in clients}
    explained = unexplained = 0
    for client in clients:
        for message_id, (room, when) in sent_at.items():
            if room != client.room or client.deliveries.get(message_id):
                continue
            sender = by_name.get(message_id.rsplit("-", 1)[0])
            closed = [c.reset_at for c in (sender, client) if c is not None and c.reset_at]
            if any(when >= at - 2.0 for at in closed) or began - 1.0 <= when <= ended + 1.0:
                explained += 1
            else:
                unexplained += 1
    return {
        "alarm_seconds": round(ended - began, 1),
        "resets_in_alarm": sum(
            1 for c in clients if c.reset_at and began - 1.0 <= c.reset_at <= ended + 2.0
        ),
        "lost_explained_by_alarm": explained,
        "lost_unexplained": unexplained,
        "pings_failed_in_alarm": sum(
            1 for issued, _ in pinger.failed if began - PING_TIMEOUT <= issued <= ended + 2.0
        ),
        "pings_failed_outside_alarm": sum(
            1 for issued, _ in pinger.failed if not began - PING_TIMEOUT <= issued <= ended + 2.0
        ),
    }


# How long beyond the broker's own outage a client may be silent, and a
# /ping/ may go unanswered: the "pause plus 5 s", with the pause
# measured as the broker's outage (see ``targets``).
OUTAGE_ALLOWANCE = 5.0


def _pings_failed_beyond(failed, outage):
    """The failed pings that the broker's outage does not explain.

    A request needs the broker, so one whose 10 s ended while the broker was
    away, or within ``OUTAGE_ALLOWANCE`` of its return, could not be
    answered in time whatever the layer did; every other one counts."""
    if outage is None:
        return len(failed)
    down, up = outage
    return sum(
        1 for issued, _ in failed if not down <= issued + PING_TIMEOUT <= up + OUTAGE_ALLOWANCE
    )


def _fresh_client_chats(stack, room):
    """After the faults: a new client joins ``room`` and gets its own message back."""
    try:
        client = Client(stack, room, "fresh")
    except Exception:
        return False
    try:
        if not client.welcomed.wait(15):
            return False
        client.send("fresh-1")
        return wait_until(
            lambda: client.deliveries.get("fresh-1"), 15, interval=0.1, raise_on_timeout=False
        )
    finally:
        client.close()


def _where_lost(layer, lost_ids, handled_log, reply_channels):
    """Where the lost messages went: never handled by a worker (and of those,
    how many Channels' ``enforce_ordering`` parked in a socket's ``__wait__``
    channel for good), or handled but not delivered to every member."""
    runs = collections.Counter()
    stale = collections.Counter()  # (reply channel, order) -> times a worker saw it after its turn
    early = collections.Counter()  # reply channel -> frames enforce_ordering sent to __wait__
    if os.path.exists(handled_log):
        with open(handled_log, encoding="utf8") as log:
            for line in log:
                fields = line.split()
                if len(fields) >= 4 and fields[1] == "stale":
                    stale[(fields[2], fields[3])] += 1
                elif len(fields) >= 4 and fields[1] == "early":
                    early[fields[2]] += 1
                elif len(fields) >= 2:
                    runs[fields[1]] += 1
    handled = set(runs)
    lost_messages = set(lost_ids)
    parked = set()
    for channel in reply_channels:
        wait_channel = "__wait__." + channel.replace("!", "?")
        while True:
            name, content = layer.receive([wait_channel])
            if name is None:
                break
            try:
                parked.add(json.loads(content.get("text") or "{}").get("id"))
            except ValueError:
                pass
    never_handled = lost_messages - handled
    return {
        # A frame a worker ran twice: the copy of a publish whose confirm
        # was lost, taken by the other worker while this one ran the
        # original (the docs' "Delivery rule").
        "frames_run_twice": sorted(m for m, n in runs.items() if n > 1),
        "lost_messages": len(lost_messages),
        "lost_never_handled": len(never_handled),
        "lost_parked_by_enforce_ordering": len(never_handled & parked),
        "lost_after_handling": len(lost_messages & handled),
        # Duplicate frames whose turn had passed: enforce_ordering parks
        # them for good and cycles them through websocket.receive after
        # every later frame of their socket (see chat.consumers).
        "stale_frames": len(stale),
        "stale_frame_sightings": sum(stale.values()),
        # Frames that came before their turn: enforce_ordering's __wait__ sends.
        "frames_parked": sum(early.values()),
        "most_parked_for_one_socket": max(early.values(), default=0),
    }


def _count_in_logs(log_dir, text):
    """How many lines of the stack's logs hold ``text``."""
    count = 0
    for name in os.listdir(log_dir) if log_dir and os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), encoding="utf8", errors="replace") as log:
            count += sum(1 for line in log if text in line)
    return count


def _group_members(node, layer, rooms):
    """{room: its member channels}, from the bindings ``rabbitmqctl`` lists.

    Not ``layer.group_channels``: that needs the management API, which the
    restart's node runs without (see ``run``)."""
    listed = json.loads(
        node.ctl(
            "list_bindings",
            "source_name",
            "destination_name",
            "destination_kind",
            "arguments",
            "--formatter=json",
        )
    )
    topology = layer.topology
    exchanges = {topology.group_exchange("room-" + room): room for room in rooms}
    members = {room: [] for room in rooms}
    for binding in listed:
        room = exchanges.get(binding.get("source_name"))
        # rabbitmqctl lists a binding's arguments as [name, type, value] triples.
        arguments = {a[0]: a[2] for a in binding.get("arguments") or [] if len(a) == 3}
        channel = topology.member_of_binding(
            binding.get("destination_name") or "", binding.get("destination_kind"), arguments
        )
        if room is not None and channel and channel not in members[room]:
            members[room].append(channel)
    return members


def run(
    queue_type="classic",
    duration=30.0,
    clients=20,
    rooms=4,
    rate=10.0,
    kill_every=3.0,
    restart_pause=5.0,
    node=None,
    log=print,
    echo=False,
    restart=True,
    alarm=0.0,
    node_loss=False,
    cluster=None,
    node_loss_at=None,
    restart_at=None,
    stop_first=False,
    workers=2,
    worker_threads=1,
    persistent=False,
    management_plugin=False,
    operation_timeout=None,
    capacity=100,
):
    """Run the stack through faults; returns the report (a dict).

    ``capacity`` is the layer's for every process: 100, its default, as
    users run it. daphne parks what the clients send while the broker is
    away and publishes it at the pace the workers take it.

    With ``alarm`` (seconds), the run has no kills and no restart: a memory
    alarm of that length in the middle blocks every publisher instead.

    With ``node_loss``, the stack runs on a 3-node cluster (``cluster``, or
    one of its own), every process given the three nodes' URLs in order, so
    that it connects to the first; instead of the restart, the node its
    connections are on stops its application for ``restart_pause`` seconds
    in the middle (``stop_app``, ``start_app``), or ``node_loss_at`` seconds
    into the run. ``restart_at`` (seconds into the run) moves the restart
    from the middle. With ``stop_first`` the node stopped is the first one:
    where the processes connected first and made the clients' memberships
    (the kills move the connections on to the other nodes).
    ``workers`` is the number of runworker processes (2 by default), each
    on every channel, with ``worker_threads`` threads each (runworker's
    default, 1).

    The run's own single node has no management plugin unless
    ``management_plugin``: before RabbitMQ 3.13 the plugin's agent keeps a
    stopping node's listener closed 5.4 s longer (its stop waits 5 s; PR
    #11070), so that ``stop_app``, a 5 s pause and ``start_app`` keep the
    broker away 10.8 s instead of the 5.9 s the issue's pause means
    (measured here, RabbitMQ 3.10.8). Nothing in the stack needs the API;
    the groups are read with ``rabbitmqctl``. A cluster always has it: the
    node-loss run finds the connections through it.

    ``operation_timeout`` (seconds) sets the processes' layer option (the
    chat project's default is 30 s): a restart whose pause is longer than
    it is an outage that every runworker must outlive, since Channels
    catches nothing around the layer's calls.
    """
    return FaultRun(**locals()).run()  # the arguments, by name


class FaultRun(object):
    """One run of :func:`run` (which documents the options), in named steps.

    :meth:`run` calls them in order: :meth:`start_broker`,
    :meth:`start_stack`, :meth:`start_clients`, :meth:`chat_through_faults`
    (with the scenario's :meth:`faults`), :meth:`settle`, then the checks
    (:meth:`count_deliveries`, :meth:`disruption_figures`,
    :meth:`delivery_figures`, :meth:`silence_figures`, :meth:`ping_figures`,
    :meth:`process_figures`, :meth:`groups_after_leaving`,
    :meth:`where_lost`, :meth:`scenario_figures`) and, whatever happened,
    :meth:`stop`. Each step reads what the ones before it left on ``self``
    and writes its figures into ``self.report``, in the report's order.
    """

    def __init__(self, **options):
        for name, value in options.items():  # run's arguments, as attributes
            setattr(self, name, value)
        self.scenario = (
            "node-loss"
            if self.node_loss
            else ("alarm" if self.alarm else ("restart" if self.restart else "kills"))
        )
        # The one disruption's figures are named after it (lost_at_restart,
        # lost_at_node_loss...).
        self.label = "node_loss" if self.node_loss else "restart"
        self.own_node = self.node is None and not self.node_loss
        self.own_cluster = self.node_loss and self.cluster is None
        self.prefix = "faults-%s" % uuid.uuid4().hex[:8]
        self.handled_log = os.path.join(
            chatstack.tempfile.gettempdir(), self.prefix + "-handled.log"
        )
        self.stack = None
        self.layer = None
        self.members = []  # the connected clients, until they leave
        self.report = {}

    def run(self):
        try:
            self.start_broker()
            self.start_stack()
            self.start_clients()
            self.chat_through_faults()
            self.settle()
            self.count_deliveries()
            self.disruption_figures()
            self.delivery_figures()
            self.silence_figures()
            self.ping_figures()
            self.process_figures()
            self.groups_after_leaving()
            self.where_lost()
            self.scenario_figures()
            self.report["logs"] = self.stack.log_dir
            return self.report
        finally:
            self.stop()

    # -- starting -----------------------------------------------------------------------

    def start_broker(self):
        """The run's own node, or cluster; the URLs the processes are given."""
        from devtools.rabbitmq import RabbitNode

        if self.own_node:
            self.node = RabbitNode() if self.management_plugin else RabbitNode(plugins=())
            self.node.start()
        if self.own_cluster:
            began = time.monotonic()
            self.cluster = start_cluster(3, name="asgiamqp-faults")
            self.log("a 3-node cluster started in %.1f s" % (time.monotonic() - began))
        if self.node_loss:
            # The kills and the management API go through the last node; the
            # processes connect to the first, which is the one stopped (the
            # node is picked by where their connections are when it happens).
            self.node = self.cluster[-1]
        self.urls = [n.amqp_url for n in self.cluster] if self.node_loss else [self.node.amqp_url]

    def start_stack(self):
        """daphne and the runworkers on the broker, and a layer of the test's own."""
        self.stack = chatstack.ChatStack(
            self.urls,
            self.node.management_url,  # None without the plugin
            prefix=self.prefix,
            workers=self.workers,
            worker_args=["--threads", str(self.worker_threads)],
            echo=self.echo,
            env={
                "CHAT_QUEUE_TYPE": self.queue_type,
                "CHAT_PERSISTENT": "1" if self.persistent else "",
                "CHAT_CAPACITY": str(self.capacity),
                "CHAT_LAYER_LOG_LEVEL": os.environ.get("CHAT_LAYER_LOG_LEVEL", "WARNING"),
                "CHAT_HANDLED_LOG": self.handled_log,
                "CHAT_OPERATION_TIMEOUT": str(self.operation_timeout or ""),
            },
        )
        self.report.update(
            {
                "queue_type": self.queue_type,
                "persistent": self.persistent,
                "workers": self.workers,
                "management_plugin": self.node.has_management,
                "operation_timeout": self.operation_timeout,
                "duration": self.duration,
                "scenario": self.scenario,
            }
        )
        self.stack.start(timeout=90)
        self.layer = make_layer(
            self.urls[::-1],
            management_url=self.node.management_url,
            prefix=self.prefix,
            queue_type=self.queue_type,
            dead_letter_worker=False,
            capacity=self.capacity,
        )

    def start_clients(self):
        """The clients, each in its room and welcomed."""
        self.room_names = ["room%d" % i for i in range(self.rooms)]
        for index in range(self.clients):
            self.members.append(
                Client(self.stack, self.room_names[index % self.rooms], "c%02d" % index)
            )
        for client in self.members:
            if not client.welcomed.wait(30):
                raise chatstack.StackError("%s was never welcomed" % client.name)
        what = "kills%s" % (" and a restart" if self.restart else "")
        if self.node_loss:
            what = "kills and the loss of a node of 3"
        elif self.alarm:
            what = "a %.0f s memory alarm" % self.alarm
        self.log(
            "stack up (%s queues, %d clients in %d rooms); %s for %.0f s"
            % (self.queue_type, self.clients, self.rooms, what, self.duration)
        )

    # -- the faults and the traffic -----------------------------------------------------

    def faults(self):
        """The scenario's faults: kills and a restart in the middle, kills alone,
        kills and the loss of a node, or a memory alarm alone."""
        alarm, node_loss, duration = self.alarm, self.node_loss, self.duration
        return Faults(
            self.node,
            None if alarm else self.kill_every,
            restart_at=(
                (duration / 2.0 if self.restart_at is None else self.restart_at)
                if self.restart and not alarm and not node_loss
                else None
            ),
            pause=self.restart_pause,
            alarm_at=(duration - alarm) / 2.0 if alarm else None,
            alarm_seconds=alarm,
            cluster=self.cluster if node_loss else None,
            node_loss_at=(
                (duration / 2.0 if self.node_loss_at is None else self.node_loss_at)
                if node_loss
                else None
            ),
            stop_first=self.stop_first,
            prefix=self.prefix,
        )

    def chat_through_faults(self):
        """Every client sends ``rate`` messages/s for ``duration`` s while the
        faults happen and a pinger asks /ping/."""
        self.fault_source = self.faults()
        self.pinger = Pinger(self.stack)
        self.sent_at = {}  # message id -> (room, monotonic time)
        self.pinger.start()
        self.fault_source.start()
        self.start = time.monotonic()
        tick = 0
        while time.monotonic() - self.start < self.duration:
            tick += 1
            for client in self.members:
                message_id = "%s-%d" % (client.name, tick)
                if client.send(message_id):
                    self.sent_at[message_id] = (client.room, time.monotonic())
            at_moment(self.start, tick / self.rate)  # the clients' send rate
        self.end = time.monotonic()
        self.fault_source.stop()

    def delivered(self):
        return sum(len(client.deliveries) for client in self.members)

    def settle(self):
        """Let the last messages through: until every delivery is in, or
        nothing new has arrived for 10 s (120 s at most).

        After the restart the workers work through the frames daphne held
        during the outage, slowly: Channels' enforce_ordering parks the
        frames that two workers take out of order in __wait__ channels and
        requeues them one by one.
        """
        room_members = collections.Counter(client.room for client in self.members)
        self.expected = sum(room_members[room] for room, _ in self.sent_at.values())
        progress = {"delivered": -1, "at": time.monotonic()}

        def settled():
            now_delivered = self.delivered()
            if now_delivered >= self.expected:
                return True
            if now_delivered != progress["delivered"]:
                progress.update(delivered=now_delivered, at=time.monotonic())
                return False
            return time.monotonic() - progress["at"] > 10

        wait_until(settled, 120, interval=0.2, raise_on_timeout=False)
        self.report["settle_seconds"] = round(time.monotonic() - self.end, 1)
        self.pinger.stop()

    # -- the checks ---------------------------------------------------------------------

    def count_deliveries(self):
        """The lost deliveries (message ids, one per member that missed one)
        and the duplicated ones."""
        self.alive = {proc.name: proc.alive() for proc in self.stack.processes()}
        self.lost_ids = []
        self.duplicated = 0
        self.duplicates = []  # what each duplicate was, for the report
        sent_at = self.sent_at
        for client in self.members:
            for message_id, (room, _) in sent_at.items():
                if room == client.room and not client.deliveries.get(message_id):
                    self.lost_ids.append(message_id)
            self.duplicated += sum(n - 1 for n in client.deliveries.values() if n > 1)
            self.duplicates.extend(
                "%s got %s %d times (sent %+.1f s from the start)"
                % (client.name, m, n, sent_at[m][1] - self.start)
                for m, n in client.deliveries.items()
                if n > 1 and m in sent_at
            )
        self.report["out_of_order"] = sum(client.out_of_order for client in self.members)
        # Each late delivery: who got it, the message, the later tick seen first,
        # and when (s from the start; the kills are in "kill_times").
        self.report["late_deliveries"] = [
            "%s got %s after tick %d at %+.2f s" % (c.name, m, later, at - self.start)
            for c in self.members
            for at, m, later in c.late
        ][:20]
        source = getattr(self, "fault_source", None)
        kills = source.kills if source is not None else []
        self.report["kill_times"] = [round(k - self.start, 2) for k in kills]

    def disruption_figures(self):
        """What the one disruption (the restart, or the loss of a node) cost:
        the deliveries lost around it, when they were sent, how long until
        its backlog was delivered and the clients heard again; and the
        window of time whose silences are its own."""
        faults, sent_at, report, label = self.fault_source, self.sent_at, self.report, self.label
        self.disruption = disruption = faults.restart or faults.node_loss
        self.lost_at_disruption = 0
        if disruption is not None:
            window = (disruption[0] - 1.0, disruption[1] + 1.0)
            self.lost_at_disruption = sum(
                1 for m in self.lost_ids if window[0] <= sent_at[m][1] <= window[1]
            )
        if self.node_loss and disruption is not None:
            report["local_leaders_on_lost_node"] = len(faults.local_leaders_lost)
            stopped = faults.node_stopped_at
            report["node_stopped_after"] = (
                None if stopped is None else round(stopped - disruption[0], 1)
            )
            report["lost_at_node_stop"] = (
                sum(1 for m in self.lost_ids if stopped - 2.0 <= sent_at[m][1] <= stopped + 1.0)
                if stopped is not None and faults.local_leaders_lost
                else 0
            )
        if disruption is not None:
            # When the lost messages were sent, in seconds after stop_app
            # began (the broker or node was back at restart_seconds).
            offsets = collections.Counter(
                round(sent_at[m][1] - disruption[0]) for m in self.lost_ids
            )
            report["lost_by_send_time"] = dict(sorted(offsets.items()))
        # The disruption lasts until what was sent up to its end has been
        # delivered: a silence that begins while the workers still work
        # through that backlog counts as the disruption's.
        self.disrupted = None
        if disruption is not None:
            drained = _drained_at(self.members, sent_at, disruption[1])
            self.disrupted = (disruption[0] - 2.0, max(disruption[1], drained) + 2.0)
            report[label + "_drained_seconds"] = round(max(0.0, drained - disruption[1]), 1)
        depths = getattr(faults, "depths_at_stop", None)
        if depths is not None:
            # A classic queue's transient messages do not survive a restart:
            # each frame waiting for a worker is a message to every member of
            # its room, each message in daphne's queue one delivery.
            per_room = max(1, self.clients // max(1, self.rooms))
            report["deliveries_in_queues_at_stop"] = sum(
                count * (1 if naming.is_process_local_queue(queue) else per_room)
                for queue, count in depths.items()
            )
        if faults.outage:
            # How long after the broker answered again each client heard
            # again: the stack's own share of the restart silence.
            back = faults.outage[1]
            firsts = [
                min((t for t in client.frame_times if t >= back), default=self.end) - back
                for client in self.members
            ]
            report[label + "_heard_again_seconds"] = (
                round(min(firsts), 2),
                round(max(firsts), 2),
            )

    def delivery_figures(self):
        """The faults that happened, and what was sent, delivered, lost and duplicated."""
        faults, label, disruption = self.fault_source, self.label, self.disruption
        self.report.update(
            {
                "clients": self.clients,
                "kills": len(faults.kills),
                label + "_seconds": (
                    round(disruption[1] - disruption[0], 1) if disruption else None
                ),
                "node_stopped": faults.lost_node,
                "connections_at_node_loss": faults.connections_at_loss,
                ("node" if self.node_loss else "broker") + "_outage_seconds": (
                    round(faults.outage[1] - faults.outage[0], 1) if faults.outage else None
                ),
                "fault_errors": faults.errors,
                "sent": len(self.sent_at),
                "expected": self.expected,
                "delivered": self.delivered(),
                "lost": len(self.lost_ids),
                "lost_at_" + label: self.lost_at_disruption,
                "duplicated": self.duplicated,
                "duplicates": sorted(self.duplicates)[:10],
            }
        )

    def silence_figures(self):
        """The longest silence a client saw around a kill, and around the disruption."""
        disrupted = self.disrupted
        gaps = _silences(self.members, self.start, self.end)
        kill_gaps = [
            g for g in gaps if disrupted is None or not disrupted[0] <= g[1] <= disrupted[1]
        ]
        restart_gaps = [
            g[0] for g in gaps if disrupted is not None and disrupted[0] <= g[1] <= disrupted[1]
        ]
        longest = max(kill_gaps, default=(0.0, self.start, None))
        self.report["longest_silence_kill"] = round(longest[0], 2)
        # Where to look in the logs: its client and its start, from the run's start.
        self.report["longest_silence_kill_began"] = "%s at +%.2f s" % (
            longest[2],
            longest[1] - self.start,
        )
        self.report["longest_silence_" + self.label] = round(max(restart_gaps or [0.0]), 2)

    def ping_figures(self):
        """The /ping/s answered and failed, and when the failed ones were issued."""
        failed, label, disruption = self.pinger.failed, self.label, self.disruption
        self.report.update(
            {
                "pings": self.pinger.answered,
                "pings_failed": len(failed),
                # An HTTP request needs the broker: one issued while the broker
                # restarts waits for it, longer than the 10 s timeout, and one
                # issued after it is back can wait as long: its response queues
                # in daphne's one process-local queue behind the group fan-out
                # of everything the clients sent during the outage, which takes
                # 30-60 s to work through. The target is on the kills before it;
                # the rest is reported.
                "pings_failed_before_" + label: sum(
                    1
                    for issued, _ in failed
                    if disruption is None or issued + PING_TIMEOUT < disruption[0]
                ),
                "pings_failed_beyond_outage": _pings_failed_beyond(
                    failed, self.fault_source.outage
                ),
                "ping_failures": [
                    "%s, issued %+.1f s from the %s" % (text, issued - disruption[0], label)
                    if disruption is not None
                    else text
                    for issued, text in failed[:5]
                ],
            }
        )

    def process_figures(self):
        """The WebSockets the stack reset, and whether every process lived."""
        self.report.update(
            {
                "websockets_reset": sum(1 for c in self.members if c.reset),
                "channel_full_in_logs": _count_in_logs(self.stack.log_dir, "ChannelFull"),
                "resets": [c.reset for c in self.members if c.reset][:5],
                "processes_alive": self.alive,
                "all_alive": all(self.alive.values()),
            }
        )

    def groups_after_leaving(self):
        """The clients leave; every room's group must then be empty."""
        node, layer, room_names = self.node, self.layer, self.room_names
        self.reply_channels = [client.channel for client in self.members if client.channel]
        # Read the same way as the emptiness below, so that a check that
        # could not see a member fails rather than passes.
        self.report["group_members_before_leaving"] = sum(
            len(m) for m in _group_members(node, layer, room_names).values()
        )
        self.clients_at_end = list(self.members)
        for client in self.members:
            client.close()
        self.members = []
        # Empty groups count only if the same listing saw their members.
        self.report["groups_empty"] = bool(
            self.report["group_members_before_leaving"]
        ) and wait_until(
            lambda: not any(_group_members(node, layer, room_names).values()),
            30,
            interval=0.5,
            raise_on_timeout=False,
        )

    def where_lost(self):
        """Where the lost messages went, and which duplicates a frame run
        twice explains."""
        self.report.update(
            _where_lost(self.layer, self.lost_ids, self.handled_log, self.reply_channels)
        )
        twice = set(self.report["frames_run_twice"])
        self.report["duplicated_by_frames_run_twice"] = sum(
            n - 1
            for client in self.clients_at_end
            for m, n in client.deliveries.items()
            if n > 1 and m in twice
        )

    def scenario_figures(self):
        """The alarm's figures and a fresh client's chat after it; the node
        loss's connections per node at the end."""
        if self.alarm:
            self.report.update(
                _alarm_figures(
                    self.fault_source.alarm, self.clients_at_end, self.sent_at, self.pinger
                )
            )
            self.report["recovered"] = _fresh_client_chats(self.stack, self.room_names[0])
        if self.node_loss:
            self.report["connections_at_end"] = layer_connections_by_node(self.node)
            self.report["nodes"] = {n.nodename: n.amqp_port for n in self.cluster}

    # -- stopping -----------------------------------------------------------------------

    def stop(self):
        """Close the clients, stop the stack, delete what the run made."""
        for client in self.members:
            client.close()
        if self.stack is not None:
            codes = self.stack.stop()
            self.report.setdefault("exit_codes", codes)
        if self.layer is not None:
            self.layer.close()
        if self.own_node and self.node is not None:
            self._keep_broker_log(self.node)
            self.node.cleanup(graceful=False)
        if self.own_cluster and self.cluster is not None:
            for each in self.cluster:
                each.cleanup(graceful=False)
        if self.stack is not None:
            self.stack.cleanup(keep_logs=True)
        if os.path.exists(self.handled_log) and not os.environ.get("STACKFAULTS_KEEP_HANDLED"):
            os.unlink(self.handled_log)

    def _keep_broker_log(self, node):
        """A copy of the node's log beside the processes' logs, where a
        connection the broker closed (541 INTERNAL_ERROR) says why."""
        if self.stack is None or not os.path.exists(node.log_file):
            return
        shutil.copy(node.log_file, os.path.join(self.stack.log_dir, "rabbit.log"))


def targets(report, restart_pause=5.0):
    """The targets a report must meet: a list of (what, ok) pairs.

    Through kills alone nothing may be lost and ``/ping/`` must always
    answer. Through a restart every process must live, no socket may be
    reset, and neither a client's silence nor an unanswered ``/ping/`` may
    outlast the broker's own outage by more than 5 s (the issue's "pause
    plus 5 s"; see the restart's checks below); with quorum queues, or
    persistent messages, nothing may be lost. What a restart costs classic
    queues is measured and reported, not asserted (see the docs' "Broker
    outages"): a classic queue drops the transient frames it held, and
    Channels' ``enforce_ordering`` then stalls those sockets, their
    disconnect included.
    """
    checks = [
        ("every process alive", report["all_alive"]),
        ("no WebSocket reset", report["websockets_reset"] == 0),
        (
            "0 duplicates, but for frames a worker ran twice (counted)",
            report["duplicated"] <= report["duplicated_by_frames_run_twice"],
        ),
        ("silence around a kill <= 2 s", report["longest_silence_kill"] <= 2.0),
        # Without a restart or a node loss no failed ping is explained.
        (
            "/ping/ 100% but while the broker or its node was away (+5 s)",
            report.get("pings_failed_beyond_outage") == 0 and report["pings"] > 0,
        ),
    ]
    if report.get("scenario") == "alarm":
        # daphne closes the sockets whose frames the blocked broker refused:
        # resets are the alarm's cost, counted, and so are the deliveries
        # they explain. Everything else must hold. The groups are reported,
        # not asserted: daphne's websocket.disconnect for a socket it closed
        # during the alarm is refused too, so that membership stays until
        # group_expiry.
        return [
            ("every process alive", report["all_alive"]),
            ("the alarm was raised and cleared", report.get("alarm_seconds") is not None),
            ("0 lost but for sockets closed by the alarm", report.get("lost_unexplained") == 0),
            ("/ping/ 100% outside the alarm", report.get("pings_failed_outside_alarm") == 0),
            ("a new client chats after the alarm", bool(report.get("recovered"))),
            (
                "0 duplicates, but for frames a worker ran twice (counted)",
                report["duplicated"] <= report["duplicated_by_frames_run_twice"],
            ),
        ]
    if report.get("scenario") == "node-loss":
        return _node_loss_targets(report, checks)
    checks += [
        ("no delivery out of order", report.get("out_of_order") == 0),
        ("no ChannelFull in any process's log", report.get("channel_full_in_logs") == 0),
        ("groups empty after the clients left", report["groups_empty"]),
    ]
    if report.get("scenario") == "kills":
        return checks + [("0 lost", report["lost"] == 0)]
    # The "pause + 5 s" means a broker away for the pause. The probe
    # measures how long it was away: stop_app and start_app add their own
    # seconds (0.5-1.5 s on the test's node after a 60 s run, 5.6 s with
    # quorum queues after 90 s of traffic at 10 messages/s, and 5 s more
    # with the management plugin before RabbitMQ 3.13; see ``run``). So the
    # allowance is 5 s beyond that outage, never less than pause + 5 s, and
    # a /ping/ must be answered unless its 10 s ended while the broker was
    # away or within those 5 s of its return.
    outage = report.get("broker_outage_seconds")
    allowed = max(restart_pause, outage if outage is not None else restart_pause)
    checks += [
        (
            "silence around the restart <= broker outage (>= pause) + 5 s",
            outage is not None and report["longest_silence_restart"] <= allowed + OUTAGE_ALLOWANCE,
        ),
    ]
    # An outage longer than the processes' operation_timeout is held to the
    # same targets. It was not, until daphne's sends parked through an
    # outage (asgi_amqp/parked_sends.py): each raised OperationTimeout out
    # of daphne's onMessage after freezing it for operation_timeout, and
    # Twisted reset that socket (2 of 20 in a 40 s quorum run, 774 of
    # 11,730 deliveries lost; in a 90 s classic run silence 42 s).
    heard = report.get("restart_heard_again_seconds")
    checks.append(
        (
            "every client heard again within 5 s of the broker's return",
            bool(heard) and heard[1] <= 5.0,
        )
    )
    if report["queue_type"] == "quorum" or report.get("persistent"):
        checks.append(("quorum or persistent: 0 lost", report["lost"] == 0))
    else:
        # Transient messages in a classic queue do not survive its restart.
        in_queues = report.get("deliveries_in_queues_at_stop")
        checks += [
            (
                "classic: lost <= what the queues held at stop_app",
                in_queues is not None and report["lost"] <= in_queues,
            ),
            ("classic: lost < 2 %", report["lost"] < 0.02 * max(1, report["expected"])),
        ]
    return checks


# The longest a connected client may be silent around the loss of its node.
# The restart's bound grows with the broker's outage; here the other two
# nodes serve throughout, so it does not: the connections move to another
# node (about 1 s), the quorum queues led on the stopped node elect new
# leaders there.
# Measured at 1 message/s per client: 1.9 s in a 180 s run, 2.8-3.9 s in
# 24-40 s runs. 10 s leaves room for a loaded 2-core machine.
NODE_LOSS_SILENCE = 10.0

# Around a kill on the cluster: 3 s, not the single node's 2 s. The three
# nodes share the 2-core machine with the stack; measured 1.0-1.4 s, and
# 2.24 s once while other work kept the machine busy.
NODE_LOSS_KILL_SILENCE = 3.0

# The clients' rate in the node-loss scenario from the command line
# (messages/s each). Every publish to a quorum queue is confirmed once a
# majority of the three nodes has it, and all three nodes share the 2-core
# machine with the stack; the short tests in ``make test`` run at 1/s.
NODE_LOSS_RATE = 5.0


def _node_loss_targets(report, checks):
    """The node-loss scenario's targets: the kills', and
    through the loss of the node the processes were connected to, with quorum
    queues, nothing lost, every ``/ping/`` answered but one whose 10 s ended
    while the node was away or within 5 s of its return, the groups empty
    at the end and a bounded silence. The other two nodes serve
    throughout, so the bound does not grow with the node's own outage.
    With ``--stop-first-node`` too: a membership is a binding, which every
    node holds, and group messages reach daphne's quorum queue directly,
    with no dead-letter hop that a node's stop could drop.

    ``lost_at_node_stop`` still counts, for the record, the lost deliveries
    of messages sent from 2 s before ``stop_app`` returned to 1 s after
    when the node held the quorum leader of a process-local queue.
    """
    checks = [c for c in checks if not c[0].startswith("silence around a kill")] + [
        (
            "silence around a kill <= %.0f s" % NODE_LOSS_KILL_SILENCE,
            report["longest_silence_kill"] <= NODE_LOSS_KILL_SILENCE,
        ),
        ("a node was stopped and started again", bool(report.get("node_stopped"))),
        (
            "silence around the node loss <= %.0f s" % NODE_LOSS_SILENCE,
            report.get("node_loss_seconds") is not None
            and report["longest_silence_node_loss"] <= NODE_LOSS_SILENCE,
        ),
    ]
    if report["queue_type"] == "quorum":
        checks += [
            (
                "quorum: 0 lost",
                report["lost"] == 0,
            ),
            ("quorum: groups empty after the clients left", report["groups_empty"]),
        ]
    return checks


def format_report(report):
    keys = [
        "scenario",
        "queue_type",
        "persistent",
        "workers",
        "duration",
        "kills",
        "restart_seconds",
        "broker_outage_seconds",
        "node_stopped",
        "connections_at_node_loss",
        "node_loss_seconds",
        "node_outage_seconds",
        "restart_drained_seconds",
        "restart_heard_again_seconds",
        "node_loss_drained_seconds",
        "node_loss_heard_again_seconds",
        "settle_seconds",
        "sent",
        "expected",
        "delivered",
        "lost",
        "lost_at_restart",
        "lost_at_node_loss",
        "local_leaders_on_lost_node",
        "node_stopped_after",
        "lost_at_node_stop",
        "duplicated",
        "duplicated_by_frames_run_twice",
        "frames_run_twice",
        "duplicates",
        "longest_silence_kill",
        "longest_silence_kill_began",
        "longest_silence_restart",
        "longest_silence_node_loss",
        "alarm_seconds",
        "resets_in_alarm",
        "lost_explained_by_alarm",
        "lost_unexplained",
        "pings_failed_in_alarm",
        "pings_failed_outside_alarm",
        "recovered",
        "pings",
        "pings_failed",
        "pings_failed_before_restart",
        "pings_failed_before_node_loss",
        "pings_failed_beyond_outage",
        "websockets_reset",
        "all_alive",
        "group_members_before_leaving",
        "groups_empty",
        "connections_at_end",
        "nodes",
        "lost_by_send_time",
        "ping_failures",
        "lost_messages",
        "lost_never_handled",
        "lost_parked_by_enforce_ordering",
        "lost_after_handling",
        "stale_frames",
        "stale_frame_sightings",
        "frames_parked",
        "most_parked_for_one_socket",
        "out_of_order",
        "late_deliveries",
        "kill_times",
        "channel_full_in_logs",
        "deliveries_in_queues_at_stop",
    ]
    lines = ["%-25s %s" % (key, report.get(key)) for key in keys if key in report]
    for what, ok in targets(report):
        lines.append("%-4s %s" % ("ok" if ok else "FAIL", what))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue-type", choices=["classic", "quorum", "both"], default="both")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of traffic and faults (default 60)"
    )
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="messages/s per client (default 10, and %g for node-loss)" % NODE_LOSS_RATE,
    )
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--restart-pause", type=float, default=5.0)
    parser.add_argument(
        "--scenario",
        choices=["kills", "restart", "both", "alarm", "node-loss", "all"],
        default="both",
        help=(
            "kills alone, kills and a restart, both (default), a memory alarm alone, "
            "kills and the loss of a node of a 3-node cluster (node-loss, quorum queues "
            "unless --queue-type classic), or all of them"
        ),
    )
    parser.add_argument(
        "--alarm-seconds", type=float, default=8.0, help="the alarm scenario's alarm (8 s)"
    )
    parser.add_argument(
        "--stop-first-node",
        action="store_true",
        help=(
            "node-loss: stop the first node, where the memberships' classic queues live, "
            "rather than the one the processes are connected to then"
        ),
    )
    parser.add_argument("--workers", type=int, default=2, help="runworker processes (2)")
    parser.add_argument(
        "--worker-threads", type=int, default=1, help="each runworker's --threads (1)"
    )
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="the layer's persistent=True: classic queues keep their messages through a restart",
    )
    parser.add_argument(
        "--management-plugin",
        action="store_true",
        help=(
            "run the single node with the management plugin: before RabbitMQ 3.13 "
            "it keeps a restart's broker away 5 s longer (the targets allow it)"
        ),
    )
    parser.add_argument(
        "--operation-timeout",
        type=float,
        default=None,
        help=(
            "the processes' operation_timeout (the chat project's default is 30 s); "
            "with a --restart-pause above it, the restart is an outage every runworker "
            "must outlive"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--echo", action="store_true", help="show the processes' output")
    args = parser.parse_args(argv)
    kinds = ["classic", "quorum"] if args.queue_type == "both" else [args.queue_type]
    failed = False
    reports = []
    scenarios = {
        "both": ["kills", "restart"],
        "all": ["kills", "restart", "alarm", "node-loss"],
    }.get(args.scenario, [args.scenario])
    # A classic queue is unavailable while its node is down and its messages
    # are gone when it comes back (docs: "Clusters and the loss of a node"):
    # the node loss runs with quorum queues unless classic alone is asked for.
    runs = [
        (kind, scenario)
        for kind in kinds
        for scenario in scenarios
        if scenario != "node-loss" or kind == "quorum" or kinds == ["classic"]
    ]
    for kind, scenario in runs:
        report = run(
            kind,
            args.duration,
            args.clients,
            args.rooms,
            args.rate
            if args.rate is not None
            else (NODE_LOSS_RATE if scenario == "node-loss" else 10.0),
            args.kill_every,
            args.restart_pause,
            echo=args.echo,
            log=lambda text: print(text, file=sys.stderr),
            restart=scenario == "restart",
            alarm=args.alarm_seconds if scenario == "alarm" else 0.0,
            node_loss=scenario == "node-loss",
            stop_first=args.stop_first_node,
            workers=args.workers,
            worker_threads=args.worker_threads,
            persistent=args.persistent,
            management_plugin=args.management_plugin,
            operation_timeout=args.operation_timeout,
        )
        reports.append(report)
        failed |= not all(ok for _, ok in targets(report, args.restart_pause))
        if not args.json:
            print(format_report(report))
            print()
    if args.json:
        print(json.dumps(reports, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
