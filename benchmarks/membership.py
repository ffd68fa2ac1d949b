"""The broker work of one group membership, as the layer does it, as data.

``add_phases`` and ``discard_runs`` spell out, call by call, what ``group_add`` and
``group_discard`` ask of the broker (asgi_amqp.groups, names from
``asgi_amqp.naming.Topology``); ``PipelinedChannel`` sends such calls together and waits for
them together. The membership ceiling (``contestants.RawMembershipContestant``) runs them, so
it does the layer's work, no less. What limits the pipelining:

* the lease is confirmed before the binding is made, or a binding could outlive a lost lease;
* so is a process-local member's join notice: the confirm, not frame order, puts it ahead of
  the binding's group messages on every node of a cluster
  (test_groups.py::test_a_join_notice_the_full_process_queue_refused_binds_nothing);
  the two publishes go out together;
* a queue re-declare renews ``x-expires`` only when answered (test_group_renewal.py), so it
  always is; pika holds back the channel's later RPCs until the answer (a publish goes at
  once), so an answered call ends its phase;
* declares of what exists and bindings made again go ``nowait``; the phase's last, answered,
  call vouches for them: the broker runs a channel's methods in order and closes the channel
  at the first that fails
  (test_settings_mismatch_is_named.py::test_group_add_names_the_step_of_its_chain_that_differs);
* ``made`` leaves out what this process made lately, as the layer's ``MemberExchanges`` and
  ``Groups._renewing`` do;
* ``group_discard``'s unbinds go ``nowait``, the last answered, while a process-local
  channel's leave notice goes on a second channel, as the layer sends it on its publishing
  connection beside the unbinds, so the broker runs the two at once.

So ``group_add`` is two round trips, as in the layer
(test_group_add_remakes_what_went.py::test_a_normal_channels_group_add_is_two_round_trips),
and ``group_discard`` one.
"""

import collections
import itertools
import time

import pika

_IDS = itertools.count(1)


class Call(collections.namedtuple("Call", "method kwargs answered remedy", defaults=(False, None))):
    """One AMQP method on a pika ``Channel``: ``getattr(impl, method)(**kwargs)``.

    ``basic_publish`` is a confirmed publish (``mandatory`` in ``kwargs``);
    ``remedy``: the calls that make its queue when the broker returns it.
    Any other method is an RPC, sent with ``nowait`` unless ``answered``.
    """

    def describe(self):
        kwargs = self.kwargs
        names = [
            str(kwargs[key])
            for key in ("queue", "exchange", "source", "destination", "routing_key")
            if kwargs.get(key)
        ]
        return " ".join([self.method] + names)


def message_id():
    return "bench-membership.%d" % next(_IDS)


def _expiration(ends):
    return str(max(1, int(round((ends - time.time()) * 1000))))


def lease_publish(topology, group, channel, stamp):
    """The lease of ``stamp``: what ``Groups._send_lease`` publishes."""
    from asgi_amqp import naming

    properties = pika.BasicProperties(
        delivery_mode=2,
        message_id=message_id(),
        expiration=_expiration(topology.lease_ends(stamp)),
        headers={
            naming.KIND_HEADER: naming.LEASE_KIND,
            naming.GROUP_HEADER: group,
            naming.MEMBER_HEADER: channel,
            naming.LEASE_HEADER: str(stamp),
        },
    )
    declare = queue_declare(topology.lease_queue, topology.lease_queue_arguments())
    return _publish("", topology.lease_queue, properties, remedy=[declare])


def notice_publish(topology, kind, group, channel, stamp=None):
    """A join or leave notice into ``channel``'s process queue (``Groups._notify``)."""
    from asgi_amqp import naming

    headers = {
        naming.KIND_HEADER: kind,
        naming.GROUP_HEADER: group,
        naming.MEMBER_HEADER: channel,
    }
    if stamp is not None:
        headers[naming.LEASE_ENDS_HEADER] = int(topology.lease_ends(stamp) * 1000)
    properties = pika.BasicProperties(
        delivery_mode=1,
        content_type="application/x-msgpack",
        message_id=message_id(),
        headers=headers,
        timestamp=int(time.time()),
    )
    queue = topology.channel_queue(channel)
    declare = queue_declare(queue, topology.channel_queue_arguments(channel))
    return _publish("", queue, properties, remedy=[declare])


def _publish(exchange, routing_key, properties, body=b"", mandatory=True, remedy=None):
    kwargs = dict(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        properties=properties,
        mandatory=mandatory,
    )
    return Call("basic_publish", kwargs, False, remedy)


def queue_declare(queue, arguments):
    """Always answered: only an answered re-declare renews ``x-expires``."""
    return Call("queue_declare", dict(queue=queue, durable=True, arguments=arguments), True)


def exchange_declare(exchange, exchange_type="fanout", auto_delete=True):
    return Call(
        "exchange_declare",
        dict(exchange=exchange, exchange_type=exchange_type, durable=True, auto_delete=auto_delete),
    )


def add_phases(topology, group, channel, stamp, lease=True, made=None):
    """``group_add(group, channel)`` with the lease of ``stamp``: a list of phases.

    Phase 1: the lease (unless ``lease=False``: this process already sent that stamp's), a
    process-local channel's join notice, and a normal channel's queue re-declare when its
    member exchange is to be made. Phase 2: the steps of ``Groups._membership_steps``, nowait,
    the last answered. An empty phase is left out.

    ``made``: member exchanges and ``(group, channel)`` memberships this process made lately
    (their declares are left out, see the module docstring); both are added to it.
    """
    from asgi_amqp import naming

    member, arguments = topology.membership_binding(channel, stamp)
    group_exchange = topology.group_exchange(group)
    queue = topology.channel_queue(channel)
    local = "!" in channel
    made = set() if made is None else made
    # A normal channel's queue may not exist yet: declared in phase 1. Otherwise it exists
    # (the join notice was confirmed into it) and its answered declare ends phase 2.
    queue_first = not local and member not in made
    first = [lease_publish(topology, group, channel, stamp)] if lease else []
    if local:
        first.append(notice_publish(topology, naming.JOIN_KIND, group, channel, stamp))
    if queue_first:
        first.append(queue_declare(queue, topology.channel_queue_arguments(channel)))
    second = []
    if member not in made:
        second += [
            exchange_declare(member),
            Call("queue_bind", dict(queue=queue, exchange=member, routing_key="")),
        ]
    made.add(member)
    if (group, channel) not in made:
        second += [
            exchange_declare(group_exchange),
            Call(
                "exchange_bind",
                dict(destination=group_exchange, source=topology.group_router, routing_key=group),
            ),
        ]
    made.add((group, channel))
    second += [
        Call(
            "exchange_bind",
            dict(destination=member, source=group_exchange, routing_key="", arguments=arguments),
            queue_first,
        ),
    ]
    if not queue_first:
        second.append(queue_declare(queue, topology.channel_queue_arguments(channel)))
    return [phase for phase in (first, second) if phase]


def discard_runs(topology, group, channel):
    """``group_discard(group, channel)``: ``(unbinds, notices)`` for ``run_beside``: every
    live stamp's unbind, nowait, the last answered; a process-local channel's leave notice."""
    from asgi_amqp import naming

    group_exchange = topology.group_exchange(group)
    unbinds = []
    for stamp in topology.live_stamps():
        member, arguments = topology.membership_binding(channel, stamp)
        unbinds.append(
            Call(
                "exchange_unbind",
                dict(
                    destination=member, source=group_exchange, routing_key="", arguments=arguments
                ),
            )
        )
    unbinds[-1] = unbinds[-1]._replace(answered=True)
    notices = []
    if "!" in channel:
        notices.append(notice_publish(topology, naming.LEAVE_KIND, group, channel))
    return unbinds, notices


class Refused(Exception):
    """The broker nacked or returned a publish it had to take."""


class PipelinedChannel(object):
    """A pika ``BlockingChannel`` whose calls go out together.

    Confirms are tracked here on ``_impl`` (a ``BlockingChannel`` in confirm mode waits for
    each publish alone). ``run(calls)`` sends every call, then waits for every confirm and
    answer. A channel error raises ``ChannelClosedByBroker`` (the channel is reopened); a
    nacked publish raises ``Refused``; a returned one has its queue made and is sent again, once.
    """

    def __init__(self, connection):
        self.connection = connection
        self.beside = None  # a PipelinedChannel of the same connection, for run_beside
        self._open()

    def _open(self):
        self.channel = self.connection.channel()
        impl = self.channel._impl
        self._next_tag = 0
        self._unsettled = {}  # delivery tag -> message_id
        self._nacked = []
        self._returned = []  # message_ids
        self._answers = 0  # answered RPCs not answered yet
        impl.add_on_return_callback(self._on_return)
        selected = []
        impl.confirm_delivery(self._on_confirm, callback=selected.append)
        self.channel._flush_output(lambda: bool(selected))

    # -- callbacks (pika's I/O, inside _flush_output) ----------------------------------

    def _on_confirm(self, frame):
        method = frame.method
        tags = [method.delivery_tag]
        if method.multiple:
            tags = [tag for tag in self._unsettled if tag <= method.delivery_tag]
        for tag in tags:
            mid = self._unsettled.pop(tag, None)
            if isinstance(method, pika.spec.Basic.Nack):
                self._nacked.append(mid)

    def _on_return(self, _channel, _method, properties, _body):
        self._returned.append(properties.message_id)

    def _on_answer(self, _frame):
        self._answers -= 1

    # -- calls --------------------------------------------------------------------------

    def send(self, call):
        impl = self.channel._impl
        if call.method == "basic_publish":
            impl.basic_publish(**call.kwargs)
            self._next_tag += 1
            self._unsettled[self._next_tag] = call.kwargs["properties"].message_id
            return
        if call.answered:
            self._answers += 1
            getattr(impl, call.method)(callback=self._on_answer, **call.kwargs)
        else:
            getattr(impl, call.method)(callback=None, **call.kwargs)

    def _settled(self):
        """Every confirm and answer is in, or the channel was closed."""
        if self.channel.is_closed:
            return True
        return not self._unsettled and not self._answers

    def wait(self):
        """Until every confirm and answer is in; raises as ``run`` says."""
        self.connection._flush_output(self._settled)
        self._check()

    def _check(self):
        """After a wait: raise for a closed channel or a nacked publish."""
        if self.channel.is_closed:
            reason = getattr(self.channel, "_closing_reason", None)
            self._open()
            if isinstance(reason, Exception):
                raise reason
            raise pika.exceptions.ChannelClosed(None, "channel closed")
        nacked, self._nacked = self._nacked, []
        if nacked:
            raise Refused("%d publishes nacked" % len(nacked))

    def run_beside(self, calls, publishes):
        """``calls`` here and ``publishes`` on a second channel (``beside``), sent and waited
        for together, so the broker runs both at once, as it does the layer's two connections."""
        beside = self.beside
        if beside is None:
            beside = self.beside = PipelinedChannel(self.connection)
        self._returned = []
        beside._returned = []
        for call in calls:
            self.send(call)
        for call in publishes:
            beside.send(call)
        self.connection._flush_output(lambda: self._settled() and beside._settled())
        try:
            self._check()
        finally:
            beside._check()
        beside._send_returned(publishes, True)

    def run(self, calls, again=True):
        """Send ``calls`` together and wait for them."""
        self._returned = []
        after_answered = False
        for call in calls:
            if call.method == "basic_publish" and after_answered:
                # pika would send it ahead of the RPCs it holds back.
                raise ValueError("a publish after an answered call in one phase")
            self.send(call)
            after_answered = after_answered or call.answered
        self.wait()
        self._send_returned(calls, again)

    def _send_returned(self, calls, again):
        """Returned mandatory publishes of ``calls``: their queues made and sent again once
        (``again``), else ``Refused``."""
        if not self._returned:
            return
        returned = [
            call
            for call in calls
            if call.method == "basic_publish"
            and call.kwargs["properties"].message_id in self._returned
        ]
        mandatory = [call for call in returned if call.kwargs.get("mandatory")]
        if not mandatory:
            return
        if not again:
            raise Refused("returned: %s" % ", ".join(call.describe() for call in mandatory))
        for call in mandatory:
            # Its queue did not exist (new, expired or flushed): make it, send again.
            if call.remedy:
                self.run(call.remedy, again=False)
            self.run([call], again=False)

    def publish(self, exchange, routing_key, body, properties, mandatory=False):
        """One confirmed publish, waited for."""
        self.run([_publish(exchange, routing_key, properties, body, mandatory)])
