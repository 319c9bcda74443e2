"""Must show 1: 8 threads in each of 2 processes claim 10 000 runs; each exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pgtick import db
from pgtick.store import NewRun, RunStore

RUNS = 10_000
PROCESSES = 2
THREADS = 8


def test_two_processes_claim_every_run_exactly_once(
    store: RunStore, conn: db.Connection, dsn: str, tmp_path: Path
) -> None:
    store.enqueue_many([NewRun("noop", {"i": i}) for i in range(RUNS)])
    go = tmp_path / "go"
    script = Path(__file__).with_name("claimer.py")
    outs = [tmp_path / f"out{p}.json" for p in range(PROCESSES)]
    procs = [
        subprocess.Popen([sys.executable, str(script), dsn, str(THREADS), str(go), str(out)])
        for out in outs
    ]
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    results = [json.loads(out.read_text()) for out in outs]

    assert [r["errors"] for r in results] == [[]] * PROCESSES  # nobody hit lock_timeout
    per_thread = [ids for r in results for ids in r["claimed"].values()]
    everything = [run_id for ids in per_thread for run_id in ids]
    assert len(everything) == RUNS
    assert len(set(everything)) == RUNS
    # Both processes really took part.
    assert all(sum(len(ids) for ids in r["claimed"].values()) > 0 for r in results)

    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM runs GROUP BY status, attempts"
    ).fetchall()
    assert rows == [("running", 1, RUNS)]
    opened = conn.execute(
        "SELECT count(*), count(DISTINCT run_id) FROM attempts WHERE outcome IS NULL"
    ).fetchone()
    assert opened == (RUNS, RUNS)
