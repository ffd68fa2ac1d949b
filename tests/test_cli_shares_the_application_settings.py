"""The command line creates queues with the application's settings, and uses
queues that exist with the arguments they have.

Sources, highest first: an option (before or after the command), an
``ASGI_AMQP_*`` variable, ``--config FILE`` (JSON or TOML), the Django
settings' ``CHANNEL_LAYERS[alias]["CONFIG"]``, the layer's defaults. Each
test reads the arguments the broker gave a queue the command created.
"""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from helpers import Management, drain, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def app(broker, cli_prefix, new_layer):
    """The application's layer on the test's prefix, flushed afterwards."""
    return new_layer(broker, flush=True, prefix=cli_prefix, capacity=3, expiry=20)


@pytest.fixture
def arguments(broker, cli_prefix):
    """arguments(channel) -> the broker's arguments of the channel's queue."""
    management = Management(broker)

    def arguments(channel):
        return management.queue("%s:q:%s" % (cli_prefix, channel))["arguments"]

    return arguments


@pytest.fixture
def django_settings(tmp_path, monkeypatch, cli_prefix):
    """A Django settings module in the current directory: its name."""
    name = "site_%s" % uuid.uuid4().hex[:8]
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(
        textwrap.dedent(
            """\
            SECRET_KEY = "x"
            CHANNEL_LAYERS = {
                "default": {
                    "BACKEND": "asgi_amqp.AMQPChannelLayer",
                    "ROUTING": "chat.routing.channel_routing",
                    "CONFIG": {
                        "prefix": %r,
                        "capacity": 5,
                        "expiry": 30,
                        "channel_capacity": {"http.request": 4},
                    },
                },
                "other": {
                    "BACKEND": "asgi_amqp.AMQPChannelLayer",
                    "CONFIG": {"prefix": %r, "capacity": 11},
                },
            }
            """
            % (cli_prefix, cli_prefix)
        )
    )
    monkeypatch.chdir(tmp_path)
    return "%s.settings" % name


def test_django_settings_give_queues_the_applications_arguments(
    cli_env, django_settings, arguments, app
):
    result = run_cli(["--django-settings", django_settings, "send", "cfg.a", "{}"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    result = run_cli(
        ["send", "http.request", "{}", "--django-settings", django_settings], env=cli_env
    )
    assert result.exit_code == 0, result.stderr

    assert arguments("cfg.a")["x-max-length"] == 5
    assert arguments("cfg.a")["x-message-ttl"] == 30000
    assert arguments("http.request")["x-max-length"] == 4


def test_django_settings_module_from_the_environment_and_a_layer_alias(
    cli_env, django_settings, arguments, app
):
    cli_env = dict(cli_env, DJANGO_SETTINGS_MODULE=django_settings)
    result = run_cli(["--layer", "other", "send", "cfg.b", "{}"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert arguments("cfg.b")["x-max-length"] == 11


def test_precedence_option_then_variable_then_file_then_django(
    cli_env, django_settings, arguments, app, tmp_path
):
    config = tmp_path / "layer.json"
    config.write_text(json.dumps({"capacity": 6}))
    base = ["--django-settings", django_settings]

    def capacity_of(channel, args, extra_env=None):
        result = run_cli(
            base + args + ["send", channel, "{}"], env=dict(cli_env, **(extra_env or {}))
        )
        assert result.exit_code == 0, result.stderr
        return arguments(channel)["x-max-length"]

    assert capacity_of("p.django", []) == 5
    assert capacity_of("p.file", ["--config", str(config)]) == 6
    variable = {"ASGI_AMQP_CAPACITY": "7"}
    assert capacity_of("p.env", ["--config", str(config)], variable) == 7
    assert capacity_of("p.option", ["--config", str(config), "--capacity", "8"], variable) == 8
    # An option after the command wins over the same option before it.
    result = run_cli(
        base + ["--capacity", "8", "send", "p.after", "{}", "--capacity", "9"], env=cli_env
    )
    assert result.exit_code == 0, result.stderr
    assert arguments("p.after")["x-max-length"] == 9


def test_toml_config_file_with_group_expiry_queue_type_and_channel_capacity(
    cli_env, cli_prefix, arguments, tmp_path, broker, new_layer
):
    new_layer(broker, flush=True, prefix=cli_prefix)  # flushes the prefix afterwards
    config = tmp_path / "layer.toml"
    config.write_text(
        textwrap.dedent(
            """\
            prefix = "%s"
            expiry = 45
            group_expiry = 120
            queue_type = "quorum"

            [channel_capacity]
            "t.*" = 12
            """
            % cli_prefix
        )
    )
    result = run_cli(["--config", str(config), "send", "t.one", "{}"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    found = arguments("t.one")
    assert found["x-queue-type"] == "quorum"
    assert found["x-message-ttl"] == 45000
    assert found["x-max-length"] == 11  # a quorum queue admits one more than x-max-length

    # --channel-capacity adds a pattern before the file's patterns.
    result = run_cli(
        ["--config", str(config), "--channel-capacity", "t.two=30", "send", "t.two", "{}"],
        env=cli_env,
    )
    assert result.exit_code == 0, result.stderr
    assert arguments("t.two")["x-max-length"] == 29


def test_variables_named_after_the_options(cli_env, cli_prefix, arguments, broker, new_layer):
    new_layer(broker, flush=True, prefix=cli_prefix)
    variables = dict(
        cli_env,
        ASGI_AMQP_PREFIX=cli_prefix,
        ASGI_AMQP_EXPIRY="15",
        ASGI_AMQP_CHANNEL_CAPACITY="v.a=21,v.b=22",
    )
    for channel in ("v.a", "v.b"):
        result = run_cli(["send", channel, "{}"], env=variables)
        assert result.exit_code == 0, result.stderr
    assert arguments("v.a")["x-max-length"] == 21
    assert arguments("v.b")["x-max-length"] == 22
    assert arguments("v.a")["x-message-ttl"] == 15000


def test_an_existing_queue_with_other_arguments_is_used_as_it_is(
    cli_env, cli_prefix, app, arguments
):
    app.send("x.chan", {"n": 0})  # the application made the queue: capacity 3, expiry 20
    options = ["--prefix", cli_prefix]  # the command's own defaults: capacity 100, expiry 60

    result = run_cli(options + ["send", "x.chan", '{"n": 1}'], env=cli_env)
    assert result.exit_code == 0, result.stderr
    lines = "".join(json.dumps({"channel": "x.chan", "message": {"n": n}}) + "\n" for n in (2, 3))
    result = run_cli(
        options + ["send", "--from", "-", "--on-full", "skip"], env=cli_env, input=lines
    )
    assert result.exit_code == 1, result.stderr  # the queue's own capacity, 3, holds
    assert "sent 1, refused 1, in doubt 0, not sent 0," in result.stderr

    result = run_cli(options + ["receive", "x.chan", "-n", "1"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["message"] == {"n": 0}
    assert arguments("x.chan")["x-max-length"] == 3
    assert drain(app, ["x.chan"]) == [("x.chan", {"n": 1}), ("x.chan", {"n": 2})]


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"hosts": [["localhost", 6379]]}', "hosts must be a list of AMQP URLs"),
        ('{"url": "amqp://a", "hosts": ["amqp://b"]}', "gives both 'url' and 'hosts'"),
        ('{"capacity": 5, "hostz": 1}', "unknown layer option 'hostz'"),
        ('{"capacity": 5,', "is not valid JSON"),
        ("[1, 2]", "must be an object of layer options"),
    ],
)
def test_a_bad_config_file_is_one_line_before_the_broker(cli_env, tmp_path, content, expected):
    config = tmp_path / "bad.json"
    config.write_text(content)
    result = run_cli(["--config", str(config), "send", "c.a", "{}"], env=cli_env)
    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_settings_module_that_does_not_import_is_one_line(cli_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli(
        ["--django-settings", "nowhere_to_be_found.settings", "send", "c", "{}"], env=cli_env
    )
    assert result.exit_code == 2
    assert "cannot import the Django settings module 'nowhere_to_be_found.settings'" in (
        result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _python_m(args, env, cwd):
    """``python -m asgi_amqp ARGS`` in a process of its own (Django is set up there)."""
    path = os.pathsep.join([str(cwd), ROOT])
    return subprocess.run(
        [sys.executable, "-m", "asgi_amqp"] + list(args),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(cwd),
        env=dict(os.environ, PYTHONPATH=path, **env),
    )


def test_django_setup_reads_the_settings_through_django(
    cli_env, django_settings, arguments, app, tmp_path
):
    result = _python_m(
        ["--django-settings", django_settings, "--django-setup", "send", "cfg.dj", "{}"],
        cli_env,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert arguments("cfg.dj")["x-max-length"] == 5

    settings = tmp_path / django_settings.replace(".", "/")
    with open(str(settings) + ".py", "a") as handle:
        handle.write("INSTALLED_APPS = ['no_such_app_here']\n")
    result = _python_m(
        ["--django-settings", django_settings, "--django-setup", "send", "cfg.dj", "{}"],
        cli_env,
        tmp_path,
    )
    assert result.returncode == 2
    assert "Django could not be set up" in result.stderr and "no_such_app_here" in result.stderr
    assert "Traceback" not in result.stderr
