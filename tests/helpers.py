"""What the tests share: waiting, ports, layers, private nodes, fakes, the management API, traffic.

* :func:`wait_until`: poll a condition against a deadline;
* :func:`at_moment`: a step of a scenario's own timeline, at a moment of its clock;
* :func:`as_reactor_thread`: run calls on a thread that the layer takes for
  daphne's reactor thread, without running a reactor;
* :func:`free_port`: a TCP port nothing listens on (``devtools.rabbitmq``'s);
* :func:`make_layer` and :class:`LayerFactory`: layers on a prefix of their own;
  ``tests/conftest.py`` turns the factory into the ``new_layer`` and
  ``module_layer`` fixtures, which close every layer they made;
* :func:`drain`: every message waiting on some channels;
* :func:`private_node`: a RabbitMQ node of the caller's own, for tests that
  break the broker (``tests/conftest.py``'s ``node`` fixture);
* :func:`start_cluster` and :func:`cluster_url`: a cluster of private nodes
  (``tests/test_cluster.py`` and the stack fault test's ``node-loss``);
* :class:`SilentBroker`: a listener that never answers, to prove a call did
  not reach for the broker;
* :class:`Management`: the management API of a broker's vhost;
* :class:`NotRabbitMQ`: an HTTP server on loopback that answers like a proxy
  or a web server (404s, an HTML page, JSON that is not RabbitMQ's);
* :class:`Traffic`: numbered messages sent and received by threads, counted;
* :func:`run_cli`: the ``asgi-amqp`` command, run in-process.
"""

import collections
import contextlib
import http.server
import json
import re
import select
import socket
import threading
import time
import urllib.request
import uuid
from urllib.parse import unquote, urlsplit

import pika

from asgi_amqp import AMQPChannelLayer
from asgi_amqp.management import ManagementClient
from devtools.rabbitmq import free_port

__all__ = [
    "LayerFactory",
    "Management",
    "NotRabbitMQ",
    "SilentBroker",
    "Traffic",
    "drain",
    "free_port",
    "make_layer",
    "private_node",
    "cluster_url",
    "run_cli",
    "start_cluster",
    "at_moment",
    "as_reactor_thread",
    "consumers_on",
    "wait_until",
]


# -- waiting --------------------------------------------------------------------------------


def wait_until(predicate, timeout, interval=0.05, message="condition", raise_on_timeout=True):
    """Call ``predicate`` every ``interval`` s until it returns something true; return that.

    Past ``timeout`` s from the call: an AssertionError naming ``message``, or,
    with ``raise_on_timeout=False``, the predicate's last (false) value.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return value
            raise AssertionError("%s not met within %.1f s" % (message, timeout))
        time.sleep(interval)


def at_moment(start, moment, late=None, sleep=time.sleep):
    """Return at ``moment`` s after ``start`` (a ``time.monotonic()``) on the
    scenario's own clock; at once if that moment has passed.

    Not a wait for a condition: a step of the scenario's timeline, such as a
    renewal due 1.2 s after the first call, a send rate, a pause after each
    send, a reader that spends 0.05 s on each message (a slow application)
    or an outage held for 1 s. A timeline's moments count from its start,
    so that the time its steps take does not add up. With ``late`` (s),
    fail if the moment passed by more than that, since the scenario's timing
    would then say nothing. ``sleep`` does the waiting (e.g. a pika
    BlockingConnection's, to serve its I/O).
    """
    delay = start + moment - time.monotonic()
    if late is not None:
        assert delay > -late, "the schedule fell %.2f s behind at %.2f s" % (-delay, moment)
    if delay > 0:
        sleep(delay)


# -- layers ---------------------------------------------------------------------------------


def as_reactor_thread(function, timeout=60):
    """``function()``'s result, run on a new thread that Twisted (and so the
    layer's ``callers.on_reactor_thread``) takes for the reactor's own thread.

    A reactor cannot run twice in one process (``test_twisted`` runs it in
    child interpreters); marking a thread is enough for what the layer asks.
    Twisted's mark goes back to what it was afterwards."""
    from twisted.python import threadable

    outcome = {}

    def run():
        threadable.registerAsIOThread()
        try:
            outcome["result"] = function()
        except BaseException as exc:  # re-raised in the caller
            outcome["error"] = exc

    before = threadable.ioThread
    thread = threading.Thread(target=run, name="fake-reactor", daemon=True)
    try:
        thread.start()
        thread.join(timeout)
    finally:
        threadable.ioThread = before
    if thread.is_alive():
        raise AssertionError("the call on the reactor thread did not end within %s s" % timeout)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def make_layer(broker_or_url, **config):
    """An AMQPChannelLayer on a prefix of its own (``t-`` and 10 hex digits) unless
    ``prefix`` is given.

    ``broker_or_url`` is a broker (anything with ``amqp_url`` and
    ``management_url``: the session broker, a RabbitNode, a SilentBroker) or
    an AMQP URL or a list of them; ``config`` goes to the layer.
    """
    config.setdefault("prefix", "t-%s" % uuid.uuid4().hex[:10])
    url = getattr(broker_or_url, "amqp_url", None)
    if url is None:
        url = broker_or_url
    else:
        config.setdefault("management_url", broker_or_url.management_url)
    return AMQPChannelLayer(url=url, **config)


class LayerFactory(object):
    """:func:`make_layer` that keeps its layers and closes them all in :meth:`close`
    (last made, first closed); a layer made with ``flush=True`` is flushed first."""

    def __init__(self):
        self._made = []

    def __call__(self, broker_or_url, flush=False, **config):
        layer = make_layer(broker_or_url, **config)
        self._made.append((layer, flush))
        return layer

    def close(self):
        made, self._made = self._made, []
        failure = None
        for layer, flush in reversed(made):
            try:
                if flush:
                    layer.flush()
            except Exception as exc:  # closing the others first; raised below
                failure = failure or exc
            finally:
                layer.close()
        if failure is not None:
            raise failure

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def queue_counts(broker, queue):
    """The broker's own counts for ``queue`` (a passive declare on a
    connection of its own): ``message_count`` (ready messages, neither
    pushed nor unacked) and ``consumer_count``."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method
    finally:
        connection.close()


def consumers_on(broker, queue):
    """The broker's count of consumers on ``queue``; 0 while it does not exist."""
    try:
        return queue_counts(broker, queue).consumer_count
    except pika.exceptions.ChannelClosedByBroker:
        return 0


def drain(layer, channels, block=False):
    """Every message currently receivable on ``channels``, as (channel, message) pairs."""
    received = []
    while True:
        channel, message = layer.receive(channels, block=block)
        if channel is None:
            return received
        received.append((channel, message))


# -- brokers --------------------------------------------------------------------------------


@contextlib.contextmanager
def private_node(**options):
    """A RabbitMQ node of the caller's own (``options`` go to RabbitNode), for
    tests that break the broker; deleted afterwards."""
    from devtools.rabbitmq import RabbitNode

    node = RabbitNode(**options)
    try:
        node.start()
        yield node
    finally:
        node.cleanup(graceful=False)


def _in_parallel(*functions):
    """Call every function in a thread of its own; raise the first error."""
    errors = []

    def call(function):
        try:
            function()
        except BaseException as exc:  # noqa: B902 - raised below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(f,)) for f in functions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def start_cluster(size=3, name="asgiamqp-cl", quorum_vhost=None):
    """``size`` private RabbitMQ nodes joined into one cluster; the list of nodes.

    The nodes start in parallel (5-6 s each on their own), then join the
    first one at a time: two nodes joining the same node at once can race
    on the cluster's schema. With ``quorum_vhost``, that vhost is created
    with the default queue type quorum and ``guest`` may use it. The caller
    cleans up every node (``node.cleanup(graceful=False)``); on an error
    here, every node started is cleaned up first.
    """
    from devtools.rabbitmq import RabbitNode

    tag = uuid.uuid4().hex[:6]
    nodes = [RabbitNode(name="%s%d-%s" % (name, i + 1, tag)) for i in range(size)]
    try:
        _in_parallel(*[node.start for node in nodes])
        for node in nodes[1:]:
            node.join_cluster(nodes[0])
        status = nodes[0].ctl("cluster_status", "--formatter", "json")
        missing = [node.nodename for node in nodes if node.nodename not in status]
        if missing:
            raise AssertionError("not in the cluster: %s" % ", ".join(missing))
        if quorum_vhost:
            nodes[0].ctl("add_vhost", quorum_vhost, "--default-queue-type", "quorum")
            nodes[0].ctl("set_permissions", "-p", quorum_vhost, "guest", ".*", ".*", ".*")
    except BaseException:
        for node in nodes:
            node.cleanup(graceful=False)
        raise
    return nodes


def cluster_url(node, vhost="/"):
    """``node``'s AMQP URL on ``vhost``."""
    return node.amqp_url.replace("/%2F", "/" + ("%2F" if vhost == "/" else vhost))


class SilentBroker(object):
    """A TCP listener that accepts nothing and says nothing.

    A client connecting to it completes the TCP handshake (the kernel does
    that for the backlog) and then waits forever for the AMQP greeting, so a
    call that tries to use it cannot finish quickly; :meth:`touched` tells
    whether anyone connected. Its ``amqp_url`` and ``management_url`` both
    point at it, so :func:`make_layer` takes it as a broker.
    """

    def __init__(self):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self.port = self._socket.getsockname()[1]
        self.amqp_url = "amqp://guest:guest@127.0.0.1:%d/%%2F" % self.port
        self.management_url = "http://guest:guest@127.0.0.1:%d/" % self.port

    def touched(self):
        readable, _, _ = select.select([self._socket], [], [], 0)
        return bool(readable)

    def assert_untouched(self, layer):
        """``layer`` (on this broker) started no thread and nobody connected here."""
        assert layer.threads() == [], "the layer started its I/O threads"
        assert not self.touched(), "the layer connected to its broker"

    def close(self):
        self._socket.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Management(ManagementClient):
    """The layer's management API client on a broker's vhost (by default the one
    its ``amqp_url`` names), with what the tests ask beyond the layer's needs."""

    def __init__(self, broker, vhost=None, timeout=5.0):
        if vhost is None:
            path = urlsplit(broker.amqp_url).path
            vhost = unquote(path[1:]) if len(path) > 1 else "/"
        super(Management, self).__init__(broker.management_url, vhost, timeout=timeout)
        self.vhost = vhost

    def request(self, method, path, body=None):
        """``method`` on ``/api/<path>`` with ``body`` as JSON; the HTTP status
        (an error status raises urllib.error.HTTPError)."""
        request = urllib.request.Request(
            "%s/api/%s" % (self._base, path),
            method=method,
            data=None if body is None else json.dumps(body).encode("utf8"),
            headers={"Authorization": self._auth, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status

    def objects(self, prefix):
        """Names of the queues and exchanges whose name starts with ``prefix``."""
        names = self.queue_names(prefix) + self.exchange_names(prefix)
        return {name for name in names if name.startswith(prefix)}

    def connections(self):
        """Every client connection's record."""
        return self._get("connections") or []


class NotRabbitMQ(object):
    """A real HTTP server on 127.0.0.1 that is not RabbitMQ's management API.

    ``answer`` is what every GET gets: ``"404"`` (a web server without that
    path), ``"html"`` (a proxy's or a login page, status 200) or ``"json"``
    (status 200 and ``{"status": "ok"}``, a health endpoint). ``paths``
    lists the paths asked, in order. Use it as a context manager;
    :meth:`management_url` gives a URL with a password for it.
    """

    _PAGES = {
        "404": (404, "text/html", b"<html><body><h1>Not Found</h1></body></html>"),
        "html": (200, "text/html", b"<!doctype html><html><body>Sign in</body></html>"),
        "json": (200, "application/json", b'{"status": "ok"}'),
    }

    def __init__(self, answer):
        status, content_type, body = self._PAGES[answer]
        self.paths = []
        paths = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                paths.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self._server.server_address[1]
        # Polled every 50 ms, so that shutdown() returns at once (the default is 0.5 s).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def management_url(self, password="guest"):
        return "http://guest:%s@127.0.0.1:%d/" % (password, self.port)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# -- traffic --------------------------------------------------------------------------------


class Traffic(object):
    """Numbered messages through a layer: sender threads and receiver threads, all counted.

    Sender ``i`` sends ``{"n": n}`` for n = i * 10**7 + 1, + 2, ..., each to
    ``channels[n % len(channels)]``, on ``layer``; receivers ask for
    ``receive_from`` (default ``channels``) on ``reader`` (default ``layer``),
    blocking or not. A call that raises is counted by kind and type and its
    thread goes on after ``backoff`` s; a polling receiver that found nothing
    asks again after ``poll_pause`` s. Once told to stop, receivers return at
    once, or with ``drain_on_stop`` at their first receive that finds nothing.

    ``confirmed`` maps (channel, n) to the time its send returned,
    ``received`` lists (channel, n) as received (``received_at`` their times),
    ``longest`` is the longest call of each kind ("send", "receive",
    "blocking receive"), ``raised`` counts exceptions ("TypeName" for sends,
    "<kind> TypeName" for receives), ``raised_at`` lists (time, exception,
    kind) and ``errors`` counts their texts.
    """

    def __init__(
        self,
        layer,
        channels,
        senders=1,
        blocking_receivers=1,
        polling_receivers=0,
        reader=None,
        receive_from=None,
        backoff=0.05,
        poll_pause=0.01,
        drain_on_stop=False,
    ):
        self.layer = layer
        self.reader = reader or layer
        self.channels = list(channels)
        self.receive_from = list(receive_from or channels)
        self.backoff = backoff
        self.poll_pause = poll_pause
        self.drain_on_stop = drain_on_stop
        self.lock = threading.Lock()
        self.sending = threading.Event()  # cleared by pause(): the senders wait
        self.sending.set()
        self._in_send = 0  # senders inside a send call (under the lock)
        self._stop_sending = threading.Event()
        self._stop_receiving = threading.Event()
        self.confirmed = {}
        self.received = []
        self.received_at = []
        self.longest = collections.defaultdict(float)
        self.raised = collections.Counter()
        self.raised_at = []
        self.errors = collections.Counter()
        self.senders = [
            threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(senders)
        ]
        self.receivers = [
            threading.Thread(target=self._receive, args=(True,), daemon=True)
            for _ in range(blocking_receivers)
        ]
        self.receivers += [
            threading.Thread(target=self._receive, args=(False,), daemon=True)
            for _ in range(polling_receivers)
        ]
        self.threads = self.senders + self.receivers

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    # -- the threads --------------------------------------------------------------------

    def _timed(self, kind, function, *args):
        started = time.monotonic()
        try:
            return function(*args)
        finally:
            elapsed = time.monotonic() - started
            with self.lock:
                self.longest[kind] = max(self.longest[kind], elapsed)

    def _count(self, kind, exc):
        name = type(exc).__name__ if kind == "send" else "%s %s" % (kind, type(exc).__name__)
        with self.lock:
            self.raised[name] += 1
            self.raised_at.append((time.monotonic(), exc, kind))
            self.errors["%s %s: %s" % (kind, type(exc).__name__, str(exc)[:100])] += 1

    def _send(self, index):
        n = index * 10**7
        while not self._stop_sending.is_set():
            if not self.sending.wait(0.1):
                continue
            with self.lock:  # pause() clears ``sending`` under the lock
                if not self.sending.is_set():
                    continue
                self._in_send += 1
            n += 1
            channel = self.channels[n % len(self.channels)]
            try:
                self._timed("send", self.layer.send, channel, {"n": n})
            except Exception as exc:  # counted by type
                self._count("send", exc)
                with self.lock:
                    self._in_send -= 1
                self._stop_sending.wait(self.backoff)
            else:
                with self.lock:
                    self.confirmed[(channel, n)] = time.monotonic()
                    self._in_send -= 1

    def _receive(self, block):
        kind = "blocking receive" if block else "receive"
        while self.drain_on_stop or not self._stop_receiving.is_set():
            try:
                channel, message = self._timed(kind, self.reader.receive, self.receive_from, block)
            except Exception as exc:  # counted by type
                self._count(kind, exc)
                if self._stop_receiving.is_set():
                    return
                self._stop_receiving.wait(self.backoff)
                continue
            if channel is None:
                if self._stop_receiving.is_set():
                    return
                if not block:
                    self._stop_receiving.wait(self.poll_pause)
                continue
            with self.lock:
                self.received.append((channel, message["n"]))
                self.received_at.append(time.monotonic())

    # -- steering -----------------------------------------------------------------------

    def missing(self):
        """Confirmed, not (yet) received."""
        with self.lock:
            return set(self.confirmed) - set(self.received)

    def received_after(self, when):
        """How many messages were received after ``when`` (a monotonic time)."""
        with self.lock:
            return sum(1 for t in self.received_at if t > when)

    def wait_flowing(self, count, timeout, after=None):
        """Wait until ``count`` messages were received after ``after`` (default:
        now), at most ``timeout`` s (then an AssertionError)."""
        after = time.monotonic() if after is None else after
        wait_until(
            lambda: self.received_after(after) >= count,
            timeout,
            interval=0.01,
            message="%d messages received" % count,
        )

    def wait_received(self, timeout, settle=None):
        """Wait until everything confirmed was received, at most ``timeout`` s (or,
        with ``settle``, until nothing arrived for that long); whether it was."""

        def done():
            with self.lock:
                last = self.received_at[-1] if self.received_at else 0
            quiet = settle is not None and time.monotonic() - last > settle
            return not self.missing() or quiet

        wait_until(done, timeout, raise_on_timeout=False)
        return not self.missing()

    def pause(self, timeout):
        """Hold the senders and wait, at most ``timeout`` s, until no send is in
        flight and everything confirmed was received; whether it was.
        :meth:`resume` lets them go on."""
        started = time.monotonic()
        with self.lock:
            self.sending.clear()

        def no_send_in_flight():
            with self.lock:
                return self._in_send == 0

        if not wait_until(no_send_in_flight, timeout, interval=0.01, raise_on_timeout=False):
            return False
        return self.wait_received(max(0.0, started + timeout - time.monotonic()))

    def resume(self):
        self.sending.set()

    def stop_sending(self, join):
        """Stop the senders; wait up to ``join`` s for each."""
        self._stop_sending.set()
        self.sending.set()
        for thread in self.senders:
            thread.join(join)
        self.stopped_sending_at = time.monotonic()

    def stop_receiving(self, join):
        """Stop the receivers; wait up to ``join`` s for each."""
        self._stop_receiving.set()
        for thread in self.receivers:
            thread.join(join)

    def finish(self, sender_join, receiver_join, timeout, settle=None):
        """Stop sending, receive what is missing (:meth:`wait_received`), stop
        receiving; no thread may still be blocked in a call."""
        self.stop_sending(sender_join)
        self.wait_received(timeout, settle)
        self.stop_receiving(receiver_join)
        hung = [thread.name for thread in self.threads if thread.is_alive()]
        assert not hung, "threads still blocked: %s" % hung

    # -- measuring ----------------------------------------------------------------------

    def longest_call(self):
        with self.lock:
            return max(self.longest.values(), default=0.0)

    def first_after(self, when, what):
        """Seconds from ``when`` to the first send confirmed (``what`` "send") or
        message received after it; None if there was none."""
        with self.lock:
            times = self.confirmed.values() if what == "send" else self.received_at
            later = [t for t in times if t > when]
        return min(later) - when if later else None

    def recovery(self, when, within):
        """(first send, first receive) after ``when`` (:meth:`first_after`), waiting
        until ``within`` s after ``when`` for both."""

        def both():
            return None not in (self.first_after(when, "send"), self.first_after(when, "receive"))

        wait_until(both, when + within - time.monotonic(), raise_on_timeout=False)
        return self.first_after(when, "send"), self.first_after(when, "receive")

    def longest_gap(self, times, start, end):
        """Longest stretch between start and end (at most when the senders were
        stopped) without one of ``times``."""
        end = min(end, getattr(self, "stopped_sending_at", end))
        points = [start] + sorted(t for t in times if start <= t <= end) + [end]
        return max(b - a for a, b in zip(points, points[1:]))

    def counts(self, restart_window=None):
        """The figures; a loss confirmed within ``restart_window`` (start, end)
        counts as "lost to broker restart", not "lost"."""
        with self.lock:
            received = collections.Counter(self.received)
            missing = set(self.confirmed) - set(received)
            in_restart = set()
            if restart_window is not None:
                start, end = restart_window
                in_restart = {key for key in missing if start <= self.confirmed[key] <= end}
            return {
                "confirmed": len(self.confirmed),
                "raised": dict(self.raised),
                "received": len(self.received),
                "duplicates": sum(c - 1 for c in received.values() if c > 1),
                "lost": len(missing - in_restart),
                "lost to broker restart": len(in_restart),
                "longest call": {k: round(v, 2) for k, v in sorted(self.longest.items())},
            }


# -- the command line -----------------------------------------------------------------------


BULK_SUMMARY = re.compile(
    r"^sent (\d+), refused (\d+), in doubt (\d+), not sent (\d+), of (\d+) lines in ", re.M
)


def bulk_summary(stderr):
    """(sent, refused, in doubt, not sent) of ``send --from``'s one summary line,
    checked to add up to the lines it read."""
    found = BULK_SUMMARY.findall(stderr)
    assert len(found) == 1, stderr
    counts = tuple(int(n) for n in found[0])
    assert sum(counts[:4]) == counts[4], stderr
    return counts[:4]


def run_cli(args, env=None, input=None):
    """``asgi-amqp ARGS`` run in-process (click's CliRunner): a click Result,
    its ``stdout`` and ``stderr`` apart; ``env`` is added to the environment."""
    from click.testing import CliRunner

    from asgi_amqp.tools import cli

    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    return runner.invoke(
        cli.cli, list(args), env=env, input=input, catch_exceptions=False, prog_name=cli.PROG
    )
