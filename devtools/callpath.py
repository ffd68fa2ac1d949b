"""Every file of the package whose code runs during a layer call.

``python -m devtools.callpath`` runs each call below after a warm-up, on
``AMQP_URL`` or a broker of its own (``devtools.rabbitmq.provide_broker``):
``send`` (to a channel whose queue exists), ``receive`` (blocking, of a
message the consumer an earlier receive started has pushed: a worker's
steady state), ``group_add`` (a new channel's first membership) and
``expiry`` (the dead-letter worker ending a membership whose lease ran
out, from the ``group_add``'s return until the group is gone).

A profile function records, per thread, each ``asgi_amqp`` file in which a
function is called, returns, resumes after a return or calls a builtin:
``sys.setprofile`` on the caller's thread for the call, and
``threading.setprofile`` before the layer starts its threads, which then
carry it from their first line (it records only during a measure). A call
ends once the caller returned (a send once its publish is confirmed) and
every thread of the layer waits in its loop's pika poll again, with
nothing handed to it. No file is left out, no function replaced. The I/O
thread's own timers (the consumers' sweep and balance) are no call's: a
call one fell into is measured again. The calls' layer runs no dead-letter
worker (they do not involve it) and lingers long enough for the pushed
message to wait for the receive.
"""

import argparse
import contextlib
import functools
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Callable, Container, Dict, Iterator, List, Optional, Sequence

import pika
import pika.exceptions
from pika.adapters import select_connection

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from asgi_amqp.engine import deadletter
from asgi_amqp.engine.io import thread as io_thread
from devtools.rabbitmq import provide_broker

ROOT = os.path.dirname(os.path.abspath(asgi_amqp.__file__)) + os.sep
Call = Callable[[], Any]
#: The layer's threads: what the walks call them, and the function each rests
#: in (waiting in pika's poll).
THREADS: Dict[str, str] = {io_thread.THREAD_NAME: "I/O thread", deadletter.THREAD_NAME: "worker"}
LOOPS: Dict[str, CodeType] = {
    io_thread.THREAD_NAME: io_thread.IOThread._loop.__code__,
    deadletter.THREAD_NAME: deadletter.DeadLetterWorker._serve.__code__,
}
POLL = "poll"  # the name of every pika poller's wait
# What runs call_later's callbacks: a timer's call is no call's (``measure_call``).
TIMER = select_connection._Timer.process_timeouts.__code__  # type: ignore[attr-defined]
ATTEMPTS = 5
WAIT_SECONDS = 10.0
EXPIRY_SECONDS = 30.0


@dataclass
class Walk:
    """The package files a call ran, in the order each thread first ran them."""

    name: str
    threads: Dict[str, List[str]] = field(default_factory=dict)  # in order of first activity
    timers: int = 0  # the layer's timers that ran meanwhile
    attempts: int = 1

    @property
    def files(self) -> List[str]:
        """Every file once: the first thread's, then each next thread's new ones."""
        found: List[str] = []
        for files in self.threads.values():
            found.extend(name for name in files if name not in found)
        return found

    def ran_on(self, name: str) -> List[str]:
        return [thread for thread, files in self.threads.items() if name in files]


class Recorder(object):
    """The profile function: records the watched threads into ``walk`` while it is set."""

    def __init__(self) -> None:
        self.walk: Optional[Walk] = None
        self._watched: Dict[int, str] = {}  # thread ident -> its name in the walk
        self._names: Dict[str, Optional[str]] = {}  # code file -> package file, or None

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        walk = self.walk
        if walk is None:
            return
        thread = self._watched.get(threading.get_ident())
        if thread is None:
            return
        inside = self._note(walk, thread, frame)
        if event == "return" and frame.f_back is not None:  # the caller resumes
            self._note(walk, thread, frame.f_back)
        elif inside and event == "call" and frame.f_back and frame.f_back.f_code is TIMER:
            walk.timers += 1

    def _note(self, walk: Walk, thread: str, frame: FrameType) -> bool:
        filename = frame.f_code.co_filename
        if filename not in self._names:
            path = os.path.abspath(filename)
            self._names[filename] = path[len(ROOT) :] if path.startswith(ROOT) else None
        name = self._names[filename]
        if name is None:
            return False
        files = walk.threads.setdefault(thread, [])
        if name not in files:
            files.append(name)
        return True

    @contextlib.contextmanager
    def recording(self, name: str, watched: Dict[int, str]) -> Iterator[Walk]:
        self._watched, self.walk = watched, Walk(name)
        try:
            yield self.walk
        finally:
            self.walk = None

    @contextlib.contextmanager
    def starting_threads(self) -> Iterator[None]:
        """The threads started in the block carry the profile function."""
        threading.setprofile(self.profile)
        try:
            yield
        finally:
            threading.setprofile(None)


def _watched(layer: AMQPChannelLayer, names: Container[str]) -> Dict[int, str]:
    """The layer's threads among ``names``, by ident, with their names in the walks."""
    return {t.ident: THREADS[t.name] for t in layer.threads() if t.ident and t.name in names}


def _at_rest(frame: Optional[FrameType], loop: CodeType) -> bool:
    """Whether a thread waits in pika's poll, called from ``loop`` (no package frame between)."""
    if frame is None or frame.f_code.co_name != POLL:
        return False
    if frame.f_code.co_filename != select_connection.__file__:
        return False
    while frame is not None and not os.path.abspath(frame.f_code.co_filename).startswith(ROOT):
        frame = frame.f_back
    return frame is not None and frame.f_code is loop


def wait_at_rest(layer: AMQPChannelLayer) -> None:
    """Wait until every thread of ``layer`` is at rest and nothing is handed to it."""
    inbox = layer._engine._io._inbox  # type: ignore[union-attr]
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        handed = inbox._wakeup_sent  # read first: a rest seen after it follows the take
        frames = sys._current_frames()
        if not handed and all(
            _at_rest(frames.get(t.ident or 0), LOOPS[t.name]) for t in layer.threads()
        ):
            return
        time.sleep(0.001)
    raise RuntimeError("the layer's threads did not come to rest in %.0f s" % WAIT_SECONDS)


def measure_call(
    recorder: Recorder, name: str, layer: AMQPChannelLayer, prepare: Callable[[int], Call]
) -> Walk:
    """One call's walk, taken again while a timer of the layer's own falls into it.

    ``prepare(attempt)`` sets the call up, unmeasured, and returns it.
    """
    for attempt in range(ATTEMPTS):
        call = prepare(attempt)
        wait_at_rest(layer)
        watched = _watched(layer, THREADS)
        watched[threading.get_ident()] = "caller"
        with recorder.recording(name, watched) as walk:
            previous = sys.getprofile()
            sys.setprofile(recorder.profile)
            try:
                call()
            finally:
                sys.setprofile(previous)
            wait_at_rest(layer)
        if not walk.timers:
            walk.attempts = attempt + 1
            return walk
    raise RuntimeError("a timer fell into every one of %d %ss" % (ATTEMPTS, name))


def measure(url: str, management_url: Optional[str] = None) -> List[Walk]:
    """The walks of ``send``, ``receive``, ``group_add`` and ``expiry`` on ``url``."""
    prefix = "callpath%s" % secrets.token_hex(3)
    recorder = Recorder()
    layer = AMQPChannelLayer(
        url, prefix=prefix, management_url=management_url, dead_letter_worker=False, linger=30
    )
    expiring = AMQPChannelLayer(
        url, prefix=prefix + "x", management_url=management_url, group_expiry=1
    )
    try:
        with recorder.starting_threads():
            layer.send("callpath.s", {"n": -1})  # starts the threads, declares the queue
        send = functools.partial(layer.send, "callpath.s")
        walks = [measure_call(recorder, "send", layer, lambda n: functools.partial(send, {"n": n}))]
        layer.send("callpath.a", {"n": -1})
        layer.receive(["callpath.a"], block=True)  # starts the consumer
        walks.append(measure_call(recorder, "receive", layer, lambda n: _receive(layer, n)))
        layer.group_add("callpath", "callpath.a")  # the shared objects
        join = functools.partial(layer.group_add, "callpath")  # a new channel's first membership
        walks.append(
            measure_call(
                recorder, "group_add", layer, lambda n: functools.partial(join, "g.%d" % n)
            )
        )
        walks.append(_expiry(recorder, expiring, url))
    finally:
        for each in (layer, expiring):
            with contextlib.suppress(Exception):
                each.flush()
            each.close()
    return walks


def _receive(layer: AMQPChannelLayer, n: int) -> Call:
    """A receive of a message sent before it, which the consumer has pushed."""
    layer.send("callpath.a", {"n": n})
    time.sleep(0.2)

    def receive() -> None:
        channel, message = layer.receive(["callpath.a"], block=True)
        if channel != "callpath.a" or message != {"n": n}:
            raise RuntimeError("the receive got %r, not the waiting message" % (message,))

    return receive


def _expiry(recorder: Recorder, layer: AMQPChannelLayer, url: str) -> Walk:
    """From a membership's ``group_add`` until the worker removed it."""
    with recorder.starting_threads():
        layer.group_add("callpath", "callpath.e")
    exchange = layer.topology.group_exchange("callpath")
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        with recorder.recording("expiry", _watched(layer, [deadletter.THREAD_NAME])) as walk:
            deadline = time.monotonic() + EXPIRY_SECONDS
            while _exists(connection, exchange):
                if time.monotonic() > deadline:
                    raise RuntimeError("no membership ended in %.0f s" % EXPIRY_SECONDS)
                time.sleep(0.05)
            wait_at_rest(layer)
    return walk


def _exists(connection: pika.BlockingConnection, exchange: str) -> bool:
    try:
        connection.channel().exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    return True


def report(walks: Sequence[Walk]) -> str:
    """Each walk: its count, then each file with the threads that ran it."""
    out = []
    for walk in walks:
        again = " (attempt %d: timers fell into the others)" % walk.attempts
        out.append("%s: %d files%s" % (walk.name, len(walk.files), again * (walk.attempts > 1)))
        for number, name in enumerate(walk.files, 1):
            out.append("  %2d. %-28s %s" % (number, name, ", ".join(walk.ran_on(name))))
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    with provide_broker() as broker:
        started = time.monotonic()
        walks = measure(broker.amqp_url, broker.management_url)
        took = time.monotonic() - started
    print(report(walks))
    print("measured in %.1f s" % took)
    return 0


if __name__ == "__main__":
    sys.exit(main())
