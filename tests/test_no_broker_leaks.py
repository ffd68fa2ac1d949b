"""Nothing stays behind on the broker: everything a prefix made expires by itself.

Short-lived reply channels (``daphne.response.N?xyz``, one message each),
process-local channels (``daphne.response.pN!xyz``, one message each) and
groups with one member of each kind are made, then left alone. Within
``group_expiry`` plus 10 s of the last of them, the prefix's queue,
exchange and binding counts on the broker (management API) are back to
what they were before: only the router, the dead-letter exchange and queue
and their bindings remain.

The default run makes 1,000 channels, 100 groups and 100 process-local
channels; ``make leaks`` (``ASGI_AMQP_LEAK_SIZES=full``) makes 10,000,
1,000 and 1,000, which takes a few minutes on a shared 2-core machine:
RabbitMQ creates a durable queue in about 5 ms there.
"""

import os
import threading
import time
import uuid

import pytest

from helpers import Management, make_layer, wait_until

pytestmark = [pytest.mark.slow]

EXPIRY = 2.0  # channel queues go 2 x EXPIRY after their last use
GROUP_EXPIRY = 4.0
SETTLE = 10.0  # the promise: back to the baseline within GROUP_EXPIRY + SETTLE
SIZES = {"default": (1000, 100, 100), "full": (10000, 1000, 1000)}
WORKERS = 4  # layers (connections) making objects at once; they share the prefix
PROCESSES = 10  # process-local queues ("daphne.response.pN!") the local channels share


def _sizes():
    name = os.environ.get("ASGI_AMQP_LEAK_SIZES", "default")
    if name not in SIZES:
        raise ValueError("ASGI_AMQP_LEAK_SIZES must be one of %s" % ", ".join(SIZES))
    return SIZES[name]


class BrokerCounts(object):
    """The prefix's queues, exchanges and bindings, counted through the management API."""

    def __init__(self, broker, prefix):
        self._api = Management(broker)
        self._prefix = prefix + ":"

    def __call__(self):
        api, prefix = self._api, self._prefix
        queues = len(api.queue_names(prefix))
        exchanges = len(api.exchange_names(prefix))
        bindings = api._get("bindings/%s" % api._vhost, {"columns": "source,destination"}) or []
        touching = sum(
            1
            for binding in bindings
            if binding["source"].startswith(prefix) or binding["destination"].startswith(prefix)
        )
        return {"queues": queues, "exchanges": exchanges, "bindings": touching}


def _layers(broker, prefix):
    return [
        make_layer(
            broker,
            prefix=prefix,
            expiry=EXPIRY,
            group_expiry=GROUP_EXPIRY,
            capacity=1000,
            operation_timeout=60,
        )
        for _ in range(WORKERS)
    ]


def _make_objects(layer, index, channels, groups, local_channels):
    """This worker's share (every WORKERS-th item from ``index``) of the objects."""
    replies = [
        layer.new_channel("daphne.response.%d?" % (n % 7)) for n in range(index, channels, WORKERS)
    ]
    locals_ = [
        "daphne.response.p%d!%s" % (n % PROCESSES, uuid.uuid4().hex[:12])
        for n in range(index, local_channels, WORKERS)
    ]
    outcomes = layer.send_many((name, {"n": n}) for n, name in enumerate(replies + locals_))
    failed = [outcome for outcome in outcomes if outcome is not None]
    assert not failed, failed[:3]
    for position, group in enumerate(range(index, groups, WORKERS)):
        layer.group_add("room%d" % group, replies[position % len(replies)])
        layer.group_add("room%d" % group, locals_[position % len(locals_)])


def _in_parallel(layers, *sizes):
    errors = []

    def work(layer, index):
        try:
            _make_objects(layer, index, *sizes)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(layer, index), daemon=True)
        for index, layer in enumerate(layers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not [t for t in threads if t.is_alive()], "object creation did not finish"
    if errors:
        raise errors[0]


def test_channels_groups_and_local_channels_all_expire(broker):
    channels, groups, local_channels = _sizes()
    prefix = "leak-%s" % uuid.uuid4().hex[:8]
    layers = _layers(broker, prefix)
    counts = BrokerCounts(broker, prefix)
    try:
        for layer in layers:
            layer.send_group("nobody", {})  # the shared objects, declared once per layer
        baseline = counts()
        started = time.monotonic()
        _in_parallel(layers, channels, groups, local_channels)
        made = time.monotonic()
        peak = counts()
        assert peak["exchanges"] > baseline["exchanges"], (baseline, peak)
        assert peak["queues"] > baseline["queues"], (baseline, peak)
        samples = []

        def back_to_baseline():
            now = counts()
            samples.append((round(time.monotonic() - made, 1), now))
            return now == baseline

        returned = wait_until(
            back_to_baseline, GROUP_EXPIRY + SETTLE, interval=1.0, raise_on_timeout=False
        )
        assert returned, "not back to %s within %.0f s; last samples %s" % (
            baseline,
            GROUP_EXPIRY + SETTLE,
            samples[-3:],
        )
        print(
            "made %d channels, %d groups, %d local channels in %.1f s; peak %s; "
            "back to %s %.1f s later"
            % (channels, groups, local_channels, made - started, peak, baseline, samples[-1][0])
        )
    finally:
        for layer in layers:
            layer.close()
