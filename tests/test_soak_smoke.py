"""``make soak`` in small: one minute of the soak's traffic on a private node, every bound held.

The full run (``python -m devtools.soak``, 30 minutes) is too long for the
suite; this runs the same :class:`devtools.soak.Soak` for one minute with
short expiries (so the broker is back at its baseline within about 20 s of
the end), a sample every 5 s and a connection kill every 20 s. It checks
that the harness itself works end to end, and the bounds on a short run:
no layer call raised through the kills, nothing hung, no thread or file
descriptor piled up, and the broker's objects stayed within what the
traffic keeps alive and went away after it.
"""

import json
import os

import pytest

from devtools.rabbitmq import Broker
from devtools.soak import Soak, SoakConfig

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.heavy]


def test_a_one_minute_soak_holds_every_bound(node, tmp_path):
    config = SoakConfig(
        minutes=1,
        out=str(tmp_path),
        rate=100,
        expiry=3,
        group_expiry=5,
        consumer_idle_timeout=3,
        kill_every=20,
        sample_every=5,
        seed=1,
    )
    broker = Broker(node.amqp_url, node.management_url, node, "node", repr(node))
    soak = Soak(config, broker, node, say=print)
    bounds = soak.run()
    paths = soak.write(bounds)
    table = soak.table(bounds)
    print(table)
    failed = [bound.name for bound in bounds if not bound.ok]
    assert not failed, "bounds failed: %s\n%s" % (failed, table)
    assert soak.killer is not None and len(soak.killer.kill_times) >= 2, table
    with open(paths["summary"]) as handle:
        summary = json.load(handle)
    assert summary["passed"] is True
    assert summary["counts"]["direct received"] > 0
    assert os.path.getsize(paths["samples"]) > 0
