"""``peek`` shows messages and leaves them in order; ``requeue`` moves them,
taking each off its channel only once the broker confirmed its copy."""

import json

from helpers import Management, drain, run_cli


def _numbers(result):
    return [json.loads(line)["message"]["n"] for line in result.stdout.splitlines()]


def _sent(cli_layer, channel, numbers):
    for n in numbers:
        cli_layer.send(channel, {"n": n})


def test_peek_shows_the_next_messages_and_leaves_them_in_order(cli_env, cli_layer):
    _sent(cli_layer, "pk.a", range(5))
    result = run_cli(["peek", "pk.a", "-n", "3"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert _numbers(result) == [0, 1, 2]
    assert run_cli(["peek", "pk.a", "-n", "10"], env=cli_env).stdout.count("\n") == 5
    assert drain(cli_layer, ["pk.a"]) == [("pk.a", {"n": n}) for n in range(5)]


def test_peek_at_a_channel_without_a_queue_creates_none(cli_env, broker, cli_prefix):
    result = run_cli(["peek", "pk.none"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "note: channel pk.none has no queue" in result.stderr  # as stats says it
    assert Management(broker).queue("%s:q:pk.none" % cli_prefix) is None


def test_purge_empties_the_named_channels_only(cli_env, cli_layer):
    _sent(cli_layer, "pg.a", range(3))
    _sent(cli_layer, "pg.b", range(2))
    _sent(cli_layer, "pg.keep", range(4))
    refused = run_cli(["purge", "pg.a"], env=cli_env, input="n\n")
    assert refused.exit_code == 1 and "nothing was purged" in refused.stderr
    result = run_cli(["purge", "pg.a", "pg.b", "pg.none", "--yes"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert "purged 3 message(s) from pg.a" in result.stderr
    assert "purged 2 message(s) from pg.b" in result.stderr
    assert "note: channel pg.none has no queue" in result.stderr
    assert drain(cli_layer, ["pg.a", "pg.b"]) == []
    assert drain(cli_layer, ["pg.keep"]) == [("pg.keep", {"n": n}) for n in range(4)]


def test_requeue_moves_the_oldest_first(cli_env, cli_layer):
    _sent(cli_layer, "rq.dead", range(5))
    result = run_cli(["requeue", "rq.dead", "rq.live", "-n", "3"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert "moved 3 message(s) from rq.dead to rq.live" in result.stderr
    assert drain(cli_layer, ["rq.live"]) == [("rq.live", {"n": n}) for n in range(3)]
    assert drain(cli_layer, ["rq.dead"]) == [("rq.dead", {"n": n}) for n in (3, 4)]


def test_requeue_into_a_process_local_channel(cli_env, cli_layer):
    _sent(cli_layer, "rq.src", [1, 2])
    result = run_cli(["requeue", "rq.src", "worker!abc"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert drain(cli_layer, ["worker!"]) == [("worker!abc", {"n": 1}), ("worker!abc", {"n": 2})]


def test_requeue_stops_at_a_full_destination_and_keeps_the_rest(
    cli_env, broker, cli_prefix, new_layer
):
    app = new_layer(broker, flush=True, prefix=cli_prefix, capacity=2)
    app.send("rq.full", {"n": 100})  # its queue exists with capacity 2: one place left
    sources = new_layer(broker, prefix=cli_prefix, capacity=10)
    _sent(sources, "rq.from", range(4))

    result = run_cli(["requeue", "rq.from", "rq.full"], env=cli_env)
    assert result.exit_code == 1
    assert "channel rq.full is full; moved 1" in result.stderr
    assert drain(app, ["rq.full"]) == [("rq.full", {"n": 100}), ("rq.full", {"n": 0})]
    assert drain(sources, ["rq.from"]) == [("rq.from", {"n": n}) for n in (1, 2, 3)]


def test_requeue_moves_bodies_it_cannot_decrypt(cli_env, broker, cli_prefix, new_layer):
    app = new_layer(broker, flush=True, prefix=cli_prefix, symmetric_encryption_keys=["k"])
    _sent(app, "rq.enc", [7])
    result = run_cli(["requeue", "rq.enc", "rq.enc2"], env=cli_env)  # no key given
    assert result.exit_code == 0, result.stderr
    assert drain(app, ["rq.enc2"]) == [("rq.enc2", {"n": 7})]


def _frame(socket, order):
    return {"reply_channel": "daphne.response.%s!c" % socket, "order": order, "n": order}


def test_peek_requeue_and_purge_take_an_ordered_channels_shards_for_it(cli_env, cli_layer):
    """websocket.receive's frames live in shards (docs/topology.rst): peek
    shows them after the channel's own queue, requeue into it puts each
    frame in its socket's shard, and purge empties them all."""
    cli_layer.send("websocket.receive", {"n": 100})  # no order: the channel's own queue
    for order in range(3):
        cli_layer.send("websocket.receive", _frame("a", order))
    result = run_cli(["peek", "websocket.receive", "-n", "10"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert _numbers(result) == [100, 0, 1, 2]
    # Frames moved into the ordered channel reach their socket's shard, in order.
    for order in range(3, 6):
        cli_layer.send("ws.parked", _frame("a", order))
    assert run_cli(["requeue", "ws.parked", "websocket.receive"], env=cli_env).exit_code == 0
    got = drain(cli_layer, ["websocket.receive"])
    assert sorted(m["n"] for _, m in got) == [0, 1, 2, 3, 4, 5, 100]
    assert [m["n"] for _, m in got if "order" in m] == [0, 1, 2, 3, 4, 5]
    # A channel no layer here consumed: nothing is held back from the purge.
    for order in range(2):
        cli_layer.send("websocket.disconnect", _frame("b", order))
    cli_layer.send("websocket.disconnect", {"n": 100})
    result = run_cli(["purge", "websocket.disconnect", "--yes"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert "purged 3 message(s)" in result.stderr
    assert cli_layer.receive(["websocket.disconnect"]) == (None, None)


def test_peek_says_a_quorum_queues_shard_cannot_be_read(cli_env, broker, cli_prefix, new_layer):
    layer = new_layer(broker, flush=True, prefix=cli_prefix, queue_type="quorum")
    layer.send("websocket.receive", _frame("q", 0))
    result = run_cli(["peek", "websocket.receive", "--queue-type", "quorum"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and "refuses basic.get" in result.stderr
    assert layer.receive(["websocket.receive"])[1]["n"] == 0  # still there
