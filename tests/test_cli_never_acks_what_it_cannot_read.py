"""``asgi-amqp receive`` never takes a message off its queue unless it printed it.

A message it cannot decrypt or decode is reported on stderr (the channel and
the reason, never the body), stays in its queue in its place, and the
command exits 2. The keys come from ``--symmetric-encryption-key``,
``ASGI_AMQP_SYMMETRIC_ENCRYPTION_KEYS`` or the loaded config.
"""

import json

import pika
import pytest

from helpers import drain, run_cli

SECRET = "the-plain-text-of-a-secret"
KEY = "application-key"


@pytest.fixture
def app(broker, cli_prefix, new_layer):
    """The application's layer, which encrypts."""
    return new_layer(broker, flush=True, prefix=cli_prefix, symmetric_encryption_keys=[KEY])


def _messages(result):
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_undecryptable_messages_stay_in_order_and_exit_2(cli_env, app):
    for n in range(3):
        app.send("enc.a", {"n": n, "secret": SECRET})

    result = run_cli(["receive", "enc.a", "--timeout", "0"], env=cli_env)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "channel enc.a" in result.stderr
    assert "left in the queue" in result.stderr
    assert "symmetric_encryption_keys" in result.stderr  # the hint: it looks encrypted
    assert SECRET not in result.stderr
    assert drain(app, ["enc.a"]) == [("enc.a", {"n": n, "secret": SECRET}) for n in range(3)]


def test_with_the_key_from_the_environment_every_message_is_printed(cli_env, app):
    for n in range(3):
        app.send("enc.b", {"n": n})
    variables = dict(cli_env, ASGI_AMQP_SYMMETRIC_ENCRYPTION_KEYS="an-old-key," + KEY)
    result = run_cli(["receive", "enc.b", "--timeout", "0"], env=variables)
    assert result.exit_code == 0, result.stderr
    assert [m["message"]["n"] for m in _messages(result)] == [0, 1, 2]
    assert drain(app, ["enc.b"]) == []


def test_keys_from_the_option_or_a_config_file(cli_env, app, tmp_path):
    app.send("enc.c", {"n": 1})
    app.send("enc.c", {"n": 2})
    result = run_cli(
        ["receive", "enc.c", "-n", "1", "--symmetric-encryption-key", KEY], env=cli_env
    )
    assert result.exit_code == 0, result.stderr
    assert _messages(result) == [{"channel": "enc.c", "message": {"n": 1}}]

    config = tmp_path / "layer.json"
    config.write_text(json.dumps({"symmetric_encryption_keys": [KEY]}))
    result = run_cli(["--config", str(config), "receive", "enc.c", "-t", "0"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    assert _messages(result) == [{"channel": "enc.c", "message": {"n": 2}}]


def test_a_body_that_is_not_a_message_stops_the_receive_and_stays(
    broker, cli_env, cli_prefix, new_layer
):
    cli_layer = new_layer(broker, flush=True, prefix=cli_prefix)
    cli_layer.send("raw.a", {"n": 1})
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        connection.channel().basic_publish("", "%s:q:raw.a" % cli_prefix, SECRET.encode())
    cli_layer.send("raw.a", {"n": 3})

    result = run_cli(["receive", "raw.a", "--timeout", "0"], env=cli_env)
    assert result.exit_code == 2
    assert _messages(result) == [{"channel": "raw.a", "message": {"n": 1}}]
    assert "channel raw.a" in result.stderr and SECRET not in result.stderr

    # Still there, in its place: peek shows it is first, then the next one.
    result = run_cli(["peek", "raw.a"], env=cli_env)
    assert result.exit_code == 2
    assert _messages(result) == [{"channel": "raw.a", "message": {"n": 3}}]
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        bodies = [channel.basic_get("%s:q:raw.a" % cli_prefix, auto_ack=True)[2] for _ in range(2)]
    assert bodies[0] == SECRET.encode()
    assert cli_layer._serializer.loads(bodies[1]) == {"n": 3}


def test_process_local_channels_keep_their_full_name(cli_env, app):
    app.send("local!one", {"n": 1})
    app.send("local!two", {"n": 2})
    result = run_cli(["receive", "local!", "-t", "0"], env=cli_env)
    assert result.exit_code == 2
    assert "channel local!" in result.stderr

    result = run_cli(
        ["receive", "local!", "-t", "0", "--symmetric-encryption-key", KEY], env=cli_env
    )
    assert result.exit_code == 0, result.stderr
    assert _messages(result) == [
        {"channel": "local!one", "message": {"n": 1}},
        {"channel": "local!two", "message": {"n": 2}},
    ]
