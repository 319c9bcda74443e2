"""The console of a daemon whose DSN points at PgBouncer in transaction mode: every page reads
through the pooler (read-only transactions with their statement timeout set inside them), and
an operator logs in, retries a dead run and logs out (stored, for every daemon) through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.conftest import Cluster, wait_for
from tests.browser.conftest import Console, listening
from tests.dbhelp import connect

TOKEN = "pooler-console-token-0123456789"
CONFIG = """
[database]
prepared_statements = false

[web]
listen = "127.0.0.1:0"
token_file = "{token_file}"

[job_types.flaky]
command = ["/bin/sh", "-c", "echo tried; exit 1"]
max_attempts = 1

[schedules.nightly]
job_type = "record"
cron = "0 3 * * *"
"""


@pytest.mark.timeout(120)
def test_console_pages_and_a_retry_through_pgbouncer(
    dsn: str, pooled_dsn: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cluster = Cluster(pooled_dsn, tmp_path)
    try:
        daemon = cluster.start(cluster.config(CONFIG.format(token_file=token_file)))
        url = f"http://127.0.0.1:{listening(daemon, 'web.listen')}"
        console = Console(daemon, url, dsn, 0, 0, TOKEN)
        with connect(dsn) as conn:
            row = conn.execute("SELECT pgtick.enqueue('flaky', %s::jsonb)", [json.dumps({})])
            run_id = int(row.fetchone()[0])  # type: ignore[index]
            wait_for(
                lambda: (
                    conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone()
                    == ("dead",)
                ),
                30,
                what="the run to go dead",
            )
        cookie = {"Cookie": f"pgtick_session={console.login()}"}
        for path, marker in [
            ("/", "flaky"),
            ("/runs?status=dead", f"/runs/{run_id}"),
            (f"/runs/{run_id}", "tried"),  # its output, read through the pooler too
            ("/schedules", "nightly"),
        ]:
            status, body = console.get(path, cookie)
            assert status == 200, (path, status, body[:300])
            assert marker in body, (path, body[:500])
        status, body = console.get(f"/runs/{run_id}", cookie)
        start = body.index('name="csrf" value="') + len('name="csrf" value="')
        csrf = body[start : body.index('"', start)]
        status, location, _ = console.post(
            "/actions/retry", {"run_id": str(run_id), "csrf": csrf}, cookie
        )
        assert status == 303 and "retried" in location, (status, location)
        with connect(dsn) as conn:
            wait_for(
                lambda: (
                    conn.execute("SELECT attempts FROM runs WHERE id = %s", [run_id]).fetchone()
                    == (2,)
                ),
                30,
                what="the retried run's second attempt",
            )
        # the logout is stored through the pooler too, and the session refused after it
        status, location, _ = console.post("/logout", {"csrf": csrf}, cookie)
        assert (status, location) == (303, "/login")
        status, _, body = console.post(
            "/actions/retry", {"run_id": str(run_id), "csrf": csrf}, cookie
        )
        assert status == 403 and "logged out" in body, body[:300]
        log = daemon.log()
        assert "does not exist" not in log and "Traceback" not in log
    finally:
        cluster.stop_all()
