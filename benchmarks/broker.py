"""A small pika helper for the benchmark's untimed housekeeping.

Purging, counting and deleting queues happens on this connection, never on a
contestant's own, so housekeeping cannot disturb what is measured. Every
queue or exchange a contestant creates is registered with ``track_*`` and
deleted by ``delete_tracked`` at the end of the run, whatever happened.
``LayerKeeper`` does an AMQPChannelLayer's housekeeping on such a
connection, in the harness's process and in worker processes alike.
"""

import base64
import collections
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import msgpack
import pika
import pika.exceptions

from .asgi_trials import ROOMS, Keeper
from .scenarios import MESSAGE


class _QuietWhileBusy(logging.Filter):
    """Drop pika's "Channel.Close (404)" warnings caused by our own passive
    declares and purges (only on the thread doing housekeeping, only while it
    does); the layer's own warnings, on its own threads, still show."""

    def __init__(self):
        super(_QuietWhileBusy, self).__init__()
        self.busy_thread = None

    def filter(self, record):
        return not (record.thread == self.busy_thread and "NOT_FOUND" in record.getMessage())


_QUIET = _QuietWhileBusy()
logging.getLogger("pika.channel").addFilter(_QUIET)


def connection_parameters(url):
    """pika parameters for the benchmark's own connections. Heartbeats are off:
    these connections sit idle while other contestants run, and a blocking
    connection only answers heartbeats when it is called."""
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 5
    parameters.heartbeat = 0
    return parameters


class Admin(object):
    def __init__(self, url, management_url=None):
        from asgi_amqp.urls import management_url_for, vhost_of

        self.connection = pika.BlockingConnection(connection_parameters(url))
        self._channel = self.connection.channel()
        self.queues = []
        self.exchanges = []
        self.vhost = vhost_of(url)
        # The management API to read bindings from, as the layer chooses it.
        self.management_url = (
            management_url or os.environ.get("AMQP_MANAGEMENT_URL") or management_url_for(url)
        )

    # -- facts ------------------------------------------------------------------

    @property
    def server_properties(self):
        return dict(self.connection._impl.server_properties or {})

    def server_version(self):
        props = self.server_properties
        return "%s %s" % (_text(props.get("product", "RabbitMQ")), _text(props.get("version", "?")))

    def server_platform(self):
        return _text(self.server_properties.get("platform", ""))

    # -- queues -------------------------------------------------------------------

    def _run(self, method, *args, **kwargs):
        """Run one RPC; a channel-level error (404) reopens the channel and returns None."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        _QUIET.busy_thread = threading.get_ident()
        try:
            return getattr(self._channel, method)(*args, **kwargs)
        except pika.exceptions.ChannelClosedByBroker:
            self._channel = self.connection.channel()
            return None
        finally:
            _QUIET.busy_thread = None

    def depth(self, queue):
        """Ready messages in ``queue``, or None if it does not exist."""
        frame = self._run("queue_declare", queue, passive=True)
        return None if frame is None else frame.method.message_count

    def wait_depth(self, queue, expected, timeout=10.0):
        """Poll until ``queue`` holds ``expected`` ready messages; the last depth seen."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.depth(queue)
            if seen == expected or time.monotonic() > deadline:
                return seen
            self.connection.sleep(0.01)

    def purge(self, queue):
        self._run("queue_purge", queue)

    def declare(self, queue, arguments):
        self._run("queue_declare", queue, durable=True, arguments=arguments)
        self.track_queue(queue)

    def publish(self, queue, body, properties):
        """An unconfirmed publish to ``queue`` (for untimed fills)."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        self._channel.basic_publish("", queue, body, properties)

    def exchange_declare(self, exchange, exchange_type):
        self._run("exchange_declare", exchange, exchange_type=exchange_type, durable=True)
        self.track_exchange(exchange)

    def bind(self, queue, exchange, routing_key=""):
        self._run("queue_bind", queue, exchange, routing_key=routing_key)

    def delete_many(self, queues=(), exchanges=()):
        """Delete ``queues`` and ``exchanges`` (gone already is fine), pipelined:
        every delete sent with nowait, then one synchronous call. True if the
        channel stayed open."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        impl = self._channel._impl  # pika: callback=None sends nowait=True
        for queue in queues:
            impl.queue_delete(queue, callback=None)
        for exchange in exchanges:
            impl.exchange_delete(exchange, callback=None)
        return self._run("basic_qos", prefetch_count=0) is not None

    def take(self, queue, expected, timeout=10.0):
        """Take the messages of ``queue`` (``basic_get``, acked) until their
        kinds (``_message_kind``) count ``expected`` (a Counter), more than
        it of one kind, or ``timeout`` passed; the counts taken."""
        counts = collections.Counter()
        deadline = time.monotonic() + timeout
        while True:
            got = self._run("basic_get", queue, auto_ack=True)
            method, properties = (None, None) if got is None else got[:2]
            if method is not None:
                counts[_message_kind(properties.headers)] += 1
                continue
            if (
                counts == expected
                or any(n > expected.get(kind, 0) for kind, n in counts.items())
                or time.monotonic() > deadline
            ):
                return counts
            self.connection.sleep(0.01)

    def sift(self, queue, drop=None):
        """The headers of every message in ``queue``, read without taking
        them (``basic_get`` unacked, then all put back), except those for
        which ``drop(headers)`` is true: those are acked, gone. A queue that
        does not exist holds nothing."""
        channel = self.connection.channel()
        seen = []
        _QUIET.busy_thread = threading.get_ident()
        try:
            while True:
                method, properties, _body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                headers = properties.headers or {}
                seen.append(headers)
                if drop is not None and drop(headers):
                    channel.basic_ack(method.delivery_tag)
            channel.basic_nack(0, multiple=True, requeue=True)
            channel.basic_qos(prefetch_count=0)  # the requeue is done
        except pika.exceptions.ChannelClosedByBroker:
            pass  # no such queue
        finally:
            _QUIET.busy_thread = None
            if channel.is_open:
                channel.close()
        return seen

    def unbind_many(self, bindings):
        """Remove ``bindings`` (``(destination type, destination, source,
        arguments)``; routing key ""), pipelined like ``delete_many``."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
        impl = self._channel._impl
        for kind, destination, source, arguments in bindings:
            if kind == "exchange":
                impl.exchange_unbind(destination, source, "", arguments, callback=None)
            else:
                impl.queue_unbind(destination, source, "", arguments, callback=None)
        return self._run("basic_qos", prefetch_count=0) is not None

    # -- the management API ---------------------------------------------------------

    def bindings_from(self, exchange):
        """The bindings whose source is ``exchange`` (management API:
        ``destination``, ``destination_type``, ``arguments``); none for an
        exchange that does not exist."""
        parts = urllib.parse.urlsplit(self.management_url)
        base = "%s://%s%s" % (parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"))
        path = "/api/exchanges/%s/%s/bindings/source" % (
            urllib.parse.quote(self.vhost, safe=""),
            urllib.parse.quote(exchange, safe=""),
        )
        token = "%s:%s" % (
            urllib.parse.unquote(parts.username or "guest"),
            urllib.parse.unquote(parts.password or "guest"),
        )
        request = urllib.request.Request(
            base + path,
            headers={"Authorization": "Basic " + base64.b64encode(token.encode()).decode()},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as response:
                return json.loads(response.read().decode("utf8")) or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise

    # -- clean-up -------------------------------------------------------------------

    def track_queue(self, name):
        if name not in self.queues:
            self.queues.append(name)

    def track_exchange(self, name):
        if name not in self.exchanges:
            self.exchanges.append(name)

    def delete_tracked(self):
        """Delete every tracked object; returns (queues deleted, exchanges deleted)."""
        queues = exchanges = 0
        for queue in self.queues:
            if self._run("queue_delete", queue) is not None:
                queues += 1
        for exchange in self.exchanges:
            if self._run("exchange_delete", exchange) is not None:
                exchanges += 1
        self.queues, self.exchanges = [], []
        return queues, exchanges

    def delete_layer(self, topology, channels, queues=()):
        """Delete what a layer of ``topology`` made for ``channels`` (its
        channels' queues, its dead-letter queue and exchange, its group
        router), ``queues`` and anything else tracked."""
        for queue in list(queues) + [topology.channel_queue(c) for c in channels]:
            self.track_queue(queue)
        self.track_queue(topology.dead_letter_queue)
        self.track_exchange(topology.dead_letter_exchange)
        self.track_exchange(topology.group_router)
        return self.delete_tracked()

    def close(self):
        if self.connection.is_open:
            self.connection.close()


# -- group memberships: the broker's record, checked and removed --------------------------


class MembershipKeeping(object):
    """The membership checks and clean-up of an AMQP layer's keeper, for
    ``asgi_trials.check_membership_round``: ``LayerKeeper``'s and the
    ceiling's. Needs ``admin`` (an ``Admin``) and ``topology``."""

    def check_deliveries(self, channel, pairs, present, notices, what):
        """One send_group to each group reaches a process-local queue once
        per group that has members there (the process copies it to them);
        the join and leave notices of the round wait there too."""
        expected = collections.Counter()
        if present:
            expected["group"] = len({group for group, _channel in pairs})
        expected.update(notices)
        expected = +expected  # no zero counts
        queue = self.topology.channel_queue(channel)
        seen = self.admin.take(queue, expected)
        if seen == expected:
            return []
        return [
            "%s: one send_group to each of %d groups and the round's notices left %s in "
            "their process's queue %s, not %s"
            % (what, len(ROOMS), _counts(seen), channel, _counts(expected))
        ]

    def check_memberships(self, pairs, present):
        return check_leases(self.admin, self.topology, pairs, present)

    def forget(self, pairs):
        forget_leases(self.admin, self.topology, pairs)


class LayerKeeper(MembershipKeeping, Keeper):
    """An AMQPChannelLayer's housekeeping on an ``Admin`` connection: passive declares for
    counts, ``queue.purge``, unconfirmed publishes for fills."""

    def __init__(self, layer, admin):
        super(LayerKeeper, self).__init__(layer)
        self.admin = admin
        self.properties = pika.BasicProperties(
            delivery_mode=1, content_type="application/x-msgpack"
        )
        self.body = msgpack.packb(MESSAGE, use_bin_type=True)
        self.counter = 0

    def close(self):
        self.admin.close()

    def _queue(self, channel):
        return self.layer.topology.channel_queue(channel)

    def purge(self, channel):
        self.admin.purge(self._queue(channel))

    def depth(self, channel):
        return self.admin.depth(self._queue(channel))

    def wait_depth(self, channel, expected):
        return self.admin.wait_depth(self._queue(channel), expected)

    def fill(self, channel, count):
        """Publish ``count`` messages the way the layer would (msgpack body,
        unique message_id), without confirms: fast and untimed."""
        queue = self._queue(channel)
        self.admin.declare(queue, self.layer.topology.channel_queue_arguments(channel))
        properties = self.properties
        # A process-local channel's messages name it (one queue per process).
        properties.headers = {"asgi-channel": channel} if "!" in channel else None
        for _ in range(count):
            self.counter += 1
            properties.message_id = "fill.%d" % self.counter
            self.admin.publish(queue, self.body, properties)

    @property
    def topology(self):
        return self.layer.topology


def membership_bindings(admin, topology, groups):
    """``{(group, member): {stamp, ...}}``: the bindings from the exchanges of
    ``groups`` (management API) and the lease stamps they carry (``None``
    for a binding without one)."""
    from asgi_amqp import naming

    found = {}
    for group in sorted(groups):
        for binding in admin.bindings_from(topology.group_exchange(group)):
            arguments = binding.get("arguments") or {}
            member = topology.member_of_binding(
                str(binding.get("destination", "")), binding.get("destination_type"), arguments
            )
            if member:
                stamp = arguments.get(naming.LEASE_HEADER)
                found.setdefault((group, member), set()).add(
                    None if stamp is None else _text(stamp)
                )
    return found


def check_leases(admin, topology, pairs, present):
    """The record of ``pairs`` (group, channel) in the design with leases.

    ``present``: each membership must have a binding from its group's
    exchange with a live lease stamp (``Topology.live_stamps``), and the
    lease queue a lease message of that group, member and stamp (read
    without being taken). Otherwise no binding of the membership may be
    left, of any stamp; its lease messages stay, as the layer leaves them.
    """
    from asgi_amqp import naming

    found = membership_bindings(admin, topology, {group for group, _channel in pairs})
    if not present:
        wrong = sum(1 for pair in pairs if pair in found)
        if wrong:
            return [
                "%d of %d memberships still have a binding from their group exchange"
                % (wrong, len(pairs))
            ]
        return []
    problems = []
    live = {str(stamp) for stamp in topology.live_stamps()}
    unbound = sum(1 for pair in pairs if not found.get(pair, set()) & live)
    if unbound:
        problems.append(
            "%d of %d memberships have no binding with a live lease stamp from their "
            "group exchange" % (unbound, len(pairs))
        )
    leases = set()
    for headers in admin.sift(topology.lease_queue):
        leases.add(
            (
                _text(headers.get(naming.GROUP_HEADER)),
                _text(headers.get(naming.MEMBER_HEADER)),
                _text(headers.get(naming.LEASE_HEADER)),
            )
        )
    unleased = sum(
        1
        for group, channel in pairs
        if not any((group, channel, stamp) in leases for stamp in found.get((group, channel), ()))
    )
    if unleased:
        problems.append(
            "%d of %d memberships have no lease message of their binding's stamp in %s"
            % (unleased, len(pairs), topology.lease_queue)
        )
    return problems


def forget_leases(admin, topology, pairs):
    """Remove what ``pairs`` (group, channel) made, untimed: their bindings
    from the group exchanges (as found, every stamp; the group exchanges are
    auto-delete and go with their last one), a normal channel's member
    exchange, and their lease messages (the others are put back)."""
    from asgi_amqp import naming

    wanted = set(pairs)
    groups = sorted({group for group, _channel in pairs})
    bindings = []
    for group in groups:
        source = topology.group_exchange(group)
        for binding in admin.bindings_from(source):
            destination = str(binding.get("destination", ""))
            kind = binding.get("destination_type")
            arguments = binding.get("arguments") or {}
            if (group, topology.member_of_binding(destination, kind, arguments)) in wanted:
                bindings.append((kind, destination, source, arguments))
    admin.unbind_many(bindings)
    members = sorted({channel for _group, channel in pairs if "!" not in channel})
    admin.delete_many((), [topology.member_exchange(channel) for channel in members])

    def theirs(headers):
        member = (
            _text(headers.get(naming.GROUP_HEADER)),
            _text(headers.get(naming.MEMBER_HEADER)),
        )
        return member in wanted

    admin.sift(topology.lease_queue, drop=theirs)


def layer_objects(topology, channels, group):
    """(queues, exchanges) a layer of ``topology`` makes for ``channels`` and ``group``,
    shared ones (the lease queue) included."""
    queues = [topology.channel_queue(c) for c in channels]
    queues.append(topology.lease_queue)
    queues.append(topology.dead_letter_queue)
    exchanges = [topology.member_exchange(c) for c in channels]
    exchanges += [
        topology.group_exchange(group),
        topology.dead_letter_exchange,
        topology.group_router,
    ]
    exchanges += [topology.group_exchange(room) for room in ROOMS]
    return queues, exchanges


def _counts(counter):
    if not counter:
        return "nothing"
    return ", ".join("%d %s" % (n, kind) for kind, n in sorted(counter.items()))


def _message_kind(headers):
    """What a message of a process-local queue is: its ``asgi-kind`` (a join
    or leave notice), else ``group`` for a group message, else ``other``."""
    headers = headers or {}
    kind = headers.get("asgi-kind")
    if kind:
        return _text(kind)
    return "group" if headers.get("asgi-group") else "other"


def _text(value):
    return value.decode("utf8", "replace") if isinstance(value, bytes) else str(value)
