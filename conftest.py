"""Repository-wide pytest set-up: a real RabbitMQ broker for the test session.

The session fixture ``broker`` yields a :class:`devtools.rabbitmq.Broker`:

* ``$AMQP_URL`` (and ``$AMQP_MANAGEMENT_URL``) if set;
* else a ``rabbitmq:3-management`` container if a Docker engine answers;
* else a private RabbitMQ node (``rabbitmq-server`` must be installed; as root,
  ``make broker-deps`` installs it), deleted at the end of the session.

Tests that break the broker on purpose (kill it, stop_app, close connections)
are marked ``faults`` and start a private :class:`devtools.rabbitmq.RabbitNode`
of their own, never the session broker (``tests/conftest.py``'s ``node``
fixture, next to its layer and fake-broker fixtures; ``tests/helpers.py`` has
the rest the tests share).

Tests that need a broker are marked ``broker``: here, every test that uses
the ``broker`` or ``node`` fixture or is marked ``faults``; by hand, the few
that start a node another way. Tests that need the spark or channels extra
are marked ``extras`` by hand. ``make check`` runs the rest (``-m 'not
broker and not extras'``) with ``ASGI_AMQP_NO_BROKER`` set, under which a
node that starts is an error (devtools.rabbitmq.refuse_if_no_broker): a
broker test that is not marked fails there rather than starting one.
"""

import contextlib
import signal
import threading

import pytest

from asgi_amqp.urls import redact
from devtools.rabbitmq import provide_broker


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes seconds (starts extra broker nodes, waits for expiry, ...)"
    )
    config.addinivalue_line(
        "markers",
        "faults: injects broker faults (kill, stop_app, close connections); needs a private node",
    )
    config.addinivalue_line(
        "markers",
        "broker: needs a RabbitMQ broker (make check runs the tests without this marker)",
    )
    config.addinivalue_line(
        "markers",
        "heavy: loads the machine for long (a whole stack, a cluster, a storm): make test "
        "never runs two at once (devtools/test_brokers.py)",
    )
    config.addinivalue_line(
        "markers",
        "alone: timing targets set on a quiet machine (a chat at 10 messages/s per client, a "
        "connect storm): make test runs these with no other test beside them",
    )
    config.addinivalue_line(
        "markers",
        "extras: needs the spark or channels extra, which make check neither installs nor runs",
    )
    # A SIGTERM (CI timeout, `kill`) would end pytest without running fixture
    # teardown and leave the private broker node behind.  Turn it into a
    # KeyboardInterrupt, which pytest unwinds cleanly.
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


#: Fixtures that start or connect to a broker.
_BROKER_FIXTURES = frozenset(["broker", "node"])


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config, items):
    """Mark ``broker`` every test that uses a broker fixture or is marked ``faults``."""
    for item in items:
        uses = _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if uses or item.get_closest_marker("faults"):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def broker(request):
    """The session's broker (a devtools.rabbitmq.Broker: amqp_url, management_url, owner)."""
    with provide_broker() as found:
        where = redact(found.amqp_url)  # no password in the test log
        _announce(request.config, "broker: %s -> %s" % (found.description, where))
        yield found


def _announce(config, message):
    """Write one line to the terminal, past pytest's output capture."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    suspended = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with suspended:
        reporter.ensure_newline()
        reporter.write_line(message, cyan=True)
