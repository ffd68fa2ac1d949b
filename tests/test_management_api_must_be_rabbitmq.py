"""A management URL that answers but is not RabbitMQ's API is an error, not an empty broker.

A proxy, a web server or a wrong port answers with 404s, an HTML page or
some other JSON. Read naively, that is a broker with no queues: ``flush``
"succeeds" and deletes nothing, statistics are all zero. The management
client checks ``/api/overview`` once and raises ManagementAPIError naming
the URL (never its password); the command line exits 2 with that one line.
The server here is a real HTTP server on loopback (helpers.NotRabbitMQ).
"""

import pytest
from click.testing import CliRunner

from asgi_amqp import ManagementAPIError, statistics
from asgi_amqp.management import ManagementClient
from asgi_amqp.tools import cli
from helpers import NotRabbitMQ

SECRET = "s3cret-mgmt-pw"
ANSWERS = ["404", "html", "json"]


@pytest.fixture(params=ANSWERS)
def impostor(request):
    with NotRabbitMQ(request.param) as server:
        yield server


def _check_error(exc, server):
    text = str(exc)
    assert "is not a RabbitMQ management API" in text
    assert "127.0.0.1:%d" % server.port in text
    assert SECRET not in text and SECRET not in repr(exc)
    assert "\n" not in text


def test_layer_calls_raise_naming_the_url(broker, new_layer, impostor):
    layer = new_layer(broker, management_url=impostor.management_url(SECRET))
    calls = [
        layer.flush,
        lambda: layer.group_channels("g"),
        lambda: statistics.channel_statistics(layer, "c"),
        lambda: statistics.global_statistics(layer),
        lambda: statistics.all_channel_statistics(layer),
    ]
    for call in calls:
        with pytest.raises(ManagementAPIError) as info:
            call()
        _check_error(info.value, impostor)
    assert impostor.paths and all(p.startswith("/api/overview") for p in impostor.paths)
    # Listed by its configuration, not by a probe: the calls above are what fail.
    assert "statistics" in layer.extensions


def test_flush_deletes_nothing_it_could_not_list(broker, new_layer, impostor):
    """The failed check comes before any deletion: the channel is still there."""
    good = new_layer(broker, flush=True)
    good.send("still.here", {"n": 1})
    bad = new_layer(
        broker, prefix=good.topology.prefix, management_url=impostor.management_url(SECRET)
    )
    with pytest.raises(ManagementAPIError):
        bad.flush()
    assert good.receive(["still.here"]) == ("still.here", {"n": 1})


def test_the_check_is_made_once_per_client(broker):
    client = ManagementClient(broker.management_url, "/")
    asked = []
    request = client._request

    def counting(path, params=None):
        asked.append(path)
        return request(path, params)

    client._request = counting
    assert "rabbitmq_version" in client.overview()
    client.queue_names("t-nothing-")
    client.exchange_names("t-nothing-")
    client.queue("t-nothing-q")
    assert asked.count("overview") == 1
    assert len(asked) == 4


def test_a_new_client_checks_before_its_first_request(impostor):
    client = ManagementClient(impostor.management_url(SECRET), "/", timeout=2)
    with pytest.raises(ManagementAPIError) as info:
        client.queue_names("asgi:")
    _check_error(info.value, impostor)
    assert repr(client).count(SECRET) == 0


def _runner():
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.mark.parametrize("command", [["flush", "--yes"], ["stats"], ["stats", "--json"]])
def test_cli_exits_2_with_one_line(broker, impostor, command):
    result = _runner().invoke(
        cli.cli,
        ["--prefix", "t-impostor"] + command,
        env={
            "AMQP_URL": broker.amqp_url,
            "AMQP_MANAGEMENT_URL": impostor.management_url(SECRET),
        },
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("asgi-amqp: error: http://127.0.0.1:%d " % impostor.port)
    assert "is not a RabbitMQ management API" in lines[0]
    assert SECRET not in result.stderr
