"""`pgtick logs RUN_ID --follow` on a run cancelled before it ever started ends (exit 1): it
waited forever, as its end needed an attempt's outcome or an attempt started, and a run
cancelled while queued has neither."""

from __future__ import annotations

import subprocess
import sys

from tests import dbhelp
from tests.acceptance.cli import insert_run


def test_follow_of_a_run_cancelled_before_it_started_ends(
    dsn: str, conn: dbhelp.Connection
) -> None:
    run_id = insert_run(conn, job_type="x")
    conn.execute(
        "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE id = %s", (run_id,)
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pgtick", "logs", str(run_id), "--follow", "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=20,
            env={"PGTICK_CONFIG": "", "PATH": "/usr/bin:/bin"},
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"pgtick logs {run_id} --follow still waiting after 20s") from None
    assert proc.returncode in (1, 4), (proc.returncode, proc.stderr)
