"""``make test`` runs the suite on both broker kinds side by side, never two heavy tests at once.

``devtools.test_brokers`` is driven here with its pytest runs recorded instead
of run: what each half selects, that the ``alone`` tests run with nothing
beside them, and the port share each run gets.
"""

import threading

import pytest

from devtools import rabbitmq, test_brokers


class Recorder(object):
    """Stands in for ``run_pytest``: records each run and answers ``statuses``' next."""

    def __init__(self, statuses=None):
        self.runs = []
        self.statuses = dict(statuses or {})
        self.lock = threading.Lock()
        self.running = 0  # runs under way now
        self.beside = []  # (kind, marker) of each run that began while another was under way
        self.overlap = threading.Barrier(2, timeout=10)  # holds a run until its partner starts

    def __call__(self, env, args, command=None, prefix=""):
        args = list(args)
        marker = args[args.index("-m") + 1] if "-m" in args else None
        kind = env.get(test_brokers.SERVER_DIR_VARIABLE) and "server-dir" or "debian"
        with self.lock:
            self.runs.append((kind, marker, env.get(rabbitmq.PORTS_VARIABLE), args))
            if self.running:
                self.beside.append((kind, marker))
            self.running += 1
        if marker in (HEAVY, REST):
            try:  # a half's two runs wait for each other, so that they overlap
                self.overlap.wait()
            except threading.BrokenBarrierError:
                self.overlap.reset()
        with self.lock:
            self.running -= 1
        return self.statuses.get((kind, marker), 0), {"passed": 10}, 60.0


HEAVY = test_brokers.SELECTIONS[test_brokers.HEAVY]
REST = test_brokers.SELECTIONS["rest"]
ALONE = test_brokers.SELECTIONS[test_brokers.ALONE]


@pytest.fixture
def two_kinds(monkeypatch):
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.delenv(rabbitmq.PORTS_VARIABLE, raising=False)  # set in make test's own halves
    monkeypatch.delenv(test_brokers.REQUIRE_VARIABLE, raising=False)
    monkeypatch.delenv(test_brokers.REQUIRE_PYTHONS_VARIABLE, raising=False)
    monkeypatch.setenv(test_brokers.PYTHONS_VARIABLE, "none")
    monkeypatch.setenv(test_brokers.SERVER_DIR_VARIABLE, "/nowhere/rabbitmq_server-4.0.5")
    monkeypatch.setenv(test_brokers.ERLANG_VARIABLE, "/nowhere/erlang")
    versions = {"debian": "3.10.8", "server-dir": "4.0.5"}
    monkeypatch.setattr(test_brokers, "probe", lambda kind: (versions[kind.name], None))
    recorder = Recorder()
    monkeypatch.setattr(test_brokers, "run_pytest", recorder)
    return recorder


def test_each_kind_runs_every_test_in_two_halves_and_heavy_tests_never_meet(two_kinds, capsys):
    assert test_brokers.main(["-k", "groups"]) == 0
    runs = two_kinds.runs
    assert sorted((kind, marker) for kind, marker, _, _ in runs) == sorted(
        (kind, marker) for kind in ("debian", "server-dir") for marker in (HEAVY, REST, ALONE)
    )
    # The halves run in order, two runs each: one heavy run and one of the rest.
    first, second, last = runs[:2], runs[2:4], runs[4:]
    for half in (first, second):
        assert sorted(marker for _, marker, _, _ in half) == sorted([HEAVY, REST])
    # Then each kind's alone tests, one kind after the other, with nothing beside them.
    assert [(kind, marker) for kind, marker, _, _ in last] == [
        ("debian", ALONE),
        ("server-dir", ALONE),
    ]
    assert len(two_kinds.beside) == 2  # one run of each half began beside the other
    assert all(marker != ALONE for _, marker in two_kinds.beside)
    assert all(args[-2:] == ["-k", "groups"] for _, _, _, args in runs)
    out = capsys.readouterr().out
    assert "RabbitMQ 3.10.8 (debian); heavy tests and the rest" in out
    assert "brokers: 60 passed, 0 failed" in out  # every part of both kinds counted
    assert "both brokers, side by side: " in out


def test_the_markers_select_every_test_once():
    # heavy, rest and alone split any test: exactly one selection takes it.
    for heavy in (True, False):
        for alone in (True, False):
            marks = {"heavy": heavy, "alone": alone}
            chosen = [
                name
                for name, expression in test_brokers.SELECTIONS.items()
                if eval(expression, {}, marks)
            ]
            assert len(chosen) == 1, (marks, chosen)


def test_the_two_runs_pick_ports_from_shares_that_do_not_meet(two_kinds):
    test_brokers.main([])
    shares = {}
    for kind, _, share, _ in two_kinds.runs:
        low, high = (int(part) for part in share.split("-"))
        shares.setdefault(kind, set()).add((low, high))
    (debian,), (server_dir,) = shares["debian"], shares["server-dir"]
    assert debian[1] <= server_dir[0] or server_dir[1] <= debian[0]


@pytest.mark.parametrize("kind", ["debian", "server-dir"])
@pytest.mark.parametrize("marker", [HEAVY, REST, ALONE])
def test_a_failing_part_fails_the_run(two_kinds, kind, marker):
    two_kinds.statuses[(kind, marker)] = 1
    assert test_brokers.main([]) == 1


def test_a_half_that_selects_nothing_is_not_a_failure(two_kinds):
    two_kinds.statuses[("debian", HEAVY)] = test_brokers.NO_TESTS
    two_kinds.statuses[("server-dir", ALONE)] = test_brokers.NO_TESTS
    assert test_brokers.main(["-k", "only_light_ones"]) == 0


def test_a_marker_selection_runs_the_kinds_one_after_the_other(two_kinds):
    assert test_brokers.main(["-m", "not slow"]) == 0
    assert [(kind, marker) for kind, marker, _, _ in two_kinds.runs] == [
        ("debian", "not slow"),
        ("server-dir", "not slow"),
    ]
    assert all(share is None for _, _, share, _ in two_kinds.runs)


def test_ports_keep_to_the_share_given(monkeypatch):
    monkeypatch.setenv(rabbitmq.PORTS_VARIABLE, "12000-13500")
    ports = rabbitmq._free_ports(6) + [rabbitmq.free_port()]
    assert all(12000 <= port < 13500 for port in ports), ports


def test_a_share_that_is_not_a_range_is_named(monkeypatch):
    monkeypatch.setenv(rabbitmq.PORTS_VARIABLE, "12000")
    with pytest.raises(rabbitmq.RabbitNodeError, match=rabbitmq.PORTS_VARIABLE):
        rabbitmq.free_port()
