"""devtools/pythons.py and its part in make test, without building a root.

The builds themselves run in make test (devtools/test_brokers.py), where
every line they print is read.
"""

import pytest

from devtools import pythons, test_brokers


def test_the_root_gets_the_broker_and_none_of_the_machines_paths(monkeypatch):
    monkeypatch.setenv("AMQP_URL", "amqp://127.0.0.1:5999/")
    monkeypatch.setenv("ASGI_AMQP_NO_BROKER", "1")
    monkeypatch.setenv("ASGI_AMQP_RABBITMQ_SERVER_DIR", "/somewhere/on/the/machine")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("SOME_SECRET", "x")
    env = pythons._root_environ({"EXTRA": "1"})
    assert env["AMQP_URL"] == "amqp://127.0.0.1:5999/"
    assert env["ASGI_AMQP_NO_BROKER"] == "1" and env["EXTRA"] == "1"
    assert "ASGI_AMQP_RABBITMQ_SERVER_DIR" not in env
    assert "PIP_FIND_LINKS" not in env and "SOME_SECRET" not in env
    assert env["PIP_CERT"] == pythons.ROOT_CA
    assert env["PATH"].startswith(pythons.VENV + "/bin:")


def test_a_command_runs_in_the_checkout_inside_a_private_mount_namespace(monkeypatch):
    monkeypatch.setenv(pythons.DIR_VARIABLE, "/var/tmp/roots")
    line = pythons._in_root("3.9", ["python", "-V"], {})
    assert line[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = line[-1]
    assert "mount --bind %s /var/tmp/roots/bullseye%s" % (pythons.HERE, pythons.HERE) in script
    assert "exec chroot /var/tmp/roots/bullseye" in script


def test_an_unknown_version_is_named():
    with pytest.raises(pythons.PythonUnavailable, match="3.9, 3.13"):
        pythons.root_dir("3.7")


@pytest.mark.parametrize("required", [False, True])
def test_a_python_that_cannot_be_built_is_named_and_fails_only_if_required(monkeypatch, required):
    def cannot(version):
        raise pythons.PythonUnavailable("building a Debian root needs root")

    monkeypatch.setattr(pythons, "build", cannot)
    kind = test_brokers.Kind("debian", {})
    failed, counts, lines = test_brokers.run_other_python("3.13", kind, "RabbitMQ x", required)
    assert failed is required and counts == {}
    assert lines[0].startswith("not run: Python 3.13: building a Debian root needs root")
    assert ("ASGI_AMQP_REQUIRE_PYTHONS" in lines[0]) is required
