"""Issue 42: after any stop, ``send --from`` says which lines the broker has.

Every line read is sent, refused, in doubt or not sent; every line not sent
is in the rejects file, and ``send --from FILE.rejects`` resumes without
sending anything the broker confirmed. Before, a broker stall counted lines
in doubt as failed (the broker had them) and the printed ``--skip`` sent
them twice; ``--on-full fail`` went on sending the lines after the full
one; JSON nested 1,000 deep crashed the command with a RecursionError.
"""

import codecs
import collections
import gc
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pika
import pytest

from asgi_amqp.serialization import Serializer
from helpers import Management, bulk_summary, drain, free_port, run_cli, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, records):
    with open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


def _rejects(path):
    """{line number: kind} of a rejects file."""
    with open(path) as handle:
        records = [json.loads(line) for line in handle]
    kinds = {record["line"]: record["kind"] for record in records}
    assert len(kinds) == len(records), "a line in the rejects file twice"
    return kinds


def _depth(url, queues):
    """Messages ready in ``queues``, by passive declares (exact, unlike the API's samples)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    total = 0
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                total += channel.queue_declare(queue, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:  # not declared yet
                channel = connection.channel()
        return total
    finally:
        connection.close()


# -- case 1: a broker stall -------------------------------------------------------------------

STALL_LINES = 40000
STALL_CHANNELS = 20


def _command(node, prefix, *args):
    env = dict(os.environ, AMQP_URL=node.amqp_url, AMQP_MANAGEMENT_URL=node.management_url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "asgi_amqp", "--prefix", prefix, "--capacity", "1000000"]
    # Messages outlive the test's reads (90,000 of them); no call waits long.
    command += ["--expiry", "900", "--operation-timeout", "3"] + list(args)
    return command, env


def _no_connections(node):
    return node.ctl("-q", "list_connections", "name").strip() == ""


def _take_all(url, queues):
    """How many copies of each line ("n") the queues hold; takes them all.

    Each queue's depth (a passive declare) says how many to take, and each
    take waits 10 s at most."""
    serializer = Serializer(2**20, None)
    copies = collections.Counter()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        for queue in queues:
            left = channel.queue_declare(queue, passive=True).method.message_count
            for _method, _properties, body in channel.consume(
                queue, auto_ack=True, inactivity_timeout=10
            ):
                assert body is not None, "%d messages of %s did not come" % (left, queue)
                copies[serializer.loads(body)["n"]] += 1
                left -= 1
                if not left:
                    break
            channel.cancel()
    finally:
        connection.close()
    return copies


def _delete(url, queues):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.faults
def test_a_stalled_broker_leaves_lines_in_doubt_and_the_resume_sends_the_rest_once(node, tmp_path):
    prefix = "stall-%s" % os.urandom(4).hex()
    source = tmp_path / "huge.jsonl"
    channels = ["cron.c%d" % (n % STALL_CHANNELS) for n in range(STALL_CHANNELS)]
    _write(
        source,
        (
            {"channel": channels[n % STALL_CHANNELS], "message": {"n": n}}
            for n in range(STALL_LINES)
        ),
    )
    queues = ["%s:q:%s" % (prefix, channel) for channel in channels]
    command, env = _command(node, prefix, "send", "--from", str(source))
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    frozen = False
    try:
        # Freeze the node mid-run, once its queues hold some of the lines.
        wait_until(
            lambda: process.poll() is not None or _depth(node.amqp_url, queues) >= 3000,
            timeout=60,
            interval=0.02,
            message="3,000 lines in the broker",
        )
        assert process.poll() is None, "the run ended before the stall: %s" % process.stderr
        os.kill(node.pid, signal.SIGSTOP)
        frozen = True
        _, stderr = process.communicate(timeout=90)
    finally:
        if frozen:
            os.kill(node.pid, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
            process.wait(10)
    try:
        assert process.returncode == 2, stderr  # it gave up: the broker did not answer
        sent, refused, in_doubt, not_sent = bulk_summary(stderr)
        assert in_doubt > 0 and refused == 0 and sent + in_doubt >= 3000, stderr
        kinds = _rejects(str(source) + ".rejects")
        assert collections.Counter(kinds.values()) == {"in doubt": in_doubt, "not sent": not_sent}
        # Once the broker closed the command's connection it has read all it will.
        wait_until(lambda: _no_connections(node), timeout=60, interval=0.5, message="closed")
        held = _depth(node.amqp_url, queues)
        copies = _take_all(node.amqp_url, queues)
        assert sum(copies.values()) == held
        doubtful = {number - 1 for number, kind in kinds.items() if kind == "in doubt"}
        arrived = sum(1 for n in doubtful if copies[n])
        print(
            "\nstall: %s; the broker held %d (%d in doubt arrived)"
            % (stderr.strip().splitlines()[-3], held, arrived)
        )
        assert held == sent + arrived
        for n in range(STALL_LINES):
            if n + 1 not in kinds:  # sent: exactly once
                assert copies[n] == 1, n
            elif n in doubtful:
                assert copies[n] <= 1, n
            else:
                assert copies[n] == 0, n

        # The resume sends every line not in doubt that is not in the broker.
        command, env = _command(node, prefix, "send", "--from", str(source) + ".rejects")
        resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 1, resumed.stderr  # the lines in doubt are still not sent
        assert bulk_summary(resumed.stderr) == (not_sent, 0, in_doubt, 0)
        assert "--resend-in-doubt" in resumed.stderr
        assert set(_rejects(str(source) + ".rejects").values()) == {"in doubt"}
        copies.update(_take_all(node.amqp_url, queues))
        for n in range(STALL_LINES):
            assert copies[n] == 1 or (n in doubtful and copies[n] == 0), n

        # --resend-in-doubt sends the rest: a second copy of each that had arrived.
        command, env = _command(
            node, prefix, "send", "--resend-in-doubt", "--json", "--from", str(source) + ".rejects"
        )
        resent = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert resent.returncode == 0, resent.stderr
        summary = json.loads(resent.stdout)
        assert (summary["lines"], summary["sent"], summary["in_doubt"]) == (in_doubt,) * 2 + (0,)
        assert summary["rejects"] is None and os.path.getsize(str(source) + ".rejects") == 0
        again = _take_all(node.amqp_url, queues)
        assert set(again) == doubtful and set(again.values()) == {1}
        copies.update(again)
        assert sum(1 for n in doubtful if copies[n] == 2) == arrived
    finally:
        _delete(node.amqp_url, queues)


# -- case 2: --on-full fail stops ----------------------------------------------------------


def test_on_full_fail_writes_nothing_after_the_refusal_and_the_resume_is_exact(
    broker, cli_env, tmp_path, new_layer
):
    source = tmp_path / "fa.jsonl"
    records = [{"channel": "fa.a", "message": {"n": n}} for n in range(150)]
    records += [{"channel": "fa.b", "message": {"n": n}} for n in range(150, 5150)]
    _write(source, records)
    options = ["--capacity", "100", "--channel-capacity", "fa.b=10000"]
    layer = new_layer(
        broker, flush=True, prefix=cli_env["ASGI_AMQP_PREFIX"], channel_capacity={"fa.b": 10000}
    )
    result = run_cli(options + ["send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 1, result.stderr
    sent, refused, in_doubt, not_sent = bulk_summary(result.stderr)
    assert "stopped at line 101: channel fa.a is full (--on-full=fail)" in result.stderr
    assert in_doubt == 0 and refused >= 50
    first = collections.Counter(m["n"] for _, m in drain(layer, ["fa.a", "fa.b"]))
    # Nothing went after the refusal was seen: at most a window's worth was in flight.
    assert sum(first.values()) == sent and sum(1 for n in first if n >= 150) < 5000
    kinds = _rejects(str(source) + ".rejects")
    assert len(kinds) == refused + not_sent
    assert set(kinds) | {n + 1 for n in first} == set(range(1, 5151))
    assert not set(kinds) & {n + 1 for n in first}
    assert all(kinds[line] == "refused" for line in range(101, 151))

    # fa.a was drained: the resume has room, and sends each line not sent once.
    again = run_cli(options + ["send", "--json", "--from", str(source) + ".rejects"], env=cli_env)
    assert again.exit_code == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["exit_status"] == 0 and summary["lines"] == summary["sent"] == len(kinds)
    assert summary["refused"] == summary["in_doubt"] == summary["not_sent"] == 0
    assert os.path.getsize(str(source) + ".rejects") == 0
    first.update(m["n"] for _, m in drain(layer, ["fa.a", "fa.b"]))
    assert first == collections.Counter(range(5150))


# -- case 3: deep nesting ------------------------------------------------------------------

# Past every Python's JSON parser: 3.13's follows 5,000 levels, where 3.11's
# stopped before 1,000. 50,000 keeps the single send's argument under 128 KiB.
DEEP = '{"channel": "deep.a", "message": {"d": %s%s}}' % ("[" * 50000, "]" * 50000)


def test_json_nested_past_the_parsers_depth_is_an_error_of_its_line(cli_env, cli_layer, tmp_path):
    good = json.dumps({"channel": "deep.a", "message": {"n": 1}})
    result = run_cli(["send", "--from", "-"], env=cli_env, input=DEEP + "\n" + good + "\n")
    assert result.exit_code == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^line 1: invalid JSON: nested too deeply", result.stderr, re.M)
    assert bulk_summary(result.stderr) == (1, 0, 0, 1)
    assert drain(cli_layer, ["deep.a"]) == [("deep.a", {"n": 1})]

    source = tmp_path / "deep.jsonl"
    source.write_text(good + "\n" + DEEP + "\n")
    result = run_cli(["send", "--from", str(source)], env=cli_env)
    assert re.search(r"^line 2: invalid JSON: nested too deeply", result.stderr, re.M)
    assert bulk_summary(result.stderr) == (1, 0, 0, 1)
    assert _rejects(str(source) + ".rejects") == {2: "not sent"}

    message = DEEP[DEEP.index('{"d"') : -1]
    result = run_cli(["send", "deep.a", message], env=cli_env)
    assert result.exit_code == 2
    assert "MESSAGE_JSON" in result.stderr and "nested too deeply" in result.stderr


# -- for cron jobs: a dry run, and a byte-order mark -------------------------------------


def test_a_dry_run_checks_every_line_and_sends_nothing(broker, cli_env, cli_prefix, tmp_path):
    source = tmp_path / "check.jsonl"
    lines = [
        json.dumps({"channel": "dry.a", "message": {"n": 1}}),
        "{bad",
        json.dumps({"channel": "dry.a", "message": {"text": "x" * 200}}),
        json.dumps({"channel": "bad name", "message": {}}),
    ]
    source.write_bytes(codecs.BOM_UTF8 + "\n".join(lines).encode() + b"\n")
    options = ["--max-message-size", "100", "send", "--dry-run", "--from", str(source)]
    result = run_cli(options, env=cli_env)
    assert result.exit_code == 1, result.stderr
    assert [line.split(":")[0] for line in result.stderr.splitlines()[:3]] == [
        "line 2",
        "line 3",
        "line 4",
    ]
    assert "dry run: 4 lines, 1 valid, 3 bad; nothing was sent" in result.stderr
    assert Management(broker).queue("%s:q:dry.a" % cli_prefix) is None
    assert not os.path.exists(str(source) + ".rejects")


def test_a_byte_order_mark_is_not_part_of_line_one(cli_env, cli_layer, tmp_path):
    source = tmp_path / "bom.jsonl"
    lines = [json.dumps({"channel": "bom.a", "message": {"n": n}}) for n in (1, 2)]
    source.write_bytes(codecs.BOM_UTF8 + "\n".join(lines).encode() + b"\n")
    result = run_cli(["send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert drain(cli_layer, ["bom.a"]) == [("bom.a", {"n": 1}), ("bom.a", {"n": 2})]


def test_a_bulk_send_gives_the_collector_its_thresholds_back(
    cli_env, cli_layer, tmp_path, monkeypatch
):
    """``send --from`` collects young objects less often while it sends, then restores
    the process's thresholds, also after a line that fails."""
    from asgi_amqp.tools import bulk

    during = []
    submit = bulk.BulkSender.submit

    def recording(self, *args, **kwargs):
        during.append(gc.get_threshold())
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(bulk.BulkSender, "submit", recording)
    source = tmp_path / "gc.jsonl"
    source.write_text(json.dumps({"channel": "gc.a", "message": {"n": 1}}) + "\n{bad\n")
    before = gc.get_threshold()
    result = run_cli(["send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 1, result.stderr
    assert during and during[0][0] > before[0]
    assert gc.get_threshold() == before
    assert drain(cli_layer, ["gc.a"]) == [("gc.a", {"n": 1})]


def test_json_summary_when_the_broker_cannot_be_reached(tmp_path, monkeypatch):
    """A cron job reading --json gets its object when nothing could be sent too."""
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "lines.jsonl"
    _write(source, ({"channel": "un.a", "message": {"n": n}} for n in range(5)))
    env = {
        "AMQP_URL": "amqp://guest:pw@127.0.0.1:%d/%%2F" % free_port(),
        "AMQP_MANAGEMENT_URL": "http://127.0.0.1:%d/" % free_port(),
    }
    result = run_cli(["send", "--json", "--from", str(source)], env=env)
    assert result.exit_code == 2, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["lines"], summary["sent"], summary["not_sent"]) == (5, 0, 5)
    assert summary["rejects"] is None and "cannot reach the broker" in summary["error"]
    assert summary["exit_status"] == 2 and "pw" not in result.stdout + result.stderr
    assert not os.path.exists(str(source) + ".rejects")  # the input itself is the resume


class ConfirmDroppingProxy(object):
    """Forwards TCP to ``target``; once a client sent a basic.publish frame,
    what the broker sends back on that connection is dropped: the broker
    takes the message, and its confirm never comes."""

    PUBLISH = b"\x00\x3c\x00\x28"  # method frame payload: class 60 (basic), method 40

    def __init__(self, target):
        self._target = target
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]
        self._pairs = []  # [client, upstream, frozen]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def frozen(self):
        return any(pair[2] for pair in self._pairs)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        for client, upstream, _ in self._pairs:
            client.close()
            upstream.close()
        self._listener.close()

    def _run(self):
        while not self._stop.is_set():
            live = list(self._pairs)
            sockets = [self._listener] + [s for pair in live for s in pair[:2]]
            readable, _, _ = select.select(sockets, [], [], 0.05)
            for sock in readable:
                if sock is self._listener:
                    client, _ = self._listener.accept()
                    self._pairs.append([client, socket.create_connection(self._target), False])
                    continue
                pair = next(p for p in live if sock in p[:2])
                other = pair[1] if sock is pair[0] else pair[0]
                data = sock.recv(65536)
                if not data:
                    self._pairs.remove(pair)
                    pair[0].close()
                    pair[1].close()
                    continue
                if sock is pair[0]:
                    other.sendall(data)
                    pair[2] = pair[2] or self.PUBLISH in data
                elif not pair[2]:
                    other.sendall(data)


def test_a_single_send_without_its_confirm_is_in_doubt(broker, cli_env, cli_layer):
    target = urlsplit(broker.amqp_url)
    proxy = ConfirmDroppingProxy((target.hostname, target.port))
    try:
        url = "amqp://%s@127.0.0.1:%d%s" % (
            target.netloc.rpartition("@")[0],
            proxy.port,
            target.path,
        )
        env = dict(cli_env, AMQP_URL=url)
        result = run_cli(["--operation-timeout", "2", "send", "doubt.a", '{"n": 1}'], env=env)
        assert proxy.frozen
    finally:
        proxy.close()
    assert result.exit_code == 1, result.stderr
    assert "channel doubt.a: in doubt: it was written to the broker" in result.stderr
    assert "guest@" not in result.stderr
    # Here the broker did take it: "in doubt" was the honest answer.
    assert drain(cli_layer, ["doubt.a"]) == [("doubt.a", {"n": 1})]
