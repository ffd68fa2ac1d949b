"""No connection of any kind before the command's settings are valid.

Issue 42: ``AMQP_URL='amqp:/deploy:pw@127.0.0.1:5682/%2F'`` was refused
cleanly, but only after a ``GET /api/overview`` to the management API (the
existing queues' capacities are read before the layer checked the URL).
Two listening sockets stand in for the AMQP port and the management API,
and count every connection made to them.
"""

import socket

import pytest

from helpers import run_cli

MALFORMED = [
    "amqp:/deploy:pw@127.0.0.1:{amqp}/%2F",  # one slash: no host
    "amqp://deploy:pw@127.0.0.1:{amqp}/%2F?heartbeat_interval=3",  # a key pika refuses
]


class Listener(object):
    """A socket on a free loopback port that records whether anyone connected."""

    def __init__(self):
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(8)
        self._socket.setblocking(False)
        self.port = self._socket.getsockname()[1]

    def connected(self):
        """True if a connection is waiting to be accepted (the kernel took it)."""
        try:
            connection, _ = self._socket.accept()
        except BlockingIOError:
            return False
        connection.close()
        return True

    def close(self):
        self._socket.close()


@pytest.fixture
def listeners():
    amqp, management = Listener(), Listener()
    yield amqp, management
    amqp.close()
    management.close()


@pytest.mark.parametrize("url", MALFORMED, ids=["one-slash", "unknown-key"])
@pytest.mark.parametrize(
    "command", [["send", "a.b", "{}"], ["send", "--from", "-"], ["peek", "a.b"], ["stats"]]
)
def test_a_malformed_url_makes_no_connection(listeners, url, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    amqp, management = listeners
    env = {
        "AMQP_URL": url.format(amqp=amqp.port),
        "AMQP_MANAGEMENT_URL": "http://deploy:pw@127.0.0.1:%d/" % management.port,
    }
    result = run_cli(command, env=env, input='{"channel": "a.b", "message": {}}\n')
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("asgi-amqp: error: ") and "URL" in result.stderr
    assert "pw" not in result.stderr.replace("heartbeat_interval", "")
    assert not amqp.connected(), "an AMQP connection before the URL was checked"
    assert not management.connected(), "a management API request before the URL was checked"


def test_a_rejects_file_that_cannot_be_written_stops_before_any_connection(listeners, tmp_path):
    amqp, management = listeners
    source = tmp_path / "lines.jsonl"
    source.write_text('{"channel": "a.b", "message": {}}\n')
    env = {
        "AMQP_URL": "amqp://guest:guest@127.0.0.1:%d/%%2F" % amqp.port,
        "AMQP_MANAGEMENT_URL": "http://127.0.0.1:%d/" % management.port,
    }
    missing = str(tmp_path / "no-such-folder" / "lines.rejects")
    result = run_cli(["send", "--from", str(source), "--rejects", missing], env=env)
    assert result.exit_code == 2, result.stderr
    assert "cannot write the rejects file %s" % missing in result.stderr
    assert not amqp.connected() and not management.connected()
