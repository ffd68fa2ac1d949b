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


def test_receive_twisted_fires_on_the_reactor_thread(broker):
    prefix = "tw-%s" % uuid.uuid4().hex[:10]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, broker.amqp_url, broker.management_url or "", prefix],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    results = json.loads(done.stdout.decode().strip().splitlines()[-1])
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
