"""``send_group`` to a member whose queue is full waits for room, off
daphne's reactor: after an outage, the workers running daphne's parked
frames fill daphne's own queue faster than it reads, and every group
message dropped there is lost to all of that daphne's members. A member
nobody reads costs the wait once, then its group's sends drop at once."""

import threading
import time

from asgi_amqp.groups import GAVE_UP_FOR, ROOM_PATIENCE
from helpers import wait_until

PROCESS = "daphne.response.wait!"  # what daphne receives: every channel of its own
MEMBER = PROCESS + "s1"


def _fill(layer, capacity):
    for n in range(capacity):
        layer.send(PROCESS + "other", {"fill": n})


def test_a_full_members_group_message_waits_for_its_reader(broker, new_layer):
    daphne = new_layer(broker, flush=True, capacity=5)
    worker = new_layer(broker, prefix=daphne.topology.prefix, capacity=5)
    daphne.group_add("room", MEMBER)
    _fill(worker, 4)  # the join notice is the fifth message of the queue

    def read_after_a_moment():
        time.sleep(0.3)  # daphne busy for a moment: the send must not give up
        for _ in range(4):
            assert daphne.receive([PROCESS], block=True)[0] == PROCESS + "other"

    reader = threading.Thread(target=read_after_a_moment)
    reader.start()
    started = time.monotonic()
    worker.send_group("room", {"text": "hello"})
    waited = time.monotonic() - started
    reader.join(10)
    assert 0.25 < waited < ROOM_PATIENCE, waited
    got = []
    wait_until(
        lambda: got.append(daphne.receive([PROCESS])) or got[-1][0] is not None,
        10,
        message="the group message",
    )
    assert got[-1] == (MEMBER, {"text": "hello"})
    assert daphne.receive([PROCESS]) == (None, None)  # the marked copies are dropped
    assert worker.connection_statistics()["group_sends_dropped"] == 0


def test_a_member_nobody_reads_costs_the_wait_once(broker, new_layer):
    daphne = new_layer(broker, flush=True, capacity=5)
    worker = new_layer(broker, prefix=daphne.topology.prefix, capacity=5)
    daphne.group_add("room", MEMBER)
    _fill(worker, 4)
    started = time.monotonic()
    worker.send_group("room", {"n": 1})
    assert time.monotonic() - started >= ROOM_PATIENCE - 0.3
    started = time.monotonic()
    worker.send_group("room", {"n": 2})  # within GAVE_UP_FOR: no wait
    assert time.monotonic() - started < min(1.0, GAVE_UP_FOR)
    assert worker.connection_statistics()["group_sends_dropped"] == 2
