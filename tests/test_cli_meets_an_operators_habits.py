"""What an operator expects of a command: options anywhere, one-line usage
errors, -v/-q, shell completion, a node list in AMQP_URL, and no traceback
from a broken installation."""

import json
import os
import subprocess
import sys

import pytest

from helpers import Management, drain, free_port, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _console(*args, extra_env=None):
    """The installed console script's entry point, as a subprocess."""
    code = "import sys; from asgi_amqp.tools.console import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code] + list(args),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, **(extra_env or {})),
    )


def test_layer_options_after_the_command(cli_env, broker, cli_prefix, cli_layer):
    result = run_cli(["send", "--capacity", "9", "--group-expiry", "50", "h.a", "{}"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    queue = Management(broker).queue("%s:q:h.a" % cli_prefix)
    assert queue["arguments"]["x-max-length"] == 9


@pytest.mark.parametrize(
    "args, hint",
    [
        (["send", "--no-such-option"], "asgi-amqp send --help"),
        (["no-such-command"], "asgi-amqp --help"),
        (["peek"], "asgi-amqp peek --help"),
        (["--capacity", "zero", "send", "c", "{}"], "asgi-amqp --help"),
        (["send", "c", "{}", "--channel-capacity", "nonsense"], "asgi-amqp send --help"),
    ],
)
def test_usage_errors_are_one_line_with_a_hint(cli_env, args, hint):
    result = run_cli(args, env=cli_env)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("asgi-amqp: error: ")
    assert "(see '%s')" % hint in lines[0]


def test_verbose_logs_the_settings_without_secrets_and_quiet_keeps_stderr_empty(cli_env, cli_layer):
    options = ["--symmetric-encryption-key", "k-secret", "send", "h.v", "{}"]
    result = run_cli(["-v"] + options, env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert "INFO: asgi_amqp.tools.cli.settings: layer settings:" in result.stderr
    assert "k-secret" not in result.stderr and "guest:guest" not in result.stderr

    assert "layer settings" not in run_cli(options, env=cli_env).stderr

    lines = json.dumps({"channel": "h.q", "message": {}}) + "\n"
    result = run_cli(["-q", "send", "--from", "-"], env=cli_env, input=lines)
    assert result.exit_code == 0 and result.stderr == ""
    assert drain(cli_layer, ["h.q"]) == [("h.q", {})]


def test_amqp_url_holds_a_node_list(broker, cli_prefix, cli_layer):
    down = "amqp://guest:guest@127.0.0.1:%d/%%2F" % free_port()
    cli_env = {"AMQP_MANAGEMENT_URL": broker.management_url, "ASGI_AMQP_PREFIX": cli_prefix}
    result = run_cli(
        ["send", "h.n", '{"n": 1}'], env=dict(cli_env, AMQP_URL=broker.amqp_url + "," + down)
    )
    assert result.exit_code == 0, result.stderr
    # A node that is down is passed over for the next one.
    result = run_cli(["peek", "h.n"], env=dict(cli_env, AMQP_URL=down + "," + broker.amqp_url))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["message"] == {"n": 1}


def test_when_no_node_answers_the_error_names_every_node_tried(tmp_path, monkeypatch):
    """It named only the last node tried, so a typo in the first was hidden."""
    monkeypatch.chdir(tmp_path)
    ports = [free_port(), free_port()]
    urls = ",".join("amqp://guest:pw@127.0.0.1:%d/%%2F" % port for port in ports)
    env = {"AMQP_URL": urls, "AMQP_MANAGEMENT_URL": "http://127.0.0.1:%d/" % free_port()}
    for command in (["send", "h.none", "{}"], ["peek", "h.none"]):
        result = run_cli(command, env=env)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        for port in ports:
            assert "127.0.0.1:%d" % port in result.stderr, (command, result.stderr)
        assert "pw" not in result.stderr


def test_a_commands_help_names_the_shared_options_without_repeating_them():
    """Every command's --help repeated the group's 25 settings options."""
    group = run_cli(["--help"])
    assert group.exit_code == 0 and "--queue-type" in group.stdout
    for command in (["send"], ["peek"], ["stats"]):
        result = run_cli(command + ["--help"])
        assert result.exit_code == 0, result.stderr
        assert "--queue-type" not in result.stdout and "--max-consumers" not in result.stdout
        assert "The settings options of 'asgi-amqp --help'" in result.stdout
    assert "--on-full" in run_cli(["send", "--help"]).stdout
    # Still accepted after the command, and completed there.
    assert run_cli(["send", "--queue-type", "nonsense", "c", "{}"]).exit_code == 2


def test_shell_completion_script_and_answers():
    result = _console(extra_env={"_ASGI_AMQP_COMPLETE": "bash_source"})
    assert result.returncode == 0
    assert "_asgi_amqp_completion" in result.stdout
    result = _console(
        extra_env={
            "_ASGI_AMQP_COMPLETE": "bash_complete",
            "COMP_WORDS": "asgi-amqp send --queue-t",
            "COMP_CWORD": "2",
        }
    )
    assert result.stdout.split() == ["plain,--queue-type"]


def test_a_broken_installation_is_one_line_not_a_traceback():
    code = (
        "import sys; sys.modules['click'] = None; "
        "from asgi_amqp.tools.console import main; sys.exit(main(['--help']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("asgi-amqp: error: cannot start: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_setting_that_needs_a_missing_package_is_one_line(cli_env):
    code = (
        "import sys; sys.modules['cryptography'] = None; "
        "from asgi_amqp.tools.console import main; "
        "sys.exit(main(['--symmetric-encryption-key', 'k', 'send', 'c', '{}']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, **cli_env),
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cryptography" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
