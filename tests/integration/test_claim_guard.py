"""Every write a holder makes is guarded by its claim (worker id and attempt), and a running
run an operator cancels stays held until its holder lets go: the statements on a real
PostgreSQL, without a daemon."""

from __future__ import annotations

from pgtick.storage import db, sqlfile
from pgtick.storage.store import ClaimType, Failure, Lease, NewRun, RunStore
from tests.integration import plans
from tests.integration.leases import expire

NOOP = [ClaimType("noop", 60.0, 10)]


def _expire_and_reap(store: RunStore, conn: db.Connection, run_id: int) -> None:
    expire(conn, [run_id])
    assert [r.id for r in store.reap(lambda job_type, attempt: 0.0)] == [run_id]


def test_a_write_of_an_earlier_claim_never_lands_on_a_later_claim_by_the_same_worker(
    store: RunStore, conn: db.Connection
) -> None:
    """Item 4: the same daemon (same worker id) claims the run again after its first lease
    expired and was reaped; every write for attempt 1 is refused, attempt 2's go through."""
    run_id = store.enqueue(NewRun("noop"))
    [first] = store.claim("w", NOOP, 1)
    _expire_and_reap(store, conn, run_id)
    [second] = store.claim("w", NOOP, 1)
    assert (first.attempt, second.attempt) == (1, 2)

    assert store.heartbeat("w", [Lease(run_id, 1, 60.0)]).held == set()
    assert store.succeed("w", [(run_id, 1)]) == set()
    assert store.fail("w", [Failure(run_id, 1, "late", "E", "", 5.0)]) == []
    assert store.release("w", [(run_id, 1)]) == set()
    assert store.acknowledge_cancel("w", [(run_id, 1)]) == set()
    assert store.mark_timed_out("w", [((run_id, 1), "timed out after 1s")]) == set()
    with store.connection() as c, c.transaction():
        assert RunStore.succeed_on(c, "w", [(run_id, 1)]) == set()
    row = conn.execute("SELECT status, attempts FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row == ("running", 2)

    assert store.heartbeat("w", [Lease(run_id, 2, 60.0)]).held == {run_id}
    assert store.succeed("w", [(run_id, 2)]) == {run_id}
    outcomes = conn.execute(
        "SELECT attempt, outcome FROM attempts WHERE run_id = %s ORDER BY id", [run_id]
    ).fetchall()
    assert outcomes == [(1, "lost"), (2, "succeeded")]


def test_a_cancelled_running_run_stays_held_until_its_holder_lets_go(
    store: RunStore, conn: db.Connection
) -> None:
    """Item 5: cancel keeps the lease and the open attempt; the heartbeat keeps renewing it
    (the handler may still run); retry refuses it until the holder lets go, which closes the
    attempt then."""
    run_id = store.enqueue(NewRun("noop"))
    store.claim("w", NOOP, 1)
    assert store.cancel([run_id]) == [run_id]
    row = conn.execute("SELECT status, locked_by FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row == ("cancelled", "w")
    beat = store.heartbeat("w", [Lease(run_id, 1, 60.0)])
    assert (beat.held, beat.cancelled) == ({run_id}, {run_id})  # renewed, to be stopped
    [(held_id, holder, left)] = store.held_after_cancel([run_id])
    assert (held_id, holder) == (run_id, "w") and 55 <= left <= 60
    assert store.retry([run_id]) == []
    assert conn.execute("SELECT outcome FROM attempts WHERE run_id = %s", [run_id]).fetchall() == [
        (None,)
    ]
    assert store.acknowledge_cancel("w", [(run_id, 1)]) == {run_id}
    attempt = conn.execute(
        "SELECT outcome, error, finished_at > (SELECT finished_at FROM runs WHERE id = %s) "
        "FROM attempts WHERE run_id = %s",
        [run_id, run_id],
    ).fetchone()
    assert attempt == ("lost", "cancelled by operator", True)  # ended after the cancel
    assert store.held_after_cancel([run_id]) == []
    assert store.retry([run_id]) == [run_id]


def test_a_run_past_its_timeout_stays_held_and_says_so_until_its_failure_is_written(
    store: RunStore, conn: db.Connection
) -> None:
    """The note a daemon writes on a run whose Python handler runs on past its timeout: the
    run stays running, held (renewed, counted by a limit, not claimable), and reads as timed
    out and stopping; the failure written when the handler returns ends it as any other."""
    limited = [ClaimType("noop", 60.0, 10, max_running=1)]
    run_id = store.enqueue(NewRun("noop"))
    store.enqueue(NewRun("noop"))
    store.claim("w", limited, 1)
    assert store.mark_timed_out("w", [((run_id, 1), "timed out after 1s")]) == {run_id}
    run = store.get_run(run_id)
    assert run is not None and run.timed_out_running
    assert (run.status, run.locked_by, run.error_type) == ("running", "w", "timeout")
    assert store.heartbeat("w", [Lease(run_id, 1, 60.0)]).held == {run_id}
    assert store.claim("w2", limited, 1) == []  # its slot is taken
    [flow] = store.flow_state(limited)
    assert (flow.running, flow.waiting_concurrency) == (1, 1)
    [failed] = store.fail("w", [Failure(run_id, 1, "timed out after 1s", "timeout", "", 0.0)])
    assert failed.status == "failed"
    run = store.get_run(run_id)
    assert run is not None and not run.timed_out_running
    assert run.last_error == "timed out after 1s"
    assert len(store.claim("w2", limited, 2)) == 1  # the slot is free again


def test_the_reaper_lets_go_of_cancelled_runs_whose_holder_died(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("noop"))
    store.claim("dead-daemon", NOOP, 1)
    store.cancel([run_id])
    assert store.reap_cancelled() == 0  # the lease is live: its handler may still run
    expire(conn, [run_id])
    assert store.reap_cancelled() == 1
    row = conn.execute(
        "SELECT r.status, r.locked_by, a.outcome, a.error FROM runs r "
        "JOIN attempts a ON a.run_id = r.id WHERE r.id = %s",
        [run_id],
    ).fetchone()
    assert row == ("cancelled", None, "lost", "cancelled by operator")
    assert store.retry([run_id]) == [run_id]


def test_retry_of_a_cancelled_run_whose_holder_died_closes_its_attempt(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("noop"))
    store.claim("dead-daemon", NOOP, 1)
    store.cancel([run_id])
    expire(conn, [run_id])
    assert store.retry([run_id]) == [run_id]
    assert conn.execute("SELECT outcome FROM attempts WHERE run_id = %s", [run_id]).fetchall() == [
        ("lost",)
    ]


def test_the_cancelled_lease_reaper_reads_only_its_index(conn: db.Connection) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, run_at, attempts, max_attempts, finished_at) "
        "SELECT 'noop', 'cancelled', now(), 1, 10, now() FROM generate_series(1, 50000)"
    )
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, finished_at) "
        "SELECT 'noop', 'cancelled', 1, 'w', now() + interval '1 minute', now() "
        "FROM generate_series(1, 5)"
    )
    conn.execute("ANALYZE runs")
    rows = conn.execute(
        b"EXPLAIN " + sqlfile.query("reap_cancelled", "pgtick").as_bytes(None),
        {"limit": 500, "alive": 5.0, "slack": 2.0},
    ).fetchall()
    plan = plans.readable(conn, "\n".join(r[0] for r in rows))
    assert "runs_cancel_lease_idx" in plan, plan
    assert "Seq Scan on runs" not in plan, plan


def test_each_claim_in_a_batch_is_matched_to_its_own_attempt_in_any_order(
    store: RunStore, conn: db.Connection
) -> None:
    """The writes find each run's attempt (and lease, error, delay) by its position in the
    lists of ids, by binary search: the store sends them sorted whatever order it is given,
    and a list that is not sorted (another caller of the SQL) writes nothing rather than
    match a run to another's attempt."""
    ids = [store.enqueue(NewRun("noop")) for _ in range(40)]
    claimed = {r.id: r.attempt for r in store.claim("w", NOOP, 40)}
    assert sorted(claimed) == ids
    again = ids[1::2]  # claimed a second time: their attempt 1 is stale
    expire(conn, again)
    assert sorted(r.id for r in store.reap(lambda job_type, attempt: 0.0)) == again
    claimed |= {r.id: r.attempt for r in store.claim("w", NOOP, 40)}
    assert sorted(claimed.values()) == [1] * 20 + [2] * 20
    shuffled = sorted(ids, key=lambda run_id: (run_id * 7919) % 97)  # no order at all

    beat = store.heartbeat("w", [Lease(i, claimed[i], 60.0 + i) for i in shuffled])
    assert beat.held == set(ids)
    leases = conn.execute(
        "SELECT id, round(extract(epoch FROM locked_until - now())) FROM runs WHERE id = ANY(%s)",
        [ids],
    ).fetchall()
    assert {i: int(left) for i, left in leases} == {i: 60 + i for i in ids}  # each its own

    current = [(i, claimed[i]) for i in ids[:20]]
    stale = [(i, 1) for i in again[10:]]  # runs 21, 23, ..., 39 of the 40
    assert store.succeed("w", sorted(current + stale, key=lambda c: -c[0])) == set(ids[:20])

    failures = [
        Failure(i, claimed[i], f"error {i}", "E", f"detail {i}", 100.0 + i) for i in ids[20:30]
    ]
    assert {f.id for f in store.fail("w", failures[::-1])} == set(ids[20:30])
    rows = conn.execute(
        "SELECT r.id, r.last_error, a.error, round(extract(epoch FROM r.run_at - a.finished_at))"
        " FROM runs r JOIN attempts a ON a.run_id = r.id AND a.attempt = r.attempts"
        " WHERE r.id = ANY(%s)",
        [ids[20:30]],
    ).fetchall()
    assert {row[0]: row[1:] for row in rows} == {
        i: (f"error {i}", f"detail {i}", 100 + i) for i in ids[20:30]
    }

    assert store.release("w", [(i, claimed[i]) for i in reversed(ids[30:35])]) == set(ids[30:35])

    # The SQL itself, given lists that are not sorted: no run gets another's attempt.
    rest = ids[35:]
    backwards = {
        "worker_id": "w",
        "ids": rest[::-1],
        "attempts": [claimed[i] for i in rest[::-1]],
        "results": None,
    }
    with store.connection() as c:
        written = {row[0] for row in c.execute(sqlfile.query("succeed", c.schema), backwards)}
    statuses = dict(conn.execute("SELECT id, status FROM runs WHERE id = ANY(%s)", [rest]))
    assert statuses == {i: "succeeded" if i in written else "running" for i in rest}
