"""The ``twisted`` extension on a real reactor.

Daphne's native mode is covered end to end in tests/e2e; these pin the
contract of ``receive_twisted`` itself. A reactor cannot be restarted in one
process, so the reactor half runs in a child interpreter.
"""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import json, sys
    from twisted.internet import reactor
    from asgi_amqp import AMQPChannelLayer

    url, management_url, prefix = sys.argv[1:4]
    layer = AMQPChannelLayer(url=url, management_url=management_url, prefix=prefix,
                             receive_timeout=1)
    results = {}

    def fired_on_reactor_thread():
        import threading
        return threading.current_thread() is threading.main_thread()

    def step(name, deferred, then):
        def record(value):
            results[name] = [list(value), fired_on_reactor_thread()]
            then()
        def failed(failure):
            results[name] = ["error", repr(failure.value)]
            then()
        deferred.addCallbacks(record, failed)

    def finish():
        layer.flush()
        layer.close()
        reactor.stop()

    def timed_out():
        step("timeout", layer.receive_twisted(["tw.empty"]), finish)

    def from_generator():
        names = (name for name in ["tw.other", "tw.gen"])
        step("generator", layer.receive_twisted(names), timed_out)

    def start():
        layer.send("tw.gen", {"text": "hello"})
        step("nothing", layer.receive_twisted([]), from_generator)

    reactor.callWhenRunning(start)
    reactor.callLater(30, reactor.stop)
    reactor.run()
    print(json.dumps(results))
""")


def run_child(script, broker, *args, timeout=60):
    """Run ``script`` in a child interpreter (its own reactor); its last line, as JSON."""
    prefix = "tw-%s" % uuid.uuid4().hex[:10]
    done = subprocess.run(
        [sys.executable, "-c", script, broker.amqp_url, broker.management_url or "", prefix]
        + [str(arg) for arg in args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def test_receive_twisted_fires_on_the_reactor_thread(broker):
    results = run_child(CHILD, broker)
    # An empty collection: (None, None) at once, as a plain receive gives.
    assert results["nothing"] == [[None, None], True]
    # A one-shot iterable of names is read once, and the message is found.
    assert results["generator"] == [["tw.gen", {"text": "hello"}], True]
    # receive_timeout passes: daphne gets (None, None) and asks again.
    assert results["timeout"] == [[None, None], True]


def test_receive_twisted_refuses_bad_names_in_the_caller(broker, new_layer):
    layer = new_layer(broker)
    with pytest.raises(TypeError):
        layer.receive_twisted(["bad name"])
    with pytest.raises(TypeError):
        layer.receive_twisted("tw.a")
    assert layer.threads() == [], "a refused call must not connect"


# daphne's reply reader: one receive_twisted after another on its process's
# queue. Messages the consumer was already pushed are taken on the reactor
# thread, without a trip through a pool thread each.
DRAIN_CHILD = textwrap.dedent("""
    import json, sys, threading
    from twisted.internet import reactor, threads
    from asgi_amqp import AMQPChannelLayer, twisted_support

    url, management_url, prefix, count = sys.argv[1:5]
    count = int(count)
    layer = AMQPChannelLayer(url=url, management_url=management_url, prefix=prefix,
                             receive_timeout=1, capacity=10000)
    hops = []
    real_defer_to_thread = threads.deferToThread

    def counting_defer_to_thread(*args, **kwargs):
        hops.append(1)
        return real_defer_to_thread(*args, **kwargs)

    twisted_support.threads.deferToThread = counting_defer_to_thread
    got, off_thread = [], []

    def read(result=None):
        if result is not None:
            if threading.current_thread() is not threading.main_thread():
                off_thread.append(1)
            if result[0] is not None:
                got.append([result[0], result[1]["n"]])
        if len(got) >= count:
            layer.close()
            reactor.stop()
            return
        layer.receive_twisted(["tw.reply!"]).addCallbacks(read, failed)

    def failed(failure):
        print(json.dumps({"error": repr(failure.value)}))
        reactor.stop()

    def start():
        # A first, empty receive starts the consumer; then the burst arrives.
        layer.receive(["tw.reply!"], block=True)
        for n in range(count):
            layer.send("tw.reply!%s" % ("a" if n % 2 else "b"), {"n": n})
        read()

    reactor.callWhenRunning(start)
    reactor.callLater(60, reactor.stop)
    reactor.run()
    print(json.dumps({"got": got, "hops": len(hops), "off_thread": len(off_thread)}))
""")


def test_daphne_drains_what_was_pushed_without_a_pool_thread_each(broker):
    count = 400
    results = run_child(DRAIN_CHILD, broker, count, timeout=90)
    assert "error" not in results, results
    got = results["got"]
    # Nothing lost or repeated, each channel in its order, all on the reactor thread.
    assert sorted(n for _, n in got) == list(range(count))
    for channel in ("tw.reply!a", "tw.reply!b"):
        numbers = [n for name, n in got if name == channel]
        assert numbers == sorted(numbers), channel
    assert results["off_thread"] == 0
    # Each pool-thread receive waits for the consumer's next push, which
    # brings up to a window of messages (16): most are taken held.
    assert results["hops"] < count / 2, results["hops"]
