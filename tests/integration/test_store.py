"""RunStore against a real PostgreSQL: leases, retries, reaper, idempotency, operator actions."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

import pgtick
from pgtick.config import WorkerConfig
from pgtick.core.backoff import Backoff
from pgtick.storage import db
from pgtick.storage.store import Beat, ClaimType, Failure, Lease, NewRun, RunStore
from tests.integration.leases import expire

NOOP = [ClaimType("noop", 60.0, 10)]


def _claim_one(store: RunStore, worker: str, types: list[ClaimType] = NOOP) -> int:
    claimed = store.claim(worker, types, 1)
    assert len(claimed) == 1
    return claimed[0].id


def test_claim_sets_lease_attempt_and_opens_attempt_row(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("noop", {"x": 1}))
    store.enqueue(NewRun("other"))  # a type this worker does not handle stays queued
    store.enqueue(NewRun("noop", run_at=store.now() + timedelta(hours=1)))  # not due yet
    claimed = store.claim("w1", [ClaimType("noop", 30.0, 4)], 10)
    assert [c.id for c in claimed] == [run_id]
    c = claimed[0]
    assert (c.attempt, c.max_attempts, c.payload) == (1, 4, {"x": 1})
    row = conn.execute(
        "SELECT status, locked_by, locked_until - started_at, attempts FROM runs WHERE id = %s",
        [run_id],
    ).fetchone()
    assert row == ("running", "w1", timedelta(seconds=30), 1)
    attempts = store.get_attempts(run_id)
    assert [(a.attempt, a.worker_id, a.outcome) for a in attempts] == [(1, "w1", None)]
    statuses = dict(conn.execute("SELECT job_type, status FROM runs WHERE id <> %s", [run_id]))
    assert statuses == {"other": "queued", "noop": "queued"}


def test_each_payload_is_read_as_enqueued(store: RunStore) -> None:
    """Payloads as the handler sees them, the empty object (read without the JSON decoder)
    among them: a new dict on every read, so a handler's changes stay its own."""
    payloads = [{}, {"a": 1}, {"": {}}, {"k": "{}"}, None]
    ids = store.enqueue_many([NewRun("noop", p) for p in payloads])
    claimed = {c.id: c for c in store.claim("w1", NOOP, len(ids))}
    expected = [{} if p is None else p for p in payloads]
    assert [claimed[i].payload for i in ids] == expected
    empty = claimed[ids[0]]
    first = empty.payload
    first["changed"] = True
    assert empty.payload == {}


def test_run_max_attempts_wins_over_job_type_default(store: RunStore) -> None:
    store.enqueue(NewRun("noop", max_attempts=2))
    assert store.claim("w1", NOOP, 1)[0].max_attempts == 2


def test_lease_guard_after_expiry_and_takeover(store: RunStore, conn: db.Connection) -> None:
    """Must show 2: a worker whose lease expired and was taken changes nothing, sees the loss."""
    run_id = store.enqueue(NewRun("noop"))
    assert _claim_one(store, "A") == run_id
    # A freezes: its lease runs out, the reaper makes the run claimable, B takes it.
    expire(conn, [run_id])
    reaped = store.reap(lambda job_type, attempt: 0.0)
    assert [(r.id, r.status) for r in reaped] == [(run_id, "failed")]
    assert _claim_one(store, "B") == run_id

    assert store.heartbeat("A", [Lease(run_id, 1, 60.0)]).held == set()
    assert store.succeed("A", [(run_id, 1)]) == set()
    assert store.fail("A", [Failure(run_id, 1, "late", "Exception", "tb", 5.0)]) == []
    assert store.release("A", [(run_id, 1)]) == set()

    run = store.get_run(run_id)
    assert run is not None
    assert (run.status, run.locked_by, run.attempts, run.last_error) == (
        "running",
        "B",
        2,
        "lease expired while running on A",
    )
    outcomes = [(a.worker_id, a.outcome) for a in store.get_attempts(run_id)]
    assert outcomes == [("A", "lost"), ("B", None)]
    # B, the rightful holder, can heartbeat and finish.
    assert store.heartbeat("B", [Lease(run_id, 2, 60.0)]).held == {run_id}
    assert store.succeed("B", [(run_id, 2)]) == {run_id}
    assert [(a.worker_id, a.outcome) for a in store.get_attempts(run_id)] == [
        ("A", "lost"),
        ("B", "succeeded"),
    ]


def test_retries_follow_backoff_on_database_clock_then_dead(
    store: RunStore, conn: db.Connection
) -> None:
    """Must show 3: 10 failures -> failed 9 times then dead, run_at per backoff."""
    policy = Backoff("exponential", base_seconds=10, max_seconds=600, jitter=0.0)
    run_id = store.enqueue(NewRun("noop"))
    statuses = []
    for n in range(1, 11):
        claimed = store.claim("w", NOOP, 1)
        assert [(c.id, c.attempt) for c in claimed] == [(run_id, n)]
        [result] = store.fail(
            "w",
            [
                Failure(
                    run_id,
                    n,
                    f"boom {n}",
                    "ValueError",
                    f"Traceback ... boom {n}",
                    policy.delay(n),
                )
            ],
        )
        statuses.append(result.status)
        finished_at = conn.execute(
            "SELECT finished_at FROM attempts WHERE run_id = %s AND attempt = %s", [run_id, n]
        ).fetchone()
        assert finished_at is not None
        if result.status == "failed":
            # Both timestamps are the same statement's now(): the database clock.
            assert result.run_at - finished_at[0] == timedelta(seconds=min(600, 10 * 2 ** (n - 1)))
            conn.execute("UPDATE runs SET run_at = now() WHERE id = %s", [run_id])
    assert statuses == ["failed"] * 9 + ["dead"]
    run = store.get_run(run_id)
    assert run is not None
    assert (run.status, run.attempts, run.last_error, run.error_type) == (
        "dead",
        10,
        "boom 10",
        "ValueError",
    )
    assert run.finished_at is not None
    attempts = store.get_attempts(run_id)
    assert [(a.attempt, a.outcome, a.error) for a in attempts] == [
        (n, "failed", f"Traceback ... boom {n}") for n in range(1, 11)
    ]
    assert store.claim("w", NOOP, 1) == []


def test_fail_without_delay_is_dead_at_once(store: RunStore) -> None:
    run_id = store.enqueue(NewRun("noop"))
    _claim_one(store, "w")
    [result] = store.fail("w", [Failure(run_id, 1, "bad input", "Fail", "", None)])
    assert result.status == "dead"


def test_reaper_fails_or_kills_expired_and_leaves_live_leases(
    store: RunStore, conn: db.Connection
) -> None:
    """Must show 4."""
    ids = store.enqueue_many([NewRun("noop") for _ in range(4)])
    store.enqueue_many([NewRun("noop", max_attempts=1)])
    claimed = store.claim("w", NOOP, 10)
    assert len(claimed) == 5
    expired, exhausted, live = ids[:3], [c.id for c in claimed if c.max_attempts == 1], ids[3]
    expire(conn, expired + exhausted)
    reaped = store.reap(lambda job_type, attempt: 30.0)
    assert sorted((r.id, r.status) for r in reaped) == sorted(
        [(i, "failed") for i in expired] + [(i, "dead") for i in exhausted]
    )
    rows = conn.execute(
        "SELECT id, status, error_type, run_at - updated_at, locked_by FROM runs ORDER BY id"
    ).fetchall()
    for run_id, status, error_type, delay, locked_by in rows:
        if run_id in expired:
            assert (status, error_type, delay, locked_by) == (
                "failed",
                "lease_expired",
                timedelta(seconds=30),
                None,
            )
        elif run_id in exhausted:
            assert (status, error_type, locked_by) == ("dead", "lease_expired", None)
        else:
            assert (run_id, status, error_type, locked_by) == (live, "running", None, "w")
    lost = conn.execute(
        "SELECT run_id, outcome, error_type FROM attempts WHERE outcome IS NOT NULL ORDER BY run_id"
    ).fetchall()
    assert lost == [(i, "lost", "lease_expired") for i in sorted(expired + exhausted)]
    assert store.reap(lambda job_type, attempt: 30.0) == []


def test_release_does_not_count_the_attempt(store: RunStore) -> None:
    run_id = store.enqueue(NewRun("noop"))
    _claim_one(store, "w")
    assert store.release("w", [(run_id, 1)]) == {run_id}
    run = store.get_run(run_id)
    assert run is not None and (run.status, run.attempts, run.locked_by) == ("queued", 0, None)
    assert _claim_one(store, "w2") == run_id
    assert store.get_run(run_id).attempts == 1  # type: ignore[union-attr]
    assert [(a.attempt, a.outcome) for a in store.get_attempts(run_id)] == [
        (1, "released"),
        (1, None),
    ]


def test_idempotency_python_api_and_sql_function(dsn: str, store: RunStore) -> None:
    """Must show 5 (sequential part)."""
    with psycopg.connect(dsn) as conn:  # a caller's own transaction, default search_path
        first = pgtick.enqueue(conn, "invoice", {"n": 1}, idempotency_key="inv-42")
        second = pgtick.enqueue(conn, "invoice", {"n": 2}, idempotency_key="inv-42")
        conn.commit()
        third = conn.execute(
            "SELECT pgtick.enqueue('invoice', '{\"n\": 3}'::jsonb, NULL, 'inv-42', NULL)"
        ).fetchone()
        conn.commit()
    assert third is not None
    assert first == second == third[0]
    assert store.enqueue(NewRun("invoice", {"n": 4}, idempotency_key="inv-42")) == first
    assert store.enqueue_many(
        [
            NewRun("invoice", idempotency_key="inv-42"),
            NewRun("invoice", idempotency_key="new"),
            NewRun("invoice", idempotency_key="new"),
        ]
    )[::2] == [first, store.enqueue(NewRun("invoice", idempotency_key="new"))]
    run = store.get_run(first)
    assert run is not None and run.payload == {"n": 1}


def test_transactional_enqueue_rolls_back_with_the_caller(dsn: str, store: RunStore) -> None:
    with psycopg.connect(dsn) as conn:
        run_id = pgtick.enqueue(conn, "invoice")
        conn.rollback()
    assert store.get_run(run_id) is None


def test_idempotency_concurrent_enqueue_from_8_threads(dsn: str, conn: db.Connection) -> None:
    """Must show 5 (concurrent part): 8 threads, same key, at the same moment."""
    barrier = threading.Barrier(8)
    results: list[int] = []
    errors: list[BaseException] = []

    def enqueue(i: int) -> None:
        try:
            with psycopg.connect(dsn) as own:
                barrier.wait()
                results.append(pgtick.enqueue(own, "invoice", {"i": i}, idempotency_key="same"))
                own.commit()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for _round in range(5):
        threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert len(results) == 40 and len(set(results)) == 1
    count = conn.execute("SELECT count(*) FROM runs WHERE idempotency_key = 'same'").fetchone()
    assert count == (1,)


def test_enqueue_notifies_listeners(dsn: str, store: RunStore) -> None:
    with db.connect_raw(dsn) as listener:
        listener.execute("LISTEN pgtick")
        store.enqueue(NewRun("noop"))
        store.enqueue_many([NewRun("bulk")])
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=4)]
    assert [p for p in got if not p.startswith("!due ")] == ["noop", "bulk"]
    assert [p.split()[2] for p in got if p.startswith("!due ")] == ["noop", "bulk"]


def test_operator_retry_and_cancel(store: RunStore) -> None:
    queued, running, dead = store.enqueue_many([NewRun("noop") for _ in range(3)])
    claimed = store.claim("w", NOOP, 2)
    assert {c.id for c in claimed} == {queued, running}
    store.fail("w", [Failure(queued, 1, "x", "E", "", None)])  # now dead
    assert store.cancel([dead, running, 999_999]) == sorted([dead, running])
    beat = store.heartbeat("w", [Lease(running, 1, 60.0)])
    # Still held and renewed while its handler may run, and the worker learns it was
    # cancelled by an operator (not lost to another daemon): it stops the handler.
    assert beat.held == {running}
    assert beat.cancelled == {running}
    assert store.cancel([dead]) == []  # terminal already
    # Its handler may still run: no retry until the worker has let go of it.
    assert store.held_after_cancel([running])[0][:2] == (running, "w")
    assert store.retry([queued, dead, running]) == sorted([queued, dead])
    assert store.acknowledge_cancel("w", [(running, 1)]) == {running}
    assert store.retry([running]) == [running]
    for run_id in (queued, dead, running):
        run = store.get_run(run_id)
        assert run is not None and (run.status, run.locked_by, run.finished_at) == (
            "queued",
            None,
            None,
        )
    # Killed by Fail, not exhausted: its budget is unchanged.
    assert store.get_run(queued).max_attempts == 10  # type: ignore[union-attr]
    # A run that used up its attempts gets exactly one more.
    store.claim("w", NOOP, 3)
    [spent] = store.enqueue_many([NewRun("noop", max_attempts=1)])
    assert _claim_one(store, "w") == spent
    store.fail("w", [Failure(spent, 1, "x", "E", "", 5.0)])
    assert store.get_run(spent).status == "dead"  # type: ignore[union-attr]
    assert store.retry([spent]) == [spent]
    assert store.get_run(spent).max_attempts == 2  # type: ignore[union-attr]


def test_prune_deletes_old_terminal_runs_in_batches(store: RunStore, conn: db.Connection) -> None:
    ids = store.enqueue_many([NewRun("noop") for _ in range(25)])
    claimed = store.claim("w", NOOP, 25)
    store.succeed("w", [(c.id, c.attempt) for c in claimed])
    conn.execute(
        "UPDATE runs SET finished_at = now() - interval '8 days' WHERE id = ANY(%s)", [ids[:20]]
    )
    assert store.prune("succeeded", 7 * 86400, batch=7) == 20
    left = conn.execute("SELECT count(*) FROM runs").fetchone()
    assert left == (5,)
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (5,)
    with pytest.raises(ValueError, match="terminal"):
        store.prune("queued", 0)


def test_worker_registry(store: RunStore, conn: db.Connection) -> None:
    from pgtick.storage.store import WorkerInfo

    store.register_worker(WorkerInfo("w1", "host", 123, "0.1.0", 8, ["noop"]))
    store.register_worker(WorkerInfo("w2", "host", 124, "0.1.0", 8, ["noop"]))
    conn.execute("UPDATE workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'w2'")
    assert store.heartbeat("w1", []) == Beat(set(), True, set())
    assert store.reap_workers(600) == ["w2"]
    # Forgotten: it must register again.
    assert store.heartbeat("w2", []) == Beat(set(), False, set())
    store.deregister_worker("w1")
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)


def test_effect_once(store: RunStore) -> None:
    assert store.effect_once("email:1", 1) is True
    assert store.effect_once("email:1", 2) is False


def test_heartbeat_registers_a_forgotten_worker_again(store: RunStore, conn: db.Connection) -> None:
    from pgtick.core.heartbeat import Heartbeat
    from pgtick.core.worker import Worker
    from pgtick.observability.metrics import Metrics
    from pgtick.storage.store import WorkerInfo

    info = WorkerInfo("w1", "host", 1, "0.1.0", 1, ["noop"])
    store.register_worker(info)
    conn.execute("DELETE FROM workers")  # another daemon's reaper forgot us during an outage
    metrics = Metrics(["noop"], "test", 1)
    worker = Worker(store, "w1", WorkerConfig(threads=1), {}, metrics)
    Heartbeat(store, worker, 20.0, metrics, info).beat()
    assert conn.execute("SELECT id FROM workers").fetchall() == [("w1",)]


def test_a_heartbeat_skips_a_run_locked_elsewhere_instead_of_waiting(
    store: RunStore, dsn: str
) -> None:
    """A session holding one of our runs' row locks (an operator's FOR UPDATE left open, our
    own result being written) must not hold up the renewal of every other lease: the beat
    renews the rest at once and reports the locked one busy, neither renewed nor gone."""
    ids = store.enqueue_many([NewRun("noop") for _ in range(3)])
    claimed = {c.id for c in store.claim("w", NOOP, 3)}
    assert claimed == set(ids)
    locked, *free = ids
    with psycopg.connect(dsn, autocommit=True) as admin:
        before = dict(
            admin.execute("SELECT id, locked_until FROM pgtick.runs WHERE id = ANY(%s)", [ids])
        )
    beats: list[Beat] = []
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1 FROM pgtick.runs WHERE id = %s FOR UPDATE", [locked])
        beating = threading.Thread(
            target=lambda: beats.append(store.heartbeat("w", [Lease(i, 1, 60.0) for i in ids]))
        )
        beating.start()
        beating.join(5)
        waited = beating.is_alive()  # blocked behind the lock
        other.rollback()
        beating.join(5)
    assert not waited
    [beat] = beats
    assert beat.held == set(free)
    assert beat.busy == {locked}
    assert beat.registered is False and beat.cancelled == set()
    with psycopg.connect(dsn, autocommit=True) as admin:
        after = dict(
            admin.execute("SELECT id, locked_until FROM pgtick.runs WHERE id = ANY(%s)", [ids])
        )
    assert after[locked] == before[locked]  # not renewed
    assert all(after[i] > before[i] for i in free)
    # Once the lock is gone, the next beat renews it like the others.
    assert store.heartbeat("w", [Lease(i, 1, 60.0) for i in ids]).held == set(ids)


def test_a_result_that_waited_on_a_run_another_transaction_moved_is_written_again(
    store: RunStore, dsn: str
) -> None:
    """runs is partitioned by status: an operator's cancel moves a running run from runs_live
    to runs_cancelled. A result written meanwhile waits on the row lock, and PostgreSQL then
    fails it with SQLSTATE 40001 (the row moved to another partition); the store writes it
    again and finds the run cancelled: nothing written, no error, the cancel stands."""
    run_id = store.enqueue(NewRun("noop"))
    [claimed] = store.claim("w", NOOP, 1)
    results: list[object] = []
    with psycopg.connect(dsn) as operator:
        operator.execute(
            "UPDATE pgtick.runs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            [run_id],
        )
        writing = threading.Thread(
            target=lambda: results.append(store.succeed("w", [(run_id, claimed.attempt)]))
        )
        writing.start()
        writing.join(1)
        assert writing.is_alive()  # waiting on the operator's row lock
        operator.commit()
        writing.join(10)
    assert results == [set()]  # written again, and the guard found the run cancelled
    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT status, tableoid::regclass::text, locked_by FROM pgtick.runs WHERE id = %s",
            [run_id],
        ).fetchone()
    assert row is not None and row[:2] == ("cancelled", "pgtick.runs_cancelled_default")
    assert row[2] == "w"  # still held: the daemon lets go once its handler stopped
