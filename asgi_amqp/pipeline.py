"""Pipelined sends: many messages in flight, each one's error (or None) in input order.

``send`` waits for its confirm: a round trip per message on the caller's time.
``SendPipeline`` keeps a window of messages in flight instead, hands them to the I/O
thread a chunk at a time and collects the confirms later, oldest first, while the caller
encodes the next rows. Memory is bounded by the window, whatever the input's size.

Each message has ``send``'s promise: sent only once confirmed, ``ChannelFull`` when its
queue was full, ``send``'s exception otherwise. Order per channel holds: a channel's
queue is declared before its first message leaves, and one connection's publishes reach
a queue in the order sent (test_every_message_arrives_in_order_per_channel). A message
returned (its queue vanished meanwhile) or refused by a queue not full (its node failed)
goes through ``send``'s retry, which may put it behind later ones of its channel.
"""

import collections
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from . import engine, naming
from .channel_names import is_process_local
from .engine import ACKED, Engine
from .errors import (
    ACCESS_REFUSED,
    BrokerConnectionError,
    BrokerOperationError,
    MessageTooLarge,
)

if TYPE_CHECKING:
    from .layer import AMQPChannelLayer

NOT_FOUND = 404

CHUNK = 256  # messages per hand-off to the I/O thread
WINDOW = 4096  # messages in flight at most

# A message's *error*: None once sent, else the exception ``send`` would have raised.
SendError = Optional[BaseException]
# report(tag, error, in_doubt): ``in_doubt`` for the error of a message *written* with no
# confirm back, which the broker may have; False: sent (error None) or certainly not.
Report = Callable[[Any, SendError, bool], None]


class NotAttempted(Exception):
    """The error of a message that was never handed to the broker: the
    sending stopped first (``SendPipeline.stop``, or an interrupt in the
    middle of handing a chunk over). It is not in any queue."""


class _Entry(object):
    """One input item on its way: published (``batch``, ``index``) or already decided."""

    __slots__ = (
        "tag",
        "kind",
        "name",
        "queue",
        "body",
        "properties",
        "batch",
        "index",
        "deadline",
        "error",
    )

    def __init__(self, tag: Any, kind: str, name: str) -> None:
        self.tag = tag
        self.kind = kind
        self.name = name
        self.queue: Optional[str] = None
        self.body = b""
        self.properties: Any = None
        self.batch: Optional[engine.InFlight] = None
        self.index = 0
        self.deadline = 0.0
        self.error: SendError = None


class SendPipeline(object):
    """Sends through ``layer`` with a window of confirms outstanding.

    Made by ``AMQPChannelLayer.send_pipeline`` for one caller, whose thread alone uses
    it; of the layer it reads public parts only (``sender``, ``groups``, ``topology``,
    name checks) and publishes and declares through its ``engine``.

    ``put`` takes one message and may block while the window is full; ``flush`` waits
    for everything put so far. ``report(tag, error, in_doubt)`` is called for every
    message in the order put, from the calling thread (see ``Report``). Before each
    chunk goes, the messages confirmed already are reported, so a caller can ``stop``.
    """

    def __init__(
        self,
        layer: "AMQPChannelLayer",
        engine: Engine,
        report: Report,
        chunk: int = CHUNK,
        window: int = WINDOW,
        keep_existing: bool = False,
    ) -> None:
        self._layer = layer
        self._sender = layer.sender  # message properties, encoding, finish_send
        self._engine = engine  # publishes and declares
        self._groups = layer.groups  # the shared objects a group send needs
        # A tool sending for an application (command line, Spark) does not re-declare its
        # queues: a passive declare first, and a queue that exists is used as it is.
        self._keep_existing = keep_existing
        self._report = report
        self._chunk_size = chunk
        self._window = max(window, chunk)
        self._waiting: List[_Entry] = []  # validated, not yet handed over
        self._in_flight: Deque[_Entry] = collections.deque()
        self._declared: Set[str] = set()
        # The 403 of a user that may not declare queues: only check them after it.
        self._passive_only: Optional[BrokerOperationError] = None
        self._infrastructure = False

    def put(self, kind: str, name: str, message: Dict[str, Any], tag: Any = None) -> None:
        """Send ``message`` to channel ``name`` (``kind`` "channel") or group."""
        entry = _Entry(tag, kind, name)
        try:
            self._prepare(entry, message)
        except Exception as exc:  # invalid name or message: never published
            entry.error = exc
        self._in_flight.append(entry)
        if entry.error is None:
            self._waiting.append(entry)
            if len(self._waiting) >= self._chunk_size:
                self._report_answered()  # may ``stop`` what waits for this chunk
                self._launch()
        while len(self._in_flight) > self._window:
            self._finish_oldest()

    def put_error(self, error: BaseException, tag: Any = None) -> None:
        """Report ``error`` for an item that was not even a message, in its turn."""
        entry = _Entry(tag, "channel", "")
        entry.error = error
        self._in_flight.append(entry)
        while len(self._in_flight) > self._window:
            self._finish_oldest()

    def flush(self) -> None:
        """Hand over what is left and report every message put."""
        self._launch()
        while self._in_flight:
            self._finish_oldest()

    def stop(self, why: str) -> None:
        """Hand nothing more over: what waits for its chunk is ``NotAttempted``.

        What was handed over already is still reported by ``flush``:
        sent once confirmed, whatever the reason for stopping.
        """
        waiting, self._waiting = self._waiting, []
        for entry in waiting:
            if entry.error is None:
                entry.error = NotAttempted("not sent: %s" % why)

    # -- steps -------------------------------------------------------------------

    def _prepare(self, entry: _Entry, message: Dict[str, Any]) -> None:
        """Validate and encode in the caller's thread, before anything is sent."""
        layer, sender = self._layer, self._sender
        if entry.kind == "group":
            layer.valid_group_name(entry.name)
            # The group tells a process which of its members to copy it to.
            entry.properties = sender.properties({naming.GROUP_HEADER: entry.name})
        else:
            layer.valid_channel_name(entry.name)
            entry.queue = layer.topology.send_queue(entry.name, message)
            headers = {naming.CHANNEL_HEADER: entry.name} if is_process_local(entry.name) else None
            entry.properties = sender.properties(
                headers, persistent=naming.keeps_order(entry.queue)
            )
        entry.body = sender.encode(message)

    def _launch(self) -> None:
        """Declare the chunk's new queues, then hand its publishes over at once;
        interrupted before (a KeyboardInterrupt in a declare), they are ``NotAttempted``."""
        entries, self._waiting = self._waiting, []
        if not entries:
            return
        try:
            self._hand_over(entries)
        except BaseException:
            for entry in entries:
                if entry.batch is None and entry.error is None:
                    entry.error = NotAttempted("not sent: interrupted before it was handed over")
            raise

    def _hand_over(self, entries: List[_Entry]) -> None:
        self._declare_queues(entries)
        ready = [entry for entry in entries if entry.error is None]
        if not ready:
            return
        router = self._layer.topology.group_router
        requests: List[engine.PublishRequest] = []
        for entry in ready:
            if entry.kind == "group":
                requests.append(
                    (
                        router,
                        entry.name,
                        entry.body,
                        entry.properties,
                        False,
                        "send to group %s" % entry.name,
                    )
                )
            else:
                requests.append(
                    (
                        "",
                        entry.queue or "",
                        entry.body,
                        entry.properties,
                        True,
                        "send to %s" % entry.name,
                    )
                )
        try:
            batch = self._engine.start_publishes(requests)
        except Exception as exc:  # the layer is closed
            for entry in ready:
                entry.error = exc
            return
        deadline = time.monotonic() + self._sender.operation_timeout
        for index, entry in enumerate(ready):
            entry.batch, entry.index, entry.deadline = batch, index, deadline

    def _declare_queues(self, entries: List[_Entry]) -> None:
        if not self._infrastructure and any(e.kind == "group" for e in entries):
            try:
                self._groups.ensure_infrastructure()
                self._infrastructure = True
            except Exception as exc:
                self._fail(entries, lambda e: e.kind == "group", exc)
        for entry in entries:
            queue = entry.queue
            if queue is None or queue in self._declared or entry.error is not None:
                continue
            try:
                if self._keep_existing and self._exists(queue):
                    self._declared.add(queue)
                    continue
                self._declare(entry.name, queue)
                self._declared.add(queue)
            except Exception as exc:  # e.g. the queue exists with other arguments
                self._fail(entries, _for_queue(queue), exc)

    def _declare(self, channel: str, queue: str) -> None:
        """Declare ``channel``'s queue; for a user that may only send, check it exists.

        The ``sender`` role gets a 403 for a declare, but a passive one needs no
        permission (test_sender_sends_to_channels_that_exist): the messages go to a
        queue that is there, else the 403 is their error.
        """
        declare = self._engine.declare
        if not self._passive_only:
            try:
                declare([self._sender.queue_declare(channel, queue)], "declare %s" % queue)
                return
            except BrokerOperationError as exc:
                if exc.reply_code != ACCESS_REFUSED:
                    raise
                self._passive_only = exc
        try:
            declare([engine.queue_declare(queue, None, passive=True)], "check %s" % queue)
        except BrokerOperationError as exc:
            if exc.reply_code == NOT_FOUND:
                raise self._passive_only from None
            raise

    def _exists(self, queue: str) -> bool:
        step = engine.queue_declare(queue, None, passive=True, not_found_ok=True)
        return self._engine.declare([step], "check %s" % queue) is not None

    @staticmethod
    def _fail(entries: List[_Entry], which: Callable[[_Entry], bool], exc: Exception) -> None:
        for entry in entries:
            if entry.error is None and which(entry):
                entry.error = exc

    def _report_answered(self) -> None:
        """Report the oldest messages whose confirm (or error) came already, without waiting."""
        while self._in_flight:
            entry = self._in_flight[0]
            if entry.error is None and (
                entry.batch is None or not entry.batch.answered(entry.index)
            ):
                return
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        entry = self._in_flight[0]
        if entry.batch is None and entry.error is None:
            self._launch()  # the oldest is still waiting for its chunk
        error, in_doubt = self._error(entry)  # an interrupt here leaves it in flight
        self._in_flight.popleft()
        self._report(entry.tag, error, in_doubt)

    def _error(self, entry: _Entry) -> Tuple[SendError, bool]:
        """(error or None, in doubt) of one message: see ``Report``."""
        if entry.error is not None:
            return entry.error, False
        if entry.batch is None:
            return NotAttempted("not sent: never handed over"), False
        try:
            outcome = entry.batch.outcome(entry.index, entry.deadline)
        except Exception as exc:
            # No confirm: in doubt if it was written, unless the broker named
            # a refusal (a permission, its size limit).
            refused = isinstance(exc, (BrokerOperationError, MessageTooLarge))
            return exc, entry.batch.written(entry.index) and not refused
        if outcome == ACKED or entry.kind == "group":
            return None, False  # a full group member drops the message: the spec
        try:
            # Refused or returned: send's own loop decides, as for one send.
            self._sender.finish_send(
                entry.name, entry.queue or "", entry.body, entry.properties, outcome
            )
        except Exception as exc:  # a connection error: its publish again may have gone
            return exc, isinstance(exc, BrokerConnectionError)
        return None, False


def _for_queue(queue: str) -> Callable[[_Entry], bool]:
    return lambda entry: entry.queue == queue


def send_all(layer: "AMQPChannelLayer", items: Any, kind: str) -> List[SendError]:
    """The error (None: sent) of every ``(name, message)`` in ``items``, in order."""
    errors: List[SendError] = []

    def collect(tag: Any, error: SendError, in_doubt: bool) -> None:
        errors.append(error)

    pipeline = layer.send_pipeline(collect)
    for item in items:
        try:
            name, message = item
        except (TypeError, ValueError):
            pipeline.put_error(
                TypeError("items must be (%s name, message) pairs, not %r" % (kind, item))
            )
            continue
        pipeline.put(kind, name, message)
    pipeline.flush()
    return errors
