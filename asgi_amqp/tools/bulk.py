"""One send under a full-channel policy, shared by the command line and the Spark sender."""

import time

from ..errors import ChannelFull

ON_FULL = ("fail", "skip", "retry")
RETRY_FIRST_DELAY = 0.1
RETRY_MAX_DELAY = 2.0


def send_one(layer, kind, name, message, on_full, retries, sleep=time.sleep):
    """Send to a channel (``kind`` "channel") or group; True once sent.

    False means the channel stayed full: at once, or with ``on_full="retry"``
    after ``retries`` waits of 0.1 s doubling up to 2 s. Any other error
    propagates to the caller, which decides how to count it.
    """
    attempt = 0
    while True:
        try:
            if kind == "group":
                layer.send_group(name, message)
            else:
                layer.send(name, message)
            return True
        except ChannelFull:
            if on_full != "retry" or attempt >= retries:
                return False
            sleep(min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2 ** attempt))
            attempt += 1
