"""``devtools.callpath`` sees what a call runs, and docs/architecture.rst lists it.

The tool lists every file of the package whose code runs, on any thread,
during a ``send``, a blocking ``receive``, a ``group_add`` and a
membership's expiry. These tests hold it to files that must run (the
hand-over to the I/O thread and back, the broker call), and the walks of
docs/architecture.rst to what it finds: file, order and threads.
"""

import pathlib
import re
import sys
import threading
from typing import Dict, List, Tuple

import pytest

from asgi_amqp import naming
from devtools import callpath

ARCHITECTURE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "architecture.rst"
CALLS = ["send", "receive", "group_add", "expiry"]
#: Each walk's heading in docs/architecture.rst.
TITLES = {
    "One ``send``": "send",
    "One blocking ``receive``": "receive",
    "One ``group_add``": "group_add",
    "One membership's expiry": "expiry",
}
CALLER, IO, WORKER = "caller", "I/O thread", "worker"
HAND_OVER = [
    ("engine/engine.py", CALLER),
    ("engine/io/thread.py", CALLER),
    ("engine/io/inbox.py", CALLER),
    ("engine/io/inbox.py", IO),
    ("engine/io/thread.py", IO),
    ("engine/futures.py", CALLER),
    ("engine/futures.py", IO),
]
#: Files that run in each call, and a thread each runs on.
CERTAIN: Dict[str, List[Tuple[str, str]]] = {
    "send": HAND_OVER
    + [
        ("layer.py", CALLER),
        ("sending.py", CALLER),
        ("serialization.py", CALLER),
        ("engine/publisher.py", IO),
    ],
    "receive": HAND_OVER[1:5]  # served from held messages: the ack's wake-up, no wait
    + [
        ("layer.py", CALLER),
        ("receiving.py", CALLER),
        ("engine/deliveries.py", CALLER),
        ("serialization.py", CALLER),
        ("engine/consumers/acks.py", IO),
    ],
    "group_add": HAND_OVER
    + [
        ("layer.py", CALLER),
        ("groups.py", CALLER),
        ("engine/publisher.py", IO),
        ("engine/declares.py", IO),
    ],
    "expiry": [("engine/deadletter.py", WORKER), ("naming.py", WORKER)],
}
Listed = List[Tuple[str, List[str]]]  # (file, the threads that ran it)


def documented_walks() -> Dict[str, Tuple[int, Listed]]:
    """Each walk of docs/architecture.rst: its heading's count, and its list."""
    walks: Dict[str, Tuple[int, Listed]] = {}
    current = None
    for line in ARCHITECTURE.read_text().splitlines():
        heading = re.match(r"(.+) \((\d+) files?\)$", line)
        if heading and heading.group(1) in TITLES:
            current = TITLES[heading.group(1)]
            walks[current] = (int(heading.group(2)), [])
            continue
        item = re.match(r"#\. ``([\w/]+\.py)`` \(([^)]+)\): ", line)
        if current and item:
            walks[current][1].append((item.group(1), item.group(2).split(", ")))
        elif current and line.startswith("---"):
            current = None  # the next section
    return walks


def test_the_documented_walks_are_counted_and_whole():
    walks = documented_walks()
    assert sorted(walks) == sorted(CALLS)
    for name, (count, files) in walks.items():
        assert count == len(files), name
        assert len({file for file, _ in files}) == count, "%s lists a file twice" % name


def test_the_recorder_counts_a_file_only_a_callee_runs():
    # naming.Topology.channel_queue calls channel_names.non_local_name.
    recorder = callpath.Recorder()
    topology = naming.Topology("p", 60, 86400, lambda channel: 100)
    with recorder.recording("call", {threading.get_ident(): CALLER}) as walk:
        sys.setprofile(recorder.profile)
        try:
            topology.channel_queue("a.b")
        finally:
            sys.setprofile(None)
    assert walk.files == ["naming.py", "channel_names.py"]


@pytest.fixture(scope="module")
def walks(broker):
    return {walk.name: walk for walk in callpath.measure(broker.amqp_url, broker.management_url)}


@pytest.mark.slow  # the expiry waits for a lease to end (about 2 s)
def test_every_call_is_walked(walks):
    assert list(walks) == CALLS


@pytest.mark.slow
@pytest.mark.parametrize("name", CALLS)
def test_a_walk_holds_the_files_that_must_run(walks, name):
    walk = walks[name]
    missing = [(file, thread) for file, thread in CERTAIN[name] if thread not in walk.ran_on(file)]
    assert not missing, "%s:\n%s" % (missing, callpath.report([walk]))


@pytest.mark.slow
@pytest.mark.parametrize("name", CALLS)
def test_the_architecture_lists_what_the_tool_finds(walks, name):
    count, listed = documented_walks()[name]
    found = [(file, walks[name].ran_on(file)) for file in walks[name].files]
    assert listed == found, callpath.report([walks[name]])
    assert count == len(found)
