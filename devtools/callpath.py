"""The files a layer call crosses, from the API to the wire.

``python -m devtools.callpath`` runs each call below once to warm up and
once measured, against ``AMQP_URL`` (prefixes of its own, flushed at the
end: only the shared objects a flush keeps stay), and prints for each the
distinct files of ``asgi_amqp`` on its path, their count, and the stack
lines they come from.

The path of a call is what is on the call stack when the call reaches the
wire, not every module it uses (a foundation called and returned from, such
as ``naming`` or ``serialization``, is not on it at that moment):

* the caller's stack when it hands work to the I/O thread
  (``engine.io.inbox.Inbox.put``, the one hand-over);
* the I/O thread's stack at each pika channel method it calls for that work
  (``basic_publish``, ``queue_declare``, ``exchange_bind``, ``basic_ack``...).

Only the caller's thread and the layer's I/O thread are recorded: the
dead-letter worker, or a second layer that sends a message for a receive
to wait for, does other work meanwhile. A membership's expiry starts in the
dead-letter worker instead: its path is that thread's stack, from the lease
it consumed to the unbind (and the ack of the lease) on the wire.

The calls:

``send``
    a send to a normal channel whose queue exists;
``receive``
    a blocking receive that waits on a consumer started by an earlier one
    (the steady state of a worker): its wire end is the consumer's delivery,
    which pika hands to the pool on the I/O thread, and that delivery's
    ``basic_ack``; a second layer sends the message while it waits;
``group_add``
    a normal channel's membership, renewed within its lease stamp;
``group_add new member``
    a normal channel's first membership (its lease message is published);
``group_add process-local``
    the same for a process-local channel (a join notice is published too);
``group_discard``
    a normal channel leaving a group;
``expiry``
    a membership's lease ends and the dead-letter worker unbinds it.
"""

import argparse
import contextlib
import os
import secrets
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set

import pika.channel

import asgi_amqp
from asgi_amqp import AMQPChannelLayer
from asgi_amqp.engine import deadletter
from asgi_amqp.engine.io import inbox
from asgi_amqp.engine.io import thread as io_thread

ROOT = os.path.dirname(os.path.abspath(asgi_amqp.__file__))

#: The pika channel methods that put something on the wire for a layer call.
WIRE_METHODS = (
    "basic_ack",
    "basic_consume",
    "basic_get",
    "basic_nack",
    "basic_publish",
    "exchange_bind",
    "exchange_declare",
    "exchange_delete",
    "exchange_unbind",
    "queue_bind",
    "queue_declare",
    "queue_delete",
    "queue_unbind",
)
IO_THREAD = io_thread.THREAD_NAME
DEAD_LETTER_THREAD = deadletter.THREAD_NAME
#: The most files a call may cross (the project's aim, asserted by its tests).
MOST_FILES = 6
#: How a stack line names the thread it was taken on (any other: the caller's).
_KINDS = {IO_THREAD: "io", DEAD_LETTER_THREAD: "dead-letter worker"}


@dataclass
class Path:
    """What one measured call crossed: the stack lines, and their files in order."""

    name: str
    lines: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)

    def add(self, where: str, stack: Sequence[traceback.FrameSummary]) -> None:
        frames = [frame for frame in stack if _inside(frame.filename)]
        if not frames:
            return
        line = "%s: %s" % (
            where,
            " > ".join("%s:%s" % (_relative(f.filename), f.name) for f in frames),
        )
        if line not in self.lines:
            self.lines.append(line)
        for frame in frames:
            name = _relative(frame.filename)
            if name not in self.files:
                self.files.append(name)


class Recorder(object):
    """Records the stacks of the threads it is told to watch, while a path is open.

    Installed by ``tracing``; hooks run on any thread, and only the watched
    ones (by ident) are recorded, under a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Optional[Path] = None
        self._threads: Set[int] = set()

    @contextlib.contextmanager
    def path(self, name: str, threads: Sequence[threading.Thread]) -> Iterator[Path]:
        """Record ``threads`` (idents) into a new ``Path`` for the block's length."""
        found = Path(name)
        with self._lock:
            self._path = found
            self._threads = {t.ident for t in threads if t.ident is not None}
        try:
            yield found
        finally:
            with self._lock:
                self._path = None
                self._threads = set()

    def note(self, where: str) -> None:
        """Record the current thread's stack if it is watched."""
        with self._lock:
            path = self._path
            if path is None or threading.get_ident() not in self._threads:
                return
            stack = traceback.extract_stack()[:-2]  # less this hook and its wrapper
            kind = _KINDS.get(threading.current_thread().name, "caller")
            path.add("%s %s" % (kind, where), stack)


@contextlib.contextmanager
def tracing() -> Iterator[Recorder]:
    """Hook ``Inbox.put`` and pika's channel methods; undone on exit."""
    recorder = Recorder()
    originals: Dict[str, Any] = {}
    original_put = inbox.Inbox.put

    def put(self: inbox.Inbox, works: Any) -> bool:
        recorder.note("Inbox.put")
        return original_put(self, works)

    def hooked(method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: pika.channel.Channel, *args: Any, **kwargs: Any) -> Any:
            recorder.note(method)
            return original(self, *args, **kwargs)

        return call

    inbox.Inbox.put = put  # type: ignore[method-assign]
    for method in WIRE_METHODS:
        originals[method] = getattr(pika.channel.Channel, method)
        setattr(pika.channel.Channel, method, hooked(method, originals[method]))
    try:
        yield recorder
    finally:
        inbox.Inbox.put = original_put  # type: ignore[method-assign]
        for method, original in originals.items():
            setattr(pika.channel.Channel, method, original)


def _inside(filename: str) -> bool:
    return os.path.abspath(filename).startswith(ROOT + os.sep)


def _relative(filename: str) -> str:
    return os.path.relpath(os.path.abspath(filename), ROOT)


def _thread(layer: AMQPChannelLayer, name: str) -> threading.Thread:
    for thread in layer.threads():
        if thread.name == name:
            return thread
    raise RuntimeError("the layer runs no thread %r" % name)


def measure(
    url: str, management_url: Optional[str] = None, expiry_wait: float = 30.0
) -> List[Path]:
    """Every call's path (see the module docstring), on the broker at ``url``.

    ``management_url`` (default: the layer's) is for the ``flush`` at the end."""
    prefix = "callpath%s" % secrets.token_hex(3)
    settings: Dict[str, Any] = dict(expiry=10, management_url=management_url)
    layer = AMQPChannelLayer(url, prefix=prefix, group_expiry=60, **settings)
    helper = AMQPChannelLayer(url, prefix=prefix, dead_letter_worker=False, **settings)
    expiring = AMQPChannelLayer(url, prefix=prefix + "x", group_expiry=2, **settings)
    paths: List[Path] = []
    try:
        with tracing() as recorder:
            layer.send("callpath.warm", {"n": 0})  # starts the threads
            watched = [threading.current_thread(), _thread(layer, IO_THREAD)]

            def measured(
                name: str, call: Callable[[], Any], warm: Optional[Callable[[], Any]] = None
            ) -> None:
                (warm or call)()  # the shared objects, the queue, the consumer, the stamp
                with recorder.path(name, watched) as path:
                    call()
                paths.append(path)

            measured("send", lambda: layer.send("callpath.a", {"n": 1}))
            measured("receive", lambda: _receive_while_sent(layer, helper, "callpath.r"))
            measured("group_add", lambda: layer.group_add("callpath", "callpath.b"))
            measured(
                "group_add new member",
                lambda: layer.group_add("callpath", "callpath.n2"),
                warm=lambda: layer.group_add("callpath", "callpath.n1"),
            )
            measured("group_add process-local", lambda: layer.group_add("callpath", "callpath.c!x"))
            measured("group_discard", lambda: layer.group_discard("callpath", "callpath.b"))
            paths.append(_expiry(recorder, expiring, expiry_wait))
    finally:
        for each in (layer, helper, expiring):
            with contextlib.suppress(Exception):
                each.flush()
            each.close()
    return paths


def _receive_while_sent(layer: AMQPChannelLayer, helper: AMQPChannelLayer, channel: str) -> None:
    """A blocking receive on ``layer`` that waits until ``helper`` sends."""
    sender = threading.Timer(0.3, lambda: helper.send(channel, {"n": 2}))
    sender.start()
    try:
        got, _message = layer.receive([channel], block=True)
    finally:
        sender.join()
    if got != channel:
        raise RuntimeError("the blocking receive got nothing from %s" % channel)


def _expiry(recorder: Recorder, layer: AMQPChannelLayer, wait: float) -> Path:
    """The dead-letter worker's path for a lease that ends."""
    layer.group_add("callpath", "callpath.e")
    worker = _thread(layer, DEAD_LETTER_THREAD)
    with recorder.path("expiry", [worker]) as path:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not any(
            "exchange_unbind" in line for line in path.lines
        ):
            time.sleep(0.05)
        time.sleep(0.5)  # the lease's ack follows its unbind
    if not path.lines:
        raise RuntimeError("no lease ended within %.0f s" % wait)
    return path


def report(paths: Sequence[Path]) -> str:
    """The paths as text: name, count and files, then the stack lines."""
    out = []
    for path in paths:
        out.append("%s: %d files: %s" % (path.name, len(path.files), " > ".join(path.files)))
        out.extend("    " + line for line in path.lines)
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("AMQP_URL"), help="default: $AMQP_URL")
    parser.add_argument(
        "--management-url",
        default=os.environ.get("AMQP_MANAGEMENT_URL"),
        help="for the flush at the end; default: $AMQP_MANAGEMENT_URL, else the layer's",
    )
    options = parser.parse_args(argv)
    if not options.url:
        parser.error("no broker: give --url or set AMQP_URL")
    paths = measure(options.url, options.management_url)
    print(report(paths))
    longest = max(len(path.files) for path in paths)
    return 0 if longest <= MOST_FILES else 1


if __name__ == "__main__":
    sys.exit(main())
