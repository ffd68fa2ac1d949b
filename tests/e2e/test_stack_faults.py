"""The whole Channels stack through broker faults (short version).

daphne, two runworkers and 20 WebSocket clients in 4 rooms, on a private
node of this test's own. In ``kills`` the broker closes every connection
every 3 s; in ``restart`` it also restarts its application once in the
middle. ``make faults-stack`` runs the long version, and
``tests/project/stackfaults.py`` says what is counted and asserted.
"""

import pytest
import stackfaults
from e2e_support import chatstack  # noqa: F401  (puts tests/project on sys.path)

pytestmark = [pytest.mark.slow, pytest.mark.faults]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("scenario", ["kills", "restart"])
def test_the_stack_rides_through_broker_faults(scenario, queue_type):
    restart = scenario == "restart"
    report = stackfaults.run(
        queue_type=queue_type,
        duration=24.0 if restart else 16.0,
        restart_pause=5.0,
        restart=restart,
    )
    print("\n" + stackfaults.format_report(report))
    failed = [what for what, ok in stackfaults.targets(report, restart_pause=5.0) if not ok]
    assert not failed, "%s\n%s\nlogs: %s" % (
        failed,
        stackfaults.format_report(report),
        report.get("logs"),
    )
    if restart:
        assert report["kills"] >= 3 and report["restart_seconds"] is not None
    else:
        # Kills come every 3 s, each through rabbitmqctl (0.35 s idle, seconds
        # on a loaded machine): at least 3 in 16 s.
        assert report["kills"] >= 3 and report["restart_seconds"] is None
