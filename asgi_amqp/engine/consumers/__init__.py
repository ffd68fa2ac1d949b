"""The consumers' channel: blocking receives, and polls served by pushes.

``pool.ConsumerPool`` keeps consumers between calls and owns, each in its own module:

``acks.Acks``
    every ack and nack of the channel; taken acks wait in ``acks.TakenAcks``,
    shared with callers' threads;
``polls.Polls``
    what non-blocking receives ask of the consumers;
``sweep.Sweep``
    the timer that gives back what lingered and cancels what nobody wants;
``balance.Balance``
    the spread of an ordered channel's shards over the processes;
``owners.OwnerWait``
    after a lost connection, the shards that wait for their owner.

All of it runs on the I/O thread, except where a docstring says otherwise.
"""

from .pool import THREADS_WINDOW, ConsumerPool, ConsumerSettings

__all__ = ["THREADS_WINDOW", "ConsumerPool", "ConsumerSettings"]
