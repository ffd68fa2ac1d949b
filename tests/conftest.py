"""Fixtures of the tests under tests/ (the session ``broker`` is the repository's conftest.py).

* ``new_layer(broker_or_url, flush=False, **config)``: a layer on a prefix of
  its own (helpers.make_layer), closed after the test, flushed first if made
  with ``flush=True``; ``module_layer`` is the same for module fixtures;
* ``silent_broker``: a helpers.SilentBroker, one per module;
* ``node``: a private RabbitMQ node, one per module, for tests that break it;
* ``cli_prefix``, ``cli_env``, ``cli_layer``: a prefix, the environment of
  the ``asgi-amqp`` command on it (``helpers.run_cli``), and a layer on it.
"""

import logging
import threading
import uuid

import pytest

from helpers import LayerFactory, SilentBroker, private_node, wait_until


def _layer_factory():
    """layer(broker_or_url, flush=False, **config): closed at teardown (flushed first
    with flush=True)."""
    with LayerFactory() as factory:
        yield factory


new_layer = pytest.fixture(_layer_factory, name="new_layer")
module_layer = pytest.fixture(_layer_factory, scope="module", name="module_layer")


@pytest.fixture(scope="module")
def silent_broker():
    with SilentBroker() as sink:
        yield sink


@pytest.fixture(scope="module")
def node():
    with private_node() as node:
        yield node


# -- the command line ----------------------------------------------------------------------


@pytest.fixture
def cli_prefix():
    """A prefix of the test's own for the asgi-amqp command."""
    return "cli-%s" % uuid.uuid4().hex[:10]


@pytest.fixture
def cli_env(broker, cli_prefix, tmp_path, monkeypatch):
    """The environment the command runs with: the broker and ``ASGI_AMQP_PREFIX``;
    the current directory is the test's own (a send from stdin writes its
    rejects file there)."""
    monkeypatch.chdir(tmp_path)
    return {
        "AMQP_URL": broker.amqp_url,
        "AMQP_MANAGEMENT_URL": broker.management_url,
        "ASGI_AMQP_PREFIX": cli_prefix,
    }


@pytest.fixture
def cli_layer(broker, cli_prefix, new_layer):
    """A layer on the command's prefix (to check what it did), flushed afterwards."""
    return new_layer(broker, flush=True, prefix=cli_prefix)


@pytest.fixture(autouse=True)
def _logging_untouched():
    """Logging as it was before each test: the ``asgi-amqp`` command, run
    in-process, configures logging for its process (root level and handler,
    pika's level), which must not hide records from the tests after it."""
    root, pika_logger = logging.getLogger(), logging.getLogger("pika")
    saved = root.level, list(root.handlers), pika_logger.level
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    pika_logger.setLevel(saved[2])


# -- threads the layer starts stop on close() -----------------------------------------------


def _layer_threads():
    return {t for t in threading.enumerate() if t.name.startswith("asgi_amqp-") and t.is_alive()}


@pytest.fixture(scope="module", autouse=True)
def _no_layer_thread_outlives_its_module():
    """Every thread a layer starts (I/O, dead-letter worker) ends when the
    layer is closed. A module that leaves one running leaked a layer, or
    the layer lost track of a thread; either way its reconnect attempts
    would log into the tests after it."""
    before = _layer_threads()
    yield
    stopped = wait_until(lambda: not (_layer_threads() - before), 10.0, raise_on_timeout=False)
    assert stopped, "threads still running after the module: %s" % sorted(
        t.name for t in _layer_threads() - before
    )
