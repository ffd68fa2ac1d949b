"""``group_add`` skips the declares of the member exchanges its process made
lately, and makes again whatever went.

A process remembers the member exchanges it declared and bound to their
queue (``asgi_amqp.groups.MemberExchanges``), and a later ``group_add``
binds the membership without declaring them again. What those skipped
calls did besides their answer: nothing. What can go wrong: the exchange
went meanwhile, with its queue. Each test removes an object behind the
process's back (a member exchange's queue, a group exchange, everything
by a flush) and checks that the next ``group_add`` still makes a
membership that a group message reaches.
"""

import pika
import pytest

from helpers import Management

pytestmark = pytest.mark.slow


def _delete(broker, exchange=None, queue=None):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        channel = connection.channel()
        if exchange:
            channel.exchange_delete(exchange)
        if queue:
            channel.queue_delete(queue)
    finally:
        connection.close()


def _reaches(layer, group, reader, expected_channel):
    layer.send_group(group, {"to": group})
    assert layer.receive([reader], block=True) == (expected_channel, {"to": group})


@pytest.mark.parametrize("channel, reader", [("made.normal", "made.normal"), ("made!x", "made!")])
def test_a_second_group_add_skips_the_declares_it_made(broker, new_layer, channel, reader):
    layer = new_layer(broker, flush=True, group_expiry=60)
    layer.group_add("made", channel)
    member = layer.topology.membership_binding(channel, layer.topology.lease_stamp())[0]
    assert layer.groups._member_exchanges.made_lately(member)
    layer.group_add("made", channel)
    _reaches(layer, "made", reader, channel)


@pytest.mark.parametrize("channel, reader", [("gone.normal", "gone.normal"), ("gone!x", "gone!")])
def test_a_group_exchange_deleted_elsewhere_is_made_again(broker, new_layer, channel, reader):
    """Another process's discard of the last member, or a lease's end, deletes
    the (auto-delete) group exchange: this process's next group_add is
    refused (404) and makes it, and its binding from the router, again."""
    layer = new_layer(broker, flush=True, group_expiry=60)
    other = new_layer(broker, prefix=layer.topology.prefix, group_expiry=60)
    layer.group_add("went", "gone.keeper")
    other.group_discard("went", "gone.keeper")  # the last member: the exchange goes
    exchanges = Management(broker).exchange_names(layer.topology.prefix + ":")
    assert layer.topology.group_exchange("went") not in exchanges
    layer.group_add("went", channel)
    _reaches(layer, "went", reader, channel)
    assert layer.group_channels("went") == [channel]


@pytest.mark.parametrize("channel, reader", [("re.normal", "re.normal"), ("re!x", "re!")])
def test_a_renewal_skips_the_group_declares_and_remakes_them_when_they_went(
    broker, new_layer, channel, reader
):
    """A renewal of a membership this process made does not declare the
    group's exchange nor bind it to the router: the membership's own live
    binding keeps that auto-delete exchange. When that binding went behind
    the process's back (a discard elsewhere, the last member: the exchange
    went with it), the renewal is refused (404) and makes everything again."""
    layer = new_layer(broker, flush=True, group_expiry=60)
    other = new_layer(broker, prefix=layer.topology.prefix, group_expiry=60)
    topology = layer.topology
    layer.group_add("renewed", channel)
    assert layer.groups._renewing("renewed", channel)
    steps = layer.groups._membership_steps("renewed", channel, topology.lease_stamp(), True)
    group_exchange = topology.group_exchange("renewed")
    # Neither the group exchange's declare nor its binding to the router:
    assert not [
        step
        for step in steps
        if group_exchange in (step.kwargs.get("exchange"), step.kwargs.get("destination"))
    ], steps
    layer.group_add("renewed", channel)  # the renewal: the binding alone
    _reaches(layer, "renewed", reader, channel)
    other.group_discard("renewed", channel)  # the last member: the exchange goes
    exchanges = Management(broker).exchange_names(topology.prefix + ":")
    assert topology.group_exchange("renewed") not in exchanges
    assert layer.groups._renewing("renewed", channel)  # the process cannot know
    layer.group_add("renewed", channel)
    _reaches(layer, "renewed", reader, channel)
    assert layer.group_channels("renewed") == [channel]
    layer.group_discard("renewed", channel)
    assert not layer.groups._renewing("renewed", channel)


def test_a_member_exchange_gone_with_its_queue_is_made_again(broker, new_layer):
    """A normal channel's member exchange is auto-delete and bound only to its
    queue: when the queue goes (expired, deleted), so does the exchange."""
    layer = new_layer(broker, flush=True, group_expiry=60)
    layer.group_add("first", "queue.went")
    topology = layer.topology
    _delete(broker, queue=topology.channel_queue("queue.went"))
    layer.group_add("second", "queue.went")
    _reaches(layer, "second", "queue.went", "queue.went")


def test_a_flush_elsewhere_forgets_nothing_that_matters(broker, new_layer):
    """Everything under the prefix deleted by another process's flush: the
    process's memory of what it made is wrong for all of it at once."""
    layer = new_layer(broker, flush=True, group_expiry=60)
    other = new_layer(broker, prefix=layer.topology.prefix, group_expiry=60)
    layer.group_add("flushed", "fl!a")
    layer.group_add("flushed", "fl.b")
    other.flush()
    layer.group_add("flushed", "fl!a")
    layer.group_add("flushed", "fl.b")
    layer.send_group("flushed", {"to": "flushed"})
    assert layer.receive(["fl!"], block=True) == ("fl!a", {"to": "flushed"})
    assert layer.receive(["fl.b"], block=True) == ("fl.b", {"to": "flushed"})


def _record_broker_calls(layer):
    """Wrap the groups' engine calls: each ``declare`` as its list of steps,
    each ``start_publishes`` as ``"publish"``, in the order they were made."""
    calls = []
    engine = layer.groups._engine
    declare, start_publishes = engine.declare, engine.start_publishes

    def recording_declare(steps, what):
        calls.append(list(steps))
        return declare(steps, what)

    def recording_start_publishes(requests):
        calls.append("publish")
        return start_publishes(requests)

    engine.declare = recording_declare
    engine.start_publishes = recording_start_publishes
    return calls


def test_a_normal_channels_group_add_is_two_round_trips(broker, new_layer):
    """The lease and, when its member exchange is to be made, the channel's
    queue are started together; then one run of steps whose only answered
    step ends it. A renewal's run ends with the queue's answered declare,
    which renews its lease and vouches for the binding sent before it."""
    layer = new_layer(broker, flush=True, group_expiry=60)
    queue = layer.topology.channel_queue("trips.normal")
    layer.groups.ensure_infrastructure()  # once per process
    calls = _record_broker_calls(layer)
    layer.group_add("trips", "trips.normal")  # nothing was ever sent to it
    assert calls[0] == "publish"  # the lease, then the queue while it is in flight
    assert [step.method for step in calls[1]] == ["queue_declare"]
    run = calls[2]
    assert len(calls) == 3, calls
    assert [step.answered for step in run] == [False] * len(run), run  # the last one ends it
    assert run[-1].method == "exchange_bind"
    _reaches(layer, "trips", "trips.normal", "trips.normal")
    del calls[:]
    layer.groups._bound.clear()  # a later stamp's renewal, as another process would make it
    layer.groups._leases_sent.clear()
    layer.group_add("trips", "trips.normal")
    assert calls[0] == "publish" and len(calls) == 2, calls
    run = calls[1]
    assert run[-1].method == "queue_declare" and run[-1].kwargs["queue"] == queue
    assert [step.answered for step in run[:-1]] == [False] * (len(run) - 1), run
    _reaches(layer, "trips", "trips.normal", "trips.normal")
