"""How long ``send`` keeps trying after the broker said no."""

import time

from .errors import BrokerConnectionError, BrokerOperationError


class SendAttempts(object):
    """How long ``send`` keeps trying after the broker said no.

    A nack from a queue that is not full means it could not take the
    message (a quorum queue between leaders, a node going down): the
    message was not delivered, so it is sent again, with a growing pause,
    until ``operation_timeout``. A return means the queue does not exist:
    it is declared and the message sent again, three times at most.
    """

    def __init__(self, channel, queue, timeout):
        self.channel = channel
        self.queue = queue
        self.timeout = timeout
        self.refusals = 0
        self.declares = 0
        self.refused_until = None

    def refused(self):
        now = time.monotonic()
        if self.refused_until is None:
            self.refused_until = now + self.timeout
        if now >= self.refused_until:
            raise BrokerConnectionError(
                "the broker kept refusing the message for %s for %.1f s although its queue "
                "is not full (its node may be going down); it was not delivered"
                % (self.channel, self.timeout)
            )
        time.sleep(min(0.5, self.refused_until - now, 0.02 * 2 ** min(self.refusals, 4)))
        self.refusals += 1

    def returned(self):
        self.declares += 1
        if self.declares > 3:
            raise BrokerOperationError(
                312, "queue %s disappears as soon as it is declared" % self.queue
            )
