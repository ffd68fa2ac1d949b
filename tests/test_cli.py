"""The asgi-amqp command line, against the session broker.

Most tests run the click command in-process (click.testing.CliRunner); a few
run ``python -m asgi_amqp`` as a real subprocess for exit codes, stderr and
the absence of a progress bar when stderr is not a terminal.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner  # noqa: E402

from asgi_amqp import statistics  # noqa: E402
from asgi_amqp.tools import cli  # noqa: E402
from asgi_amqp.tools.cli.send import _progress  # noqa: E402
from asgi_amqp.tools.jsonbytes import dumps, loads  # noqa: E402
from helpers import at_moment, drain, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY_RE = re.compile(
    r"^sent (\d+), refused (\d+), in doubt (\d+), not sent (\d+), of (\d+) lines "
    r"in [\d.]+ s \(([\d.]+) msg/s\)$",
    re.M,
)


def _runner():
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.fixture
def prefix():
    return "cli-%s" % uuid.uuid4().hex[:10]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """The rejects file of a send from stdin goes to the current directory."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def env(broker):
    return {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": broker.management_url}


@pytest.fixture
def layer(broker, prefix, new_layer):
    """A layer on the test's prefix (to check what the command did), flushed afterwards."""
    return new_layer(broker, flush=True, prefix=prefix, capacity=1000, receive_timeout=1)


@pytest.fixture
def run(env, prefix):
    """run(*args, input=None, capacity=1000) -> click Result, on the test's prefix."""

    def run(*args, **kwargs):
        options = ["--prefix", prefix, "--capacity", str(kwargs.pop("capacity", 1000))]
        result = _runner().invoke(
            cli.cli, options + list(args), env=env, catch_exceptions=False, **kwargs
        )
        return result

    return run


def _jsonl(records):
    return "".join(json.dumps(r) + "\n" for r in records)


def _summary(result):
    """(sent, refused, in doubt, not sent), which add up to the lines read."""
    found = SUMMARY_RE.findall(result.stderr)
    assert len(found) == 1, result.stderr
    counts = tuple(int(x) for x in found[0][:4])
    assert sum(counts) == int(found[0][4]), result.stderr
    return counts


# -- JSON with bytes ----------------------------------------------------------------


def test_bytes_round_trip_through_json():
    message = {"b": b"\x00\xff", "nested": [{"x": b"abc"}], "s": "text"}
    line = dumps(message)
    assert json.loads(line)["b"] == {"__bytes__": "AP8="}
    assert loads(line) == message


@pytest.mark.parametrize("text", ['{"__bytes__": "%%%"}', '{"__bytes__": 3}'])
def test_invalid_bytes_representation_is_an_error(text):
    with pytest.raises(ValueError):
        loads(text)


# -- send and receive ------------------------------------------------------------------


def test_send_then_receive_prints_json_lines(run, layer):
    result = run("send", "cli.a", '{"text": "hi", "raw": {"__bytes__": "AAEC"}, "n": 3}')
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    result = run("send", "cli.a", '{"second": true}')
    assert result.exit_code == 0

    result = run("receive", "cli.a", "--count", "2", "--timeout", "5")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == [
        {"channel": "cli.a", "message": {"text": "hi", "raw": {"__bytes__": "AAEC"}, "n": 3}},
        {"channel": "cli.a", "message": {"second": True}},
    ]


def test_sent_bytes_arrive_as_bytes(run, layer):
    assert run("send", "cli.b", '{"raw": {"__bytes__": "AAEC"}}').exit_code == 0
    assert drain(layer, ["cli.b"], block=True)[:1] == [("cli.b", {"raw": b"\x00\x01\x02"})]


def test_receive_stops_at_count_and_leaves_the_rest(run, layer):
    for i in range(3):
        layer.send("cli.c", {"i": i})
    result = run("receive", "cli.c", "-n", "2")
    assert result.exit_code == 0
    assert [json.loads(x)["message"]["i"] for x in result.stdout.splitlines()] == [0, 1]
    assert drain(layer, ["cli.c"]) == [("cli.c", {"i": 2})]


def test_receive_fewer_than_count_exits_1(run):
    started = time.monotonic()
    result = run("receive", "cli.empty", "--count", "1", "--timeout", "0.5")
    assert result.exit_code == 1
    assert time.monotonic() - started < 5
    assert "received 0 of 1" in result.stderr


def test_receive_timeout_0_drains_what_is_waiting(run, layer):
    layer.send("cli.d", {"i": 1})
    layer.send("cli.e", {"i": 2})
    result = run("receive", "cli.d", "cli.e", "--timeout", "0")
    assert result.exit_code == 0
    got = sorted(
        (json.loads(x)["channel"], json.loads(x)["message"]["i"])
        for x in result.stdout.splitlines()
    )
    assert got == [("cli.d", 1), ("cli.e", 2)]


def test_receive_process_local_channel(run, layer):
    layer.send("cli.local!one", {"i": 1})
    result = run("receive", "cli.local!", "-n", "1")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"channel": "cli.local!one", "message": {"i": 1}}


def test_send_to_full_channel_exits_1(run, layer):
    for _ in range(2):
        assert run("send", "cli.f", "{}", capacity=2).exit_code == 0
    result = run("send", "cli.f", "{}", capacity=2)
    assert result.exit_code == 1
    assert result.stderr.strip() == "asgi-amqp: error: channel cli.f is full (capacity 2)"


def test_new_channel(run):
    result = run("new-channel", "cli.reply?")
    assert result.exit_code == 0
    assert re.match(r"^cli\.reply\?[A-Za-z0-9]{12}$", result.stdout.strip())
    result = run("new-channel", "no-question-mark")
    assert result.exit_code == 2
    assert "must end with '?'" in result.stderr


# -- invalid input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("send", "bad name", "{}"),
        ("send-group", "bad/group", "{}"),
        ("receive", "cli.x!y"),
        ("group-add", "g", "bad name"),
    ],
)
def test_invalid_names_are_one_line_and_exit_2(run, args):
    result = run(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asgi-amqp: error: "), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("payload", ["{not json", "[1, 2]", '{"x": 99999999999999999999999}'])
def test_invalid_message_json_is_a_usage_error(run, payload):
    result = run("send", "cli.a", payload)
    assert result.exit_code == 2
    assert "MESSAGE_JSON" in result.stderr


def test_send_needs_channel_and_message_or_from(run, tmp_path):
    assert run("send", "cli.a").exit_code == 2
    path = tmp_path / "x.jsonl"
    path.write_text("")
    assert run("send", "cli.a", "{}", "--from", str(path)).exit_code == 2


# -- bulk mode ------------------------------------------------------------------------------


def test_bulk_send_reports_bad_lines_and_goes_on(run, layer, tmp_path):
    layer.group_add("cli.room", "cli.member")
    lines = [json.dumps({"channel": "cli.bulk", "message": {"i": i}}) for i in range(10)]
    lines.insert(3, "{bad json")
    lines.insert(5, json.dumps({"channel": "bad name", "message": {}}))
    lines.insert(7, json.dumps({"channel": "cli.bulk", "message": [1]}))
    lines.insert(8, "")  # blank lines are skipped, not errors
    lines.append(json.dumps({"group": "cli.room", "message": {"g": 1}}))
    lines.append(json.dumps({"channel": "cli.bulk", "group": "cli.room", "message": {}}))
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(lines) + "\n")

    result = run("send", "--from", str(path))
    assert result.exit_code == 1
    assert _summary(result) == (11, 0, 0, 4)
    errors = [line for line in result.stderr.splitlines() if line.startswith("line ")]
    assert [e.split(":")[0] for e in errors] == ["line 4", "line 6", "line 8", "line 16"]
    assert "invalid JSON" in errors[0]
    assert "channel name" in errors[1].lower()
    assert "must be a JSON object" in errors[2]
    assert "exactly one" in errors[3]
    assert "Traceback" not in result.stderr
    got = [m["i"] for _, m in drain(layer, ["cli.bulk"])]
    assert got == list(range(10))
    assert drain(layer, ["cli.member"]) == [("cli.member", {"g": 1})]


def test_bulk_send_from_stdin_all_good_exits_0(run, layer):
    records = [
        {"channel": "cli.in%d" % (i % 3), "message": {"i": i, "b": {"__bytes__": "AA=="}}}
        for i in range(300)
    ]
    result = run("send", "--from", "-", input=_jsonl(records))
    assert result.exit_code == 0, result.stderr
    assert _summary(result) == (300, 0, 0, 0)
    got = drain(layer, ["cli.in0", "cli.in1", "cli.in2"])
    assert sorted(m["i"] for _, m in got) == list(range(300))
    assert all(m["b"] == b"\x00" for _, m in got)


def test_bulk_send_with_jobs_delivers_each_message_once(run, layer):
    records = [{"channel": "cli.jobs", "message": {"i": i}} for i in range(400)]
    result = run("send", "--jobs", "4", "--from", "-", input=_jsonl(records))
    assert result.exit_code == 0, result.stderr
    assert _summary(result) == (400, 0, 0, 0)
    assert sorted(m["i"] for _, m in drain(layer, ["cli.jobs"])) == list(range(400))


def _six(channel="cli.full"):
    return _jsonl({"channel": channel, "message": {"i": i}} for i in range(6))


def test_on_full_fail_stops_the_batch(run, layer):
    result = run("send", "--from", "-", input=_six(), capacity=3)
    assert result.exit_code == 1
    # Sends are pipelined: the lines already in flight when the first full
    # channel is seen count as they turn out (here: full too).
    assert _summary(result) == (3, 3, 0, 0)
    assert "stopped at line 4: channel cli.full is full" in result.stderr


def test_on_full_skip_counts_and_goes_on(run, layer, broker, prefix, new_layer):
    records = _six() + _jsonl([{"channel": "cli.other", "message": {}}])
    result = run("send", "--on-full", "skip", "--from", "-", input=records, capacity=3)
    assert result.exit_code == 1
    assert _summary(result) == (4, 3, 0, 0)
    small = new_layer(broker, prefix=prefix, capacity=3)  # queue arguments must match
    assert [m["i"] for _, m in drain(small, ["cli.full"])] == [0, 1, 2]
    assert drain(small, ["cli.other"]) == [("cli.other", {})]


def test_on_full_retry_gives_up_after_bounded_backoff(run, layer):
    started = time.monotonic()
    result = run(
        "send", "--on-full", "retry", "--retries", "2", "--from", "-", input=_six(), capacity=4
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert _summary(result) == (4, 2, 0, 0)
    assert 2 * (0.1 + 0.2) <= elapsed < 5


def test_on_full_retry_succeeds_when_a_reader_makes_room(run, broker, prefix, new_layer):
    reader = new_layer(broker, prefix=prefix, capacity=2, receive_timeout=0.2)
    got, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            channel, message = reader.receive(["cli.slow"], block=True)
            if channel:
                taken = time.monotonic()
                got.append(message["i"])
                at_moment(taken, 0.05)  # a slow application: 0.05 s on each message

    thread = threading.Thread(target=read)
    thread.start()
    try:
        result = run(
            "send", "--on-full", "retry", "--from", "-", input=_six("cli.slow"), capacity=2
        )
        assert result.exit_code == 0, result.stderr
        assert _summary(result) == (6, 0, 0, 0)
        wait_until(lambda: len(got) >= 6, 10, raise_on_timeout=False)
    finally:
        stop.set()
        thread.join(5)
    assert sorted(got) == list(range(6))


def test_no_progress_bar_when_stderr_is_not_a_terminal():
    assert _progress(10) is None


def test_progress_bar_on_a_terminal():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    bar = _progress(10, terminal)
    assert bar is not None and bar.total == 10
    bar.update(4)
    bar.refresh()
    bar.close()
    assert "4/10" in terminal.getvalue()


# -- groups ----------------------------------------------------------------------------------


def test_group_commands(run, layer):
    assert run("group-add", "cli.g", "cli.one").exit_code == 0
    assert run("group-add", "cli.g", "cli.two").exit_code == 0
    result = run("group-members", "cli.g")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["cli.one", "cli.two"]

    assert run("send-group", "cli.g", '{"hello": 1}').exit_code == 0
    result = run("receive", "cli.one", "cli.two", "-n", "2")
    assert sorted(json.loads(x)["channel"] for x in result.stdout.splitlines()) == [
        "cli.one",
        "cli.two",
    ]

    assert run("group-discard", "cli.g", "cli.two").exit_code == 0
    result = run("group-members", "--json", "cli.g")
    assert json.loads(result.stdout) == ["cli.one"]


# -- flush --------------------------------------------------------------------------------------


def test_flush_asks_and_a_no_keeps_everything(run, layer):
    layer.send("cli.keep", {"i": 1})
    result = run("flush", input="n\n")
    assert result.exit_code == 1
    assert "nothing was flushed" in result.stderr
    result = run("flush", input="")  # end of input is a no, too
    assert result.exit_code == 1
    assert drain(layer, ["cli.keep"]) == [("cli.keep", {"i": 1})]


def test_flush_with_confirmation_or_yes(run, layer):
    layer.send("cli.gone", {"i": 1})
    result = run("flush", input="y\n")
    assert result.exit_code == 0, result.stderr
    assert "Delete every" in result.stderr
    assert drain(layer, ["cli.gone"]) == []
    layer.send("cli.gone", {"i": 2})
    assert run("flush", "--yes").exit_code == 0
    assert layer.management_client().queue_names(layer.topology.prefix + ":q:") == []


# -- stats --------------------------------------------------------------------------------------


def test_stats_json_and_table(run, layer):
    layer.send("cli.s1", {"i": 1})
    layer.send("cli.s2!x", {"i": 1})
    result = run("stats", "--json")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert set(body["channels"]) == {"cli.s1", "cli.s2!"}
    for figures in list(body["channels"].values()) + [body["global"]]:
        assert set(figures) == set(statistics.KEYS)

    result = run("stats", "cli.s1")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "channel",
        "pending",
        "count",
        "count/s",
        "max",
        "age",
        "full",
        "full/s",
    ]
    assert lines[1].split()[0] == "cli.s1"
    assert len(lines) == 2  # no "(all channels)" row: the prefix's total, not cli.s1's
    assert run("stats").stdout.splitlines()[-1].startswith("(all channels)")

    result = run("stats", "bad name")
    assert result.exit_code == 2


def test_management_api_unreachable_is_one_line(run, env):
    result = _runner().invoke(
        cli.cli, ["--management-url", "http://127.0.0.1:1/", "group-members", "g"], env=env
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "management API is not reachable" in result.stderr
    # In the command's own terms: its option and variable, not the layer's keyword.
    assert "--management-url (or AMQP_MANAGEMENT_URL)" in result.stderr
    assert "management_url=" not in result.stderr


# -- credentials and unreachable brokers (real subprocesses) ---------------------------------------


def _python_m(*args, env=None, input=None):
    full_env = dict(os.environ)
    full_env.pop("AMQP_URL", None)
    full_env.pop("AMQP_MANAGEMENT_URL", None)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, full_env.get("PYTHONPATH", "")] if p)
    return subprocess.run(
        [sys.executable, "-m", "asgi_amqp"] + list(args),
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


def test_python_m_help_documents_exit_codes():
    result = _python_m("--help")
    assert result.returncode == 0
    assert "Exit status:" in result.stdout and "AMQP_URL" in result.stdout
    assert "send-group" in result.stdout


def test_unreachable_broker_is_one_line_exit_2_without_password():
    result = _python_m("--url", "amqp://someone:s3cr3t-pw@127.0.0.1:1/%2F", "send", "cli.a", "{}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("asgi-amqp: note: --url holds a password")
    assert lines[1].startswith("asgi-amqp: error: cannot reach the broker: ")
    assert "s3cr3t-pw" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_refused_credentials_from_environment_no_note_no_password(broker):
    url = re.sub(r"//[^@/]*@", "//guest:wr0ng-pw@", broker.amqp_url)
    result = _python_m(
        "send",
        "--from",
        "-",
        env={"AMQP_URL": url},
        input=_jsonl([{"channel": "cli.a", "message": {}}]),
    )
    assert result.returncode == 2
    assert "note:" not in result.stderr
    assert "wr0ng-pw" not in result.stderr + result.stdout
    assert "refused the credentials" in result.stderr
    assert result.stderr.count("\n") == 1


def test_bulk_subprocess_summary_without_progress_bar(broker, prefix):
    records = [{"channel": "cli.sub", "message": {"i": i}} for i in range(200)]
    env = {"AMQP_URL": broker.amqp_url, "AMQP_MANAGEMENT_URL": broker.management_url}
    try:
        result = _python_m(
            "--prefix",
            prefix,
            "--capacity",
            "1000",
            "send",
            "--from",
            "-",
            env=env,
            input=_jsonl(records),
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        # stderr is a pipe: the summary line only, no progress bar.
        assert SUMMARY_RE.fullmatch(result.stderr.strip()), result.stderr
        assert "\r" not in result.stderr
        result = _python_m(
            "--prefix", prefix, "--capacity", "1000", "receive", "cli.sub", "-n", "200", env=env
        )
        assert result.returncode == 0
        assert len(result.stdout.splitlines()) == 200
    finally:
        _python_m("--prefix", prefix, "flush", "--yes", env=env)


@pytest.mark.parametrize(
    "option, url",
    [
        ("--url", "amqp://u:SECRETPW@127.0.0.1:1/%2F?heartbeat_interval=3"),
        ("--url", "amqp://u:SECRETPW@127.0.0.1:notaport/"),
        ("--url", "http://u:SECRETPW@127.0.0.1/"),
        ("--url", "amqps://u:SECRETPW@127.0.0.1:1/"),
        ("--management-url", "http://u:SECRETPW@127.0.0.1:1/"),
        ("--management-url", "ftp://u:SECRETPW@127.0.0.1:1/"),
        ("--hosts", "amqp://u:SECRETPW@127.0.0.1:1/%2F?heartbeat_interval=3"),
        ("--hosts", "http://u:SECRETPW@127.0.0.1/"),
    ],
)
def test_bad_urls_never_print_the_password(env, option, url):
    command = ["stats"] if option == "--management-url" else ["send", "cli.a", "{}"]
    result = _runner().invoke(cli.cli, [option, url, "--prefix", "cli-never"] + command, env=env)
    assert result.exit_code == 2
    output = result.stdout + result.stderr
    assert "SECRETPW" not in output
    assert "Traceback" not in output
    assert "note: %s holds a password" % option in result.stderr
    assert result.stderr.count("error:") == 1


def test_an_outage_error_does_not_promise_a_reconnect_the_command_will_not_make():
    from asgi_amqp import OperationTimeout
    from asgi_amqp.tools.cli.errors import _error_for

    error = OperationTimeout(
        "send to x: the broker has been unreachable for 10.1 s (refused); "
        "the layer keeps reconnecting"
    )
    text = _error_for(error).format_message()
    assert text == (
        "cannot reach the broker: send to x: the broker has been unreachable for 10.1 s (refused)"
    )


def test_a_url_at_the_management_port_names_the_likely_mistake(broker):
    port = urlsplit(broker.management_url).port
    result = _runner().invoke(
        cli.cli,
        ["send", "x", "{}"],
        env={"AMQP_URL": "amqp://guest:guest@127.0.0.1:%d/%%2F" % port},
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "does not speak AMQP 0-9-1" in result.stderr and "15672" in result.stderr


def test_stats_of_a_channel_without_a_queue_says_so(run, layer):
    result = run("stats", "no.such.channel")
    assert result.exit_code == 0
    assert "note: channel no.such.channel has no queue" in result.stderr
    assert result.stdout.splitlines()[1].split()[1:] == ["0", "0", "0.0", "0", "0", "0.0"]
