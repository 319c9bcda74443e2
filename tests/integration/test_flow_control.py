"""Flow control in the claim, against a real PostgreSQL: priority order, concurrency limits per
job type and per key (under concurrent claimers), rate windows, and slots of a dead holder
coming back through the reaper. Daemon-level checks: tests/acceptance/test_flow_control.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from pgtick.core.dbstate import DatabaseProbe
from pgtick.observability.database import DatabaseCollector
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import ClaimType, NewRun, RunStore
from tests.integration import leases

PLAIN = ClaimType("mail", 60.0, 3)


def _held(conn: db.Connection, job_type: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE job_type = %s AND locked_by IS NOT NULL", [job_type]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_higher_priority_first_then_oldest_due_within_a_priority(store: RunStore) -> None:
    now = store.now()
    old_low = store.enqueue(NewRun("mail", run_at=now - timedelta(minutes=5), priority=-1))
    old = store.enqueue(NewRun("mail", run_at=now - timedelta(minutes=3)))
    new = store.enqueue(NewRun("mail", run_at=now - timedelta(minutes=1)))
    urgent_new = store.enqueue(NewRun("mail", priority=10))
    urgent_old = store.enqueue(NewRun("mail", run_at=now - timedelta(seconds=1), priority=10))
    high = store.enqueue(NewRun("mail", priority=3))
    store.enqueue(NewRun("mail", run_at=now + timedelta(hours=1), priority=99))  # not due
    order = [r.id for r in store.claim("w", [PLAIN], 3)]
    order += [r.id for r in store.claim("w", [PLAIN], 10)]
    assert order == [urgent_old, urgent_new, high, old, new, old_low]


def test_priority_orders_across_job_types_and_the_keyset_bound_spares_other_lanes(
    store: RunStore,
) -> None:
    now = store.now()
    store.enqueue(NewRun("mail", run_at=now - timedelta(minutes=1)))
    urgent = store.enqueue(NewRun("sms", run_at=now - timedelta(minutes=10), priority=5))
    types = [PLAIN, ClaimType("sms", 60.0, 3)]
    # A lower bound after the urgent run's due time applies to priority 0 only.
    lows = {"sms": now, "mail": now - timedelta(minutes=2)}
    assert [r.id for r in store.claim("w", types, 1, lows)] == [urgent]
    due_in = store.next_due_in(["sms"], {"sms": now})
    assert due_in is None  # nothing left of sms
    store.enqueue(NewRun("sms", run_at=now - timedelta(minutes=10), priority=-5))
    due_in = store.next_due_in(["sms"], {"sms": now})
    assert due_in is not None and due_in < -500  # other priorities are found below the bound


def test_max_running_counts_every_holder_and_frees_a_slot_on_finish(
    store: RunStore, conn: db.Connection
) -> None:
    limited = ClaimType("export", 60.0, 3, max_running=2)
    for _ in range(5):
        store.enqueue(NewRun("export"))
    first = store.claim("a", [limited], 10)
    assert len(first) == 2
    assert store.claim("b", [limited], 10) == []  # another daemon: the same limit
    assert store.succeed("a", [(first[0].id, first[0].attempt)]) == {first[0].id}
    [third] = store.claim("b", [limited], 10)
    assert _held(conn, "export") == 2
    # A released run (shutdown) frees its slot at once; a cancelled one only when let go.
    assert store.release("b", [(third.id, third.attempt)]) == {third.id}
    assert len(store.claim("b", [limited], 10)) == 1


def test_a_dead_holders_slots_come_back_when_the_reaper_recovers_its_runs(
    store: RunStore, conn: db.Connection
) -> None:
    limited = ClaimType("export", 60.0, 3, max_running=2)
    for _ in range(4):
        store.enqueue(NewRun("export"))
    held = store.claim("dead-daemon", [limited], 10)
    assert len(held) == 2
    leases.expire(conn, [r.id for r in held])
    assert store.claim("b", [limited], 10) == []  # expired but not reaped: still counted
    reaped = store.reap(lambda job_type, attempt: 0.0)
    assert {r.id for r in reaped} == {r.id for r in held}
    again = store.claim("b", [limited], 10)
    assert len(again) == 2


def test_per_key_limit_skips_a_busy_key_without_holding_back_the_others(
    store: RunStore,
) -> None:
    keyed = ClaimType("sync", 60.0, 3, key_path=("customer",), max_running_per_key=1)
    now = store.now()
    # Customer a has a long backlog ahead of everyone else's runs.
    for i in range(50):
        store.enqueue(NewRun("sync", {"customer": "a"}, run_at=now - timedelta(seconds=100 - i)))
    b = store.enqueue(NewRun("sync", {"customer": "b"}, run_at=now - timedelta(seconds=10)))
    given = store.enqueue(NewRun("sync", {"customer": "a"}, concurrency_key="c"))
    unkeyed = store.enqueue(NewRun("sync", {}))
    first = store.claim("w", [keyed], 100)
    # One of a, then b, then the run whose given key (c) overrides its payload, then the run
    # without a key (limited per type only).
    assert [r.payload.get("customer") for r in first][:1] == ["a"]
    assert {r.id for r in first[1:]} == {b, given, unkeyed}
    assert store.claim("w", [keyed], 100) == []  # every key is at its limit
    store.succeed("w", [(first[0].id, first[0].attempt)])
    [next_a] = store.claim("w", [keyed], 100)
    assert next_a.payload == {"customer": "a"}


def test_runs_without_a_key_and_of_other_keys_pass_a_key_at_its_limit(store: RunStore) -> None:
    """The keys at their limit are compared with each run's key: a run without one (no key
    given, none in its payload) is limited per type only, whatever keys are blocked."""
    keyed = ClaimType("sync", 60.0, 3, key_path=("customer",), max_running_per_key=1)
    busy = store.enqueue(NewRun("sync", {"customer": "a"}))
    assert [r.id for r in store.claim("w", [keyed], 10)] == [busy]
    store.enqueue(NewRun("sync", {"customer": "a"}))  # a is at its limit
    unkeyed = store.enqueue(NewRun("sync", {}))
    other = store.enqueue(NewRun("sync", {"customer": "b"}))
    given = store.enqueue(NewRun("sync", {"customer": "a"}, concurrency_key="c"))
    assert {r.id for r in store.claim("w", [keyed], 10)} == {unkeyed, other, given}


def test_rate_limit_holds_starts_to_the_window_and_counts_no_attempt(
    store: RunStore, conn: db.Connection
) -> None:
    rated = ClaimType("api", 60.0, 3, rate=(5, 1.0))
    for _ in range(12):
        store.enqueue(NewRun("api"))
    first = store.claim("w", [rated], 100)
    assert len(first) == 5
    assert store.claim("w", [rated], 100) == []
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE job_type = 'api' AND status = 'queued' AND attempts = 0"
    ).fetchone()
    assert row == (7,)  # held back: still queued, no attempt counted
    time.sleep(1.05)
    assert len(store.claim("w", [rated], 100)) == 5  # the window moved on
    # Starts older than the window are removed by the claims that follow it.
    time.sleep(1.05)
    store.claim("w", [rated], 100)
    row = conn.execute("SELECT count(*) FROM rate_starts WHERE job_type = 'api'").fetchone()
    assert row == (2,)


def test_rate_per_key(store: RunStore) -> None:
    rated = ClaimType("api", 60.0, 3, key_path=("tenant",), rate_per_key=(2, 3600.0))
    for tenant in ("x", "y"):
        for _ in range(4):
            store.enqueue(NewRun("api", {"tenant": tenant}))
    claimed = store.claim("w", [rated], 100)
    assert sorted(r.payload["tenant"] for r in claimed) == ["x", "x", "y", "y"]
    assert store.claim("w", [rated], 100) == []


def test_concurrent_claimers_never_let_more_than_the_limit_through(
    store: RunStore, dsn: str
) -> None:
    """8 claimers on their own connections race for a type limited to 3, finishing each run
    at once; a sampler reads the number held in its own snapshots meanwhile."""
    limit = 3
    limited = ClaimType("export", 60.0, 3, max_running=limit)
    store.enqueue_many([NewRun("export") for _ in range(600)])
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            pool = db.make_pool(dsn, "pgtick", size=1, name=name)
            try:
                mine = RunStore(pool)
                while not stop.is_set():
                    runs = mine.claim(name, [limited], 4)
                    if runs:
                        mine.succeed(name, [(r.id, r.attempt) for r in runs])
            finally:
                pool.close()
        except BaseException as exc:
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                row = c.execute(
                    "SELECT count(*) FROM pgtick.runs WHERE job_type = 'export'"
                    " AND locked_by IS NOT NULL"
                ).fetchone()
                assert row is not None
                seen.append(int(row[0]))

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(8)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute(
                "SELECT count(*) FROM pgtick.runs WHERE job_type = 'export'"
                " AND status = 'succeeded'"
            ).fetchone()
        if row == (600,):
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert row == (600,)
    assert len(seen) > 50 and max(seen) <= limit, max(seen)


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"priority": 4}, "priority = 4"),
        ({"concurrency_key": "k1"}, "concurrency_key = 'k1'"),
    ],
)
def test_enqueue_paths_store_priority_and_key(
    store: RunStore, conn: db.Connection, kwargs: dict[str, object], where: str
) -> None:
    one = store.enqueue(NewRun("mail", **kwargs))  # type: ignore[arg-type]
    [many] = store.enqueue_many([NewRun("mail", **kwargs)])  # type: ignore[arg-type]
    rows = conn.execute(f"SELECT id FROM runs WHERE {where} ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [one, many]


def test_metrics_count_the_runs_each_limit_holds_back(store: RunStore) -> None:
    limits = [
        ClaimType("export", 60.0, 3, max_running=1),
        ClaimType("api", 60.0, 3, rate=(2, 60.0)),
    ]
    for job_type in ("export", "export", "export", "api", "api", "api", "other"):
        store.enqueue(NewRun(job_type))
    store.claim("w", limits, 10)
    probe = DatabaseProbe(store, [], 60.0, limits=limits)
    metrics = Metrics(["export", "api"], "test", 8)
    metrics.registry.register(DatabaseCollector(probe, ["export", "api"], []))
    text = metrics.exposition()[0].decode()
    for line in (
        'pgtick_runs_waiting{job_type="export",reason="concurrency"} 2.0',
        'pgtick_runs_waiting{job_type="export",reason="rate"} 0.0',
        'pgtick_runs_waiting{job_type="api",reason="rate"} 1.0',
        'pgtick_limit{job_type="export",limit="max_running"} 1.0',
        'pgtick_limit_in_use{job_type="export",limit="max_running"} 1.0',
        'pgtick_limit{job_type="api",limit="rate"} 2.0',
        'pgtick_limit_in_use{job_type="api",limit="rate"} 2.0',
    ):
        assert line in text, line


def test_a_job_types_default_priority_reaches_every_enqueue_path(
    store: RunStore, conn: db.Connection
) -> None:
    store.sync_job_type_settings({"mail": 7, "sms": 0})
    store.sync_job_type_settings({"mail": 7, "sms": 0})  # again: nothing changes
    single = store.enqueue(NewRun("mail"))
    [batch] = store.enqueue_many([NewRun("mail")])
    function = conn.execute("SELECT enqueue('mail', '{}')").fetchone()
    given = store.enqueue(NewRun("mail", priority=-1))
    other = store.enqueue(NewRun("unknown"))
    assert function is not None
    rows = dict(
        conn.execute(
            "SELECT id, priority FROM runs WHERE id = ANY(%s)",
            [[single, batch, function[0], given, other]],
        ).fetchall()
    )
    assert [rows[i] for i in (single, batch, function[0], given, other)] == [7, 7, 7, -1, 0]
