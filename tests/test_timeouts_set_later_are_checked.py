"""Every wait ends: ``receive_timeout`` and ``operation_timeout`` set later are checked too.

The constructor refuses a receive_timeout that is not a positive, finite
number. The ``receive_timeout`` property's setter passed any value on to
the receiver: ``inf`` made a blocking receive wait for ever (measured: it
was still waiting, the layer otherwise working), and None failed only at
the next receive, blocking or not. Now the setter is a ValueError that
names the setting, and the old value stays. ``operation_timeout``'s setter
had the same gap, and set only the sender's copy: the engine's waits for
the I/O thread kept the constructor's value. No broker is contacted.
"""

import math
import time

import pytest

from asgi_amqp.errors import OperationTimeout
from asgi_amqp.layer import AMQPChannelLayer


@pytest.fixture
def layer(silent_broker):
    # No dead-letter worker: its connect to the silent broker cannot be
    # interrupted, and close() would wait 10 s for it.
    layer = AMQPChannelLayer(
        url=silent_broker.amqp_url,
        receive_timeout=3,
        operation_timeout=4,
        dead_letter_worker=False,
    )
    yield layer
    layer.close()


@pytest.mark.parametrize(
    "value", [math.inf, -math.inf, math.nan, 0, 0.0, -1, None, "10", True, [5]], ids=repr
)
def test_a_receive_timeout_that_would_not_end_a_wait_is_a_value_error(layer, value):
    with pytest.raises(ValueError, match="receive_timeout"):
        layer.receive_timeout = value
    assert layer.receive_timeout == 3


@pytest.mark.parametrize("value", [0.001, 0.5, 2, 3600.0])
def test_a_positive_finite_receive_timeout_is_kept(layer, value):
    layer.receive_timeout = value
    assert layer.receive_timeout == value
    assert layer.receiver.timeout == value


@pytest.mark.parametrize(
    "value", [math.inf, -math.inf, math.nan, 0, 0.0, -1, None, "10", True, [5]], ids=repr
)
def test_an_operation_timeout_that_would_not_end_a_wait_is_a_value_error(layer, value):
    with pytest.raises(ValueError, match="operation_timeout"):
        layer.operation_timeout = value
    assert layer.operation_timeout == 4
    assert layer.sender.operation_timeout == 4


def test_an_operation_timeout_set_later_bounds_the_waits_for_the_broker(layer):
    layer.operation_timeout = 0.5
    assert layer.operation_timeout == 0.5
    assert layer.sender.operation_timeout == 0.5
    # The silent broker never answers: a send gives up after the new value.
    started = time.monotonic()
    with pytest.raises(OperationTimeout):
        layer.send("a", {"n": 1})
    assert time.monotonic() - started < 3
