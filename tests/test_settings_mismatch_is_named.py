"""A queue that exists with other settings than the layer's gives a clear error.

Two layers share a prefix but not their settings: the first creates a
channel's queue (or the shared dead-letter queue), the second uses it. The
broker refuses the second's declare (406, "inequivalent arg"). Every call of
the second layer that needs the queue raises ``QueueSettingsMismatch``
within ``operation_timeout``, naming the channel or queue, the setting, both
values and the fix; none returns nothing silently or blames the network.
"""

import logging
import time
import uuid

import pytest

import asgi_amqp
from asgi_amqp import BrokerConnectionError, QueueSettingsMismatch
from asgi_amqp.errors import BrokerOperationError
from helpers import wait_until

OPERATION_TIMEOUT = 3.0
MARGIN = 1.5


@pytest.fixture
def prefix():
    return "mm-%s" % uuid.uuid4().hex[:10]


def _pair(new_layer, broker, prefix, first, second):
    """(the layer that creates the queues, the layer with other settings)."""
    common = dict(prefix=prefix, operation_timeout=OPERATION_TIMEOUT, receive_timeout=2)
    creator = new_layer(broker, flush=True, **dict(common, **first))
    other = new_layer(broker, **dict(common, **second))
    return creator, other


def _raises_mismatch(call, *args):
    started = time.monotonic()
    with pytest.raises(QueueSettingsMismatch) as caught:
        call(*args)
    took = time.monotonic() - started
    assert took < OPERATION_TIMEOUT + MARGIN, "%.1f s" % took
    return caught.value


def _says(error, *words):
    text = str(error)
    for word in words:
        assert word in text, (word, text)
    assert "use the same" in text and "delete" in text  # the fix
    assert "cannot reach" not in text and "going down" not in text


def test_the_exception_is_exported():
    assert asgi_amqp.QueueSettingsMismatch is QueueSettingsMismatch
    assert issubclass(QueueSettingsMismatch, BrokerOperationError)
    assert not issubclass(QueueSettingsMismatch, BrokerConnectionError)


def test_a_send_to_a_queue_full_at_a_smaller_capacity(broker, new_layer, prefix):
    creator, other = _pair(new_layer, broker, prefix, dict(capacity=2), dict(capacity=10))
    for n in range(2):
        creator.send("mm.full", {"n": n})
    error = _raises_mismatch(other.send, "mm.full", {"n": 2})
    _says(error, "'mm.full'", "capacity 2", "capacity 10", prefix)
    assert (error.channel, error.setting) == ("mm.full", "capacity")
    assert (error.existing_setting, error.requested_setting) == (2, 10)
    assert (error.argument, error.existing, error.requested) == ("x-max-length", 2, 10)
    assert error.reply_code == 406
    # The creator's own view is unchanged: for it, the channel is full.
    with pytest.raises(creator.ChannelFull):
        creator.send("mm.full", {"n": 3})


@pytest.mark.parametrize("block", [False, True], ids=["non-blocking", "blocking"])
def test_a_receive_from_a_queue_with_another_expiry(broker, new_layer, prefix, block):
    creator, other = _pair(new_layer, broker, prefix, dict(expiry=30), dict(expiry=60))
    creator.send("mm.expiry", {"n": 1})
    error = _raises_mismatch(other.receive, ["mm.expiry"], block)
    _says(error, "'mm.expiry'", "expiry 30", "expiry 60")
    assert (error.setting, error.existing_setting, error.requested_setting) == ("expiry", 30, 60)
    # Nothing was taken: the creator still receives the message.
    assert creator.receive(["mm.expiry"], block=True) == ("mm.expiry", {"n": 1})


def test_a_receive_over_several_channels_names_the_one_that_differs(broker, new_layer, prefix):
    creator, other = _pair(new_layer, broker, prefix, dict(capacity=5), dict(capacity=7))
    creator.send("mm.a", {"n": 1})
    error = _raises_mismatch(other.receive, ["mm.b", "mm.a", "mm.c"], True)
    assert error.channel == "mm.a" and "capacity 5" in str(error)


def test_send_many_and_group_add_name_the_mismatch(broker, new_layer, prefix):
    creator, other = _pair(new_layer, broker, prefix, dict(expiry=30), dict(expiry=45))
    creator.send("mm.group-member", {"n": 1})
    outcomes = other.send_many([("mm.group-member", {"n": n}) for n in range(3)])
    assert all(isinstance(o, QueueSettingsMismatch) for o in outcomes), outcomes
    error = _raises_mismatch(other.group_add, "mm-group", "mm.group-member")
    _says(error, "'mm.group-member'", "expiry 30", "expiry 45")


def test_quorum_after_classic_names_the_shared_dead_letter_queue(broker, new_layer, prefix, caplog):
    caplog.set_level(logging.DEBUG, logger="asgi_amqp")
    classic, quorum = _pair(
        new_layer, broker, prefix, dict(queue_type="classic"), dict(queue_type="quorum")
    )
    classic.group_add("mm-g", "mm.classic-member")  # creates the dead-letter queue as classic
    error = _raises_mismatch(quorum.group_add, "mm-g", "mm.quorum-member")
    _says(error, "dead-letter queue", "queue_type classic", "queue_type quorum", prefix)
    assert error.channel is None and error.setting == "queue_type"
    error = _raises_mismatch(quorum.send_group, "mm-g", {"n": 1})
    assert error.setting == "queue_type"

    workers = {thread.ident for thread in quorum.threads()}

    def worker_errors():  # of this layer's dead-letter worker (others may run in the process)
        return [
            r
            for r in caplog.records
            if r.thread in workers
            and r.name.endswith("deadletter")
            and r.levelno >= logging.WARNING
        ]

    found = wait_until(worker_errors, 10, message="the dead-letter worker's error")
    assert found[0].levelno == logging.ERROR
    assert "queue_type classic" in found[0].getMessage()
    # Formerly retried every 2 s forever: now once, then rarely and quietly.
    more = wait_until(lambda: len(worker_errors()) > 1, 5, raise_on_timeout=False)
    assert not more, [r.getMessage() for r in worker_errors()]


@pytest.mark.parametrize(
    "channel", ["mm!local", "mm.normal"], ids=["the last step of a run", "the first step"]
)
def test_group_add_names_the_step_of_its_chain_that_differs(broker, new_layer, prefix, channel):
    """group_add sends its steps in runs and waits once per run; when one of
    them is refused, the error still names that step's queue, and the layer
    goes on. A process-local member's queue is declared at the end of a run
    of nowait steps, a normal member's alone, first."""
    creator, other = _pair(new_layer, broker, prefix, dict(capacity=5), dict(capacity=7))
    creator.group_add("mm-chain", channel)
    queue = other.topology.channel_queue(channel)
    error = _raises_mismatch(other.group_add, "mm-chain", channel)
    assert "'%s'" % queue in str(error), str(error)
    _says(error, "capacity 5", "capacity 7")
    other.group_add("mm-fresh", "mm.fresh-member")
    other.send_group("mm-fresh", {"after": True})
    assert other.receive(["mm.fresh-member"]) == ("mm.fresh-member", {"after": True})
