"""One AMQP channel that reopens itself, and the base of the parts that use one.

Each part of the session (publisher, admin, getter, consumers) runs on its
own AMQP channel, because a channel-level error such as a 404 closes the
whole channel: a failed ``basic_get`` must not take the publisher's
outstanding confirms or the consumers' unacked deliveries with it.
Everything here runs on the I/O thread.
"""

import logging

import pika.exceptions

logger = logging.getLogger(__name__)


def describe_close(reason):
    """Reply code and text of a pika close reason, credentials never included."""
    code = getattr(reason, "reply_code", None)
    text = getattr(reason, "reply_text", None)
    if code is None:
        return None, "%s" % type(reason).__name__
    return code, text


def connection_lost(reason, connection):
    """True when a channel closed because its whole connection went."""
    return isinstance(reason, pika.exceptions.AMQPConnectionError) or not connection.is_open


class ChannelUser(object):
    """A part of the session that owns one AMQP channel.

    Subclasses implement ``setup(channel, done)`` (e.g. confirm.select),
    ``on_ready()`` and ``on_lost(reply_code, reply_text)``. After an
    unexpected channel close the channel is reopened while the connection
    lives; ``on_lost`` must settle whatever was in flight on it.
    """

    name = "channel"

    def __init__(self, connection):
        self._connection = connection
        self.channel = None
        self.ready = False
        self._closing = False
        self._open()

    def _open(self):
        if self._closing or not self._connection.is_open:
            return
        self._connection.channel(on_open_callback=self._on_open)

    def _on_open(self, channel):
        if self._closing:
            channel.close()
            return
        channel.add_on_close_callback(self._on_close)
        self.channel = channel
        self.setup(channel, self._on_setup_done)

    def _on_setup_done(self, _frame=None):
        if self._closing:
            return  # the session went while the channel was being set up
        self.ready = True
        self.on_ready()

    def _on_close(self, channel, reason):
        if channel is not self.channel:
            return
        self.channel = None
        self.ready = False
        if connection_lost(reason, self._connection):
            # The whole session goes with the connection: the I/O thread
            # calls ``forget`` on every part and hands the callers' work to
            # the next connection. Failing it here would raise in callers
            # for an outage the layer rides through.
            return
        code, text = describe_close(reason)
        if not self._closing:
            logger.debug("%s channel closed: %s %s", self.name, code, text)
        self.on_lost(code, text)
        if self._connection.is_open and not self._closing:
            self._open()

    def shutdown(self):
        """The session is going away: stop reopening, and stop listening.

        After a loss the other connection of the pair closes gracefully
        (see ``connection``), so answers and deliveries can still arrive on
        its closing channels; a part ignores them once ``closing`` is true.
        """
        self._closing = True
        self.ready = False

    @property
    def closing(self):
        return self._closing

    def forget(self):
        """The connection is gone: drop all state, resolve nobody.

        Callers' work still unresolved is retried on the next connection by
        the I/O thread; a part overrides this only to record what the broker
        may already have (see ``Publisher.forget``) or to cancel timers on
        the I/O loop, which outlives the connection.
        """

    # -- for subclasses -----------------------------------------------------

    def setup(self, channel, done):
        done()

    def on_ready(self):
        pass

    def on_lost(self, reply_code, reply_text):
        pass
