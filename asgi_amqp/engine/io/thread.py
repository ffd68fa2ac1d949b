"""The I/O thread: the only thread that touches the pika connections.

Callers hand it work with ``submit`` (through the ``Inbox``) and wait on a
``Pending``. It runs one pika ``IOLoop`` for its whole life, which services
heartbeats whatever callers do, and after every loss opens a pair of
``SelectConnection``s to one node, trying the URLs in turn with capped
exponential backoff: the *publishing* connection carries publishes and
their confirms only, the *main* one everything else. When either drops,
the other is closed and the work of both is carried over
(``io/carry_over.py``): a session never has half a pair.

Before the first connection, a failure no retry fixes (credentials, vhost,
TLS) fails waiting work at once; a node that refuses or ignores TCP may be
starting, an outage until ``first_connect_timeout`` after the first attempt.

* an alarm stops the broker reading every connection that publishes: the main
  one never does, so receives and declares go on through an alarm
  (test_broker_alarms.py::test_an_alarm_blocks_sends_for_a_bounded_time_while_receives_go_on);
* the broker requeues a closed connection's unacked deliveries
  (test_polls_take_pushed_deliveries.py::test_a_process_that_dies_holding_pushed_messages_loses_none);
* a 541 close (on 3.10, a consume racing another process's declare of a new
  quorum queue) hits this process alone (test_ordered_channels.py::
  test_a_connection_lost_to_its_own_channel_crash_waits_for_no_shard_owner).

``IOThread`` owns an ``Inbox``, a ``Dispatched`` and an ``AlarmGate``, each
saying on which threads it is used; the rest of its state is the I/O
thread's alone, but for the figures callers read, marked where declared.
"""

import collections
import copy
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, FrozenSet, Iterable, Optional, Sequence, Set, Union

import pika
import pika.connection
import pika.exceptions
from pika.adapters.select_connection import IOLoop
from pika.spec import INTERNAL_ERROR

from ...errors import AuthenticationError, BrokerConnectionError, LayerClosed
from ...urls import describe_parameters
from ..consumers import ConsumerSettings
from ..consumers.acks import TakenAcks
from ..deliveries import Delivery, HandedOff, HeldMessages, Liveness
from ..futures import wait_seconds
from ..publisher import Publisher
from ..session import Session
from ..work import Queues, Work
from .alarms import AlarmGate
from .carry_over import Dispatched
from .connection_errors import connection_error, describe_reason, retry_may_help
from .inbox import Inbox

logger = logging.getLogger(__name__)

# The I/O thread's name (``layer.threads()``, stack dumps, devtools.callpath).
THREAD_NAME = "asgi_amqp-io"


class IOThread(object):
    """The I/O thread and its connection pair (see the module docstring)."""

    def __init__(
        self,
        parameters: Sequence[pika.connection.Parameters],
        name: str = THREAD_NAME,
        consumer_settings: Optional[ConsumerSettings] = None,
        reconnect_max_delay: float = 0.5,
        handed_off: Optional[HandedOff] = None,
        first_connect_timeout: float = 0.0,
    ) -> None:
        self._parameters = list(parameters)
        # Seconds from the first attempt in which a down node is an outage (callers read it).
        self.first_connect_timeout = first_connect_timeout
        self._name = name
        self._consumer_settings = consumer_settings or ConsumerSettings(0.25, 30.0, 16)
        self._reconnect_max_delay = reconnect_max_delay
        self._inbox = Inbox()  # any thread: callers put, the I/O thread takes
        self._ioloop: Optional[IOLoop] = None  # made by the I/O thread as its first step
        self._thread: Optional[threading.Thread] = None
        self._started = threading.Event()
        self._running = False  # from start() until the thread's last step
        # Everything below is touched by the I/O thread only.
        # The main connection: declares, gets, consumers.
        self._connection: Optional[pika.SelectConnection] = None
        self._publishing: Optional[pika.SelectConnection] = None
        # Not closed yet; the loop stops once empty.
        self._open_connections: Set[pika.connection.Connection] = set()
        self._session: Optional[Session] = None
        self._waiting: Deque[Work] = collections.deque()  # work that needs a session
        self._dispatched = Dispatched()  # carried over when the pair is lost
        self._attempt = 0
        self._ever_connected = False
        self._first_attempt: Optional[float] = None  # when the first attempt began
        # Why calls fail at once before any connection (a failure no retry
        # fixes, or first_connect_timeout passed); None while waiting or connected.
        self._given_up: Optional[Exception] = None
        # Nodes whose last failed attempt no retry can fix (retry_may_help).
        self._unfixable: Set[str] = set()
        # node -> its last failure since the last connection: an error names every node.
        self._attempt_failures: Dict[str, str] = {}
        # Why the last attempt failed or the pair was lost; None once connected.
        self._failure: Optional[Exception] = None
        self._liveness = Liveness()
        # Shared with a replacement I/O thread: a restart hands no redelivery out twice.
        self._handed_off = handed_off if handed_off is not None else HandedOff()
        self._held = HeldMessages()  # shared with callers: see take_pushed
        self._taken = TakenAcks()  # what they took, until the acks go (consumers/acks.py)
        self._handed_off.held = self._held  # a copy of a held message is a copy too
        # The shards the lost session served, which the next takes back first
        # (``consumers.owners``), and whether the loss hit other processes too.
        self._served_shards: FrozenSet[str] = frozenset()
        self._shared_loss = False
        # Read by callers: when the connection was lost (None while connected
        # or before the first one) and why; and how often it was lost.
        self.connected = False
        self.disconnected_since: Optional[float] = None
        self.last_error_text: Optional[str] = None  # kept after a reconnect
        self.connection_losses = 0
        # Set by the I/O thread, read and waited on by callers (io/alarms.py).
        self.alarms = AlarmGate()

    # -- any thread ----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._running = True
        try:
            self._thread.start()
        except BaseException:  # no thread was started (e.g. the process is out of them)
            self._running = False
            raise
        if not self._started.wait(10):
            raise BrokerConnectionError("the I/O thread did not start")

    @property
    def retried(self) -> int:
        """Pieces of work carried over."""
        return self._dispatched.retried

    @property
    def republished(self) -> int:
        """Publishes in doubt, sent again as marked copies."""
        return self._dispatched.republished

    @property
    def _stopping(self) -> bool:
        """Set once by ``stop``: from then on no work is taken and no reconnect made."""
        return self._inbox.closed

    @property
    def alive(self) -> bool:
        # Asked on every call: cheaper than Thread.is_alive, which takes a lock.
        return self._running

    def submit(self, work: Work) -> None:
        """Run ``work(session)`` on the I/O thread once a session exists."""
        self.submit_many((work,))

    def submit_many(self, works: Iterable[Work]) -> None:
        """``submit`` for a list of work: one lock and at most one wake-up for all."""
        if self._inbox.put(works):
            self._loop_started.add_callback_threadsafe(self._drain_inbox)

    def asked(self, queues: Queues) -> None:
        """A blocking receive of the calling thread asks for ``queues`` (its thread)."""
        self._held.asked(queues)

    def take_pushed(self, queues: Sequence[str]) -> Optional[Delivery]:
        """A held message for one of ``queues``, or None, taken in the caller's thread;
        its ack is submitted without waiting for it."""
        taken = self._held.take(queues, threading.get_ident(), record=self._handed_off.add)
        if taken is None:
            return None
        queue, held = taken
        self._taken.add(queue, held)
        try:
            # A wake-up, and no work: every ``_drain_inbox`` sends taken acks before its work.
            # Without a session they wait for the next, which drops the lost
            # channel's: the broker put those messages back.
            self.submit_many(())
        except LayerClosed:
            pass  # the connection closes with the layer: the broker requeues them
        return held.delivery

    @property
    def awaiting_first_connection(self) -> bool:
        """Whether the layer has never connected and waits for the broker to come up."""
        return not self._ever_connected and self.disconnected_since is not None

    def outage(self) -> float:
        """Seconds since the connection was lost; 0 while connected."""
        since = self.disconnected_since
        return 0.0 if since is None else time.monotonic() - since

    def stop(self, timeout: float = 10.0) -> None:
        seconds = wait_seconds(timeout)  # a limit, checked before anything stops
        if not self._inbox.close():
            return
        if self._ioloop is not None:
            self._ioloop.add_callback_threadsafe(self._shutdown)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(seconds)
            if self._thread.is_alive():
                logger.warning("I/O thread did not stop within %.1f s", timeout)

    # -- the I/O thread ------------------------------------------------------

    @property
    def _loop_started(self) -> IOLoop:
        """The I/O loop; it exists once ``start`` returned (the thread makes it first)."""
        ioloop = self._ioloop
        if ioloop is None:  # an invariant, checked under -O too
            raise RuntimeError("the I/O thread has not started")
        return ioloop

    def _run(self) -> None:
        try:
            self._ioloop = IOLoop()
            self._ioloop.add_callback_threadsafe(self._connect)
            self._started.set()
            self._loop()
        finally:
            self._running = False

    def _loop(self) -> None:
        ioloop = self._loop_started
        try:
            ioloop.start()
        except Exception:
            logger.exception("I/O loop crashed")
        finally:
            self._fail_waiting(LayerClosed("the layer is closed"))
            ioloop.close()

    def _drain_inbox(self) -> None:
        # The batch first: a caller who takes a message after it wakes the loop again.
        works = self._inbox.take_all()
        if self._session is not None and len(self._taken):
            self._session.consumers.acks.send_taken()  # before the work: they may have waited
        for work in works:
            if not work.pending.wanted:
                continue
            if self._session is not None:
                self._dispatch(work)
            elif not self._ever_connected and self._given_up is not None:
                work.pending.fail(self._given_up)
            else:
                self._waiting.append(work)

    def _dispatch(self, work: Work) -> None:
        if work.retry:
            self._dispatched.add(work)
        session = self._session
        if session is None:  # an invariant, checked under -O too
            raise RuntimeError("session is None: work is dispatched only while there is one")
        try:
            work(session)
        except Exception as exc:
            if not self._pair_open():
                return  # a connection is going: _on_closed hands it on
            logger.exception("error while running %s", work.pending.description)
            work.pending.fail(BrokerConnectionError("internal error: %s" % exc))

    def _pair_open(self) -> bool:
        return all(c is not None and c.is_open for c in (self._connection, self._publishing))

    def _connect(self) -> None:
        """Open the main connection; the publishing one follows once it is open."""
        if self._stopping:
            return
        parameters = self._parameters[self._attempt % len(self._parameters)]
        if self._first_attempt is None:
            self._first_attempt = time.monotonic()
        logger.debug("connecting to %s", describe_parameters(parameters))
        self._publishing = None
        self._connection = self._open_connection(parameters, self._on_main_open)

    def _open_connection(
        self,
        parameters: pika.connection.Parameters,
        on_open: Callable[[pika.connection.Connection], None],
    ) -> pika.SelectConnection:
        connection = pika.SelectConnection(
            parameters,
            on_open_callback=on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
            custom_ioloop=self._ioloop,
        )
        self._open_connections.add(connection)
        return connection

    def _on_main_open(self, opened: pika.connection.Connection) -> None:
        connection = self._connection
        if opened is not connection or connection is None:
            return
        parameters = copy.copy(_parameters_of(connection))
        name = (parameters.client_properties or {}).get("connection_name", "asgi_amqp")
        parameters.client_properties = {"connection_name": "%s (publishing)" % name}
        self._publishing = self._open_connection(parameters, self._on_open)

    def _on_open(self, opened: pika.connection.Connection) -> None:
        """Both connections of the pair are open: a session starts on them."""
        connection, publishing = self._connection, self._publishing
        if opened is not publishing or connection is None or publishing is None:
            return
        publishing.add_on_connection_blocked_callback(self._on_blocked)
        publishing.add_on_connection_unblocked_callback(self._on_unblocked)
        reconnected = self._ever_connected
        if reconnected:
            logger.info("reconnected to %s", describe_parameters(connection.params))
        self._attempt = 0
        self._ever_connected = True
        self._attempt_failures.clear()
        self._unfixable.clear()
        self._given_up = None
        self._failure = None
        self.disconnected_since = None
        self.connected = True
        self._liveness.forget()
        self._held.clear()  # the old channels' deliveries are back in their queues
        self._session = Session(
            connection,
            publishing,
            self._liveness,
            self._handed_off,
            self._held,
            self._consumer_settings,
            self._taken,
            resumed=reconnected and self._shared_loss,
            reclaimed=self._served_shards,
        )
        self._served_shards = frozenset()
        waiting, self._waiting = self._waiting, collections.deque()
        for work in waiting:
            if work.pending.wanted:
                self._dispatch(work)

    def _on_open_error(
        self, connection: pika.connection.Connection, error: Union[str, Exception]
    ) -> None:
        self._open_connections.discard(connection)
        if connection not in (self._connection, self._publishing):
            self._stop_when_closed()
            return
        if connection is self._publishing:
            self._drop(self._connection)  # the pair is incomplete: start again
        self._connection = self._publishing = None
        if self._stopping:
            self._stop_when_closed()
            return
        parameters = _parameters_of(connection)
        node = describe_parameters(parameters)
        failure = connection_error(error, parameters)
        self._attempt_failures[node] = str(failure)
        if isinstance(failure, AuthenticationError) or not retry_may_help(error):
            self._unfixable.add(node)
        else:
            self._unfixable.discard(node)
        if len(self._attempt_failures) > 1 and not isinstance(failure, AuthenticationError):
            failure = BrokerConnectionError(
                "no node answered (%d tried): %s"
                % (len(self._attempt_failures), "; ".join(self._attempt_failures.values()))
            )
        self._failure = failure
        self.last_error_text = str(failure)
        # Never connected: decide once every URL failed, or at once for refused credentials.
        every_url_tried = self._attempt + 1 >= len(self._parameters)
        if self._ever_connected:
            logger.warning("%s", failure)
            if isinstance(failure, AuthenticationError):
                self._fail_waiting(failure)
        elif every_url_tried or isinstance(failure, AuthenticationError):
            self._first_connection_failed(failure)
        else:
            logger.warning("%s", failure)
        self._schedule_reconnect()

    def _first_connection_failed(self, failure: Exception) -> None:
        """Every URL failed and the layer never connected: an outage while the broker
        may be starting, else fail the work waiting and to come with the cause."""
        first_attempt = self._first_attempt if self._first_attempt is not None else time.monotonic()
        waited = time.monotonic() - first_attempt
        timeout = self.first_connect_timeout
        if self._given_up is None and not self._unfixable and waited < timeout:
            if self.disconnected_since is None:
                self.disconnected_since = first_attempt  # an outage from the start
                logger.warning(
                    "%s; waiting for the broker, up to %g s after the first attempt "
                    "(first_connect_timeout)",
                    failure,
                    timeout,
                )
            else:
                logger.debug("%s; still waiting for the first connection", failure)
            return
        if not self._unfixable and timeout and waited >= timeout:
            failure = BrokerConnectionError(
                "no connection to the broker in %.1f s (first_connect_timeout is %g s): %s"
                % (waited, timeout, failure)
            )
            self.last_error_text = str(failure)
        if self._given_up is None and not self._unfixable and timeout:
            logger.error("%s", failure)
        else:
            logger.warning("%s", failure)
        self._given_up = self._failure = failure
        self.disconnected_since = None  # no outage: calls fail at once
        self._fail_waiting(failure)

    def _on_closed(self, connection: pika.connection.Connection, reason: Exception) -> None:
        self._open_connections.discard(connection)
        if connection not in (self._connection, self._publishing):
            self._stop_when_closed()  # the other half of a pair already handled
            return
        # The other half goes too, once the parts stopped listening: what still arrives
        # on it is ignored (the work is carried over, the broker requeues deliveries).
        other = self._publishing if connection is self._connection else self._connection
        self._connection = self._publishing = None
        self.alarms.clear(self._publisher())
        session, self._session = self._session, None
        self.connected = False
        dispatched = self._dispatched.take()
        if self._stopping:
            closed = LayerClosed("the layer is closed")
            if session is not None:
                session.close(closed)
            self._drop(other)
            for work in dispatched:
                work.pending.fail(closed)
            self._stop_when_closed()
            return
        where = describe_parameters(connection.params)
        why = describe_reason(reason)
        error = BrokerConnectionError("connection to %s lost: %s" % (where, why))
        if session is not None:
            self._served_shards = session.consumers.served_shards()
            session.lose()
        # A 541 is this process's loss alone: the others keep their connections and
        # shards, and no shard waits for its owner.
        self._shared_loss = getattr(reason, "reply_code", None) != INTERNAL_ERROR
        self._drop(other)
        self._hand_on(dispatched)
        self.connection_losses += 1
        if self.disconnected_since is None:
            self.disconnected_since = time.monotonic()
        self.last_error_text = str(error)
        logger.warning("%s; reconnecting", error)
        self._failure = error
        self._schedule_reconnect()

    def _hand_on(self, dispatched: Deque[Work]) -> None:
        """Carry the lost pair's unfinished work over: it runs first on the next one."""
        self._waiting.extendleft(reversed(self._dispatched.carry(dispatched)))

    def _on_blocked(self, connection: pika.connection.Connection, frame: Any) -> None:
        if connection is not self._publishing:
            return
        reason = getattr(frame.method, "reason", None) or "a resource alarm"
        self.alarms.block(reason, _parameters_of(connection), self._publisher())

    def _on_unblocked(self, connection: pika.connection.Connection, _frame: Any) -> None:
        if connection is not self._publishing:
            return
        self.alarms.lift(_parameters_of(connection), self._publisher())

    def _publisher(self) -> Optional[Publisher]:
        """The session's publisher, which an alarm blocks; None without a session."""
        return self._session.publisher if self._session is not None else None

    def _drop(self, connection: Optional[pika.connection.Connection]) -> None:
        """Close the other half of a pair that is going; its close is then ignored."""
        if connection is None or connection.is_closing or connection.is_closed:
            return
        try:
            connection.close()
        except pika.exceptions.ConnectionWrongStateError:
            logger.debug("closing a connection of the pair", exc_info=True)

    def _stop_when_closed(self) -> None:
        """Stop the loop while stopping, once no connection is left to close."""
        if self._stopping and not self._open_connections:
            self._loop_started.stop()

    def _schedule_reconnect(self) -> None:
        if self._stopping:
            self._stop_when_closed()
            return
        self._attempt += 1
        rounds = (self._attempt - 1) // len(self._parameters)
        delay = (
            0
            if self._attempt % len(self._parameters)
            else min(self._reconnect_max_delay, 0.1 * (2**rounds))
        )
        if isinstance(self._failure, AuthenticationError):
            delay = self._reconnect_max_delay
        self._loop_started.call_later(delay, self._connect)

    def _fail_waiting(self, error: BaseException) -> None:
        waiting, self._waiting = self._waiting, collections.deque()
        for work in waiting:
            work.pending.fail(error)

    def _shutdown(self) -> None:
        if self._session is not None:
            self._session.consumers.acks.send_taken()  # what callers took is theirs
        self._fail_waiting(LayerClosed("the layer is closed"))
        closing = False
        for connection in (self._connection, self._publishing):
            if connection is not None and connection.is_open:
                connection.close()
                closing = True
        if closing:
            return  # _on_closed stops the loop once both are closed
        # Never opened, still opening or reconnecting: nothing to close cleanly.
        self._loop_started.stop()


def _parameters_of(connection: pika.connection.Connection) -> pika.connection.Parameters:
    """A connection's parameters (pika's types allow None; a connection made has them)."""
    parameters = connection.params
    if parameters is None:  # an invariant, checked under -O too
        raise RuntimeError("no connection parameters")
    return parameters
