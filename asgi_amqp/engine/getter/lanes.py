"""The getter's lanes: one AMQP channel each, for one ``basic_get`` at a time.

Broker facts:

* a channel runs one synchronous method at a time: queues asked at once need one each;
* a 404 (a queue flushed since we declared it) closes its channel only;
* a nack is never answered, and a get on another channel can overtake it
  (``Lane.barrier``; ``test_messages_taken_and_put_back_keep_their_order``).

A lane's message stays unacked (``Taken``) until the request decides. Each
``Lane`` owns its channel and job; owned by ``waves.Getter``; I/O thread only.
"""

import logging
from typing import Any, Callable, Optional, Tuple, Union

import pika
import pika.channel
from pika import spec

from ...errors import BrokerConnectionError, BrokerOperationError
from ..declares import broker_call_error
from ..deliveries import Delivery, HandedOff, Liveness
from ..reopening_channel import ReopeningChannel

logger = logging.getLogger(__name__)

NOT_FOUND = 404
EMPTY = "empty"  # a lane's answer when its queue had nothing


class Taken(object):
    """A message a lane took off a queue: unacked until the request decides."""

    __slots__ = ("lane", "channel", "delivery_tag", "delivery")

    def __init__(
        self, lane: "Lane", channel: pika.channel.Channel, delivery_tag: int, delivery: Delivery
    ) -> None:
        self.lane = lane
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.delivery = delivery

    @property
    def still_held(self) -> bool:
        """False once its channel closed: the broker has put the message back."""
        return self.lane.channel is self.channel

    def settle(self, handed: bool) -> bool:
        """Ack it, or put it back; True if it was put back."""
        if not self.still_held:
            return False
        if handed:
            self.channel.basic_ack(self.delivery_tag)
            return False
        self.channel.basic_nack(self.delivery_tag, requeue=True)
        return True


# What a lane reports for one fetch: a Taken, EMPTY, or the error.
Answer = Union[Taken, str, Exception]


class Lane(object):
    """One channel that gets the head of one queue at a time; a 404 counts as empty."""

    def __init__(
        self,
        connection: pika.SelectConnection,
        liveness: Liveness,
        handed_off: HandedOff,
        on_ready: Callable[[], None],
    ) -> None:
        self._liveness = liveness
        self._handed_off = handed_off
        self._job: Optional[Tuple[str, Any, Callable[[Answer], None]]] = None
        # The ``done`` of the barrier in flight.
        self._barrier: Optional[Callable[[], None]] = None
        self._channel = ReopeningChannel(connection, "get", self._setup, on_ready, self._on_lost)
        self._channel.open()

    @property
    def channel(self) -> Optional[pika.channel.Channel]:
        return self._channel.current

    @property
    def idle(self) -> bool:
        return self._channel.ready and self._job is None and self._barrier is None

    def barrier(self, done: Callable[[], None]) -> None:
        """Call ``done`` once the messages this lane nacked are in their queues again.

        Broker: the answer to a ``basic.qos`` (that changes nothing) comes after
        the channel's nacks were forwarded to their queues.
        """
        self._barrier = done
        channel: Any = self._channel.current  # None raises below: the channel is going
        try:
            channel.basic_qos(prefetch_count=0, callback=self._pass_barrier)
        except Exception:  # the channel is going: the broker puts them back anyway
            logger.debug("barrier on the get channel failed", exc_info=True)
            self._pass_barrier()

    def _pass_barrier(self, _frame: Any = None) -> None:
        done, self._barrier = self._barrier, None
        if done is not None:
            done()

    def _setup(self, channel: pika.channel.Channel, done: Callable[[], None]) -> None:
        channel.add_callback(self._on_empty, [spec.Basic.GetEmpty], one_shot=False)
        done()

    def fetch(self, queue: str, arguments: Any, report: Callable[[Answer], None]) -> None:
        """Get the head of ``queue``; ``report`` gets a ``Taken``, EMPTY or an exception."""
        self._job = (queue, arguments, report)
        channel: Any = self._channel.current  # None raises below, as a lost connection
        try:
            if self._liveness.alive(queue):
                channel.basic_get(queue, self._on_message, auto_ack=False)
            else:
                channel.queue_declare(
                    queue, durable=True, arguments=arguments, callback=self._on_declared
                )
        except Exception as exc:  # connection gone, or a name pika cannot encode
            logger.debug("receive from %s failed", queue, exc_info=True)
            self._finish(broker_call_error(exc, "receive"))

    def _on_declared(self, frame: Any) -> None:
        if self._job is None:
            return  # forgotten: the channel closes with its session
        queue, arguments, _ = self._job
        self._liveness.touch(queue, arguments)
        if frame.method.message_count == 0:
            self._finish(EMPTY)
        else:
            channel = self._channel.current
            if channel is None:  # an invariant, checked under -O too
                raise RuntimeError("channel is None: it answered the declare")
            channel.basic_get(queue, self._on_message, auto_ack=False)

    def _on_empty(self, _frame: Any) -> None:
        if self._job is None:
            return
        queue, arguments, _ = self._job
        self._liveness.touch(queue, arguments)
        self._finish(EMPTY)

    def _on_message(
        self,
        channel: pika.channel.Channel,
        method: Any,  # a Basic.GetOk, whose fields types-pika makes Optional
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        if self._job is None:
            return  # unacked: the broker requeues it when the channel closes
        queue, arguments, _ = self._job
        self._liveness.touch(queue, arguments)
        if self._handed_off.is_duplicate(queue, method, properties):
            channel.basic_ack(method.delivery_tag)
            channel.basic_get(queue, self._on_message, auto_ack=False)  # same queue again
            return
        delivery = Delivery(
            queue, properties.headers or {}, body, method.redelivered, properties.message_id
        )
        self._handed_off.taking(delivery)
        self._finish(Taken(self, channel, method.delivery_tag, delivery))

    def shutdown(self) -> None:
        """The session is going away: stop reopening the channel and listening on it."""
        self._channel.shutdown()

    def forget(self) -> None:
        self._job = None
        self._barrier = None

    def _on_lost(self, reply_code: Optional[int], reply_text: Optional[str]) -> None:
        self._pass_barrier()
        if self._job is None:
            return
        if reply_code == NOT_FOUND:
            self._liveness.forget(self._job[0])
            self._finish(EMPTY)
        elif reply_code is None or reply_code >= 500 or reply_code == 320:
            self._finish(
                BrokerConnectionError(
                    "connection lost during receive (%s %s)" % (reply_code, reply_text)
                )
            )
        else:
            # e.g. 406: the queue exists with other arguments (another expiry).
            self._finish(BrokerOperationError(reply_code, reply_text))

    def _finish(self, result: Answer) -> None:
        job, self._job = self._job, None
        if job is not None:
            job[2](result)
