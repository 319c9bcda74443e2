"""The bench harness end to end at tiny sizes on the test server: it exits 0 and its JSON
record holds the checked figures and the machine they came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_part(admin_dsn: str, results: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--dsn", admin_dsn],
        cwd=REPO,
        env={**os.environ, "PGTICK_BENCH_RESULTS": str(results)},
        capture_output=True,
        text=True,
        timeout=100,
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


def test_scale_times_claims_and_prints_the_plans(pg_admin_dsn: str, tmp_path: Path) -> None:
    record = run_part(
        pg_admin_dsn, tmp_path, "scale", "--terminal", "2000", "--queued", "1000", "--claims", "50"
    )
    results = record["results"]
    assert results["claim_ms"]["n"] == 50 and results["runs_per_claim"] == 8
    assert set(results["plans"]) == {"claim", "reap_select", "reap_mark"}
    assert "runs_lease_idx" in results["plans"]["reap_select"]
