"""Groups and flush: the layer's ``groups`` and ``flush`` extensions.

A mixin of ``AMQPChannelLayer``, kept apart because membership is where the
topology is busiest: a member exchange per channel bound to the group's
fanout exchange, a zero-length member queue for a process-local channel
(the broker dead-letters group messages from it into the process's queue)
and a marker queue whose expiry ends the membership (see ``naming``). Each
call states its steps as data and hands them to the engine in one go.
"""

import logging
import os
from typing import Any, Callable, Iterable, List, Optional, Tuple

from . import channel_names, engine, naming, pipeline
from .engine import ACKED
from .errors import BrokerBlocked, BrokerOperationError
from .serialization import Message

logger = logging.getLogger(__name__)


class Groups(object):
    """``group_add``, ``group_discard``, ``group_channels``, ``send_group``,
    ``send_group_many`` and ``flush``."""

    # Provided by AMQPChannelLayer (layer.py; _properties by sending.Sending).
    topology: naming.Topology
    _infrastructure_pid: Optional[int]
    _engine: Any
    _serializer: Any
    _check_group_name: Callable[..., bool]
    _check_channel_name: Callable[..., bool]
    _admin: Callable[..., Any]
    _publish: Callable[..., str]
    _properties: Callable[..., Any]
    _declare_channel_queue: Callable[..., Any]
    _management_client: Callable[..., Any]
    _stats: Any

    def group_add(self, group: str, channel: str) -> None:
        self._check_group_name(group)
        self._check_channel_name(channel)
        self._ensure_infrastructure()
        what = "group_add %s %s" % (group, channel)
        try:
            self._admin(self._membership_steps(group, channel), what)
        except BrokerOperationError as exc:
            if exc.reply_code != 404:
                raise
            # An exchange was deleted between two steps: the member's when its
            # channel's message expired at that moment, or the group's when
            # its last member left elsewhere. Building them again is correct.
            self._ensure_infrastructure(again=True)
            self._admin(self._membership_steps(group, channel), what)
        self._renew_marker(group, channel, self.topology.marker_queue(group, channel))

    def _membership_steps(self, group, channel):
        """Every object of one membership, in an order the broker accepts.

        The engine sends them in one go and waits once (``engine.declares``).
        The group's exchange and its binding to the router are declared every
        time, although they usually exist: re-declaring costs the broker
        almost nothing, while remembering them would be wrong once the group
        empties (the exchange is auto-delete) and cost a refused chain.
        """
        topology = self.topology
        member = topology.member_exchange(channel)
        # The channel's queue must exist: for a process-local member the
        # broker dead-letters into it, and dead-lettering into a missing queue
        # drops the message silently.
        steps = [self._declare_channel_queue(channel)]
        if channel_names.is_process_local(channel):
            target = topology.local_member_queue(channel)
            steps.append(
                engine.queue_declare(target, topology.local_member_queue_arguments(channel))
            )
        else:
            target = topology.channel_queue(channel)
        steps += [
            engine.exchange_declare(
                topology.group_exchange(group),
                auto_delete=naming.GROUP_EXCHANGE_AUTO_DELETE,
                inequivalent_ok=True,  # made before groups were auto-delete: use it
            ),
            engine.exchange_bind(topology.group_exchange(group), topology.group_router, group),
            engine.exchange_declare(member, auto_delete=True),
            engine.queue_bind(target, member),
            engine.exchange_bind(member, topology.group_exchange(group)),
            engine.queue_declare(
                topology.marker_queue(group, channel), topology.marker_queue_arguments()
            ),
        ]
        return steps

    def _renew_marker(self, group, channel, marker):
        properties = self._properties(
            {
                naming.KIND_HEADER: naming.MARKER_KIND,
                naming.GROUP_HEADER: group,
                naming.CHANNEL_HEADER: channel,
            }
        )
        outcome = self._publish("", marker, b"", properties, True, "group marker")
        if outcome != ACKED:
            raise BrokerOperationError(312, "membership marker for %s was not accepted" % channel)

    def group_discard(self, group: str, channel: str) -> None:
        self._check_group_name(group)
        self._check_channel_name(channel)
        topology = self.topology
        self._admin(
            [
                engine.exchange_unbind(
                    topology.member_exchange(channel), topology.group_exchange(group)
                ),
                engine.queue_delete(topology.marker_queue(group, channel)),
            ],
            "group_discard %s %s" % (group, channel),
        )

    def group_channels(self, group: str) -> List[str]:
        self._check_group_name(group)
        destinations = self._management_client().exchange_destinations(
            self.topology.group_exchange(group)
        )
        channels = (self.topology.channel_of_member_exchange(d) for d in destinations)
        return [c for c in channels if c]

    def send_group(self, group: str, message: Message) -> None:
        self._check_group_name(group)
        body = self._serializer.dumps(message)
        self._ensure_infrastructure()
        # Full members drop the message (the broker nacks); that is the spec.
        try:
            self._publish(
                self.topology.group_router,
                group,
                body,
                self._properties(),
                False,
                "send to group %s" % group,
            )
        except BrokerBlocked as exc:
            # ASGI 1.0: send_group "cannot raise ChannelFull", and Channels
            # 1.x ends a runworker on any other exception from it. A message
            # the broker would not take through a whole alarm is dropped,
            # counted and logged, like one for a full member.
            self._stats.count_group_send_dropped()
            logger.warning("send_group %s: message dropped: %s", group, exc)

    def send_group_many(
        self, items: Iterable[Tuple[str, Message]]
    ) -> List[Optional[BaseException]]:
        """``send_many`` for ``(group, message)`` items: ``send_group`` for each."""
        return pipeline.send_all(self, items, "group")

    def flush(self) -> None:
        """Delete every queue and exchange the layer made under its prefix.

        Only names of the layer's own kinds (``naming.Topology.owns``) go;
        anything else under ``{prefix}:`` and every other prefix stays.

        The shared dead-letter queue and exchange and the group router stay
        (emptied), because other processes' workers depend on them.
        """
        # Checked again here: an empty or wildcard prefix would list, and
        # delete, other prefixes' objects. Names are filtered here too, not
        # only by the API's name filter: only the layer's own kinds go.
        naming.check_prefix(self.topology.prefix)
        client = self._management_client()
        prefix = self.topology.prefix + naming.SEPARATOR
        keep = self.topology.infrastructure()
        owns = self.topology.owns
        queues = [q for q in client.queue_names(prefix) if owns(q) and q not in keep]
        exchanges = [x for x in client.exchange_names(prefix) if owns(x) and x not in keep]
        steps = [engine.queue_delete(q) for q in queues]
        steps += [engine.exchange_delete(x) for x in exchanges]
        steps.append(engine.queue_purge(self.topology.dead_letter_queue))
        self._admin(steps, "flush")
        self._engine.forget_queues()

    def _ensure_infrastructure(self, again=False):
        """Declare the shared objects once per process (and again after a 404)."""
        if self._infrastructure_pid == os.getpid() and not again:
            return
        topology = self.topology
        # Senders need only the exchanges. The dead-letter queue is the
        # workers' business; its node being down must not stop group_add.
        self._admin(
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
            ],
            "declare the layer's shared objects",
        )
        self._infrastructure_pid = os.getpid()
