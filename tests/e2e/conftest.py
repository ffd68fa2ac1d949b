"""Fixtures for the end-to-end tests: the chat project (tests/project) run by
real daphne and runworker processes on the session broker.

Every test here is marked ``slow`` (module ``pytestmark``). Stacks use a
fresh layer prefix, free ports and temporary directories, and are stopped
(by pid) and flushed from the broker at the end.
"""

import pytest
from e2e_support import new_stack, run_stack

from helpers import make_layer


@pytest.fixture(scope="session")
def chat_stack(broker):
    """daphne + two runworkers, shared by the tests that do not break it."""
    with run_stack(new_stack(broker, workers=2)) as stack:
        yield stack


@pytest.fixture(scope="session")
def chat_layer(broker, chat_stack):
    """An AMQPChannelLayer on the shared stack's prefix (for group_channels)."""
    layer = make_layer(broker, prefix=chat_stack.prefix, dead_letter_worker=False)
    yield layer
    layer.close()
