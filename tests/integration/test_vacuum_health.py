"""The vacuum-health part of the metrics' aggregate query on a real PostgreSQL: the session
holding the MVCC horizon (pid, application, age), a prepared transaction, and the dead row
versions of pgtick's tables; the job-type label bound of the database-derived series."""

from __future__ import annotations

import time

import psycopg

from pgtick.core.dbstate import HolderAges
from pgtick.observability.database import OTHER_JOB_TYPE, DatabaseSnapshot, bounded
from pgtick.storage import db
from pgtick.storage.store import HorizonHolder, MetricsSnapshot, NewRun, RunStore
from tests.acceptance.conftest import wait_for


def snapshot(store: RunStore) -> MetricsSnapshot:
    return store.metrics_snapshot({}, statement_timeout_seconds=5, pool_timeout_seconds=5)


def test_a_repeatable_read_snapshot_is_named_as_the_horizon_holder(
    dsn: str, store: RunStore
) -> None:
    assert [h for h in snapshot(store).horizon if h.kind == "session"] == []
    with psycopg.connect(dsn, application_name="nightly-report") as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgtick.runs")
        pid = holder.info.backend_pid
        time.sleep(1.2)
        snap = snapshot(store)
        oldest = snap.horizon[0]
        assert (oldest.kind, oldest.ident, oldest.application) == (
            "session",
            str(pid),
            "nightly-report",
        )
        assert oldest.state == "idle in transaction"
        assert oldest.age_seconds is not None and oldest.age_seconds >= 1.0
        assert oldest.user == "postgres" and oldest.backend_type == "client backend"
        assert snap.sees_all_sessions  # the test role is a superuser
        holder.rollback()
    assert [h for h in snapshot(store).horizon if h.ident == str(pid)] == []


def test_dead_tuples_of_pgticks_tables(store: RunStore, conn: db.Connection) -> None:
    # Autovacuum, had it removed them before the count was read, made this test flaky.
    conn.execute("ALTER TABLE runs_live SET (autovacuum_enabled = false)")
    ids = [store.enqueue(NewRun("a")) for _ in range(20)]
    conn.execute("UPDATE runs SET run_at = run_at WHERE id = ANY(%s)", [ids])
    wait_for(
        lambda: snapshot(store).dead_tuples.get("runs", 0) >= 20, 10, what="dead tuples counted"
    )
    tables = set(snapshot(store).dead_tuples)
    assert {"runs", "attempts_history", "schedules", "workers", "effects"} <= tables


def test_a_slots_age_counts_from_when_it_was_first_seen() -> None:
    ages = HolderAges()
    slot = HorizonHolder("slot", "standby1", None, "physical", None, "active", None, 100, None)
    assert ages.oldest([slot], 1000.0) == 0.0
    assert ages.oldest([HorizonHolder(**{**slot.__dict__, "xid_age": 150})], 1060.0) == 60.0
    # its xmin moved on (a younger transaction age): counted afresh
    assert ages.oldest([HorizonHolder(**{**slot.__dict__, "xid_age": 10})], 1070.0) == 0.0
    prepared = HorizonHolder("prepared", "gid", "app", None, None, "prepared", 42.0, 5, None)
    assert ages.oldest([prepared], 1080.0) == 42.0
    assert ages.oldest([], 1090.0) == 0.0


def test_job_type_labels_are_bounded_and_the_rest_summed_as_other() -> None:
    snap = DatabaseSnapshot(
        runs={
            ("conf", "queued"): 1,
            ("busy", "queued"): 50,
            ("t1", "queued"): 2,
            ("t2", "queued"): 3,
            ("t2", "succeeded"): 7,
            ("t3", "succeeded"): 100,
        },
        queue_depth={"busy": 40, "t1": 2, "t2": 3},
        oldest_due_seconds={"t1": 10.0, "t2": 30.0},
        stuck={"t1": 1},
    )
    out = bounded(snap, ["conf"], 1)
    assert out.runs == {
        ("conf", "queued"): 1,
        ("busy", "queued"): 50,
        (OTHER_JOB_TYPE, "queued"): 5,
        (OTHER_JOB_TYPE, "succeeded"): 107,
    }
    assert out.queue_depth == {"busy": 40, OTHER_JOB_TYPE: 5}
    assert out.oldest_due_seconds == {OTHER_JOB_TYPE: 30.0}
    assert out.stuck == {OTHER_JOB_TYPE: 1}
    assert bounded(snap, ["conf"], 4) is snap  # few enough: unchanged


def test_no_other_job_types_labelled_with_zero() -> None:
    snap = DatabaseSnapshot(runs={("x", "queued"): 1}, queue_depth={"x": 1})
    assert bounded(snap, [], 0).queue_depth == {OTHER_JOB_TYPE: 1}
