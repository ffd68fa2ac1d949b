"""Every option of ``AMQPChannelLayer`` passes through every tool.

The tools (the ``asgi-amqp`` command, ``layerconfig.from_django`` and
``from_file``, Spark's ``send_dataframe``) take the layer's options from
``layerconfig.LAYER_OPTIONS``, which is read off the constructor's
signature. ``persistent`` is keyword-only and was left out of it, so every
tool refused it although the docs say every option is accepted. These tests
walk the signature, so the next new option cannot be forgotten either.
"""

import inspect
import json
import textwrap

import pika
import pytest

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.tools import layerconfig
from helpers import drain, run_cli


def _constructor_options():
    signature = inspect.signature(AMQPChannelLayer.__init__)
    return {name for name in signature.parameters if name not in layerconfig.NOT_OPTIONS}


def test_every_constructor_keyword_is_a_layer_option():
    assert _constructor_options() == set(layerconfig.LAYER_OPTIONS)
    assert "persistent" in layerconfig.LAYER_OPTIONS


@pytest.mark.parametrize("option", sorted(_constructor_options()))
def test_every_tool_accepts_every_option(option, tmp_path):
    value = layerconfig.LAYER_OPTIONS[option]
    assert layerconfig.checked({option: value}, "a test") == {option: value}
    # A settings file holds it (JSON: any default the layer has is JSON too).
    if value is None or isinstance(value, (bool, int, float, str)):
        path = tmp_path / "layer.json"
        path.write_text(json.dumps({option: value}))
        assert layerconfig.from_file(str(path)) == {option: value}


@pytest.mark.extras
@pytest.mark.parametrize("option", sorted(_constructor_options()))
def test_send_dataframe_accepts_every_option(option):
    """As a keyword, checked before Spark is touched."""
    from asgi_amqp.tools import spark

    parameters = inspect.signature(spark.send_dataframe).parameters
    assert option in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()), option


def test_django_settings_with_persistent(tmp_path, monkeypatch):
    (tmp_path / "persistent_settings.py").write_text(
        textwrap.dedent(
            """\
            CHANNEL_LAYERS = {"default": {"BACKEND": "asgi_amqp.AMQPChannelLayer",
                                          "CONFIG": {"persistent": True, "prefix": "p"}}}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert layerconfig.from_django("persistent_settings")["persistent"] is True


def _delivery_mode(broker, queue):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        method, properties, _ = connection.channel().basic_get(queue, auto_ack=True)
        assert method is not None, "nothing in %s" % queue
        return properties.delivery_mode
    finally:
        connection.close()


@pytest.mark.parametrize(
    "how, expected",
    [
        (["--persistent"], 2),
        (["--transient"], 1),
        ([], 1),
        (["--config", "{file}"], 2),
        (["--config", "{file}", "--transient"], 1),
    ],
)
def test_the_command_line_sends_persistent_messages_when_told(
    how, expected, cli_env, cli_layer, broker, tmp_path
):
    config = tmp_path / "layer.toml"
    config.write_text("persistent = true\n")
    args = [arg.format(file=config) for arg in how]
    result = run_cli(args + ["send", "kept.across", '{"n": 1}'], env=cli_env)
    assert result.exit_code == 0, result.stderr
    queue = cli_layer.topology.channel_queue("kept.across")
    assert _delivery_mode(broker, queue) == expected


def test_hosts_reaches_the_broker_through_every_tool(
    broker, cli_prefix, cli_layer, tmp_path, monkeypatch
):
    """Issue 42: ``hosts`` worked in the application, but the command line
    (Django settings, --config, --hosts) and ``from_django`` (which Spark
    uses) refused it as an unknown layer option."""
    config = {"hosts": [broker.amqp_url], "prefix": cli_prefix}
    module = "hosts_settings_%s" % cli_prefix.replace("-", "_")
    (tmp_path / (module + ".py")).write_text(
        "CHANNEL_LAYERS = {'default': {'BACKEND': 'asgi_amqp.AMQPChannelLayer', "
        "'CONFIG': %r}}\n" % (config,)
    )
    (tmp_path / "layer.json").write_text(json.dumps(config))
    monkeypatch.syspath_prepend(str(tmp_path))
    # No AMQP_URL: the broker is reachable through ``hosts`` alone.
    env = {"AMQP_URL": None, "AMQP_MANAGEMENT_URL": broker.management_url}
    env.update(ASGI_AMQP_PREFIX=None, DJANGO_SETTINGS_MODULE=None, ASGI_AMQP_HOSTS=None)
    ways = {
        "django": ["--django-settings", module],
        "config": ["--config", str(tmp_path / "layer.json")],
        "option": ["--prefix", cli_prefix, "--hosts", broker.amqp_url],
    }
    for n, (way, options) in enumerate(sorted(ways.items())):
        result = run_cli(options + ["send", "hosts.a", json.dumps({"n": n})], env=env)
        assert result.exit_code == 0, (way, result.stderr)
    assert [m["n"] for _, m in drain(cli_layer, ["hosts.a"])] == [0, 1, 2]

    # Spark's path: the Django reader's config, merged and resolved as send_dataframe does.
    found = layerconfig.from_django(module)
    assert found["hosts"] == [broker.amqp_url]
    resolved = layerconfig.with_url(layerconfig.merge([found, {"capacity": 7}]))
    assert resolved["url"] == [broker.amqp_url] and "hosts" not in resolved
    layer = AMQPChannelLayer(**dict(resolved, capacity=100))
    try:
        layer.send("hosts.a", {"n": 3})
    finally:
        layer.close()
    assert drain(cli_layer, ["hosts.a"]) == [("hosts.a", {"n": 3})]
    # A later source's url replaces an earlier one's hosts, and the other way round.
    del config["hosts"]
    assert layerconfig.merge([found, {"url": "amqp://b"}]) == dict(config, url="amqp://b")
    assert layerconfig.merge([{"url": "amqp://b"}, found]) == found
