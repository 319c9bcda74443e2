"""The keyset claim against a real PostgreSQL: each type's scan starts at its lower bound, and
under a held snapshot that is what keeps the claim from visiting every run claimed since."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtick.core.keyset import BehindProbe, ClaimBounds
from pgtick.observability.metrics import Metrics
from pgtick.storage import db, sqlfile
from pgtick.storage.store import ClaimedRun, ClaimType, NewRun, RunStore

NOOP = [ClaimType("noop", 60.0, 10)]
CONSUMED = 3000  # runs consumed under the snapshot between two measurements


def test_a_bound_skips_earlier_runs_and_the_probe_starts_there_too(store: RunStore) -> None:
    now = store.now()
    early = store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=10)))
    late = store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=5)))
    lows = {"noop": now - timedelta(seconds=7)}
    due_in = store.next_due_in(["noop"], lows)
    assert due_in is not None and -7 < due_in < -4
    from_start = store.next_due_in(["noop"])
    assert from_start is not None and from_start < -9
    assert [r.id for r in store.claim("w", NOOP, 10, lows)] == [late]
    assert [r.id for r in store.claim("w", NOOP, 10)] == [early]  # a rescan finds it


def test_a_release_and_a_run_enqueued_due_in_the_past_say_rescan(store: RunStore, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgtick")
        store.enqueue(NewRun("noop"))  # due now: no rescan
        store.enqueue(NewRun("noop", run_at=store.now() - timedelta(minutes=5)))
        [first, _] = store.claim("w", NOOP, 2)
        assert store.release("w", [(first.id, first.attempt)]) == {first.id}
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    assert payloads == ["noop", "noop", "!rescan", "!rescan", "noop"]


def _claimed(job_type: str, run_at: datetime) -> ClaimedRun:
    return ClaimedRun(0, job_type, {}, 1, 1, None, None, run_at, None, run_at, run_at)


@pytest.fixture
def pin(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding a REPEATABLE READ snapshot for the whole test."""
    with psycopg.connect(dsn) as session:
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT 1").fetchone()
        yield session
        session.rollback()


def _claim_buffers(store: RunStore, lows: dict[str, Any]) -> tuple[int, list[int]]:
    """Shared buffers the claim statement touched, and what it claimed (then rolled back)."""
    params = {
        "worker_id": "probe",
        "job_types": ["noop"],
        "leases": [60.0],
        "max_attempts": [10],
        "lows": [lows.get("noop")],
        "limit": 1,
    }
    with store.connection() as conn:
        query = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sqlfile.query(
            "claim", conn.schema
        )
        with conn.transaction(force_rollback=True):
            plan = conn.execute(query, params).fetchone()[0]  # type: ignore[index]
            claimed = [
                r[0] for r in conn.execute("SELECT id FROM pgtick.runs WHERE locked_by = 'probe'")
            ]
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"]), claimed


def test_under_a_held_snapshot_the_bounded_claim_does_not_grow_with_what_was_consumed(
    store: RunStore, conn: db.Connection, pin: psycopg.Connection[Any]
) -> None:
    """Runs claimed and finished while the snapshot is held leave dead entries at the start of
    the claim index that nothing can remove: a claim from the start visits each of them, so
    its cost grows with every run consumed; a claim from the bound stays where it was."""
    start = store.now() - timedelta(hours=2)
    store.enqueue_many(
        [NewRun("noop", run_at=start + timedelta(seconds=i)) for i in range(3 * CONSUMED)]
    )
    costs = []
    for _ in range(2):
        latest = start
        for _ in range(CONSUMED // 500):
            claimed = store.claim("w", NOOP, 500)
            store.succeed("w", [(r.id, r.attempt) for r in claimed])
            latest = max(latest, *(r.run_at for r in claimed))
        lows = {"noop": latest - timedelta(seconds=1)}
        bounded, first = _claim_buffers(store, lows)
        unbounded, same = _claim_buffers(store, {})
        assert first == same and len(first) == 1
        costs.append((bounded, unbounded))
    (bounded_1, unbounded_1), (bounded_2, unbounded_2) = costs
    assert unbounded_2 > unbounded_1 + 25, costs  # the dead prefix, visited: ~40 pages more
    assert bounded_2 <= bounded_1 + 3, costs
    assert bounded_2 < unbounded_2 / 3, costs


def test_the_probe_finds_due_runs_behind_a_bound_and_asks_for_a_rescan(store: RunStore) -> None:
    now = store.now()
    store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=5)))
    store.enqueue(NewRun("noop", run_at=now + timedelta(hours=1)))  # behind nothing: not due
    store.enqueue(NewRun("other", run_at=now - timedelta(seconds=30)))
    bounds = ClaimBounds()
    bounds.lows()  # the first scan, from the start
    probe = BehindProbe(store, bounds, lambda: None, Metrics(["noop", "other"], "test", 1))
    assert probe.probe() == []  # no bounds yet: nothing can be behind them
    bounds.claimed([_claimed("noop", now), _claimed("other", now - timedelta(minutes=1))])
    assert bounds.pending() is None
    assert probe.probe() == ["noop"]
    assert bounds.pending() is not None  # the next claim scans from the start
    assert store.behind_bounds({"noop": now - timedelta(minutes=6)}) == []
