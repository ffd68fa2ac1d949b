"""The storm suite: a connect storm on daphne + two runworkers, asgi_amqp
against asgi_redis 1.4.3, same run, same machine (``python -m benchmarks
--only storm``).

For each layer, the chat project of tests/project runs as daphne + TWO
``manage.py runworker`` (``chatstack.ChatStack``, as the Channels suite and
tests/e2e/test_connect_storm.py run it), with a channel capacity of
``--storm-capacity`` (default 100, the project's own). Then, per round:

storm
    ``--storm-sockets`` (400) WebSockets, one thread each in this process,
    are released at once onto ``/chat/<room>/`` of ``--storm-rooms`` (20)
    rooms. A socket is *accepted* (the opening handshake completed),
    *refused* (HTTP 503: daphne's answer when ``websocket.connect`` is
    full), *reset* (the connection was reset or aborted: by daphne when the
    workers' accept came after autobahn's 5 s opening handshake timeout, or
    by the kernel when daphne's listen queue overflowed; the kernel's
    ListenOverflows counter, the whole machine's, is recorded), *timed out*
    (HTTP 403, daphne's answer when no accept came within its
    ``websocket_connect_timeout`` of 20 s, or the client's own 20 s) or
    *other* (any other failure; the first is shown). An accepted socket has
    *joined* when its welcome arrives: the chat consumer sends it after
    ``group_add``. Connects per second: sockets accepted / the time from the
    first connect attempt to the last accept.
broker memory
    asgi_amqp: RabbitMQ's ``mem_used`` (management API ``GET /api/nodes``,
    summed over the nodes); asgi_redis: ``used_memory`` of Redis's ``INFO
    memory``. Read before the storm and once every socket has joined or
    failed, the difference divided by the sockets then open. ``mem_used``
    is refreshed by the node every statistics interval (5 s by default), so
    each reading waits for the first value published after it was asked
    for. ``mem_used`` is the beam's RSS and ``used_memory`` what Redis's
    allocator holds: each is its server's own figure, not the same measure.
    RSS moves by megabytes on an idle node, so asgi_amqp's cell also gives
    what the Erlang VM has allocated (``GET /api/nodes/NAME/memory``,
    ``total.erlang``, computed when asked); the JSON has the categories
    that grew, and the round's line the queues under the prefix then (a
    ``__wait__`` channel, where Channels' ``enforce_ordering`` parks a
    socket's messages that came before their turn, is a queue of its own).
room message
    one joined socket per room sends a chat message; the consumer sends it
    to the room's group. The table counts the joined sockets that received
    it within 30 s.
groups empty
    every socket closes (a close handshake each, all at once); from the
    moment the last close returned, the room groups are polled until every
    one is empty: asgi_amqp ``layer.group_channels(room)`` (its bindings,
    from the management API), asgi_redis ``ZCARD`` of each group's sorted
    set (``<prefix>::group:<group>``, asgi_redis 1.4.3's ``_group_key``).
    After ``--storm-empty-cap`` seconds (120) the memberships left are
    reported.

The exceptions the consumers raised (Channels' worker logs each and carries
on; ``ChannelFull`` when a send found daphne's reply channel full) are
counted from the runworkers' logs. A warm-up storm (a tenth of the sockets,
2 rooms, not recorded) runs first. With ``--rounds N`` (default 1) the layers
alternate (AB, BA, ...) and every round gets a row.

The status is 1 when a daphne or runworker exited (Channels 1.1.8's
runworker exits when a message its consumer queued cannot be sent within
2 s after the consumer returned, e.g. to a full reply channel; a dead
worker is started again before the next round) or a socket ended in none
of the outcomes above. What a full channel costs is reported, not failed,
since each is the documented end of a full channel: an accepted socket that
never joined (asgi_amqp's ``group_add`` of a process-local channel raises
``ChannelFull`` when the join notice finds daphne's queue full), a room
message missing (``send_group`` drops a message for a full member), a
membership left (daphne 1.4.2 drops a ``websocket.disconnect`` that finds its
channel full, so no consumer discards that socket; it stays until its lease
ends, ``group_expiry``). Writes ``results/storm.md`` and ``storm.json``.
"""

import collections
import json
import os
import re
import statistics
import threading
import time
import urllib.parse
import uuid

from . import common
from .channels_bench import _chatstack, redis_stack

DEFAULT_ROUNDS = 1
CONNECT_TIMEOUT = 20.0  # the client's opening handshake (as tests/e2e/test_connect_storm.py)
STORM_DEADLINE = 90.0  # every socket accepted and joined, or failed
JOIN_GRACE = 10.0  # every handshake is over and nobody joined for this long: stop waiting
MESSAGE_DEADLINE = 30.0  # every joined socket has its room's message
POLL_EVERY = 0.25  # seconds between looks at the groups
READ_TIMEOUT = 0.5  # a client thread checks for the end this often
OUTCOMES = ("accepted", "refused", "reset", "timed out", "other")
# 503: daphne's refusal when websocket.connect is full; 403: its answer when
# no accept came within its websocket_connect_timeout (20 s).
OUTCOME_OF_STATUS = {503: "refused", 403: "timed out"}

say = common.say


class BenchError(Exception):
    pass


# -- the clients --------------------------------------------------------------------------


class Socket(object):
    """One WebSocket of the storm, driven by a thread of its own."""

    def __init__(self, index, room, url):
        self.index = index
        self.room = room
        self.url = url
        self.ws = None
        self.outcome = None  # accepted, refused, reset, other
        self.detail = None
        self.attempt_at = None
        self.accepted_at = None
        self.joined_at = None
        self.closed_at = None
        self.ended_at = None  # the handshake's end, whatever its outcome
        self.lost = None  # the connection ended before we closed it
        self.got_message_at = None
        self.frames = 0


class Storm(object):
    """``sockets`` WebSockets released at once onto ``rooms`` chat rooms of ``stack``."""

    def __init__(self, stack, sockets, rooms, tag):
        self.stack = stack
        self.tag = tag
        self.rooms = ["s%sr%d" % (tag, r) for r in range(rooms)]
        self.sockets = [
            Socket(
                i,
                self.rooms[i % rooms],
                stack.ws_url("/chat/%s/?name=u%d" % (self.rooms[i % rooms], i)),
            )
            for i in range(sockets)
        ]
        self._go = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._settled = 0  # sockets joined or failed
        self._handshakes = 0  # sockets accepted, refused, reset or failed
        self._progress_at = None  # the last handshake's end or join
        self._threads = [
            threading.Thread(target=self._run, args=(s,), name="storm-%d" % s.index, daemon=True)
            for s in self.sockets
        ]
        self.released_at = None

    def _settle(self):
        with self._cond:
            self._settled += 1
            self._progress_at = time.monotonic()
            self._cond.notify_all()

    def _handshake_over(self):
        with self._cond:
            self._handshakes += 1
            self._progress_at = time.monotonic()
            self._cond.notify_all()

    def _run(self, sock):
        import websocket

        self._go.wait()
        sock.attempt_at = time.monotonic()
        try:
            ws = websocket.create_connection(
                sock.url, timeout=CONNECT_TIMEOUT, enable_multithread=True
            )
        except websocket.WebSocketBadStatusException as exc:
            sock.outcome = OUTCOME_OF_STATUS.get(exc.status_code, "other")
            sock.detail = "HTTP %s" % exc.status_code
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            sock.outcome, sock.detail = "reset", type(exc).__name__
        except (websocket.WebSocketTimeoutException, TimeoutError) as exc:
            sock.outcome, sock.detail = "timed out", type(exc).__name__
        except Exception as exc:
            sock.outcome, sock.detail = "other", repr(exc)[:200]
        else:
            sock.accepted_at = time.monotonic()
            sock.outcome = "accepted"
            sock.ws = ws
        sock.ended_at = time.monotonic()
        self._handshake_over()
        if sock.ws is None:
            self._settle()
            return
        settled = False
        try:
            ws.settimeout(READ_TIMEOUT)
            while not self._stop.is_set():
                try:
                    raw = ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                if not raw:
                    raise EOFError("closed by the server")
                sock.frames += 1
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "welcome" and sock.joined_at is None:
                    sock.joined_at = time.monotonic()
                    settled = True
                    self._settle()
                elif kind == "message" and frame.get("id") == sock.room:
                    if sock.got_message_at is None:
                        sock.got_message_at = time.monotonic()
        except Exception as exc:
            sock.lost = repr(exc)[:200]
        finally:
            if not settled:
                self._settle()
        try:
            ws.close(timeout=3)
        except Exception:
            pass
        sock.closed_at = time.monotonic()

    def connect(self):
        """Release every socket at once; wait until each is joined or failed.

        An accepted socket whose welcome never comes (its consumer failed
        after the accept) stops the wait ``JOIN_GRACE`` seconds after the
        last handshake ended and the last socket joined. False then, or
        at ``STORM_DEADLINE``."""
        for thread in self._threads:
            thread.start()
        self.released_at = time.monotonic()
        self._go.set()
        deadline = self.released_at + STORM_DEADLINE
        total = len(self.sockets)
        with self._cond:
            while self._settled < total:
                now = time.monotonic()
                if now >= deadline:
                    break
                if self._handshakes == total and now - self._progress_at >= JOIN_GRACE:
                    break
                self._cond.wait(min(deadline - now, 0.5))
            return self._settled == total

    def open_sockets(self):
        return [s for s in self.sockets if s.outcome == "accepted" and s.lost is None]

    def joined(self):
        return [s for s in self.open_sockets() if s.joined_at is not None]

    def send_room_messages(self):
        """One message per room from a joined member; (received, expected, seconds)."""
        members = self.joined()
        senders = {}
        for sock in members:
            senders.setdefault(sock.room, sock)
        started = time.monotonic()
        for room, sock in senders.items():
            try:
                sock.ws.send(json.dumps({"text": "storm", "id": room}))
            except Exception as exc:  # its reader thread records the loss too
                sock.lost = sock.lost or repr(exc)[:200]
        deadline = started + MESSAGE_DEADLINE
        while time.monotonic() < deadline:
            if all(s.got_message_at is not None or s.lost for s in members):
                break
            time.sleep(0.05)
        received = [s for s in members if s.got_message_at is not None]
        last = max(s.got_message_at for s in received) - started if received else None
        return len(received), len(members), last

    def disconnect(self):
        """Every socket closes at once; the time the last close returned."""
        self._stop.set()
        for thread in self._threads:
            thread.join(CONNECT_TIMEOUT + 10)
        stuck = sum(1 for t in self._threads if t.is_alive())
        if stuck:
            raise BenchError("%d client threads did not end" % stuck)
        closed = [s.closed_at for s in self.sockets if s.closed_at is not None]
        return max(closed) if closed else time.monotonic()

    def figures(self):
        counts = dict.fromkeys(OUTCOMES, 0)
        for sock in self.sockets:
            counts[sock.outcome or "other"] += 1
        attempts = [s.attempt_at for s in self.sockets if s.attempt_at is not None]
        accepts = [s.accepted_at for s in self.sockets if s.accepted_at is not None]
        joins = [s.joined_at for s in self.sockets if s.joined_at is not None]
        first = min(attempts) if attempts else self.released_at
        window = (max(accepts) - first) if accepts else None
        others = [s.detail for s in self.sockets if s.outcome == "other"]
        lost = [s.lost for s in self.sockets if s.lost]
        resets = [s.ended_at - first for s in self.sockets if s.outcome == "reset"]
        return dict(
            counts,
            sockets=len(self.sockets),
            connect_window_s=window,
            connects_per_s=(len(accepts) / window) if window else None,
            joined=len(joins),
            joined_s=(max(joins) - first) if joins else None,
            other_first=others[0] if others else None,
            reset_after_s=[min(resets), max(resets)] if resets else None,
            lost=len(lost),
            lost_first=lost[0] if lost else None,
        )


# -- the sides --------------------------------------------------------------------------------


class Side(object):
    """One layer's stack and how to read its broker's memory and its groups."""

    def __init__(self, name, stack, describe, flush):
        self.name = name
        self.stack = stack
        self.describe = describe
        self.flush = flush
        self.rows = []
        self.breakdown = None  # the last memory reading's categories, if the broker has them

    def memory(self):
        """(the broker's memory in bytes, a second figure or None): a fresh
        reading, or (None, None)."""
        raise NotImplementedError

    def memberships(self, groups):
        """Members of each group (a list of counts), or None when it cannot be read."""
        raise NotImplementedError

    def queues(self):
        """(queues under the stack's prefix, of which Channels' ``__wait__``
        channels), or None where a channel is no queue of its own."""
        return None

    def close(self):
        pass


class AmqpSide(Side):
    def __init__(self, name, stack, describe, flush, management_url):
        Side.__init__(self, name, stack, describe, flush)
        self.management_url = management_url
        self._layer = None
        self._management = None
        if management_url:
            from asgi_amqp import AMQPChannelLayer
            from asgi_amqp.management import ManagementClient

            vhost = urllib.parse.unquote(urllib.parse.urlsplit(stack.amqp_url).path[1:]) or "/"
            self._management = ManagementClient(management_url, vhost)
            self._layer = AMQPChannelLayer(
                url=stack.amqp_urls,
                management_url=management_url,
                prefix=stack.prefix,
                dead_letter_worker=False,
            )

    def _get(self, path):
        status, body = _management_get(self.management_url, path)
        if status != 200:
            raise BenchError("GET /api/%s answered HTTP %d" % (path, status))
        return json.loads(body.decode("utf-8"))

    def _mem_used(self):
        nodes = self._get("nodes?columns=name,mem_used")
        return sum(int(node.get("mem_used") or 0) for node in nodes), [n["name"] for n in nodes]

    def memory(self):
        """``mem_used`` of every node, and what their Erlang VMs have allocated
        (``/api/nodes/NAME/memory``, computed when asked: ``total.erlang``)."""
        if not self.management_url:
            return None, None
        # The node publishes mem_used every statistics interval (5 s by
        # default): wait for the first value published after this call.
        first, names = self._mem_used()
        value = first
        deadline = time.monotonic() + 15.0
        while value == first and time.monotonic() < deadline:
            time.sleep(0.25)
            value, names = self._mem_used()
        erlang = 0
        self.breakdown = collections.Counter()
        for name in names:
            memory = self._get("nodes/%s/memory" % urllib.parse.quote(name, safe=""))["memory"]
            erlang += int(memory["total"]["erlang"])
            self.breakdown.update(
                {k: v for k, v in memory.items() if isinstance(v, int) and k != "total"}
            )
        return value, erlang

    def memberships(self, groups):
        if self._layer is None:
            return None
        return [len(self._layer.group_channels(group)) for group in groups]

    def queues(self):
        if self._management is None:
            return None
        names = self._management.queue_names(self.stack.prefix + ":")
        return len(names), sum(1 for name in names if "__wait__" in name)

    def close(self):
        if self._layer is not None:
            self._layer.close()
            self._layer = None


class RedisSide(Side):
    def __init__(self, name, stack, describe, flush, redis_url):
        Side.__init__(self, name, stack, describe, flush)
        self.redis = RedisClient(redis_url)
        # chatproject.settings_redis: asgi_redis's prefix is CHAT_LAYER_PREFIX + ":",
        # and asgi_redis 1.4.3's _group_key is "%s:group:%s" % (prefix, group).
        self.group_key = "%s::group:%%s" % stack.prefix

    def memory(self):
        info = self.redis.command("INFO", "memory").decode("utf-8")
        for line in info.splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":", 1)[1]), None
        raise BenchError("INFO memory without used_memory")

    def memberships(self, groups):
        return [self.redis.command("ZCARD", self.group_key % group) for group in groups]

    def close(self):
        self.redis.close()


def _management_get(management_url, path, timeout=10.0):
    import base64

    chatstack = _chatstack()
    parts = urllib.parse.urlsplit(management_url)
    netloc = parts.hostname + (":%d" % parts.port if parts.port else "")
    url = "%s://%s%s/api/%s" % (parts.scheme, netloc, parts.path.rstrip("/"), path)
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    token = base64.b64encode(("%s:%s" % (user, password)).encode("utf-8")).decode("ascii")
    return chatstack.http_get(url, timeout=timeout, headers={"Authorization": "Basic " + token})


class RedisClient(object):
    """Just enough RESP for ``INFO`` and ``ZCARD``, over one connection."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.password = urllib.parse.unquote(parts.password) if parts.password else None
        self.db = int((parts.path or "/0").lstrip("/") or 0)
        self._sock = None
        self._file = None

    def _connect(self):
        import socket

        self._sock = socket.create_connection(self.address, timeout=10)
        self._file = self._sock.makefile("rb")
        if self.password:
            self._call("AUTH", self.password)
        if self.db:
            self._call("SELECT", str(self.db))

    def _call(self, *args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            data = arg.encode("utf-8") if isinstance(arg, str) else arg
            out += b"$%d\r\n%s\r\n" % (len(data), data)
        self._sock.sendall(out)
        return self._read()

    def _read(self):
        line = self._file.readline()
        if not line:
            raise BenchError("Redis closed the connection")
        kind, rest = line[:1], line[1:].rstrip(b"\r\n")
        if kind == b"+":
            return rest
        if kind == b"-":
            raise BenchError("Redis: %s" % rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._file.read(size + 2)
            return data[:-2]
        if kind == b"*":
            return [self._read() for _ in range(int(rest))]
        raise BenchError("Redis answered %r" % line[:40])

    def command(self, *args):
        if self._sock is None:
            self._connect()
        return self._call(*args)

    def close(self):
        if self._sock is not None:
            self._file.close()
            self._sock.close()
            self._sock = self._file = None


def _category_growth(before, during, at_least=65536):
    """Bytes each memory category of the broker grew (or shrank) by, the larger first."""
    if not before or not during:
        return None
    grew = {k: during.get(k, 0) - before.get(k, 0) for k in set(before) | set(during)}
    return dict(
        sorted(
            ((k, v) for k, v in grew.items() if abs(v) >= at_least),
            key=lambda item: -abs(item[1]),
        )
    )


def listen_overflows():
    """The kernel's count of connections dropped because a listening socket's
    accept queue was full (TcpExt ListenOverflows; the whole machine's), or None."""
    try:
        with open("/proc/net/netstat") as counters:
            lines = counters.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            if "ListenOverflows" in table:
                return int(table["ListenOverflows"])
    return None


CONSUMER_ERROR = " - ERROR - worker - Error processing message with consumer "
_RECORD_LINE = re.compile(r"^\d{4}-\d\d-\d\d ")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Full|Exception|Timeout)\w*)(?::|$)")


def _log_sizes(stack):
    sizes = {}
    for proc in stack.workers:
        try:
            sizes[proc.log_path] = os.path.getsize(proc.log_path)
        except OSError:
            sizes[proc.log_path] = 0
    return sizes


def _exit_of(proc):
    """``worker-1 (rc 1: RuntimeError: ...)``: a process that exited, and why."""
    why = [line for line in proc.lines()[-40:] if _EXCEPTION_LINE.match(line)]
    return "%s (rc %s%s)" % (
        proc.name,
        proc.popen.poll(),
        ": " + why[-1][:160] if why else "",
    )


def consumer_errors(sizes):
    """``{"consumer: exception": count}`` of the runworkers' logs past ``sizes``
    (what ``_log_sizes`` read before the round): Channels' worker logs each
    exception a consumer raised and carries on."""
    counts = collections.Counter()
    for path, offset in sizes.items():
        try:
            with open(path, encoding="utf-8", errors="replace") as log:
                log.seek(offset)
                lines = log.read().splitlines()
        except OSError:
            continue
        consumer = exception = None
        for line in lines + ["0000-00-00 the end"]:
            if _RECORD_LINE.match(line):
                if consumer:
                    counts["%s: %s" % (consumer, exception or "?")] += 1
                consumer = exception = None
                if CONSUMER_ERROR in line:
                    consumer = line.split(CONSUMER_ERROR, 1)[1].rstrip(":").rsplit(".", 1)[-1]
                continue
            match = _EXCEPTION_LINE.match(line)
            if consumer and match:
                exception = match.group(1).rsplit(".", 1)[-1]
    return dict(counts)


# -- one round ----------------------------------------------------------------------------------


def wait_groups_empty(side, groups, since, cap):
    """(seconds from ``since`` until every group is empty or None, memberships left)."""
    deadline = since + cap
    left = None
    while True:
        counts = side.memberships(groups)
        if counts is None:
            return None, None
        left = sum(counts)
        now = time.monotonic()
        if left == 0:
            return now - since, 0
        if now > deadline:
            return None, left
        time.sleep(POLL_EVERY)


def storm_round(side, sockets, rooms, cap):
    """One storm on ``side``'s stack; its row (figures)."""
    stack = side.stack
    tag = uuid.uuid4().hex[:6]
    before, vm_before = side.memory()
    breakdown_before = side.breakdown
    storm = Storm(stack, sockets, rooms, tag)
    groups = ["room-" + room for room in storm.rooms]
    overflows = listen_overflows()
    sizes = _log_sizes(stack)
    try:
        settled = storm.connect()
        figures = storm.figures()
        if overflows is not None:
            overflows = listen_overflows() - overflows
        connected = len(storm.open_sockets())
        during, vm_during = side.memory()
        breakdown_during = side.breakdown
        queues = side.queues()
        received, expected, message_s = storm.send_room_messages()
    finally:
        last_close = storm.disconnect()
    empty_s, left = wait_groups_empty(side, groups, last_close, cap)
    dead = [_exit_of(proc) for proc in stack.processes() if not proc.alive()]
    errors = consumer_errors(sizes)

    def per_socket(first, then):
        if first is None or then is None or not connected:
            return None
        return (then - first) / float(connected)

    row = dict(
        figures,
        layer=side.name,
        settled=settled,
        listen_overflows=overflows,
        consumer_errors=errors,
        connected=connected,
        memory_before=before,
        memory_connected=during,
        memory_per_socket=per_socket(before, during),
        vm_memory_before=vm_before,
        vm_memory_connected=vm_during,
        vm_memory_per_socket=per_socket(vm_before, vm_during),
        memory_categories=_category_growth(breakdown_before, breakdown_during),
        queues_connected=queues,
        message_received=received,
        message_expected=expected,
        message_s=message_s,
        groups_empty_s=empty_s,
        memberships_left=left,
        empty_cap_s=cap,
        dead=dead,
    )
    row["failures"] = failures(row)
    row["findings"] = findings(row)
    return row


def failures(row):
    """What failed in a round (each a short phrase): a process exited, a socket
    ended in neither of the storm's outcomes. Empty when all held."""
    found = []
    if row["dead"]:
        found.append("exited: %s" % ", ".join(row["dead"]))
    if row["other"]:
        found.append("%d other failures (first: %s)" % (row["other"], row["other_first"]))
    return found


def findings(row):
    """What the storm cost beyond refusals and resets (each a short phrase):
    reported, not failed, since each is a full channel's documented end
    (see the module docstring)."""
    found = []
    if row["joined"] < row["accepted"]:
        found.append(
            "%d accepted sockets never joined their room (no welcome)"
            % (row["accepted"] - row["joined"])
        )
    if row["lost"]:
        found.append("%d connections lost (first: %s)" % (row["lost"], row["lost_first"]))
    if row["message_received"] < row["message_expected"]:
        found.append(
            "room message missing on %d of %d members"
            % (row["message_expected"] - row["message_received"], row["message_expected"])
        )
    if row["memberships_left"]:
        found.append(
            "%d memberships left %.0f s after the last disconnect"
            % (row["memberships_left"], row["empty_cap_s"])
        )
    return found


def describe_row(row):
    """One round in a line, with what the table leaves out."""
    return (
        "%d accepted (%d joined), %d refused, %d reset%s, %d timed out, %d other; %s "
        "connects/s; joined "
        "after %s; room message %d/%d; memory %s per socket%s; groups empty: %s; listen "
        "queue overflows %s; consumer errors: %s%s"
        % (
            row["accepted"],
            row["joined"],
            row["refused"],
            row["reset"],
            " (%.1f-%.1f s after the release)" % tuple(row["reset_after_s"])
            if row["reset_after_s"]
            else "",
            row["timed out"],
            row["other"],
            _fmt(row["connects_per_s"], "%.0f"),
            _fmt(row["joined_s"], "%.2f s"),
            row["message_received"],
            row["message_expected"],
            _fmt(row["memory_per_socket"], "%.0f B"),
            " (Erlang VM %.0f B; %d queues under the prefix then, %d of them __wait__)"
            % ((row["vm_memory_per_socket"] or 0,) + tuple(row["queues_connected"]))
            if row["queues_connected"]
            else "",
            _empty_cell(row),
            _fmt(row["listen_overflows"], "%d"),
            ", ".join("%s x%d" % item for item in sorted(row["consumer_errors"].items())) or "none",
            "".join(
                "; %s: %s" % (label, "; ".join(row[key]))
                for key, label in (("findings", "findings"), ("failures", "FAILED"))
                if row[key]
            ),
        )
    )


# -- report -------------------------------------------------------------------------------------


def _fmt(value, form, missing="n/a"):
    return missing if value is None else form % value


def _memory_cell(row):
    if row["memory_per_socket"] is None:
        return "n/a"
    text = "%s KiB (%.1f → %.1f MiB)" % (
        "{:,.1f}".format(row["memory_per_socket"] / 1024.0),
        row["memory_before"] / 1048576.0,
        row["memory_connected"] / 1048576.0,
    )
    if row.get("vm_memory_per_socket") is not None:
        text += "; Erlang VM %s KiB" % "{:,.1f}".format(row["vm_memory_per_socket"] / 1024.0)
    return text


def _empty_cell(row):
    if row["groups_empty_s"] is not None:
        return "%.2f s" % row["groups_empty_s"]
    if row["memberships_left"] is None:
        return "n/a"
    return "not within %.0f s: %d memberships left" % (row["empty_cap_s"], row["memberships_left"])


def table(rows, rounds):
    header = (
        "| layer%s | accepted (joined) / refused (503) / reset / timed out (403) / other "
        "| connects/s "
        "| all joined after | room message received | broker memory per socket "
        "(before → connected) | groups empty after the last disconnect |"
        % (" | round" if rounds > 1 else "")
    )
    lines = [header, "|" + "---|" * (8 if rounds > 1 else 7)]
    for row in rows:
        lines.append(
            "| %s%s | %d (%d) / %d / %d / %d / %d of %d | %s | %s | %d of %d in %s | %s | %s |"
            % (
                row["layer"],
                " | %d" % row["round"] if rounds > 1 else "",
                row["accepted"],
                row["joined"],
                row["refused"],
                row["reset"],
                row["timed out"],
                row["other"],
                row["sockets"],
                _fmt(row["connects_per_s"], "%.0f"),
                _fmt(row["joined_s"], "%.2f s"),
                row["message_received"],
                row["message_expected"],
                _fmt(row["message_s"], "%.2f s"),
                _memory_cell(row),
                _empty_cell(row),
            )
        )
    return "\n".join(lines)


def medians(rows):
    """Per layer, the median of each round's figures (for --rounds > 1)."""
    by = {}
    for row in rows:
        by.setdefault(row["layer"], []).append(row)

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return {
        layer: {
            key: median(r[key] for r in rs)
            for key in ("connects_per_s", "joined_s", "memory_per_socket", "groups_empty_s")
        }
        for layer, rs in by.items()
    }


# -- main -------------------------------------------------------------------------------------


def make_sides(args, ctx, chatstack, run_id, notes):
    sides = []
    capacity = {"CHAT_CAPACITY": str(args.storm_capacity)}
    stack = chatstack.ChatStack(
        ctx.amqp_url, ctx.management_url, prefix=run_id + "-amqp", workers=2, env=capacity
    )
    sides.append(
        AmqpSide(
            "asgi_amqp",
            stack,
            "asgi_amqp on RabbitMQ",
            stack.flush,
            ctx.management_url,
        )
    )
    if not ctx.management_url:
        notes.append("asgi_amqp: no management API, so no broker memory and no group counts")
    python, reason = ctx.redis_python()
    redis_url = ctx.redis.url if python else None
    if not python or not redis_url:
        reason = reason or ctx.redis.reason
        notes.append("asgi_redis left out: %s" % reason)
        say("storm: asgi_redis left out: %s" % reason)
        return sides
    stack, flusher = redis_stack(run_id, python, redis_url, capacity, workers=2)
    sides.append(
        RedisSide(
            "asgi_redis",
            stack,
            "asgi_redis 1.4.3 on %s" % ctx.redis.describe(),
            flusher,
            redis_url,
        )
    )
    return sides


def run(args, ctx):
    chatstack = _chatstack()
    rounds = args.rounds or DEFAULT_ROUNDS
    sockets = args.storm_sockets
    rooms = min(args.storm_rooms, sockets)
    cap = args.storm_empty_cap
    run_id = "storm-%s" % uuid.uuid4().hex[:8]
    load_start = os.getloadavg()
    notes = []
    sides = []
    rows = []
    status = 0
    headline = ""
    paths = []
    try:
        sides = make_sides(args, ctx, chatstack, run_id, notes)
        for side in sides:
            say("Starting %s: daphne + 2 runworkers ..." % side.describe)
            side.stack.start(timeout=90)
            say(
                "  daphne pid %d (%s mode), runworker pids %s"
                % (
                    side.stack.daphne.pid,
                    side.stack.mode,
                    ", ".join(str(w.pid) for w in side.stack.workers),
                )
            )
        for side in sides:  # warm-up, not recorded
            warm = storm_round(side, max(2, sockets // 10), 2, 60.0)
            if warm["failures"] or warm["findings"]:
                say(
                    "  warm-up on %s: %s"
                    % (side.name, "; ".join(warm["failures"] + warm["findings"]))
                )
        for round_no in range(rounds):
            for side in common.rotate(sides, round_no):
                for proc in [w for w in side.stack.workers if not w.alive()]:
                    fresh = side.stack.replace_worker(proc, kill=False)
                    say("  %s: %s exited; started %s" % (side.name, proc.name, fresh.name))
                say(
                    "  round %d %s: %d sockets into %d rooms ..."
                    % (round_no + 1, side.name, sockets, rooms)
                )
                row = storm_round(side, sockets, rooms, cap)
                row["round"] = round_no + 1
                side.rows.append(row)
                rows.append(row)
                say("  round %d %-10s %s" % (round_no + 1, side.name, describe_row(row)))
        order = [side.name for side in sides]
        rows.sort(key=lambda row: (row["round"], order.index(row["layer"])))
        for row in rows:
            for failure in row["failures"]:
                notes.append("%s round %d FAILED: %s" % (row["layer"], row["round"], failure))
            for finding in row["findings"]:
                notes.append("%s round %d: %s" % (row["layer"], row["round"], finding))
        if any(row["failures"] for row in rows):
            status = 1
        text = table(rows, rounds)
        if rounds > 1:
            text += "\n\nMedian of %d rounds: %s" % (
                rounds,
                "; ".join(
                    "%s %s connects/s, %s per socket, groups empty after %s"
                    % (
                        layer,
                        _fmt(m["connects_per_s"], "%.0f"),
                        _fmt(m["memory_per_socket"], "%.0f B"),
                        _fmt(m["groups_empty_s"], "%.2f s"),
                    )
                    for layer, m in medians(rows).items()
                ),
            )
        say()
        say(text)
        load_end = os.getloadavg()
        headline = text
        paths = _write_summary(ctx, sides, rows, args, text, notes, load_start, load_end)
        say("  written: %s" % ", ".join(os.path.relpath(p) for p in paths))
    except (BenchError, chatstack.StackError) as exc:
        say("FAILED: %s" % exc)
        status = 1
        notes.append("FAILED: %s" % exc)
    finally:
        for side in sides:
            side.stack.stop()
            side.close()
            try:
                side.flush()
            except Exception as exc:
                say("could not remove %s's objects: %s" % (side.name, exc))
            side.stack.cleanup(keep_logs=status != 0)
    return common.SuiteResult(status, headline, paths, "; ".join(notes))


def _write_summary(ctx, sides, rows, args, text, notes, load_start, load_end):
    rounds = args.rounds or DEFAULT_ROUNDS
    lines = [
        "daphne 1.4.2 + two `manage.py runworker` (Channels 1.1.8) per layer, the chat "
        "rooms of tests/project (channel capacity %d); %d WebSockets (websocket-client, "
        "a thread each, in one process) released at once into %d rooms, a warm-up storm "
        "first; one chat message per room once all are joined; then all close at once and "
        "the room groups are polled every %.2f s until empty (cap %.0f s). Connects/s: "
        "sockets accepted / (last accept - first attempt). Broker memory: RabbitMQ "
        "`mem_used` (GET /api/nodes, the first value published after asking; and what the "
        "Erlang VM allocated, GET /api/nodes/NAME/memory `total.erlang`) or Redis "
        "`used_memory` (INFO memory), before the storm and once every socket was joined, "
        "difference / sockets open. %d round%s%s."
        % (
            args.storm_capacity,
            args.storm_sockets,
            min(args.storm_rooms, args.storm_sockets),
            POLL_EVERY,
            args.storm_empty_cap,
            rounds,
            "" if rounds == 1 else "s",
            "" if rounds == 1 else ", alternating",
        ),
        "",
        text,
        "",
    ]
    lines += ["* %s round %d: %s" % (row["layer"], row["round"], describe_row(row)) for row in rows]
    lines += ["* %s" % side.describe for side in sides]
    lines += ["* %s" % n for n in notes]
    lines += [
        "",
        "Load average %.2f at start, %.2f at end (the machine is shared: compare the two "
        "layers within one run only)." % (load_start[0], load_end[0]),
    ]
    return common.write_result(
        ctx.results,
        "storm",
        "Connect storm: asgi_amqp vs asgi_redis",
        "\n".join(lines),
        {
            "sockets": args.storm_sockets,
            "rooms": min(args.storm_rooms, args.storm_sockets),
            "capacity": args.storm_capacity,
            "rounds": rounds,
            "empty_cap_s": args.storm_empty_cap,
            "rows": rows,
            "medians": medians(rows),
            "notes": notes,
        },
        ctx.command,
    )
