"""The layer's own behaviour beyond the conformance suite: threads, lifecycle, fork, receive."""

import os
import threading
import time

import pytest

from asgi_amqp import AMQPChannelLayer, LayerClosed
from helpers import Management, consumers_on, drain, free_port, make_layer, wait_until


@pytest.fixture
def layer(broker, new_layer):
    return new_layer(broker, flush=True, expiry=30, capacity=10000, receive_timeout=1)


def test_lazy_connect_starts_nothing_until_first_use(broker):
    before = set(threading.enumerate())
    layer = make_layer(broker)
    assert layer.threads() == []
    assert set(threading.enumerate()) == before
    layer.send("lazy", {"a": 1})
    assert len(layer.threads()) == 2
    layer.flush()
    layer.close()


def test_close_stops_every_thread(broker):
    before = set(threading.enumerate())
    layer = make_layer(broker)
    layer.send("c", {"a": 1})
    layer.receive(["c"], block=True)
    threads = layer.threads()
    assert threads and all(t.is_alive() for t in threads)
    layer.flush()
    layer.close()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive(), thread.name
    assert set(threading.enumerate()) <= before
    with pytest.raises(LayerClosed):
        layer.send("c", {"a": 1})


def test_first_calls_racing_from_many_threads_start_one_pair_of_threads(broker):
    """Sixteen threads make a fresh layer's first call at once: one I/O thread
    and one dead-letter worker start, and close() stops every thread started.
    (Each first caller once made a start lock of its own, and every racer
    started a pair, of which close() stopped only the last.)"""
    for _ in range(3):
        before = set(threading.enumerate())
        layer = make_layer(broker)
        gate = threading.Barrier(16)
        errors = []

        def first_call(layer, gate, errors):
            try:
                gate.wait(10)
                layer.send("race", {"a": 1})
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        callers = [
            threading.Thread(target=first_call, args=(layer, gate, errors)) for _ in range(16)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(30)
        started = {t for t in threading.enumerate() if t.name.startswith("asgi_amqp-")} - before
        assert not errors, errors
        assert sorted(t.name for t in started) == ["asgi_amqp-deadletters", "asgi_amqp-io"]
        layer.flush()
        layer.close()
        for thread in started:
            thread.join(10)
            assert not thread.is_alive(), thread.name


def test_sixteen_threads_share_one_layer(layer):
    per_thread = 50
    errors = []

    def sender(index):
        try:
            for n in range(per_thread):
                layer.send("shared", {"thread": index, "n": n})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    received = []
    lock = threading.Lock()

    def receiver():
        for _channel, message in iter(lambda: layer.receive(["shared"], block=True), (None, None)):
            with lock:
                received.append((message["thread"], message["n"]))

    readers = [threading.Thread(target=receiver) for _ in range(16)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(60)
    assert sorted(received) == [(t, n) for t in range(16) for n in range(per_thread)]


def test_blocking_receive_returns_none_after_receive_timeout(layer):
    started = time.monotonic()
    assert layer.receive(["nothing.here"], block=True) == (None, None)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 3, elapsed


def test_blocking_receive_wakes_up_when_a_message_arrives(broker, layer):
    result = {}

    def receive():
        started = time.monotonic()
        result["got"] = layer.receive(["wake.a", "wake.b"], block=True)
        result["at"] = time.monotonic() - started

    thread = threading.Thread(target=receive)
    thread.start()
    # The receive waits on the broker: its consumer is on wake.b's queue.
    queue = layer.topology.channel_queue("wake.b")
    wait_until(lambda: consumers_on(broker, queue), 5, message="the receive's consumer")
    layer.send("wake.b", {"v": 1})
    thread.join(5)
    assert result["got"] == ("wake.b", {"v": 1})
    assert result["at"] < 0.9  # well before the 1 s receive timeout


def test_blocking_receive_over_many_channels_in_a_loop(layer):
    channels = ["loop.%d" % i for i in range(12)]
    for i in range(60):
        layer.send(channels[i % 12], {"i": i})
    seen = []
    for _ in range(60):
        channel, message = layer.receive(channels, block=True)
        assert channel == "loop.%d" % (message["i"] % 12)
        seen.append(message["i"])
    assert sorted(seen) == list(range(60))
    assert layer.receive(channels, block=False) == (None, None)


def test_receive_shuffles_channels(layer):
    for i in range(20):
        layer.send("fair.a", {"i": i})
        layer.send("fair.b", {"i": i})
    firsts = [layer.receive(["fair.a", "fair.b"])[0] for _ in range(20)]
    assert set(firsts) == {"fair.a", "fair.b"}


def test_new_channel_names_are_unique_and_usable(layer):
    names = {layer.new_channel("http.response?") for _ in range(200)}
    assert len(names) == 200
    name = names.pop()
    layer.send(name, {"reply": 1})
    assert layer.receive([name]) == (name, {"reply": 1})


def test_process_local_channels_share_a_queue(layer):
    layer.send("daphne!a", {"n": 1})
    layer.send("daphne!b", {"n": 2})
    assert sorted(drain(layer, ["daphne!"])) == [("daphne!a", {"n": 1}), ("daphne!b", {"n": 2})]


def test_channel_capacity_patterns(broker, new_layer):
    layer = new_layer(broker, flush=True, capacity=100, channel_capacity={"tight.*": 2})
    layer.send("tight.one", {})
    layer.send("tight.one", {})
    with pytest.raises(layer.ChannelFull):
        layer.send("tight.one", {})
    for _ in range(5):
        layer.send("loose", {})


def test_extensions_and_version():
    import asgi_amqp

    assert {"groups", "flush", "send_many", "statistics"} <= set(AMQPChannelLayer.extensions)
    assert isinstance(asgi_amqp.__version__, str)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_message_ids_repeat_in_no_two_layers_and_no_forked_child():
    # A receiver drops a redelivery or a marked copy by its id (``HandedOff``):
    # two layers of one process, and a parent and its child, never share one.
    first = AMQPChannelLayer(url="amqp://127.0.0.1:1/", prefix="ids")
    second = AMQPChannelLayer(url="amqp://127.0.0.1:1/", prefix="ids")
    ids = [layer.sender.properties().message_id for layer in (first, second, first, second)]
    assert len(set(ids)) == 4, ids
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the id its first message gets
        try:
            os.write(write_end, first.sender.properties().message_id.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 200).decode()
    os.waitpid(pid, 0)
    parent = first.sender.properties().message_id
    assert child.split(".")[0] != parent.split(".")[0], (child, parent)
    assert first.threads() == second.threads() == []  # nothing reached a broker


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_layer_used_before_fork_works_in_the_child(layer):
    layer.send("before.fork", {"v": 1})
    assert layer.receive(["before.fork"]) == ("before.fork", {"v": 1})
    parent_threads = layer.threads()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: use the inherited layer object
        status = 1
        try:
            os.close(read_end)
            layer.send("from.child", {"pid": os.getpid()})
            got = layer.receive(["to.child"], block=True)
            ok = got == ("to.child", {"hello": "child"}) and len(layer.threads()) == 2
            os.write(write_end, b"ok" if ok else repr(got).encode())
            layer.close()
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    channel, message = layer.receive(["from.child"], block=True)
    assert channel == "from.child" and message["pid"] == pid
    layer.send("to.child", {"hello": "child"})
    answer = os.read(read_end, 200)
    _, status = os.waitpid(pid, 0)
    assert answer == b"ok", answer
    assert status == 0
    # The parent's own connection was never touched by the child.
    assert layer.threads() == parent_threads
    layer.send("after.fork", {"v": 2})
    assert layer.receive(["after.fork"]) == ("after.fork", {"v": 2})


def test_dead_threads_are_replaced_on_the_next_call(layer):
    layer.send("revive", {"n": 1})
    old_threads = layer.threads()
    # Stand-ins for a crash: both threads end without the layer being closed.
    layer._engine._io.stop()
    layer._engine._worker.stop()
    assert not any(t.is_alive() for t in old_threads)
    layer.send("revive", {"n": 2})
    new_threads = layer.threads()
    assert len(new_threads) == 2 and all(t.is_alive() for t in new_threads)
    assert not set(new_threads) & set(old_threads)
    assert sorted(m["n"] for _, m in drain(layer, ["revive"])) == [1, 2]


def test_quorum_queues(broker, new_layer):
    layer = new_layer(
        broker, flush=True, queue_type="quorum", capacity=3, expiry=30, receive_timeout=1
    )
    for i in range(3):
        layer.send("q.chan", {"i": i})
    with pytest.raises(layer.ChannelFull):  # exactly at capacity, as with classic queues
        layer.send("q.chan", {"i": 3})
    assert [m["i"] for _, m in drain(layer, ["q.chan"], block=True)] == [0, 1, 2]
    layer.group_add("qg", "q.member")
    layer.group_add("qg", "q.local!a")
    layer.send_group("qg", {"g": 1})
    assert layer.receive(["q.member"], block=True) == ("q.member", {"g": 1})
    assert layer.receive(["q.local!"], block=True) == ("q.local!a", {"g": 1})
    record = Management(broker).queue(layer.topology.channel_queue("q.chan"))
    assert record["type"] == "quorum"


def test_unknown_queue_type_is_refused(broker):
    with pytest.raises(ValueError):
        make_layer(broker, queue_type="mirrored")


def test_receive_accepts_a_set_of_channels(layer):
    # Channels 1.x's worker calls receive_many(set_of_routed_channels, block=True).
    layer.send("set.b", {"v": 1})
    assert layer.receive({"set.a", "set.b"}, block=True) == ("set.b", {"v": 1})
    assert layer.receive_many(("set.a", "set.b")) == (None, None)


def test_hosts_is_the_node_list_under_asgi_redis_name(broker):
    layer = AMQPChannelLayer(
        hosts=[broker.amqp_url],
        management_url=broker.management_url,
        prefix="t-hosts",
        dead_letter_worker=False,
    )
    try:
        layer.send("hosts.check", {"n": 1})
        assert layer.receive(["hosts.check"]) == ("hosts.check", {"n": 1})
    finally:
        layer.flush()
        layer.close()


@pytest.mark.parametrize(
    "hosts", [[("localhost", 5672)], [], ["redis://localhost:6379"]], ids=["pair", "empty", "redis"]
)
def test_hosts_that_are_not_amqp_urls_name_url(hosts):
    with pytest.raises(TypeError, match="'url'"):
        AMQPChannelLayer(hosts=hosts)


def test_url_and_hosts_together_are_refused(broker):
    with pytest.raises(TypeError, match="not both"):
        AMQPChannelLayer(url=broker.amqp_url, hosts=[broker.amqp_url])


def test_a_node_list_whose_first_node_is_down_uses_the_next(broker):
    down = "amqp://guest:guest@127.0.0.1:%d/%%2F" % free_port()
    layer = AMQPChannelLayer(
        url=[down, broker.amqp_url],
        management_url=broker.management_url,
        prefix="t-failover-%s" % os.getpid(),
        dead_letter_worker=False,
    )
    try:
        layer.send("failover.check", {"n": 1})
        assert layer.receive(["failover.check"]) == ("failover.check", {"n": 1})
    finally:
        layer.flush()
        layer.close()
