"""The whole Channels stack through broker faults (short version).

daphne, two runworkers and 20 WebSocket clients in 4 rooms, on a private
node of this test's own: the broker closes every connection every 3 s and
restarts its application once in the middle. ``make faults-stack`` runs the
long version; ``tests/project/stackfaults.py`` says what is counted.
"""

import pytest

from e2e_support import chatstack  # noqa: F401  (puts tests/project on sys.path)

import stackfaults

pytestmark = [pytest.mark.slow, pytest.mark.faults]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_stack_rides_through_kills_and_a_restart(queue_type):
    report = stackfaults.run(queue_type=queue_type, duration=24.0, restart_pause=5.0)
    print("\n" + stackfaults.format_report(report))
    failed = [what for what, ok in stackfaults.targets(report, restart_pause=5.0) if not ok]
    assert not failed, "%s\n%s\nlogs: %s" % (failed, stackfaults.format_report(report),
                                              report.get("logs"))
    assert report["kills"] >= 3 and report["restart_seconds"] is not None
