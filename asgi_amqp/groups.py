"""Groups and flush: the layer's ``groups`` and ``flush`` extensions.

A membership is a *binding* from the group's fanout exchange to the channel's
member exchange (``m:foo``, or the process's ``m:foo!`` for a process-local
channel), its arguments carrying the lease's stamp, plus a lease message the
broker dead-letters when the lease ends, for the dead-letter worker to remove
the binding. ``group_add`` has the lease (and a process-local channel's join
notice, so it is queued ahead of any group message) confirmed before it binds;
binding again with the current stamp is the renewal, and the channel queue's
answered declare renews that queue. What this process knows exists is not
declared again, and a 404 makes everything again: without ``MemberExchanges``
bench row (i) group-add falls, without ``_bound`` and ``_leases_sent`` (k) group-renew.

Broker facts (tests under tests/):

* a binding made again changes nothing
  (test_memberships_are_bindings.py::test_renewals_within_a_stamp_add_no_binding);
* a declare of an exchange that exists changes nothing but its answer;
* an expired lease message is dead-lettered
  (test_memberships_are_bindings.py::test_a_lease_ends_while_its_member_is_read);
* an answered re-declare renews a classic queue's ``x-expires``, a nowait one
  does not (test_group_renewal.py);
* an auto-delete group exchange goes when its group empties
  (test_groups.py::test_a_group_deleted_when_it_emptied_can_be_joined_again);
* a member exchange goes with its queue, its only binding
  (test_group_add_remakes_what_went.py::test_a_member_exchange_gone_with_its_queue_is_made_again);
* binding to an exchange that went is refused (404), closing the channel
  (test_group_add_remakes_what_went.py::test_a_group_exchange_deleted_elsewhere_is_made_again);
* unbinding what is not there, even from an exchange that went, is no error on
  3.10 and 4.0 (test_groups.py::test_discard_of_unknown_member_and_group_is_harmless);
* a full member's queue nacks a group message (test_send_group_waits_for_room.py).
"""

import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pika

from . import engine, naming
from .callers import Caller
from .channel_names import check_channel_name, check_group_name, is_process_local
from .engine import ACKED, NACKED, RETURNED, Engine, InFlight, PublishRequest, Step
from .errors import BrokerBlocked, BrokerOperationError, ChannelFull
from .local_groups import LocalGroups
from .management import ManagementClient
from .parked_sends import FIRST_PAUSE, LONGEST_PAUSE
from .sending import Sender
from .serialization import Message
from .statistics import Counters

logger = logging.getLogger(__name__)

# Entries ``_remember`` keeps in a table (leases sent, bindings made).
_LEASES_REMEMBERED = 100000
# Seconds a runworker's join notice and send_group wait for room in a full queue:
# the 2 s Channels 1.x gives a full channel in send.
ROOM_PATIENCE = 2.0
# Seconds after a send_group gave up on a full member that the group's sends do not
# wait: a member nobody reads (a dead daphne's) must not cost each send ROOM_PATIENCE.
GAVE_UP_FOR = 10.0
GAVE_UP_REMEMBERED = 10000  # groups whose give-up is remembered (then forgotten at once)
# Deletes a flush sends as one run, waited for within operation_timeout.
FLUSH_RUN = 100
# Seconds after which group_add declares a member exchange again at most.
REMADE_AFTER = 600.0


class RoomWait(object):
    """A caller's wait for room in a full queue, with the pauses of parked sends:
    ``ROOM_PATIENCE`` s at most within ``operation_timeout``; none on daphne's
    reactor thread, or unless ``waits``."""

    def __init__(self, operation_timeout: float, caller: Caller, waits: bool = True) -> None:
        patience = min(ROOM_PATIENCE, operation_timeout)
        waits = waits and caller is not Caller.REACTOR
        self._deadline = time.monotonic() + (patience if waits else 0.0)
        self._pause = FIRST_PAUSE

    def pause(self) -> bool:
        """Sleep the next pause and say True, or say False: the wait is over."""
        if time.monotonic() + self._pause > self._deadline:
            return False
        time.sleep(self._pause)  # a runworker's thread, never the reactor's
        self._pause = min(2 * self._pause, LONGEST_PAUSE)
        return True


def _remember(table: Dict[Tuple[str, str], int], key: Tuple[str, str], stamp: int) -> None:
    """``table[key] = stamp``, in a table of at most ``_LEASES_REMEMBERED`` entries
    (emptied when full: a forgotten entry costs a lease or two declares)."""
    if len(table) >= _LEASES_REMEMBERED:
        table.clear()
    table[key] = stamp


class MemberExchanges(object):
    """The member exchanges (``m:{channel}``, ``m:foo!``) this process declared
    and bound to their queue lately, so that ``group_add`` does not do it again.

    Such an exchange is auto-delete and bound only to its queue, so it goes only
    with that queue (``flush``, a deletion by hand, ``x-expires`` after ``2 *
    expiry`` unused), and every ``group_add`` renews that lease: an entry is
    trusted for less than that. A 404 makes everything again. Group exchanges
    are not remembered: one goes whenever its group empties, anywhere.

    Callers' threads; a dict's get, set and pop are atomic, and an entry lost to
    a race costs a declare.
    """

    LIMIT = 100000

    def __init__(self, expiry: float) -> None:
        self._trusted_for = min(REMADE_AFTER, 1.5 * expiry)
        self._made: Dict[str, float] = {}  # exchange -> monotonic time made

    def made_lately(self, exchange: str) -> bool:
        made = self._made.get(exchange)
        return made is not None and time.monotonic() - made < self._trusted_for

    def add(self, exchange: str) -> None:
        if len(self._made) >= self.LIMIT:
            self._made.clear()
        self._made[exchange] = time.monotonic()

    def forget(self, exchange: str) -> None:
        self._made.pop(exchange, None)

    def clear(self) -> None:
        self._made.clear()


class Groups(object):
    """``group_add``, ``group_discard``, ``group_channels``, ``send_group`` and ``flush``.

    Made by ``AMQPChannelLayer``; used from callers' threads only, several at
    once. It publishes and declares through the engine, and takes from the
    ``Sender`` its message properties, a channel queue's declare,
    ``operation_timeout`` and ``finish_send``.
    """

    def __init__(
        self,
        sender: Sender,
        engine: Engine,
        topology: naming.Topology,
        stats: Counters,
        local_groups: LocalGroups,
        management_client: Callable[[], ManagementClient],
        expiry: float,
    ) -> None:
        self._sender = sender  # message properties, ``finish_send``, operation_timeout
        self._engine = engine  # publishes, declares, and the queues a flush deleted
        self._topology = topology
        self._stats = stats  # group sends dropped (thread-safe, the layer's)
        self._local_groups = local_groups  # the Receiver's: a flush empties it
        self._management_client = management_client  # the layer's, made on first use
        # The pid that declared the shared objects, None before and after a flush
        # (callers' threads; a race declares them twice, harmlessly).
        self._infrastructure_pid: Optional[int] = None
        # (group, channel) -> the stamp of its lease this process last sent (callers'
        # threads; a dict's get and set are atomic).
        self._leases_sent: Dict[Tuple[str, str], int] = {}
        # Member exchanges group_add made lately (callers' threads).
        self._member_exchanges = MemberExchanges(expiry)
        # (group, channel) -> the stamp of this process's last binding of it
        # (callers' threads, atomic; an entry lost to a race costs two declares).
        self._bound: Dict[Tuple[str, str], int] = {}
        # group -> when send_group last gave up on a full member (callers' threads, atomic).
        self._gave_up: Dict[str, float] = {}

    def group_add(self, group: str, channel: str) -> None:
        check_group_name(group)
        check_channel_name(channel)
        self.ensure_infrastructure()
        stamp = self._topology.lease_stamp()
        renewing = self._renewing(group, channel)
        member = self._topology.membership_binding(channel, stamp)[0]
        # A member exchange not made lately is bound to its queue, which must exist:
        # a normal channel's is declared beside the lease (a process-local one's
        # holds the join notice).
        made_lately = self._member_exchanges.made_lately(member)
        queue_first = not made_lately and not is_process_local(channel)
        self._send_lease_and_notice(group, channel, stamp, queue_first)
        what = "group_add %s %s" % (group, channel)
        try:
            self._engine.declare(
                self._membership_steps(group, channel, stamp, renewing, made_lately, queue_first),
                what,
            )
        except BrokerOperationError as exc:
            if exc.reply_code != 404:
                raise
            # Something went between two steps (a member exchange with its queue, a
            # group's exchange when it emptied elsewhere, a process-local queue that
            # expired): make everything again.
            self._member_exchanges.forget(member)
            self._bound.pop((group, channel), None)
            self.ensure_infrastructure(again=True)
            self._engine.declare(self._membership_steps(group, channel, stamp, again=True), what)
        self._member_exchanges.add(member)
        _remember(self._bound, (group, channel), stamp)

    def _renewing(self, group: str, channel: str) -> bool:
        """Whether ``group_add(group, channel)`` renews a membership this process
        made whose lease has not ended. Then that binding keeps the group's
        auto-delete exchange, so a renewal neither declares it nor binds it to the
        router; if it went elsewhere, the renewal's binding is refused (404)."""
        stamp = self._bound.get((group, channel))
        return stamp is not None and self._topology.lease_ends(stamp) > time.time()

    def _membership_steps(
        self,
        group: str,
        channel: str,
        stamp: int,
        renewing: bool = False,
        made_lately: bool = False,
        queue_declared: bool = False,
        again: bool = False,
    ) -> List[Step]:
        """The membership's binding and what it needs, in an order the broker accepts.

        Left out: the group's exchange and its router binding when ``renewing``,
        the member exchange and its queue binding when ``made_lately``; ``again``
        (after a 404) makes everything, the channel's queue first. Otherwise the
        queue's answered declare goes last, vouching for the nowait steps before
        it (one round trip), unless ``queue_declared`` beside the lease already.
        """
        topology = self._topology
        group_exchange = topology.group_exchange(group)
        member, arguments = topology.membership_binding(channel, stamp)
        declare = self._sender.channel_queue_declare(channel)
        steps = []
        if again or not made_lately:
            steps += [
                engine.exchange_declare(member, auto_delete=True),
                engine.queue_bind(topology.channel_queue(channel), member),
            ]
        if again or not renewing:
            steps += [
                engine.exchange_declare(group_exchange, auto_delete=True),
                engine.exchange_bind(group_exchange, topology.group_router, group),
            ]
        steps.append(engine.exchange_bind(member, group_exchange, arguments=arguments))
        if again:
            return [declare] + steps  # two round trips, after a 404
        if queue_declared:
            return steps
        return steps + [declare]

    def _send_lease_and_notice(
        self, group: str, channel: str, stamp: int, declare_queue: bool = False
    ) -> None:
        """The lease (unless sent already), a process-local channel's join notice and,
        with ``declare_queue``, the channel queue's declare, all in one round trip.

        Nothing orders them: the binding, made after, needs each. A publish not
        acked goes again on its own path (``_send_lease``, ``_notify``), which
        knows what to do about it; a lease sent twice is harmless."""
        local = is_process_local(channel)
        lease = self._lease_message(group, channel, stamp)
        requests: List[PublishRequest] = []
        if lease is not None:
            what = "lease of %s in %s" % (channel, group)
            requests.append(("", self._topology.lease_queue, b"", lease, True, what))
        if local:
            notice = self._notice_message(naming.JOIN_KIND, group, channel, stamp)
            requests.append(notice)
        in_flight = self._engine.start_publishes(requests) if requests else None
        if declare_queue:
            self._engine.declare(
                [self._sender.channel_queue_declare(channel)],
                "group_add %s %s" % (group, channel),
            )
        outcomes = self._outcomes(in_flight) if in_flight is not None else []
        if lease is not None:
            if outcomes[0] == ACKED:
                self._remember_lease(group, channel, stamp)
            else:
                self._send_lease(group, channel, stamp)
        if local and outcomes[-1] != ACKED:
            self._notify(naming.JOIN_KIND, group, channel, stamp)

    def _outcomes(self, in_flight: InFlight) -> List[Optional[str]]:
        """Each outcome of publishes started together, or None while an alarm blocks
        publishing (the caller's own path waits for it)."""
        deadline = time.monotonic() + self._sender.operation_timeout
        outcomes: List[Optional[str]] = []
        for index in range(len(in_flight)):
            try:
                outcomes.append(in_flight.outcome(index, deadline))
            except BrokerBlocked:
                outcomes.append(None)
        return outcomes

    def _lease_message(
        self, group: str, channel: str, stamp: int
    ) -> Optional[pika.BasicProperties]:
        """The properties of the lease message of ``stamp``, or None if this
        process sent it already (see ``_send_lease``)."""
        if self._leases_sent.get((group, channel)) == stamp:
            return None
        headers: Dict[str, Any] = {
            naming.KIND_HEADER: naming.LEASE_KIND,
            naming.GROUP_HEADER: group,
            naming.MEMBER_HEADER: channel,
            naming.LEASE_HEADER: str(stamp),
        }
        properties = self._sender.properties(headers)
        properties.delivery_mode = 2  # a lease lost is a binding nobody removes
        ends = self._topology.lease_ends(stamp)
        properties.expiration = str(max(1, int(round((ends - time.time()) * 1000))))
        return properties

    def _remember_lease(self, group: str, channel: str, stamp: int) -> None:
        _remember(self._leases_sent, (group, channel), stamp)

    def _send_lease(self, group: str, channel: str, stamp: int) -> None:
        """Put the lease of ``stamp`` in the lease queue, unless this process did: all
        lease messages of a stamp expire at its end, so one is enough and another
        process's copy is harmless."""
        properties = self._lease_message(group, channel, stamp)
        if properties is None:
            return
        queue = self._topology.lease_queue
        what = "lease of %s in %s" % (channel, group)
        outcome = self._publish(queue, properties, what)
        if outcome == RETURNED:  # flushed, or deleted by hand
            self.ensure_infrastructure(again=True)
            outcome = self._publish(queue, properties, what)
        if outcome != ACKED:
            raise BrokerOperationError(
                312 if outcome == RETURNED else None,
                "the lease of %s in %s was not accepted (%s)" % (channel, group, outcome),
                operation="publish to %r" % queue,
            )
        self._remember_lease(group, channel, stamp)

    def _publish(self, queue: str, properties: pika.BasicProperties, what: str) -> str:
        """Publish an empty message (a lease or a notice) to ``queue``, mandatory,
        waiting through a resource alarm within ``operation_timeout``."""
        return self._engine.publish(
            "", queue, b"", properties, True, what, alarm_wait=self._sender.operation_timeout
        )

    def _notice_message(
        self, kind: str, group: str, channel: str, stamp: Optional[int] = None
    ) -> PublishRequest:
        headers: Dict[str, Any] = {
            naming.KIND_HEADER: kind,
            naming.GROUP_HEADER: group,
            naming.MEMBER_HEADER: channel,
        }
        if stamp is not None:
            headers[naming.LEASE_ENDS_HEADER] = int(self._topology.lease_ends(stamp) * 1000)
        queue = self._topology.channel_queue(channel)
        what = "%s notice of %s in %s" % (kind, channel, group)
        return ("", queue, b"", self._sender.properties(headers), True, what)

    def _notify(self, kind: str, group: str, channel: str, stamp: Optional[int] = None) -> None:
        """Tell the process of a process-local ``channel`` that it joined or left
        ``group``, through its own queue: a confirmed publish, like ``send``.

        A full queue (daphne's, full of accepts in a connect storm) is waited for
        as ``RoomWait`` says, then ``ChannelFull``: the process could not learn of
        the membership. Longer would delay the welcome its client waits for."""
        _, queue, _, properties, _, what = self._notice_message(kind, group, channel, stamp)
        room = RoomWait(self._sender.operation_timeout, self._sender.caller())
        while True:
            outcome = self._publish(queue, properties, what)
            try:
                self._sender.finish_send(channel, queue, b"", properties, outcome)
                return
            except ChannelFull:
                if not room.pause():
                    raise

    def group_discard(self, group: str, channel: str) -> None:
        check_group_name(group)
        check_channel_name(channel)
        topology = self._topology
        group_exchange = topology.group_exchange(group)
        steps = []
        # Every stamp whose lease may not have ended, nowait but the last: one round
        # trip. Unbinding what is not there is no error (see the module docstring).
        for stamp in topology.live_stamps():
            member, arguments = topology.membership_binding(channel, stamp)
            steps.append(engine.exchange_unbind(member, group_exchange, arguments))
        # The leave notice goes with the unbinds (one round trip): the process may
        # stop copying a moment before the bindings go; the channel is leaving.
        local = is_process_local(channel)
        in_flight = None
        if local:
            notice = self._notice_message(naming.LEAVE_KIND, group, channel)
            in_flight = self._engine.start_publishes([notice])
        self._engine.declare(steps, "group_discard %s %s" % (group, channel))
        self._leases_sent.pop((group, channel), None)
        self._bound.pop((group, channel), None)
        if in_flight is not None and self._outcomes(in_flight) != [ACKED]:
            try:
                self._notify(naming.LEAVE_KIND, group, channel)
            except ChannelFull as exc:
                # The binding is gone; the process counts it a member until its lease ends.
                logger.warning(
                    "group_discard %s %s: its process was not told (%s); it hands the "
                    "channel messages of the group that reach it through its other "
                    "members until the lease ends",
                    group,
                    channel,
                    exc,
                )

    def group_channels(self, group: str) -> List[str]:
        check_group_name(group)
        bindings = self._management_client().exchange_bindings_from(
            self._topology.group_exchange(group)
        )
        channels: List[str] = []
        for binding in bindings:
            channel = self._topology.member_of_binding(
                str(binding.get("destination", "")),
                binding.get("destination_type"),
                binding.get("arguments"),
            )
            if channel and channel not in channels:  # a binding per lease stamp
                channels.append(channel)
        return channels

    def send_group(self, group: str, message: Message) -> None:
        """ASGI: never ``ChannelFull``. A member whose queue is full (the broker
        nacks) is waited for as ``RoomWait`` says, since after an outage workers
        fill daphne's queue faster than it reads; the message goes again marked,
        so a member that took it drops the copy. Then it is dropped for that
        member, counted and logged, and the group's sends do not wait for
        ``GAVE_UP_FOR`` seconds."""
        check_group_name(group)
        body = self._sender.encode(message)
        self.ensure_infrastructure()
        # The group tells a process which of its members to copy it to.
        properties = self._sender.properties({naming.GROUP_HEADER: group})
        what = "send to group %s" % group
        room: Optional[RoomWait] = None
        marked = False
        while True:
            try:
                outcome = self._engine.publish(
                    self._topology.group_router,
                    group,
                    body,
                    properties,
                    False,
                    what,
                    marked,
                    alarm_wait=self._sender.operation_timeout,
                )
            except BrokerBlocked as exc:
                # ASGI 1.0: send_group "cannot raise ChannelFull", and Channels 1.x ends a
                # runworker on any other exception: dropped, like one for a full member.
                self._stats.count_group_send_dropped()
                logger.warning("send_group %s: message dropped: %s", group, exc)
                return
            if outcome != NACKED:
                self._gave_up.pop(group, None)
                return
            if room is None:
                gave_up = self._gave_up.get(group)
                waits = gave_up is None or time.monotonic() - gave_up > GAVE_UP_FOR
                room = RoomWait(self._sender.operation_timeout, self._sender.caller(), waits)
            if not room.pause():
                if len(self._gave_up) >= GAVE_UP_REMEMBERED:
                    self._gave_up.clear()  # a forgotten give-up costs one more wait
                self._gave_up[group] = time.monotonic()
                self._stats.count_group_send_dropped()
                logger.warning("send_group %s: a member's queue is full: dropped for it", group)
                return
            marked = True

    def flush(self) -> None:
        """``AMQPChannelLayer.flush``: what the layer made under its prefix goes,
        and what this process remembers of it."""
        # An empty or wildcard prefix would delete other prefixes' objects; and only
        # the layer's own kinds go, whatever the API's name filter lets through.
        naming.check_prefix(self._topology.prefix)
        client = self._management_client()
        prefix = self._topology.prefix + naming.SEPARATOR
        keep = self._topology.infrastructure()
        owns = self._topology.owns
        queues = [q for q in client.queue_names(prefix) if owns(q) and q not in keep]
        exchanges = [x for x in client.exchange_names(prefix) if owns(x) and x not in keep]
        steps = [engine.queue_delete(q) for q in queues]
        steps += [engine.exchange_delete(x) for x in exchanges]
        steps.append(engine.queue_purge(self._topology.dead_letter_queue))
        try:
            # In runs, each within operation_timeout: thousands of deletes in one run
            # outlast it on a busy broker, which would look like no answer.
            for start in range(0, len(steps), FLUSH_RUN):
                run = steps[start : start + FLUSH_RUN]
                what = "flush (%d to %d of %d)" % (start + 1, start + len(run), len(steps))
                self._engine.declare(run, what)
        finally:
            # Forget it all: a flush stopped halfway leaves it declaring again, harmlessly.
            self._leases_sent.clear()
            self._bound.clear()
            self._member_exchanges.clear()
            self._local_groups.forget()
            self._infrastructure_pid = None  # the lease queue went
            self._engine.forget_queues()

    def ensure_infrastructure(self, again: bool = False) -> None:
        """Declare the shared objects once per process (and again after a 404)."""
        if self._infrastructure_pid == os.getpid() and not again:
            return
        topology = self._topology
        # Senders need only the exchanges: the dead-letter queue's node being down
        # must not stop group_add.
        self._engine.declare(
            [
                engine.exchange_declare(topology.dead_letter_exchange),
                engine.exchange_declare(topology.group_router, exchange_type="direct"),
                engine.queue_declare(
                    topology.dead_letter_queue,
                    topology.dead_letter_queue_arguments(),
                    not_found_ok=True,
                ),
                engine.queue_bind(
                    topology.dead_letter_queue, topology.dead_letter_exchange, not_found_ok=True
                ),
                engine.queue_declare(topology.lease_queue, topology.lease_queue_arguments()),
            ],
            "declare the layer's shared objects",
        )
        self._infrastructure_pid = os.getpid()
