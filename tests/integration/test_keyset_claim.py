"""The keyset claim against a real PostgreSQL: each type's scan starts at its lower bound, and
under a held snapshot that is what keeps the claim from visiting every run claimed since."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgtick.core.keyset import BehindProbe, ClaimBounds
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import ClaimedRun, ClaimType, NewRun, RunStore
from tests.integration.horizon import held_snapshot, statement_buffers

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


def test_enqueues_and_a_release_announce_their_due_second(store: RunStore, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgtick")
        now = store.now()
        store.enqueue(NewRun("noop"))
        past = now - timedelta(minutes=5)
        store.enqueue(NewRun("noop", run_at=past))
        store.enqueue_many([NewRun("other", run_at=past), NewRun("other", run_at=now)])
        [first, _] = store.claim("w", NOOP, 2)
        assert store.release("w", [(first.id, first.attempt)]) == {first.id}
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    due_now = payloads[0]
    assert due_now.startswith("!due ") and due_now.endswith(" noop")
    assert abs(int(due_now.split()[1]) - now.timestamp()) < 5
    assert payloads[1:] == [
        "noop",
        f"!due {int(past.timestamp())} noop",  # each before its wake-up
        "noop",
        f"!due {int(past.timestamp())} other",  # one per type: the earliest
        "other",
        f"!due {int(past.timestamp())} noop",  # the run given back, due 5 minutes ago
        "noop",
    ]
    assert first.run_at == past


def _claimed(job_type: str, run_at: datetime) -> ClaimedRun:
    return ClaimedRun(0, job_type, {}, 1, 1, None, None, run_at, None, run_at, run_at)


@pytest.fixture
def pin(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding a REPEATABLE READ snapshot for the whole test."""
    with held_snapshot(dsn) as session:
        yield session


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
    with store.connection() as conn, conn.transaction(force_rollback=True):
        buffers = statement_buffers(conn, "claim", params)
        claimed = [
            r[0] for r in conn.execute("SELECT id FROM pgtick.runs WHERE locked_by = 'probe'")
        ]
    return buffers, claimed


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


def test_the_probe_finds_due_runs_behind_a_bound_and_lowers_it(store: RunStore) -> None:
    now = store.now()
    store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=5)))
    store.enqueue(NewRun("noop", run_at=now + timedelta(hours=1)))  # behind nothing: not due
    store.enqueue(NewRun("other", run_at=now - timedelta(seconds=30)))
    bounds = ClaimBounds()
    bounds.lows()  # the first scan, from the start
    probe = BehindProbe(store, bounds, lambda: None, Metrics(["noop", "other"], "test", 1))
    assert probe.probe() == []  # no bounds yet: nothing can be behind them
    bounds.claimed([_claimed("noop", now), _claimed("other", now - timedelta(minutes=1))])
    assert probe.probe() == ["noop"]
    assert bounds.pending() is None  # no scan from the start: the bound goes down to the run
    assert bounds.lows()["noop"] <= now - timedelta(minutes=5)
    assert store.behind_bounds({"noop": now - timedelta(minutes=6)}) == {}


def test_while_notified_the_probe_looks_only_where_the_claims_passed(store: RunStore) -> None:
    """A run skipped by a claim (another claimer held it) is in the range the claims passed
    over since the last probe; one put far behind while NOTIFYs arrive was announced by its
    own ``!due``, and only the look from the start (every FULL_PROBE_SECONDS) finds it."""
    now = store.now()
    old = store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=5)))
    bounds = ClaimBounds()
    bounds.lows()
    bounds.claimed([_claimed("noop", now - timedelta(seconds=20))])  # from the start
    probe = BehindProbe(
        store, bounds, lambda: None, Metrics(["noop"], "test", 1), notified=lambda: True
    )
    assert probe.probe() == ["noop"] and probe.full == 0  # first claim scanned from the start
    assert bounds.lows()["noop"] <= now - timedelta(minutes=5)
    [run] = store.claim("w", NOOP, 10, bounds.lows())
    assert run.id == old
    bounds.claimed([run, _claimed("noop", now - timedelta(seconds=20))])
    assert probe.probe() == []  # what the claims passed over since: nothing left behind
    skipped = store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=15)))
    far = store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=3)))
    bounds.lows()
    bounds.claimed([_claimed("noop", now)])  # passed over -21 s .. now
    assert probe.probe() == ["noop"]
    assert bounds.lows()["noop"] <= now - timedelta(seconds=15)
    assert bounds.lows()["noop"] > now - timedelta(minutes=3)  # the far one: not looked at
    [first] = store.claim("w", NOOP, 1, bounds.lows())
    assert first.id == skipped
    bounds.claimed([first, _claimed("noop", now)])
    assert probe.probe() == []  # nothing passed over since but the range just looked at
    silent = BehindProbe(store, bounds, lambda: None, Metrics(["noop"], "test", 1))
    assert silent.probe() == ["noop"] and silent.full == 1  # no NOTIFYs: from the start
    assert [r.id for r in store.claim("w", NOOP, 10, bounds.lows())] == [far]
