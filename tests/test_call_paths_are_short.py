"""Each call crosses at most six files of the package from the API to the wire.

A ``send``, a blocking ``receive``, a ``group_add`` (renewed, new, and of a
process-local channel), a ``group_discard`` and a membership's expiry are
measured by ``devtools.callpath``: the files on the caller's stack when it
hands work to the I/O thread, and on the I/O thread's stack at each pika
channel call (for the expiry, the dead-letter worker's). A part that only
forwards to the next one shows here as a seventh file.
"""

import pytest

from devtools import callpath

CALLS = [
    "send",
    "receive",
    "group_add",
    "group_add new member",
    "group_add process-local",
    "group_discard",
    "expiry",
]

pytestmark = pytest.mark.slow  # the expiry waits for a lease to end (about 3 s)


@pytest.fixture(scope="module")
def paths(broker):
    measured = callpath.measure(broker.amqp_url, management_url=broker.management_url)
    return {path.name: path for path in measured}


def test_every_call_is_measured(paths):
    assert sorted(paths) == sorted(CALLS)


@pytest.mark.parametrize("name", CALLS)
def test_a_call_crosses_at_most_six_files(paths, name):
    path = paths[name]
    assert path.lines, "%s reached no hand-over and no pika call" % name
    assert len(path.files) <= callpath.MOST_FILES, "%s crosses %d files:\n%s" % (
        name,
        len(path.files),
        callpath.report([path]),
    )
