"""The bench harness end to end at tiny sizes on the test server: it exits 0 and its JSON
record holds the checked figures and the machine they came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench import ceiling, common

from pgtick.embedded import installed_versions

REPO = Path(__file__).resolve().parents[2]


def run_part(
    admin_dsn: str | None, results: Path, *args: str, timeout: float = 100
) -> dict[str, Any]:
    """``python -m bench ARGS`` on the test server, or (None) on a throwaway one of its own
    (embedded, or the one ``--server`` names)."""
    env = {**os.environ, "PGTICK_BENCH_RESULTS": str(results)}
    env.pop("PGTICK_BENCH_DSN", None)
    result = subprocess.run(
        [sys.executable, "-m", "bench", *args, *(["--dsn", admin_dsn] if admin_dsn else [])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [path] = results.glob(f"{args[0]}-*.json")
    record: dict[str, Any] = json.loads(path.read_text())
    assert record["part"] == args[0]
    assert record["machine"]["nproc"] >= 1 and record["machine"]["ram_bytes"] > 0
    assert record["postgresql"] and record["packages"]["pgtick"]
    return record


def test_throughput_with_two_daemons_checks_every_run_once(
    pg_admin_dsn: str, tmp_path: Path
) -> None:
    record = run_part(pg_admin_dsn, tmp_path, "throughput", "--runs", "300", "--daemons", "2")
    results = record["results"]
    assert results["exactly_once"] is True
    assert results["runs"] == 300 and sum(results["runs_per_daemon"]) == 300
    assert results["runs_per_second"] > 0


def test_the_sql_ceiling_drains_every_run_once_with_the_daemons_statements(
    pg_admin_dsn: str, tmp_path: Path
) -> None:
    with common.fresh_database(pg_admin_dsn, "ceil_test") as dsn:
        common.enqueue_noop(dsn, 500)
        result = ceiling.drain_loaded(dsn, tmp_path, 500)
        with common.connect(dsn) as conn:
            # What the claim and the finish write, read here rather than trusted from the
            # ceiling's own checks: each run claimed once (max_attempts filled in from its job
            # type) and let go of, one 'succeeded' attempt row by a lane of the ceiling.
            runs = conn.execute(
                """
                SELECT status, attempts, max_attempts, locked_by IS NULL,
                       finished_at >= started_at, count(*)
                FROM runs GROUP BY 1, 2, 3, 4, 5
                """
            ).fetchall()
            attempts = conn.execute(
                """
                SELECT count(*), count(DISTINCT run_id), count(*) FILTER (
                    WHERE outcome = 'succeeded' AND attempt = 1
                      AND worker_id LIKE 'sql-ceiling-%')
                FROM attempts
                """
            ).fetchone()
    assert runs == [("succeeded", 1, 10, True, True, 500)]
    assert attempts == (500, 500, 500)
    assert result["runs"] == 500 and sum(result["runs_per_daemon"]) == 500
    # A lane may find nothing when the other took every batch first: at most one per lane.
    assert result["exactly_once"] is True and len(result["runs_per_daemon"]) <= result["lanes"]
    assert result["seconds"] > 0 and result["runs_per_second"] > 0


def test_the_sql_ceiling_fails_when_a_run_is_left(pg_admin_dsn: str, tmp_path: Path) -> None:
    with common.fresh_database(pg_admin_dsn, "ceil_test") as dsn:
        common.enqueue_noop(dsn, 50)
        common.enqueue_noop(dsn, 1, job_type="no_handler_anywhere")  # never claimed
        with pytest.raises(common.BenchError, match="expected 50 succeeded runs"):
            ceiling.drain_loaded(dsn, tmp_path, 50)


def test_scale_reads_the_daemons_claims_from_pg_stat_statements(tmp_path: Path) -> None:
    # Its own embedded server: the part restarts it with pg_stat_statements preloaded, which
    # the test session's server is not.
    record = run_part(
        None, tmp_path, "scale", "--terminal", "2000", "--queued", "1000", "--claims", "50"
    )
    results = record["results"]
    assert results["claim_ms"]["n"] >= 50 and 1 <= results["runs_per_claim"] <= 8
    assert results["claim_ms"]["max"] >= results["claim_ms"]["mean"] > 0
    assert results["runs_seq_scans"] == 0 and results["expired_runs_recovered"] == 100
    reaper = [s for s in results["statements"] if "locked_until < now()" in s["query"]]
    assert reaper and all(s["calls"] >= 1 for s in reaper)


@pytest.mark.skipif(
    15 not in installed_versions(),
    reason="no PostgreSQL 15 installed (apt-get install postgresql-15)",
)
def test_soak_on_postgresql_15_reports_each_statement_by_block(tmp_path: Path) -> None:
    # A throwaway cluster of the distribution's PostgreSQL 15, restarted with
    # pg_stat_statements preloaded as the embedded server is.
    record = run_part(
        None, tmp_path, "soak", "--server", "15", "--duration", "16", "--sample", "8",
        "--rate", "200", "--retention", "1m", timeout=240,
    )  # fmt: skip
    assert record["postgresql"].startswith("15.")
    results = record["results"]
    assert results["checks"]["ok"] is True
    rows = {r["statement"]: r for r in results["statements"]["rows"]}
    assert {"claim", "succeed", "planner_hints"} <= set(rows)
    for name in ("claim", "succeed"):
        assert rows[name]["calls_first"] > 0 and rows[name]["calls_last"] > 0
        assert rows[name]["us_per_call_last"] > 0 and rows[name]["us_per_run_last"] > 0
    assert results["statements"]["first"] == "0-8s" and results["statements"]["last"] == "8-16s"
