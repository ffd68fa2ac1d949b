"""A socket's frames reach one receiving process at a time, in the order sent.

ASGI 1.0's ``websocket.connect``, ``websocket.receive`` and
``websocket.disconnect`` messages carry a ``reply_channel`` and an integer
``order``. Channels' ``enforce_ordering`` runs them in that order, and
parks a frame that comes early in ``__wait__.<reply channel>``; with two
runworkers taking consecutive frames of one socket, a backlog made that
loop until frames were lost. The layer keeps each socket's frames in one
shard of the channel, which one process at a time takes (``naming``,
``engine.consumers.balance``), and spreads the shards over the processes.
Messages without an order (asgiref's conformance suite) use the channel's
own queue, as before.
"""

import collections
import socket as net
import threading
import time

import pika
import pytest

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.engine.consumers.pool import requeues_in_place
from asgi_amqp.naming import ORDERED_SHARDS
from helpers import Management, consumers_on, make_layer, queue_counts, wait_until

RECEIVE = "websocket.receive"
CHANNELS = ["websocket.connect", RECEIVE, "websocket.disconnect"]


def frame(socket, order, **extra):
    return dict({"reply_channel": "daphne.response.%s!c" % socket, "order": order}, **extra)


# -- where a message goes (no broker) ----------------------------------------------------


def test_a_sockets_frames_go_to_one_shard_and_other_messages_to_the_channel():
    layer = AMQPChannelLayer(url="amqp://127.0.0.1:1/", prefix="p")
    topology = layer.topology
    shard = topology.send_queue(RECEIVE, frame("a", 0))
    assert shard.startswith("p:q:websocket.receive#")
    assert topology.send_queue(RECEIVE, frame("a", 7, text="x")) == shard  # the same socket
    shards = {topology.send_queue(RECEIVE, frame("s%d" % n, 0)) for n in range(200)}
    assert shards == set(topology.shard_queues(RECEIVE))  # all of them used
    assert len(shards) == ORDERED_SHARDS
    # No order, a bool or text order, no reply channel, another channel: the channel's queue.
    for channel, message in [
        (RECEIVE, {"reply_channel": "daphne.response.a!c", "text": "x"}),
        (RECEIVE, frame("a", True)),
        (RECEIVE, frame("a", "1")),
        (RECEIVE, {"order": 1}),
        ("chat.receive", frame("a", 0)),
    ]:
        assert topology.send_queue(channel, message) == topology.channel_queue(channel)
    assert topology.channel_of_queue(shard) == RECEIVE
    assert topology.queue_arguments(RECEIVE, shard)["x-single-active-consumer"] is True
    assert "x-single-active-consumer" not in topology.queue_arguments(
        RECEIVE, topology.channel_queue(RECEIVE)
    )


def test_ordered_channels_is_a_setting_of_normal_channel_names():
    layer = AMQPChannelLayer(url="amqp://127.0.0.1:1/", ordered_channels=["game.move"])
    assert layer.topology.send_queue("game.move", frame("a", 0)) != "asgi:q:game.move"
    assert layer.topology.shard_queues(RECEIVE) == ()
    off = AMQPChannelLayer(url="amqp://127.0.0.1:1/", ordered_channels=[])
    assert off.topology.send_queue(RECEIVE, frame("a", 0)) == "asgi:q:websocket.receive"
    for bad in ["websocket.receive", ["daphne.response!"], ["a.b?"], ["bad name"], [3]]:
        with pytest.raises((ValueError, TypeError)):
            AMQPChannelLayer(url="amqp://127.0.0.1:1/", ordered_channels=bad)


def test_only_a_quorum_queue_before_rabbitmq_4_requeues_behind_the_later_messages():
    """Measured with pika (prefetch 10, a cancel after 5 acks): the frames
    rejected after ``basic.cancel`` came back first on classic queues (3.10.8,
    4.0.5) and on 4.0.5's quorum queues, last on 3.10.8's quorum queues."""
    assert requeues_in_place(False, None)
    assert requeues_in_place(False, {"version": b"3.10.8"})
    assert not requeues_in_place(True, {"version": b"3.10.8"})
    assert not requeues_in_place(True, {"version": "3.13.7"})
    assert requeues_in_place(True, {"version": b"4.0.5"})
    assert requeues_in_place(True, {"version": "4.1.0"})
    assert not requeues_in_place(True, {})  # unknown: the safe side
    assert not requeues_in_place(True, None)


# -- on a broker -----------------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_what_a_lost_connection_held_comes_back_first(broker, queue_type):
    """A consumer (prefetch 1) holds m0 unacked while m1-m3 wait; its
    connection goes: m0 comes back first, on either queue type (3.10.8 and
    4.0.5). Only a nack puts a message behind the later ones, on a 3.10
    quorum queue (``requeues_in_place``)."""
    queue = "back-on-loss-%s-%d" % (queue_type, time.monotonic_ns())
    holder = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    reader = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = reader.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        channel.confirm_delivery()
        held = holder.channel()
        held.basic_qos(prefetch_count=1)
        channel.basic_publish("", queue, b"0")
        assert next(held.consume(queue, inactivity_timeout=5))[2] == b"0"
        for n in (1, 2, 3):
            channel.basic_publish("", queue, str(n).encode())
        holder.close()  # m0 goes back unacked
        got = []
        for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=5):
            if method is None:
                break
            got.append(int(body))
            if len(got) == 4:
                break
        channel.cancel()
        channel.queue_delete(queue)
        assert got == [0, 1, 2, 3]
    finally:
        for connection in (holder, reader):
            if connection.is_open:
                connection.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_frame_sent_is_there_for_the_next_non_blocking_receive(broker, new_layer, queue_type):
    layer = new_layer(broker, flush=True, queue_type=queue_type)
    for order in range(3):
        layer.send(RECEIVE, frame("a", order, text=str(order)))
        layer.send(RECEIVE, {"text": "plain %d" % order})  # the channel's own queue
    got = [layer.receive(CHANNELS) for _ in range(6)]
    assert all(channel == RECEIVE for channel, _ in got), got
    assert [m["order"] for _, m in got if "order" in m] == [0, 1, 2]
    assert sorted(m["text"] for _, m in got if "order" not in m) == [
        "plain 0",
        "plain 1",
        "plain 2",
    ]
    assert layer.receive(CHANNELS) == (None, None)


def test_a_frame_for_a_full_shard_waits_in_the_process_for_room(broker, new_layer):
    """A frame for a full shard is parked, in order, and the sender goes on:
    off daphne's reactor it is enforce_ordering's requeue, which Channels
    does not retry, sent by a worker that may be the shard's only reader.
    The parked sends' bound still ends in ``ChannelFull``."""
    layer = new_layer(broker, flush=True, capacity=5)
    layer.sender.parked_sends.messages_limit = 3
    for order in range(5):
        layer.send(RECEIVE, frame("a", order))
    started = time.monotonic()
    for order in range(5, 8):
        layer.send(RECEIVE, frame("a", order))  # parked: the shard is full
    assert time.monotonic() - started < 1.0
    with pytest.raises(layer.ChannelFull, match="fill their limit"):
        layer.send(RECEIVE, frame("a", 8))
    orders = []
    wait_until(
        lambda: (
            orders.extend(m["order"] for _, m in [layer.receive([RECEIVE], block=True)] if m)
            or len(orders) >= 8
        ),
        30,
        message="the parked frames delivered",
    )
    assert orders == list(range(8))
    assert layer.sender.parked_sends.delivered == 3


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_sockets_next_frame_waits_for_the_thread_running_its_last(broker, new_layer, queue_type):
    """A runworker's threads share its layer. While one runs a socket's frame,
    no other is handed that socket's next, which ``enforce_ordering`` would
    park: two runworkers of 4 threads each lost 58 % of a chat that way, with
    no fault. Another socket's frame goes to another thread meanwhile, and
    the first thread's next receive takes its socket's next frame."""
    layer = new_layer(broker, flush=True, queue_type=queue_type)
    shard_of = lambda socket: layer.topology.send_queue(RECEIVE, frame(socket, 0))  # noqa: E731
    other = next(s for s in ("b%d" % n for n in range(100)) if shard_of(s) != shard_of("a"))
    for order in range(3):
        layer.send(RECEIVE, frame("a", order))
    assert layer.receive([RECEIVE], block=True)[1]["order"] == 0  # this thread runs it

    def receive_in_another_thread():
        got = []
        thread = threading.Thread(target=lambda: got.append(layer.receive([RECEIVE], True)))
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        return got[0]

    layer.receive_timeout = 0.5
    assert receive_in_another_thread() == (None, None)  # frame 1 waits for this thread
    layer.send(RECEIVE, frame(other, 0))
    channel, message = receive_in_another_thread()
    assert message["reply_channel"] == frame(other, 0)["reply_channel"]
    layer.receive_timeout = 5.0
    assert [layer.receive([RECEIVE], block=True)[1]["order"] for _ in range(2)] == [1, 2]
    assert layer.receive([RECEIVE]) == (None, None)


def test_a_shard_is_pushed_one_frame_ahead_however_many_threads_receive(broker, new_layer):
    """Three threads made blocking receives, which widens a normal channel's
    window to 5; a shard's stays 1, since its frames run one at a time: with
    wider ones, a kill put the held frames back out of place on 3.10.8's
    quorum queues (2 runworkers of 4 threads: 33 frames lost to
    ``enforce_ordering``'s parking)."""
    layer = new_layer(broker, flush=True, receive_timeout=0.2)
    waits = [threading.Thread(target=layer.receive, args=(["idle"], True)) for _ in range(2)]
    for thread in waits:
        thread.start()
    for thread in waits:
        thread.join(10)
    for order in range(6):
        layer.send(RECEIVE, frame("a", order))
    layer.receive_timeout = 5.0
    assert layer.receive([RECEIVE], block=True)[1]["order"] == 0
    shard = layer.topology.send_queue(RECEIVE, frame("a", 0))
    # One handed over, one pushed and held: 4 stay ready in the queue.
    wait_until(lambda: queue_counts(broker, shard).message_count == 4, 5, message="ready")
    assert [layer.receive([RECEIVE], block=True)[1]["order"] for _ in range(5)] == [1, 2, 3, 4, 5]


def test_a_shard_with_a_backlog_leaves_room_for_other_channels(broker, new_layer):
    """A thread's next receive prefers no shard: one that kept to the shard of
    its last frame while that shard held more starved every other channel
    behind a backlog (after a restart, a /ping/ waited 4-12 s)."""
    layer = new_layer(broker, flush=True)
    shard = layer.topology.send_queue(RECEIVE, frame("a", 0))
    request = layer.topology.channel_queue("http.request")
    for order in range(20):
        layer.send(RECEIVE, frame("a", order))
    channels = [RECEIVE, "http.request"]
    assert layer.receive(channels, block=True)[1]["order"] == 0  # both consumers start
    layer.send("http.request", {"path": "/ping/"})
    taken = []
    while "http.request" not in taken:
        # Each queue's next message is pushed and held before the receive.
        ready = max(0, 20 - 1 - len([c for c in taken if c == RECEIVE]) - 1)
        wait_until(
            lambda ready=ready: queue_counts(broker, shard).message_count == ready,
            5,
            message="held",
        )
        wait_until(lambda: queue_counts(broker, request).message_count == 0, 5, message="ping")
        taken.append(layer.receive(channels, block=True)[0])
    assert len(taken) < 20, "the ping came after every frame of the shard"


class Worker(object):
    """A runworker's loop on a layer of its own: receive, handle for ``work`` s, repeat."""

    def __init__(self, broker, prefix, queue_type, name, log, work=0.001):
        self.name = name
        self.layer = make_layer(broker, prefix=prefix, queue_type=queue_type, receive_timeout=0.2)
        self.log = log  # socket -> [(taken, handled, worker, order)], shared
        self.work = work
        self.handled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            channel, message = self.layer.receive(CHANNELS, block=True)
            if channel is None:
                continue
            taken = time.monotonic()
            time.sleep(self.work)  # the consumer's own work
            self.log[message["reply_channel"]].append(
                (taken, time.monotonic(), self.name, message["order"])
            )
            self.handled += 1

    def stop(self, close=True):
        self._stop.set()
        self._thread.join(10)
        if close:
            self.layer.close()


def _send_frames(layer, sockets, frames, first=0):
    for order in range(first, first + frames):
        for socket in range(sockets):
            layer.send(RECEIVE, frame("s%d" % socket, order))


def _check_order(log, expected_per_socket, copies_allowed=False, swaps_from=None):
    """Every frame, each socket's in order, and never two workers on one socket at once.

    With ``copies_allowed``, a frame may come twice: handed to a worker in the
    instant its connection went, before the broker had its ack (the docs'
    "Delivery rule"); its first take is the one checked. From ``swaps_from``
    (``time.monotonic()``) on, a frame may come one place late: the broker
    may hand a single-active-consumer queue's next message to the consumer
    that takes over before the messages the one that went held (quorum
    queues, and a consumer cancelled by a closing layer: docs/topology.rst)."""
    copies = 0
    for socket, entries in log.items():
        entries.sort()
        first = {}
        for entry in entries:
            first.setdefault(entry[3], entry)
        copies += len(entries) - len(first)
        firsts = sorted(first.values())
        if swaps_from is not None:
            late = [e for e in firsts if e[0] >= swaps_from]
            firsts = [e for e in firsts if e[0] < swaps_from] + sorted(late, key=lambda e: e[3])
            # One place late at most, after the hand-over.
            taken = {e[3]: n for n, e in enumerate(sorted(first.values()))}
            assert all(abs(taken[e[3]] - n) <= 1 for n, e in enumerate(firsts)), (
                socket,
                [(e[3], e[2], round(e[0] - swaps_from, 3)) for e in sorted(first.values())],
            )
        orders = [order for _, _, _, order in firsts]
        assert orders == list(range(expected_per_socket)), (socket, entries)
        for before, after in zip(firsts, firsts[1:]):
            # The next frame is taken only once the one before it was handled.
            late = swaps_from is not None and after[0] >= swaps_from
            assert late or after[0] >= before[1], (socket, before, after)
    assert copies_allowed or not copies, "%d frames came twice" % copies
    return copies


def _drop_between(node, clients, before, after):
    """Every connection dropped after ``before`` rounds of frames; then
    ``after`` rounds more."""
    wait_until(lambda: clients.sent >= before, 30, message="%d rounds of frames" % before)
    node.drop_all_connections()
    sent = clients.sent
    wait_until(lambda: clients.sent >= sent + after, 30, message="%d rounds after" % after)


class Clients(object):
    """``sockets`` clients sending a frame each every ``every`` seconds, in a thread."""

    def __init__(self, layer, sockets, every=0.1):
        self.sent = 0  # frames sent per socket
        self._stop = threading.Event()

        def run():
            while not self._stop.is_set():
                _send_frames(layer, sockets, 1, first=self.sent)
                self.sent += 1
                self._stop.wait(every)  # the clients' pace, not a wait for an event

        self._thread = threading.Thread(target=run, name="clients", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        return self.sent


@pytest.mark.slow
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_each_socket_reaches_one_worker_at_a_time_and_the_workers_share_them(
    broker, new_layer, queue_type
):
    """20 sockets at 10 frames/s each; two workers, a third joining: every
    frame once and in order, never two workers on one socket at once, and
    the three share the sockets, though none pauses."""
    sender = new_layer(broker, flush=True, queue_type=queue_type)
    prefix = sender.topology.prefix
    log = collections.defaultdict(list)
    workers = _two_workers(broker, sender, queue_type, log)
    sockets = 20
    clients = Clients(sender, sockets)
    try:
        wait_until(lambda: clients.sent >= 20, 30, message="2 s of frames")
        joined = time.monotonic()
        workers.append(Worker(broker, prefix, queue_type, "w2", log))
        wait_until(
            lambda: any(e[2] == "w2" for entries in log.values() for e in entries),
            30,
            message="the third worker taking sockets",
        )
        print(
            "\n%s: the third worker took its first socket %.1f s after it joined"
            % (queue_type, time.monotonic() - joined)
        )
        wait_until(lambda: clients.sent >= 60, 30, message="6 s of frames")
    finally:
        stopped = time.monotonic()
        frames = clients.stop()
        wait_until(
            lambda: sum(map(len, log.values())) >= sockets * frames, 60, message="every frame"
        )
        for worker in workers:
            worker.stop()
    _check_order(log, frames)
    last = collections.Counter(
        e[2] for entries in log.values() for e in entries if stopped - 2 <= e[0] < stopped
    )
    print("frames taken in the last 2 s:", sorted(last.items()))
    # Shared: each took a tenth at least (before busy shards moved: 2 of 320).
    assert all(last[w.name] * 10 >= sum(last.values()) for w in workers), last
    assert sender.receive(CHANNELS) == (None, None)


@pytest.mark.slow
def test_a_busy_worker_keeps_consuming_a_quiet_shard(broker, new_layer):
    """A worker whose blocking receives always find a message held never
    reaches the I/O thread's waiters; before, its consumer of a shard that
    went quiet for ``consumer_idle_timeout`` was cancelled then and not
    started again while the worker stayed busy: the socket's next frame
    waited for the backlog to end (in the stack, minutes)."""
    layer = new_layer(broker, flush=True, consumer_idle_timeout=1.0, receive_timeout=0.2)
    for n in range(100):  # the default capacity
        layer.send("busy", {"n": n})
    layer.send(RECEIVE, frame("quiet", 0))
    taken = {}
    busy = []
    stop = threading.Event()

    def work():
        while not stop.is_set():
            channel, message = layer.receive(["busy", RECEIVE], block=True)
            if channel == RECEIVE:
                taken[message["order"]] = time.monotonic()
            elif channel == "busy":
                time.sleep(0.04)  # the consumer's work: 100 of them take 4 s or more
                busy.append(message["n"])

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        wait_until(lambda: 0 in taken, 10, message="the quiet socket's first frame")
        stop.wait(2.0)  # quiet for twice consumer_idle_timeout, while busy
        sent = time.monotonic()
        layer.send(RECEIVE, frame("quiet", 1))
        busy_then = len(busy)
        wait_until(lambda: 1 in taken, 30, message="the quiet socket's next frame")
        assert busy_then < 100, "the worker was no longer busy: the test needs a longer backlog"
        assert taken[1] - sent < 1.5, "taken %.1f s after it was sent" % (taken[1] - sent)
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.slow
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_worker_that_falls_behind_gives_busy_shards_to_an_idle_one(broker, new_layer, queue_type):
    """The first worker takes every shard, serves no more than its share of
    them, and cannot keep up. When frames pile up in a shard it serves
    (``balance.BEHIND``, at two looks in a row), it gives the deepest back,
    and the idle worker takes it: the queue puts the frames it held back in
    their place, so every socket's frames still run in order, one worker at
    a time. A quorum queue on 3.10 would put them behind the backlog: there
    the shard stays, and the frames run in order on the slow worker."""
    version = Management(broker).overview()["rabbitmq_version"]
    moves = requeues_in_place(queue_type == "quorum", {"version": version})
    sender = new_layer(broker, flush=True, queue_type=queue_type)
    log = collections.defaultdict(list)
    slow, fast = _two_workers(broker, sender, queue_type, log)
    slow.work = 0.05  # 20 frames/s at most, for 80 sent
    clients = Clients(sender, 8, every=0.1)
    try:
        wait_until(lambda: clients.sent >= 120, 30, message="12 s of frames")
    finally:
        frames = clients.stop()
        wait_until(lambda: sum(map(len, log.values())) >= 8 * frames, 60, message="every frame")
        slow.stop()
        fast.stop()
    print("\nframes handled: slow %d, fast %d" % (slow.handled, fast.handled))
    _check_order(log, frames)
    if moves:
        assert fast.handled > 8 * frames // 4, "the idle worker took %d" % fast.handled


def _two_workers(broker, sender, queue_type, log, **options):
    """Two workers, the second started once the first consumes every shard.

    One after the other: RabbitMQ (3.10 and 4.0) closes with 541 INTERNAL_ERROR a
    connection that consumes a quorum queue another connection is creating
    (docs/topology.rst); the layer reconnects, but these tests count copies."""
    prefix = sender.topology.prefix
    first = Worker(broker, prefix, queue_type, "w0", log, **options)
    shards = [q for c in CHANNELS for q in sender.topology.shard_queues(c)]
    wait_until(lambda: all(consumers_on(broker, q) for q in shards), 30, message="w0 consuming")
    return [first, Worker(broker, prefix, queue_type, "w1", log, **options)]


@pytest.mark.slow
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_dead_workers_sockets_move_to_the_others_in_order(broker, new_layer, queue_type):
    """A worker that stops and closes its layer leaves its shards to the
    other at once: the frames it had not taken go to it. Closing cancels the
    consumers before the channels return what they held, so a frame may come
    one place late, on either queue type (docs/topology.rst)."""
    sender = new_layer(broker, flush=True, queue_type=queue_type)
    log = collections.defaultdict(list)
    workers = _two_workers(broker, sender, queue_type, log)
    sockets = 20
    clients = Clients(sender, sockets)
    try:
        wait_until(
            lambda: all(w.handled for w in workers), 30, message="both workers serving sockets"
        )
        dead = workers.pop(0)
        dead.stop(close=False)
        died = time.monotonic()
        dead.layer.close()
        sent_at_death = clients.sent
        wait_until(lambda: clients.sent >= sent_at_death + 20, 30, message="2 s more")
    finally:
        frames = clients.stop()
        wait_until(lambda: sum(map(len, log.values())) >= sockets * frames, 60, message="all")
        for worker in workers:
            worker.stop()
    before = {socket: [e for e in entries if e[0] < died] for socket, entries in log.items()}
    orphans = [log[socket] for socket, e in before.items() if e and e[-1][2] == dead.name]
    moved = max(min(x[0] for x in entries if x[0] > died) for entries in orphans)
    print(
        "\n%s: the dead worker's %d sockets were all taken up %.2f s after its death"
        % (queue_type, len(orphans), moved - died)
    )
    _check_order(log, frames, swaps_from=died)
    after = [e for entries in log.values() for e in entries if e[0] > died]
    assert after and all(e[2] == workers[0].name for e in after)


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("close", ["at once", "one by one"])
def test_lost_connections_move_no_socket_while_a_worker_handles_its_frame(node, queue_type, close):
    """The broker closes every connection twice while two workers handle a
    steady stream of frames: each socket's frames still run in order, one at
    a time, none lost, and a socket whose frame a worker was handling at the
    close stays with that worker (``consumers.owners``); with quorum queues
    a frame may come one place late after a close (docs/topology.rst).
    Closed one by one (``rabbitmqctl close_all_connections``, as in a
    restart), no process is handed a shard between two closes: no consumer
    waits behind another (``consumers.balance``)."""
    sender = make_layer(node, queue_type=queue_type, receive_timeout=0.2)
    log = collections.defaultdict(list)
    workers = _two_workers(node, sender, queue_type, log, work=0.005)
    watch = {worker.name: _LossWatch(worker.layer) for worker in workers}
    sockets, frames = 20, 40
    try:
        sent = []

        def send_all():
            for order in range(frames):
                for socket in range(sockets):
                    sender.send(RECEIVE, frame("s%d" % socket, order))
                sent.append(order)
                time.sleep(0.05)  # the clients' pace: 20 frames every 50 ms

        thread = threading.Thread(target=send_all, daemon=True)
        thread.start()
        closed = []
        for after in (10, 25):
            wait_until(lambda n=after: len(sent) >= n, 30, message="%d rounds sent" % after)
            closed.append(time.monotonic())
            if close == "at once":
                node.drop_all_connections()
            else:
                node.close_all_connections()
        thread.join(60)
        wait_until(
            lambda: sum(map(len, log.values())) >= sockets * frames, 60, message="every frame"
        )
    finally:
        for worker in workers:
            watch[worker.name].stop()
            worker.stop()
        sender.close()
    # A quorum queue may return a lost consumer's frames behind the next one.
    swaps_from = closed[0] if queue_type == "quorum" else None
    copies = _check_order(log, frames, copies_allowed=True, swaps_from=swaps_from)
    # A frame its worker was handling when it saw the close (taken before,
    # done after) may have replies waiting for the new connection: the
    # socket's next frame must run in the same worker. rabbitmqctl closes the
    # connections one by one, seconds after it is called on a loaded
    # machine, so each worker's own loss is the time (``_LossWatch``); a
    # socket whose last frame was done before may move, as when one
    # process's connection goes alone (docs/topology.rst).
    moved = [
        (socket, n)
        for n in range(len(closed))
        for socket, entries in log.items()
        if _moved_while_handled(entries, {name: w.losses[n] for name, w in watch.items()})
    ]
    print(
        "\n%s: %d of %d frames came twice; sockets moved by a close: %s"
        % (queue_type, copies, sockets * frames, moved)
    )
    assert not moved


@pytest.mark.slow
@pytest.mark.faults
def test_a_worker_that_reconnects_late_keeps_its_sockets(node):
    """Every connection closes; one worker reconnects about 1.5 s after the
    other (its URL list first tries a server that never answers). The other
    does not take the late one's sockets: a frame the late one counted done
    may still have replies waiting for its new connection
    (``consumers.owners.SHARD_OWNER_WAIT``)."""
    silent = net.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections and never says a word
    silent_url = (
        "amqp://guest:guest@127.0.0.1:%d/%%2F?stack_timeout=1.5" % (silent.getsockname()[1])
    )
    sender = make_layer(node, receive_timeout=0.2)
    prefix = sender.topology.prefix
    log = collections.defaultdict(list)
    late = Worker([node.amqp_url, silent_url], prefix, "classic", "late", log)
    shards = [q for c in CHANNELS for q in sender.topology.shard_queues(c)]
    wait_until(lambda: all(consumers_on(node, q) for q in shards), 30, message="late consuming")
    other = Worker(node, prefix, "classic", "other", log)
    clients = Clients(sender, 20)
    watch = {worker.name: _LossWatch(worker.layer) for worker in (late, other)}
    try:
        _drop_between(node, clients, 30, 50)
    finally:
        frames = clients.stop()
        wait_until(lambda: sum(map(len, log.values())) >= 20 * frames, 60, message="every frame")
        for each in watch.values():
            each.stop()
        late.stop()
        other.stop()
        sender.close()
        silent.close()
    _check_order(log, frames, copies_allowed=True)
    # rabbitmqctl closes the connections one by one, seconds after it is
    # called on a loaded machine: the times are when each worker saw its loss.
    lost, back = watch["late"].lost_at, watch["late"].back_at
    served = [s for s, entries in log.items() if _worker_at(entries, lost) == "late"]
    # Taken by the other after its own loss and before the late one was back.
    # (Before its loss, the broker may hand it a shard whose consumer went a
    # moment earlier: "When one process's connection goes alone" in the
    # docs. After the late one is back, Balance may move a quiet shard.)
    moved = [
        s
        for s in served
        if any(e[2] == "other" and watch["other"].lost_at <= e[0] < back for e in log[s])
    ]
    print(
        "\nthe late worker served %d sockets and was back %.2f s after its loss, "
        "%.2f s after the other's; sockets the other took meanwhile: %s"
        % (len(served), back - lost, back - watch["other"].back_at, moved)
    )
    assert served and not moved


class _ConsumerCounts(object):
    """Each shard's consumer count, asked of the broker every few
    milliseconds on a connection of its own until ``stop``: a classic
    queue's ``queue.declare-ok`` counts a waiting single active consumer
    too. ``doubled``: the shards counted with two consumers or more in two
    looks in a row."""

    def __init__(self, node, shards):
        self.doubled = collections.Counter()
        self.looks = 0
        self._parameters = pika.URLParameters(node.amqp_url)
        self._shards = shards
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consumer-counts", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:  # dropped with every other connection: connected again
                connection = pika.BlockingConnection(self._parameters)
            except pika.exceptions.AMQPConnectionError:
                continue
            try:
                self._look(connection.channel())
            except pika.exceptions.AMQPError:
                pass
            finally:
                if connection.is_open:
                    connection.close()

    def _look(self, channel):
        before = set()
        while not self._stop.wait(0.01):  # a poll of the broker's own count
            now = set()
            for shard in self._shards:
                if channel.queue_declare(shard, passive=True).method.consumer_count > 1:
                    now.add(shard)
            self.doubled.update(now & before)
            before = now
            self.looks += 1

    def stop(self):
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
@pytest.mark.faults
def test_no_consumer_ever_waits_behind_another_on_a_shard(node):
    """A process consumes a shard only when nobody does (``consumers.balance``):
    a worker that joins waits for the shards the other gives back, and after
    every connection drops the shards are taken anew. On RabbitMQ 3.10 a
    classic single-active-consumer queue whose active consumer goes while
    another waits and messages are ready stops delivering, and crashes at
    the next publish, losing every frame it held (rabbitmq-server#5460)."""
    sender = make_layer(node, receive_timeout=0.2)
    log = collections.defaultdict(list)
    workers = _two_workers(node, sender, "classic", log, work=0.005)
    shards = [q for c in CHANNELS for q in sender.topology.shard_queues(c)]
    counts = _ConsumerCounts(node, shards)
    clients = Clients(sender, 20)
    try:
        _drop_between(node, clients, 20, 40)
    finally:
        frames = clients.stop()
        counts.stop()
        wait_until(lambda: sum(map(len, log.values())) >= 20 * frames, 60, message="every frame")
        for worker in workers:
            worker.stop()
        sender.close()
    print(
        "\n%d looks at %d shards; counted with two consumers twice in a row: %s"
        % (counts.looks, len(shards), dict(counts.doubled))
    )
    assert counts.looks > 50
    assert not counts.doubled
    _check_order(log, frames, copies_allowed=True)


class _LossWatch(object):
    """When a layer saw each connection loss, and when it was connected again
    (``losses`` and ``backs``, monotonic times), until ``stop``."""

    def __init__(self, layer):
        self.losses, self.backs = [], []
        self._layer = layer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loss-watch", daemon=True)
        self._thread.start()

    @property
    def lost_at(self):
        return self.losses[0] if self.losses else float("inf")

    @property
    def back_at(self):
        return self.backs[0] if self.backs else float("inf")

    def _run(self):
        seen = self._layer.connection_statistics()["connection_losses"]
        while not self._stop.wait(0.005):  # a poll of the layer's own figures
            figures = self._layer.connection_statistics()
            now = time.monotonic()
            if figures["connection_losses"] > seen:
                self.losses += [now] * (figures["connection_losses"] - seen)
                seen = figures["connection_losses"]
            elif len(self.backs) < len(self.losses) and figures["connected"]:
                self.backs.append(now)

    def stop(self):
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
@pytest.mark.faults
def test_a_connection_lost_to_its_own_channel_crash_waits_for_no_shard_owner(node):
    """Every channel on the node crashes, so the broker closes every
    connection with 541 INTERNAL_ERROR: what a consume racing another
    process's declare of a new quorum queue does on 3.10, at start-up. Such
    a loss is each process's own, and no process holds a frame whose
    replies wait for it: the worker consumes every shard at once, and no
    socket waits ``SHARD_OWNER_WAIT`` for an owner (measured before: every
    shard the worker had not served waited, and the clients of the chat
    stack heard nothing for 2.7 s)."""
    from asgi_amqp.engine.consumers.owners import SHARD_OWNER_WAIT

    sender = make_layer(node, receive_timeout=0.2)
    log = collections.defaultdict(list)
    worker = Worker(node, sender.topology.prefix, "classic", "worker", log)
    shards = [q for c in CHANNELS for q in sender.topology.shard_queues(c)]
    try:
        wait_until(lambda: all(consumers_on(node, q) for q in shards), 30, message="consuming")
        sender.send(RECEIVE, frame("first", 0))  # one shard served
        wait_until(lambda: log[frame("first", 0)["reply_channel"]], 30, message="a first frame")
        crashed = time.monotonic()
        node.crash_channels()
        wait_until(
            lambda: worker.layer.connection_statistics()["connection_losses"] >= 1,
            30,
            message="the worker's connection closed",
        )
        for socket in range(ORDERED_SHARDS):  # new sockets, on most shards
            sender.send(RECEIVE, frame("new%d" % socket, 0))
        wait_until(lambda: len(log) == ORDERED_SHARDS + 1, 30, message="every socket's frame")
    finally:
        worker.stop()
        sender.close()
    last = max(entries[-1][0] for entries in log.values()) - crashed
    print("\nthe last socket's frame was taken %.2f s after the crash" % last)
    assert last < SHARD_OWNER_WAIT, last


def _moved_while_handled(entries, lost_at):
    """Whether a frame was in hand when its worker saw the close (``lost_at``:
    worker -> when), and the socket's next frame went to another worker."""
    entries = sorted(entries)
    for n, (taken, done, worker, order) in enumerate(entries):
        if taken < lost_at[worker] <= done:
            later = [e for e in entries[n + 1 :] if e[3] > order]
            return bool(later) and later[0][2] != worker
    return False


def _worker_at(entries, when, after=False):
    """The worker that took a socket's last frame before ``when``, or its first after."""
    taken = [entry for entry in sorted(entries) if (entry[0] > when) == after]
    return taken[0 if after else -1][2] if taken else None


def test_statistics_top_and_flush_take_the_shards_for_the_channel(broker, new_layer):
    from asgi_amqp.tools.snapshot import Collector

    layer = new_layer(broker, flush=True)
    for socket in range(3):
        layer.send(RECEIVE, frame("s%d" % socket, 0))  # three shards, most likely
    layer.send(RECEIVE, {"text": "plain"})
    # The management API samples queues every few seconds.
    wait_until(
        lambda: layer.channel_statistics(RECEIVE)["messages_pending"] == 4,
        30,
        interval=0.25,
        message="the channel's statistics counting its shards",
    )
    assert layer.global_statistics()["messages_pending"] == 4
    collect = Collector(layer.management_client(), layer.topology)
    views = [view for view in collect().channels if view.name == RECEIVE]
    assert len(views) == 1 and views[0].depth == 4, views
    layer.flush()
    head = layer.topology.channel_queue(RECEIVE)
    left = [q["name"] for q in layer.management_client().queues(head)]
    assert left == [], left
