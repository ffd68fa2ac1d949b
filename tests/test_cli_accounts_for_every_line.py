"""``asgi-amqp send --from FILE`` accounts for every line, however the run ends.

Every line is exactly one of sent (confirmed), refused, in doubt, or not
sent, and every line not sent is in the rejects file, which resumes the run.
Ctrl-C and SIGTERM stop the run between two lines; the summary's "sent" must
be what the broker holds. Before, an interrupt while new channels were being
declared counted messages as sent that never reached the broker (256 of 0),
and SIGTERM printed nothing.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pika
import pytest

from helpers import BULK_SUMMARY, Management, bulk_summary, make_layer, run_cli, wait_until

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESUME = re.compile(r"^first line not sent: (\d+) \(--skip (\d+) resumes there too\)", re.M)
LINES = 20000
CHANNELS = 300


def _write_lines(path, lines=LINES, channels=CHANNELS):
    with open(path, "w") as out:
        for i in range(lines):
            out.write(json.dumps({"channel": "acct.c%d" % (i % channels), "message": {"i": i}}))
            out.write("\n")


def _queue_depths(broker, queues):
    """{queue: ready messages} by passive declares: exact, unlike the API's samples."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    depths = {}
    try:
        for queue in queues:
            channel = connection.channel()
            try:
                depths[queue] = channel.queue_declare(queue, passive=True).method.message_count
                channel.close()
            except pika.exceptions.ChannelClosedByBroker:
                depths[queue] = 0  # never declared
    finally:
        connection.close()
    return depths


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("queues_first", [3, 120, CHANNELS], ids=["early", "declaring", "late"])
def test_a_signal_leaves_a_summary_that_matches_the_broker(
    broker, cli_prefix, tmp_path, signum, queues_first
):
    source = tmp_path / "lines.jsonl"
    _write_lines(source)
    layer = make_layer(broker, prefix=cli_prefix, capacity=100000, expiry=300)
    queues = [layer.topology.channel_queue("acct.c%d" % n) for n in range(CHANNELS)]
    env = dict(os.environ, AMQP_URL=broker.amqp_url, AMQP_MANAGEMENT_URL=broker.management_url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "asgi_amqp", "--prefix", cli_prefix, "--capacity", "100000"]
    command += ["--expiry", "300", "send", "--from", str(source)]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # The moment: once the run has declared this many of its channels' queues.
        api = Management(broker)
        wait_until(
            lambda: (
                len(api.queue_names(cli_prefix + ":q:")) >= queues_first
                or process.poll() is not None
            ),
            timeout=60,
            interval=0.02,
            message="%d queues declared" % queues_first,
        )
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    try:
        assert process.returncode in (128 + signum, 0), stderr  # 0: it finished first
        sent, refused, in_doubt, not_sent = bulk_summary(stderr)
        held = sum(_queue_depths(broker, queues).values())
        print(
            "\n%s at %d queues: %s; the broker holds %d"
            % (signal.Signals(signum).name, queues_first, stderr.strip().splitlines()[-3:], held)
        )
        assert sent == held and in_doubt == 0, stderr
        assert sent + refused + in_doubt + not_sent == LINES, stderr
        if process.returncode:
            # Every line is in the broker or in the rejects file, not both.
            present = set()
            while True:
                channel, message = layer.receive(["acct.c%d" % n for n in range(CHANNELS)])
                if channel is None:
                    break
                present.add(message["i"])
            assert len(present) == held
            with open(str(source) + ".rejects") as handle:
                rejected = [json.loads(record) for record in handle]
            assert {record["kind"] for record in rejected} <= {"not sent"}
            numbers = {record["line"] - 1 for record in rejected}
            assert len(numbers) == len(rejected) == not_sent
            assert not numbers & present and numbers | present == set(range(LINES))
    finally:
        layer.flush()
        layer.close()


def test_on_full_fail_accounts_for_the_lines_after_the_stop(cli_env, cli_layer, tmp_path):
    source = tmp_path / "one.jsonl"
    _write_lines(source, lines=3000, channels=1)
    result = run_cli(["--capacity", "100", "send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 1
    sent, refused, in_doubt, not_sent = bulk_summary(result.stderr)
    assert sent == 100 and in_doubt == 0 and refused >= 1
    assert sent + refused + in_doubt + not_sent == 3000, result.stderr
    assert RESUME.search(result.stderr).group(1) == "101", result.stderr


def test_refused_credentials_account_for_every_line(broker, cli_prefix, tmp_path):
    source = tmp_path / "lines.jsonl"
    _write_lines(source, lines=2000, channels=5)
    url = broker.amqp_url.replace("guest:guest@", "guest:wrong@")
    result = run_cli(
        ["--prefix", cli_prefix, "send", "--from", str(source)],
        env={"AMQP_URL": url, "AMQP_MANAGEMENT_URL": broker.management_url},
    )
    assert result.exit_code == 2
    assert "wrong" not in result.stderr
    if BULK_SUMMARY.search(result.stderr):  # one line in, the error alone says it all
        sent, refused, in_doubt, not_sent = bulk_summary(result.stderr)
        assert sent == 0 and sent + refused + in_doubt + not_sent == 2000, result.stderr


def test_a_single_message_over_the_size_limit_is_an_invalid_message(cli_env, cli_layer):
    """cli.rst: an invalid message exits 2 with the ``asgi-amqp: error:`` prefix.
    It exited 1 with a bare line before."""
    result = run_cli(
        ["--max-message-size", "10", "send", "too.big", '{"a": "%s"}' % ("x" * 40)], env=cli_env
    )
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("asgi-amqp: error: channel too.big: message is ")
    assert result.stderr.count("\n") == 1


def test_qq_shows_not_even_the_errors_of_single_lines(cli_env, cli_layer, tmp_path):
    """-qq was documented as "none" and printed 21 lines for a file of bad lines."""
    source = tmp_path / "bad.jsonl"
    source.write_text("".join('{"bad %d\n' % n for n in range(40)))
    result = run_cli(["-qq", "send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 1
    assert result.stderr == ""
    result = run_cli(["-q", "send", "--from", str(source)], env=cli_env)
    # 20 lines' errors, "further errors ...", and where the lines not sent went
    assert result.stderr.count("\n") == 22
    assert result.stderr.splitlines()[-1].startswith("rejects: %s.rejects (40 lines)" % source)


def test_retries_are_bounded_and_say_how_they_go(cli_env, cli_layer, tmp_path):
    """--on-full retry waited ~3.1 s per full line, silently: 10,000 lines to
    a channel nobody reads took hours. --retry-for bounds them all."""
    source = tmp_path / "full.jsonl"
    _write_lines(source, lines=200, channels=1)
    started = time.monotonic()
    result = run_cli(
        ["--capacity", "5", "send", "--on-full", "retry", "--retries", "8", "--retry-for", "6"]
        + ["--from", str(source)],
        env=cli_env,
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.stderr
    assert bulk_summary(result.stderr) == (5, 195, 0, 0), result.stderr
    assert elapsed < 6 + 8, elapsed
    assert "retrying full channels (now acct.c0)" in result.stderr
    assert "gave up retrying after" in result.stderr
