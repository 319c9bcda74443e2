"""Issue 42, finding 5 and "Must show" 2: an install at the schema before the storage cut-over
(0009, the last release whose runs table was one table) with 100 000 runs is migrated to this
version's head while the application keeps enqueueing, keyed and not, from several sessions.
Every enqueue either commits once or is refused with a retryable error (SQLSTATE 40001 or
40P01, docs/operations "Rolling deploy"); none is lost. Before the fix, the enqueues waiting on
0010's lock ran 0009's body against the new table and failed with "there is no unique or
exclusion constraint matching the ON CONFLICT specification" (42P10).

The exclusive window (how long an enqueue waited for the migration) is printed; the test
asserts it is bounded by the migration itself."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgtick.storage import migrate
from tests import dbhelp

BASE_VERSION = "0009"
OLD_RUNS = 100_000
CLIENTS = 4
HOT_KEYS = 40  # per client: most keyed enqueues find their key taken
RETRYABLE = {"40001", "40P01"}  # serialization failure, deadlock: retry the transaction


@dataclass(frozen=True)
class Call:
    marker: str
    key: str | None
    run_id: int | None
    sqlstate: str | None
    started: float
    ended: float


def _client(dsn: str, n: int, stop: threading.Event, calls: list[Call]) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        i = 0
        while not stop.is_set():
            key = f"k-{n}-{i % HOT_KEYS}" if i % 2 == 0 else None
            marker = f"{n}-{i}"
            started = time.monotonic()
            try:
                row = c.execute(
                    "SELECT pgtick.enqueue('app', %s, NULL, %s)", (Jsonb({"m": marker}), key)
                ).fetchone()
                assert row is not None
                calls.append(Call(marker, key, int(row[0]), None, started, time.monotonic()))
            except psycopg.Error as exc:
                calls.append(Call(marker, key, None, exc.sqlstate, started, time.monotonic()))
            i += 1
            time.sleep(0.005)


@pytest.mark.timeout(600)
def test_enqueues_through_the_storage_cut_over_commit_once(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = migrate.available()
    base = [m for m in shipped if m.version <= BASE_VERSION]
    monkeypatch.setattr(migrate, "available", lambda: base)
    migrate.migrate(empty_dsn, "pgtick")
    monkeypatch.undo()
    with dbhelp.connect(empty_dsn) as conn:
        conn.execute(
            "INSERT INTO runs (job_type, status, payload, idempotency_key, attempts, started_at,"
            " finished_at)"
            " SELECT 'old', CASE WHEN g %% 10 = 0 THEN 'queued' ELSE 'succeeded' END,"
            "        jsonb_build_object('g', g), CASE WHEN g %% 3 = 0 THEN 'old-' || g END,"
            "        CASE WHEN g %% 10 = 0 THEN 0 ELSE 1 END,"
            "        CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '1 hour' END,"
            "        CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '1 hour' END"
            " FROM generate_series(1, %s) g",
            (OLD_RUNS,),
        )

    stop = threading.Event()
    calls: list[Call] = []
    clients = [
        threading.Thread(target=_client, args=(empty_dsn, n, stop, calls), daemon=True)
        for n in range(CLIENTS)
    ]
    for t in clients:
        t.start()
    time.sleep(1.0)
    began = time.monotonic()
    applied = migrate.migrate(empty_dsn, "pgtick")
    took = time.monotonic() - began
    time.sleep(1.0)
    stop.set()
    for t in clients:
        t.join(timeout=60)
    assert applied == [f"{m.version}_{m.name}" for m in shipped if m.version > BASE_VERSION]

    during = [c for c in calls if c.ended >= began and c.started <= began + took]
    assert len(during) >= CLIENTS, "no enqueue overlapped the migration"
    refused = [c for c in calls if c.sqlstate is not None]
    assert all(c.sqlstate in RETRYABLE for c in refused), refused[:5]
    waited = max(c.ended - c.started for c in calls)
    print(f"migration {took:.2f} s; longest enqueue {waited:.2f} s; {len(calls)} enqueues")
    assert waited <= took + 1.0

    committed = [c for c in calls if c.run_id is not None]
    with dbhelp.connect(empty_dsn) as conn:
        runs = {
            int(i): (k, m)
            for i, k, m in conn.execute(
                "SELECT id, idempotency_key, payload->>'m' FROM runs WHERE job_type = 'app'"
            )
        }
        assert conn.execute("SELECT count(*) FROM runs WHERE job_type = 'old'").fetchone() == (
            OLD_RUNS,
        )
    by_key: dict[str, set[int]] = {}
    for c in committed:
        assert c.run_id in runs, c  # nothing committed is lost
        if c.key is None:
            assert runs[c.run_id] == (None, c.marker), c
        else:
            by_key.setdefault(c.key, set()).add(c.run_id)
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    keyed_runs = [k for k, _ in runs.values() if k is not None]
    assert len(keyed_runs) == len(set(keyed_runs))  # one run per key
    unkeyed_markers = [m for k, m in runs.values() if k is None]
    assert len(unkeyed_markers) == len(set(unkeyed_markers))  # each enqueue once
