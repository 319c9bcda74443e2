"""Must show 1: 8 threads in each of 2 processes claim 10 000 runs; each exactly once, and no
claimer ever waits on another's lock."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from pgtick.storage import db
from pgtick.storage.store import NewRun, RunStore

RUNS = 10_000
LOCKED = 1_000
PROCESSES = 2
THREADS = 8
HOLD_LOCKS_SECONDS = 8.0  # longer than the claimers' 5 s statement_timeout


def _race(dsn: str, tmp_path: Path, phase: str) -> list[dict[str, object]]:
    go = tmp_path / f"go-{phase}"
    script = Path(__file__).with_name("claimer.py")
    outs = [tmp_path / f"{phase}-{p}.json" for p in range(PROCESSES)]
    procs = [
        subprocess.Popen([sys.executable, str(script), dsn, str(THREADS), str(go), str(out)])
        for out in outs
    ]
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return [json.loads(out.read_text()) for out in outs]


def _ids(results: list[dict[str, object]]) -> list[int]:
    return [i for r in results for ids in r["claimed"].values() for i in ids]  # type: ignore[attr-defined]


def test_two_processes_claim_every_run_exactly_once(
    store: RunStore, conn: db.Connection, dsn: str, tmp_path: Path
) -> None:
    store.enqueue_many([NewRun("noop", {"i": i}) for i in range(RUNS)])
    with psycopg.connect(dsn) as holder:
        # Someone else holds row locks on the 1 000 most due runs, for longer than a claimer
        # would tolerate waiting: claimers must skip them, not queue behind them.
        locked = holder.execute(
            "SELECT id FROM pgtick.runs ORDER BY run_at, id LIMIT %s FOR UPDATE", [LOCKED]
        ).fetchall()
        started = time.monotonic()
        first = _race(dsn, tmp_path, "locked")
        assert time.monotonic() - started < HOLD_LOCKS_SECONDS
        assert [r["errors"] for r in first] == [[]] * PROCESSES
        first_ids = _ids(first)
        assert len(first_ids) == RUNS - LOCKED
        assert not {row[0] for row in locked} & set(first_ids)
        holder.rollback()
    second = _race(dsn, tmp_path, "released")
    assert [r["errors"] for r in second] == [[]] * PROCESSES

    everything = first_ids + _ids(second)
    assert len(everything) == RUNS
    assert len(set(everything)) == RUNS
    # Both processes really took part.
    assert all(sum(len(ids) for ids in r["claimed"].values()) > 0 for r in first)  # type: ignore[attr-defined]

    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM runs GROUP BY status, attempts"
    ).fetchall()
    assert rows == [("running", 1, RUNS)]
    opened = conn.execute(
        "SELECT count(*), count(DISTINCT run_id) FROM attempts WHERE outcome IS NULL"
    ).fetchone()
    assert opened == (RUNS, RUNS)
