"""Fixtures of the tests under tests/ (the session ``broker`` is the repository's conftest.py).

* ``new_layer(broker_or_url, flush=False, **config)``: a layer on a prefix of
  its own (helpers.make_layer), closed after the test, flushed first if made
  with ``flush=True``; ``module_layer`` is the same for module fixtures;
* ``silent_broker``: a helpers.SilentBroker, one per module;
* ``node``: a private RabbitMQ node, one per module, for tests that break it.
"""

import pytest

from helpers import LayerFactory, SilentBroker, private_node


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
