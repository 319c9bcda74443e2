"""The keyset claim against a real PostgreSQL: each type's scan starts at its lower bound, and
under a held snapshot that is what keeps the claim from visiting every run claimed since."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgtick.core.keyset import ClaimBounds
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


def test_a_run_of_another_priority_claimed_first_moves_no_bound(store: RunStore) -> None:
    """The bound is the priority-0 lane's: a run of a higher priority is claimed first, however
    late its run_at, and says nothing about where that lane's runs left unclaimed are. It moved
    the bound past a backlog's rest, which then waited for a look back (up to LOOK_SECONDS)."""
    bounds = _bounds_without_look_back()

    def claim(limit: int) -> list[int]:
        return _claim_ids(store, bounds, NOOP, limit)

    now = store.now()
    backlog = [
        store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=60 - i))) for i in range(4)
    ]
    urgent = store.enqueue(NewRun("noop", priority=5))
    low = store.enqueue(NewRun("noop", priority=-5))
    assert claim(2) == [urgent, backlog[0]]
    assert claim(2) == backlog[1:3]
    assert claim(2) == [backlog[3], low]  # the lower lane last, once the backlog is taken
    assert bounds.lows() == {"noop": now - timedelta(seconds=58)}  # the lane's latest, -1 s


def test_a_freed_key_slot_announces_the_earliest_finished_runs_due_second(
    store: RunStore, dsn: str
) -> None:
    """The result writer's NOTIFY for freed slots: for a type limited per key, the earliest
    due second of the runs that finished first (claimers whose bound passed that key's next
    runs lower it there), then one wake-up per type."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgtick")
        past = store.now() - timedelta(minutes=5)
        store.notify(
            {"sync", "export"}, due=[("sync", past + timedelta(seconds=30)), ("sync", past)]
        )
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    assert payloads == [f"!due {int(past.timestamp())} sync", "export", "sync"]


def test_a_key_held_back_by_its_rate_is_claimed_once_its_window_passes(store: RunStore) -> None:
    """A claim of a type with a per-key rate skips the runs of keys at their rate and takes
    later ones, so the bound moves past the skipped runs, and no NOTIFY says when the window
    lets the key start again: a window after the claim, the bound is put back to the earliest
    run_at it took. Before, the key's next run waited for a look back (every 5 s) while a rate
    of N a second allowed it after one."""
    rated = ClaimType("api", 60.0, 3, key_path=("tenant",), rate_per_key=(1, 0.5))
    bounds = _bounds_without_look_back({"api": 0.5})

    def claim() -> list[int]:
        return _claim_ids(store, bounds, [rated], 10)

    now = store.now()
    x1 = store.enqueue(NewRun("api", {"tenant": "x"}, run_at=now - timedelta(seconds=60)))
    x2 = store.enqueue(NewRun("api", {"tenant": "x"}, run_at=now - timedelta(seconds=59)))
    y = store.enqueue(NewRun("api", {"tenant": "y"}))
    assert claim() == [x1, y]  # from the start: x's second run is over its rate
    z = store.enqueue(NewRun("api", {"tenant": "z"}))
    assert claim() == [z]  # from the bound past x2
    assert 0 < (bounds.pending() or 0) <= 0.5  # an idle dispatcher wakes for the put-back
    time.sleep(0.55)
    assert claim() == [x2]


def _bounds_without_look_back(key_windows: dict[str, float] | None = None) -> ClaimBounds:
    """Bounds as a notified dispatcher keeps them, with no look back: the bound alone decides."""
    bounds = ClaimBounds(key_windows)
    bounds.notifying = lambda: True
    bounds.look_seconds = math.inf
    return bounds


def _claim_ids(
    store: RunStore, bounds: ClaimBounds, types: list[ClaimType], limit: int
) -> list[int]:
    """One claim as the dispatcher makes it (from the bounds, which it then moves)."""
    lows, looks = bounds.for_claim()
    runs, behind = store.claim_looking("w", types, limit, lows, looks)
    bounds.claimed(runs)
    bounds.found(behind)
    return [r.id for r in runs]


def _claimed(job_type: str, run_at: datetime) -> ClaimedRun:
    return ClaimedRun(0, job_type, "{}", 1, 1, None, None, run_at, None, run_at, run_at)


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
        "looks": [False],
        "look_froms": [None],
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


def test_a_look_back_finds_due_runs_behind_the_bounds(store: RunStore) -> None:
    """The claim's look back reports, per type it looks at, the earliest due run behind the
    bound; not a run ahead of it (the claim takes that) nor one not due yet."""
    now = store.now()
    store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=5)))
    store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=4)))
    store.enqueue(NewRun("noop", run_at=now + timedelta(hours=1)))  # not due
    ahead = store.enqueue(NewRun("other", run_at=now - timedelta(seconds=30)))
    types = [*NOOP, ClaimType("other", 60.0, 10)]
    lows = {"noop": now - timedelta(seconds=1), "other": now - timedelta(minutes=1)}
    looks: dict[str, datetime | None] = {"noop": None, "other": None}
    runs, behind = store.claim_looking("w", types, 10, lows, looks)
    assert [r.id for r in runs] == [ahead]
    assert behind == {"noop": now - timedelta(minutes=5)}
    runs, behind = store.claim_looking("w", types, 10, lows, {"noop": now - timedelta(minutes=4)})
    assert runs == [] and behind == {"noop": now - timedelta(minutes=4)}  # from where it said
    assert store.claim_looking("w", types, 10, lows) == ([], {})  # no look asked: none made


def test_while_notified_a_look_back_covers_only_what_the_claims_passed(store: RunStore) -> None:
    """A run skipped by a claim (another claimer held it) is in the range the claims passed
    over since the last look; one put far behind while NOTIFYs arrive was announced by its
    own ``!due``, and only the look from the start (every FULL_LOOK_SECONDS, or every look
    while no NOTIFY can arrive) finds it."""
    bounds = ClaimBounds()
    bounds.notifying = lambda: True

    def claim(limit: int = 10, look: bool = False) -> tuple[list[int], Any, dict[str, Any]]:
        bounds.look_seconds = 0.0 if look else math.inf
        lows, looks = bounds.for_claim()
        runs, behind = store.claim_looking("w", NOOP, limit, lows, looks)
        bounds.claimed(runs)
        bounds.found(behind)
        return [r.id for r in runs], looks, behind

    now = store.now()
    old = store.enqueue(NewRun("noop", run_at=now - timedelta(minutes=5)))
    assert claim(look=True) == ([old], {}, {})  # the first claim: from the start, no look
    bounds.claimed([_claimed("noop", now - timedelta(seconds=20))])  # bound at -21 s
    assert claim(look=True) == ([], {"noop": None}, {})  # the first claim passed from the start
    late = store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=30)))
    assert claim(look=True) == ([], {}, {})  # no bound moved since: nothing to look at
    bounds.claimed([_claimed("noop", now)])  # a claim passed over -21 s .. now
    skipped = store.enqueue(NewRun("noop", run_at=now - timedelta(seconds=15)))
    ids, looks, behind = claim(look=True)
    assert (ids, looks) == ([], {"noop": now - timedelta(seconds=21)})
    assert behind == {"noop": now - timedelta(seconds=15)}  # the one at -30 s: not looked at
    assert claim(limit=1) == ([skipped], {}, {})  # from the lowered bound, at once
    bounds.notifying = lambda: False  # the listener is gone: look from the start
    ids, looks, behind = claim(look=True)
    assert looks == {"noop": None} and behind == {"noop": now - timedelta(seconds=30)}
    assert claim()[0] == [late]
