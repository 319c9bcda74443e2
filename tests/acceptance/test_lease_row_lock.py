"""A run whose row another session holds locked longer than the lease (an operator's
``BEGIN; UPDATE pgtick.runs SET priority = 5 ...`` left open) stays its live holder's. The
heartbeat renews with SKIP LOCKED, so the lease ran out under the lock; once the lock went,
a reaper failed the run before the holder's next beat and another daemon ran a second copy
beside the first (the first test failed so before the fix). A holder that is stopped is
still taken from: at once without a lock, and a few seconds after its last heartbeat when
the lock outlived it (the documented exception: the run runs again)."""

from __future__ import annotations

import signal
import time

from tests import dbhelp
from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster, Daemon, wait_for
from tests.acceptance.correctness import enqueue

LEASE_SECONDS = 6.0
REAPER_SECONDS = 0.2
# A holder whose heartbeat is older than this is taken for stopped (docs/concepts.md).
HOLDER_ALIVE_SECONDS = 5.0
SLACK_SECONDS = 2.0


def _start(cluster: Cluster, threads: int, prefetch: int = 0) -> Daemon:
    """Lease 6 s, beat every 2 s, reap every 0.2 s: a reaper passes many times between two
    beats, so one that may take the run gets there first."""
    return cluster.start(
        cluster.config(
            threads=threads,
            prefetch=prefetch,
            lease=f"{LEASE_SECONDS:g}s",
            heartbeat="2s",
            reaper=f"{REAPER_SECONDS * 1000:g}ms",
            poll_interval="200ms",
        )
    )


def _holding(cluster: Cluster, conn: dbhelp.Connection, sleep: float) -> tuple[Daemon, int]:
    """A daemon of one thread running one run that takes ``sleep`` seconds; then a second
    daemon, which reaps and would run a second copy. Returns (holder, run id)."""
    holder = _start(cluster, threads=1)
    [run_id] = enqueue(conn, [("record", {"sleep": sleep})], max_attempts=3)
    wait_for(lambda: run_id in cluster.executions(), 10, what="the holder started the run")
    _start(cluster, threads=2)
    return holder, run_id


def _lock(operator: dbhelp.Connection, conn: dbhelp.Connection, run_id: int) -> float:
    """An operator's update of the run, its transaction left open; returns the seconds until
    the lease (as last renewed, on the database's clock) ends."""
    operator.execute("UPDATE pgtick.runs SET priority = 5 WHERE id = %s", [run_id])
    row = conn.execute(
        "SELECT extract(epoch FROM locked_until - now())::float8 FROM runs WHERE id = %s",
        [run_id],
    ).fetchone()
    assert row is not None and row[0] is not None, "the run is not held"
    return float(row[0])


def _attempts(conn: dbhelp.Connection, run_id: int) -> list[tuple[int, str | None]]:
    return conn.execute(  # type: ignore[return-value]
        "SELECT attempt, outcome FROM attempts WHERE run_id = %s ORDER BY attempt", [run_id]
    ).fetchall()


def test_a_row_lock_longer_than_the_lease_does_not_take_a_live_holders_run(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """The lock is held until 1 s past the lease's end: half way between two beats of the
    holder, and well inside the reaper's 5 s look back; the holder heartbeats all along. The
    run must run once, and succeed on attempt 1."""
    holder, run_id = _holding(cluster, conn, sleep=16.0)
    with dbhelp.connect(dsn) as operator, operator.transaction():
        time.sleep(_lock(operator, conn, run_id) + 1.0)
        row = conn.execute("SELECT locked_until < now() FROM runs WHERE id = %s", [run_id])
        assert row.fetchone() == (True,), "the lease did not end under the lock: test is moot"
    wait_for(
        lambda: (
            conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone()
            == ("succeeded",)
        ),
        20,
        what="the run succeeded",
    )
    time.sleep(1.0)  # a second copy, claimed right after the lock went, has started by now
    assert cluster.executions() == {run_id: 1}
    row = conn.execute("SELECT status, attempts, priority FROM runs WHERE id = %s", [run_id])
    assert row.fetchone() == ("succeeded", 1, 5)
    assert _attempts(conn, run_id) == [(1, "succeeded")]
    skipped = [e for e in holder.events() if e["event"] == "heartbeat_skipped_locked_runs"]
    assert skipped and all(e["run_ids"] == [run_id] for e in skipped)


def test_a_cancelled_run_whose_handler_still_runs_stays_held_past_a_row_lock(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """Torture seed 4242: an operator cancels a run whose handler does not stop (a sleep),
    then a session holds its row locked past the lease. The holder's beats skipped the row
    and did not count it as locked, and the reaper let go of cancelled runs whose lease ended
    whoever held them: once the lock went, the other daemon's reaper closed the attempt and
    cleared the lease while the handler still ran, and a `retry` then would start a second
    copy. Now the run stays its live holder's until its handler returns."""
    _, run_id = _holding(cluster, conn, sleep=40.0)
    [(holder,)] = conn.execute("SELECT locked_by FROM runs WHERE id = %s", [run_id]).fetchall()
    assert pgtick(dsn, "cancel", str(run_id)).code == 0
    with dbhelp.connect(dsn) as operator, operator.transaction():
        time.sleep(_lock(operator, conn, run_id) + 1.0)
        row = conn.execute("SELECT locked_until < now() FROM runs WHERE id = %s", [run_id])
        assert row.fetchone() == (True,), "the lease did not end under the lock: test is moot"
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        row = conn.execute("SELECT status, locked_by FROM runs WHERE id = %s", [run_id])
        assert row.fetchone() == ("cancelled", holder), "let go while it runs"
        assert _attempts(conn, run_id) == [(1, None)]
        time.sleep(0.1)
    # The handler runs for 40 s: long enough, on a loaded machine, for the CLI's retry to
    # come while it still runs.
    assert pgtick(dsn, "retry", str(run_id)).code != 0, "a retry started a second copy"
    wait_for(
        lambda: (
            conn.execute("SELECT locked_by FROM runs WHERE id = %s", [run_id]).fetchone() == (None,)
        ),
        45,
        what="the holder let go once its handler returned",
    )
    assert _attempts(conn, run_id) == [(1, "lost")]
    assert cluster.executions() == {run_id: 1}


def test_a_holder_stopped_under_the_lock_loses_its_run_once_its_heartbeat_is_old(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """The exception, bounded: the holder is stopped (SIGSTOP) after its lease ended under the
    lock (it had beaten at that end, so it counted as alive). Once the lock goes, the other
    daemon's reaper takes the run within HOLDER_ALIVE_SECONDS of the holder's last heartbeat
    (not at its look at every lease, 10 minutes on), and its log says the run will run
    again."""
    holder, run_id = _holding(cluster, conn, sleep=30.0)
    with dbhelp.connect(dsn) as operator, operator.transaction():
        time.sleep(_lock(operator, conn, run_id) + 0.5)
        holder.signal(signal.SIGSTOP)
        time.sleep(1.0)
        assert cluster.executions() == {run_id: 1}, "taken while the lock held it"
    committed = time.monotonic()
    try:
        wait_for(lambda: 2 in cluster.executions().values(), 20, 0.02, "the run running again")
        assert time.monotonic() - committed <= HOLDER_ALIVE_SECONDS + REAPER_SECONDS + SLACK_SECONDS
    finally:
        holder.signal(signal.SIGKILL)
        holder.wait(10)
    assert _attempts(conn, run_id)[0] == (1, "lost")
    reaped = [e for d in cluster.daemons[1:] for e in d.events() if e["event"] == "run_reaped"]
    assert [(e["run_id"], e["runs_again"]) for e in reaped] == [(run_id, True)]


def test_a_stopped_holders_run_is_taken_when_its_lease_ends(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """A daemon frozen with SIGSTOP stops heartbeating too: its run is taken as before, at
    the end of its lease, not HOLDER_ALIVE_SECONDS later."""
    holder, run_id = _holding(cluster, conn, sleep=30.0)
    holder.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: 2 in cluster.executions().values(), 20, 0.02, "the run running again")
        assert time.monotonic() - stopped <= LEASE_SECONDS + REAPER_SECONDS + SLACK_SECONDS
    finally:
        holder.signal(signal.SIGKILL)
        holder.wait(10)
    assert _attempts(conn, run_id)[0] == (1, "lost")


def test_a_row_lock_on_a_run_claimed_ahead_does_not_stall_the_heartbeat(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """Torture seed 4320 (faults x3): the heartbeat gives back runs claimed ahead that waited
    over a second for a thread, and its release waited for the row lock an operator held on
    one of them: no beat for as long, so the lease of the run the thread was running ended
    unrenewed, and a reaper took it from its live holder. Now the release waits 100 ms and
    gives up until a later beat; the running run keeps its lease and runs once."""
    holder = _start(cluster, threads=1, prefetch=2)
    warm = enqueue(conn, [("record", {})] * 5)  # quick runs: the holder claims ahead after
    wait_for(lambda: all(cluster.executions()[r] for r in warm), 10, what="the warm-up ran")
    slow, *ahead = enqueue(conn, [("record", {"sleep": 20.0})] + [("record", {})] * 2)
    wait_for(
        lambda: (
            slow in cluster.executions() and set(_statuses(conn, ahead).values()) == {"running"}
        ),
        10,
        0.01,
        "the slow run started and two claimed ahead",
    )
    assert not any(cluster.executions()[r] for r in ahead)
    with dbhelp.connect(dsn) as operator, operator.transaction():
        operator.execute("UPDATE pgtick.runs SET priority = 5 WHERE id = %s", [ahead[0]])
        _start(cluster, threads=2)  # its reaper would take the slow run from a silent holder
        time.sleep(LEASE_SECONDS + 2.0)
        assert cluster.executions()[slow] == 1
    wait_for(
        lambda: set(_statuses(conn, [slow, *ahead]).values()) == {"succeeded"},
        40,
        what="all three succeeded",
    )
    assert _attempts(conn, slow) == [(1, "succeeded")]
    assert [cluster.executions()[r] for r in (slow, *ahead)] == [1, 1, 1]
    assert any(e["event"] == "release_held_up_by_row_lock" for e in holder.events())


def _statuses(conn: dbhelp.Connection, ids: list[int]) -> dict[int, str]:
    rows = conn.execute("SELECT id, status FROM runs WHERE id = ANY(%s)", [ids]).fetchall()
    return {int(i): str(s) for i, s in rows}


def test_a_locked_row_does_not_hold_up_the_daemons_other_results(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """The torture harness, seed 103: a run's success waited 12 s behind another run's row
    lock in the same batch, and the daemon's one result writer with it, every later result
    of the daemon too. Here the locked run finishes first; the others' results are written
    while the lock is held, and the locked run's once it goes."""
    _start(cluster, threads=8)
    first, *others = enqueue(conn, [("record", {"sleep": 1.0})] + [("record", {"sleep": 2.5})] * 5)
    wait_for(lambda: len(cluster.executions()) == 6, 10, what="all six started")
    with dbhelp.connect(dsn) as operator, operator.transaction():
        operator.execute("SELECT 1 FROM pgtick.runs WHERE id = %s FOR UPDATE", [first])
        locked_at = time.monotonic()
        wait_for(
            lambda: set(_statuses(conn, others).values()) == {"succeeded"},
            10,
            what="the other runs' results written while the lock is held",
        )
        assert time.monotonic() - locked_at < 5.0
        assert _statuses(conn, [first]) == {first: "running"}
    wait_for(
        lambda: _statuses(conn, [first]) == {first: "succeeded"},
        10,
        what="the locked run's result written once the lock went",
    )
    assert cluster.executions() == dict.fromkeys([first, *others], 1)


def test_a_row_lock_at_a_drain_s_exit_does_not_start_a_run_beside_its_stubborn_handler(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """Seeds 4324 and 4318 (issue 43): a SIGTERMed daemon gives back the runs of Python
    handlers that ignored the cancel as its last act, its heartbeat stopped. That release
    waited for an operator's lock on one of them; meanwhile the other's lease ended, and
    another daemon's reaper ran it beside its first copy, still running here. Now each run's
    release waits 100 ms for its lock: the free one is given back at once, the locked one is
    left to the reaper, which takes it after this process (and its handler) ended."""
    draining = cluster.start(
        cluster.config(lease=f"{LEASE_SECONDS:g}s", heartbeat="2s", grace="1s")
    )
    locked, free = enqueue(
        conn, [("stubborn", {"seconds": 30}), ("stubborn", {"seconds": 30})], max_attempts=3
    )
    wait_for(
        lambda: cluster.executions()[locked] == 1 and cluster.executions()[free] == 1,
        10,
        what="both first copies started",
    )
    _start(cluster, threads=2)
    conn.execute(
        "UPDATE runs SET payload = '{\"seconds\": 0.1}' WHERE id = ANY(%s)", [[locked, free]]
    )
    with dbhelp.connect(dsn) as operator, operator.transaction():
        _lock(operator, conn, locked)
        draining.signal(signal.SIGTERM)
        # Before, the exit waited for this lock (and the free run's lease ended meanwhile).
        assert draining.wait(LEASE_SECONDS) == 0
        exited = time.time()
    assert '"released_at_exit"' in draining.log()
    wait_for(
        lambda: cluster.executions()[locked] == 2 and cluster.executions()[free] == 2,
        LEASE_SECONDS + HOLDER_ALIVE_SECONDS + 10,
        what="both runs taken again",
    )
    for run_id in (locked, free):
        second = [r["t"] for r in cluster.records() if r["run_id"] == run_id][1]
        assert second > exited - 0.5, f"run {run_id}: second copy {exited - second:.1f}s early"
    wait_for(
        lambda: _statuses(conn, [locked, free]) == {locked: "succeeded", free: "succeeded"},
        20,
        what="both runs done",
    )


def test_a_success_returned_while_a_drain_waits_for_a_locked_result_is_written_at_its_exit(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """Torture seed 4318, run 3206: a handler that ignored the drain's cancel returned
    normally while the drain still waited for another run's result, held up by an operator's
    row lock; the exit released its run, not its success, and it ran again. The success is
    written at the exit now (the locked result stays unwritten: exit 1, documented)."""
    daemon = cluster.start(cluster.config(threads=2, grace="500ms"))
    stubborn, locked = enqueue(
        conn, [("stubborn", {"seconds": 5}), ("record", {"sleep": 1.5})], max_attempts=3
    )
    wait_for(
        lambda: cluster.executions()[stubborn] == 1 and cluster.executions()[locked] == 1,
        10,
        what="both started",
    )
    with dbhelp.connect(dsn) as operator, operator.transaction():
        _lock(operator, conn, locked)
        daemon.signal(signal.SIGTERM)
        # The drain waits 10 s for the locked result; the stubborn handler returns at 5 s.
        assert daemon.wait(30) == 1, daemon.log()
    assert '"results_not_written"' in daemon.log()
    assert [r for r in cluster.records() if r["run_id"] == stubborn][-1]["event"] == "done"
    row = conn.execute("SELECT status, attempts FROM runs WHERE id = %s", [stubborn]).fetchone()
    assert row == ("succeeded", 1), row
