"""What ``receive`` does in the caller's thread before it asks the engine.

``receive`` is the hottest call of a worker, made with the same handful of
channel names thousands of times: the names are checked and mapped onto
their queues (``naming.Topology``) once, and the result cached here, so
that a call costs a dictionary look-up rather than a regular expression
and a string build per name.
"""

import random

from .channel_names import check_channel_name


class ReceiveTargets(object):
    """``receive``'s channel names -> the distinct queues behind them, validated.

    A worker receives from the same 10-20 names thousands of times: each
    name is checked and mapped once, and each set of names once. The
    queues come back in random order, so that no channel starves another.
    """

    def __init__(self, topology):
        self._topology = topology
        self._targets = {}  # channel -> (queue, arguments)
        self._sets = {}  # frozenset of names -> their distinct (queue, arguments)

    def __call__(self, channels):
        """[(queue, arguments)] in random order; empty for an empty collection."""
        # Any collection of names: Channels 1.x's worker passes a set. A bare
        # string is refused rather than read as a list of one-letter names.
        if isinstance(channels, (str, bytes, dict)) or not hasattr(channels, "__iter__"):
            raise TypeError(
                "channels must be a list of channel names, not %s" % type(channels).__name__
            )
        channels = list(channels)
        try:
            key = frozenset(channels)
        except TypeError:  # an unhashable, hence invalid, name: the full check says which
            key = None
        queues = self._sets.get(key) if key is not None else None
        if queues is None:
            queues = self._unique_targets(channels)
            if key is not None:
                if len(self._sets) >= 1000:
                    self._sets.clear()
                self._sets[key] = queues
        queues = list(queues)
        if len(queues) > 1:
            random.shuffle(queues)
        return queues

    def _unique_targets(self, channels):
        queues, seen = [], set()
        for channel in channels:
            queue, arguments = self._target(channel)
            if queue not in seen:
                seen.add(queue)
                queues.append((queue, arguments))
        return tuple(queues)

    def _target(self, channel):
        try:
            return self._targets[channel]
        except (KeyError, TypeError):  # TypeError: an unhashable, hence invalid, name
            pass
        check_channel_name(channel, receive=True)
        target = (
            self._topology.channel_queue(channel),
            self._topology.channel_queue_arguments(channel),
        )
        if len(self._targets) >= 10000:
            self._targets.clear()
        self._targets[channel] = target
        return target
