"""The scenarios. Each is a registry entry; contestants implement them.

To add one (say round-trip latency): register a ``Scenario`` here with a
runner (``harness.run_sequential``, or a new runner for threads or for
latencies measured inside ``op``) and give the contestants that should take
part a ``scenario_<name>(env, ops)`` method returning a ``harness.Trial``.
"""

import msgpack

from .harness import Scenario, register_scenario, run_sequential

MESSAGE_BYTES = 200


def _message(size=MESSAGE_BYTES):
    """A Channels-like http.request dict whose msgpack encoding is ``size`` bytes."""
    message = {
        "reply_channel": "daphne.response.kT3xQ9bLpW!Vd2sZr8YmNcA",
        "http_version": "1.1",
        "method": "POST",
        "path": "/chat/lobby/",
        "query_string": b"",
        "headers": [[b"host", b"localhost:8000"], [b"content-type", b"application/json"]],
        "order": 0,
        "body": b"",
    }
    base = len(msgpack.packb(message, use_bin_type=True))
    body = b"x" * max(0, size - base)
    message["body"] = body
    # bin8/bin16 headers differ in length: trim until the size is exact.
    while len(msgpack.packb(message, use_bin_type=True)) > size and body:
        body = body[:-1]
        message["body"] = body
    return message


MESSAGE = _message()
MESSAGE_SIZE = len(msgpack.packb(MESSAGE, use_bin_type=True))

SEND = register_scenario(Scenario(
    name="send",
    title="(a) send, 1 thread, %d-byte dict, broker-confirmed" % MESSAGE_SIZE,
    metric="send/s",
    runner=run_sequential,
    description=(
        "One thread sends the same %d-byte msgpack-able dict ops times to one "
        "channel; each call returns once the broker has confirmed the message. "
        "Raw pika: BlockingConnection, confirm_delivery(), basic_publish("
        "mandatory=True) to a pre-declared queue, one confirm per message. "
        "After each round the queue must hold exactly ops messages." % MESSAGE_SIZE),
))

RECEIVE = register_scenario(Scenario(
    name="receive",
    title="(c) non-blocking receive, 1 full channel",
    metric="recv/s",
    runner=run_sequential,
    description=(
        "The channel is filled with ops messages (untimed), then one thread "
        "calls a non-blocking receive ops times; every call must return a "
        "message. Raw pika: basic_get(auto_ack=False) + basic_ack, the same "
        "at-least-once guarantee, plus msgpack decoding of the body."),
))
