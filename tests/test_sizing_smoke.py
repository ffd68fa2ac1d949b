"""``make sizing`` in small: the sizing families at tiny sizes on a private node.

``python -m devtools.sizing`` measures what the layer costs a RabbitMQ node
(docs/sizing.rst quotes its figures). This runs its families with a handful
of objects each, to check that the harness works end to end: every layer
opens three connections, a channel is one queue and a membership of a
process-local channel two, and the report renders. The figures themselves are not checked; at these
sizes they are noise.
"""

import pytest

from devtools.sizing import Sizing, markdown, parse_args, slope

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def test_slope_is_the_least_squares_fit():
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert slope([(0, 0), (10, 12), (20, 18)]) == pytest.approx(0.9)
    assert slope([(5, 1)]) == 0.0


def test_tiny_sizes_measure_every_family(node):
    args = parse_args(
        [
            "--layers",
            "2",
            "--channels",
            "20",
            "--members",
            "10",
            "--quorum",
            "0",
            "--messages",
            "0",
            "--idle-seconds",
            "0.1",
        ]
    )
    results = Sizing(args, say=lambda _text: None).measure(node)

    layers = results["layers"]["per_object"]
    assert layers["connections"] == pytest.approx(3)  # main, publishing, dead-letter worker
    assert layers["sockets"] >= 2  # the management API's own socket may come and go
    assert layers["amqp_channels"] > 3
    assert results["channels"]["per_object"]["queues"] == pytest.approx(1)
    # A membership is a binding and a lease message: no queue of its own, in
    # its first group or another.
    assert results["members"]["first_group"]["per_object"]["queues"] == pytest.approx(0)
    assert results["members"]["second_group"]["per_object"]["queues"] == pytest.approx(0)
    assert "quorum" not in results and "cpu" not in results

    text = markdown(results)
    for heading in ("## Layers", "## Channels", "## Group members"):
        assert heading in text
