"""Handler outcomes through a real daemon: Retry, Fail, exceptions, Python timeouts, config."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.dbhelp import Connection, NewRun, Runs, connect

from .conftest import Cluster, wait_for

TYPES = """
[job_types.boom]
backoff = "fixed"
backoff_base = "1h"
jitter = 0.0

[job_types.stubborn]
timeout = "1s"
max_attempts = 1
"""


def _status(store: Runs, run_id: int) -> str | None:
    run = store.get_run(run_id)
    return None if run is None else run.status


def test_retry_fail_exception_and_timeout(cluster: Cluster, store: Runs, conn: Connection) -> None:
    cluster.start(cluster.config(TYPES, heartbeat="1s"))
    retry = store.enqueue(NewRun("retry_after", {"after": 300}))
    fail = store.enqueue(NewRun("give_up"))
    bug = store.enqueue(NewRun("boom"))
    slow = store.enqueue(NewRun("stubborn", {"seconds": 4}))
    wait_for(
        lambda: (
            [_status(store, i) for i in (retry, fail, bug, slow)]
            == ["failed", "dead", "failed", "dead"]
        ),
        15,
        what="all four outcomes",
    )
    # Retry(after=300): the handler's own delay, on the database clock.
    row = conn.execute(
        "SELECT r.run_at - a.finished_at, r.last_error, r.error_type FROM runs r "
        "JOIN attempts a ON a.run_id = r.id WHERE r.id = %s",
        [retry],
    ).fetchone()
    assert row == (timedelta(seconds=300), "Retry: not yet", "Retry")
    # Fail: dead at once, whatever max_attempts says.
    dead = store.get_run(fail)
    assert dead is not None
    assert (dead.attempts, dead.error_type, dead.last_error) == (
        1, "Fail", "Fail: invoice 42 does not exist")  # fmt: skip
    # An exception: failed with the job type's backoff; short last_error, bounded traceback.
    failed = store.get_run(bug)
    assert failed is not None and failed.error_type == "ValueError"
    assert failed.last_error is not None and len(failed.last_error) <= 500
    [attempt] = store.get_attempts(bug)
    assert attempt.error is not None and "Traceback" in attempt.error
    assert len(attempt.error.encode()) <= 8192
    delay = conn.execute(
        "SELECT r.run_at - a.finished_at FROM runs r JOIN attempts a ON a.run_id = r.id "
        "WHERE r.id = %s",
        [bug],
    ).fetchone()
    assert delay == (timedelta(hours=1),)
    # A Python handler past its timeout (1 s) that sleeps on (4 s, deaf to ctx.cancelled) is
    # failed by its timeout (here: dead, max_attempts 1) whatever it returns, once it has
    # returned: the run is held until then (tests/acceptance/test_timeouts.py).
    timed_out = store.get_run(slow)
    assert timed_out is not None
    assert (timed_out.error_type, timed_out.last_error) == ("timeout", "timed out after 1s")
    [attempt] = store.get_attempts(slow)
    assert (attempt.outcome, attempt.error_type) == ("failed", "timeout")
    assert attempt.finished_at is not None
    assert attempt.finished_at - attempt.started_at >= timedelta(seconds=4)


RETRY_EVERY_TIME = """
[job_types.always_retry]
max_attempts = 3
"""


def test_retry_on_every_attempt_goes_dead_after_max_attempts(cluster: Cluster, store: Runs) -> None:
    """Retry asks for another attempt only while attempts remain: with max_attempts = 3 the
    run is dead after exactly three, keeps the last error, and the log says failed twice
    (warning, with when it runs again) and dead once (error)."""
    daemon = cluster.start(cluster.config(RETRY_EVERY_TIME, poll_interval="1s"))
    run_id = store.enqueue(NewRun("always_retry", {"after": 0}))
    wait_for(lambda: _status(store, run_id) == "dead", 20, what="dead")
    run = store.get_run(run_id)
    assert run is not None
    assert (run.attempts, run.max_attempts, run.error_type, run.last_error) == (
        3, 3, "Retry", "Retry: attempt 3")  # fmt: skip
    attempts = store.get_attempts(run_id)
    assert [(a.attempt, a.outcome, a.error_type) for a in attempts] == [
        (n, "failed", "Retry") for n in (1, 2, 3)
    ]
    assert all(f"attempt {a.attempt}" in (a.error or "") for a in attempts)
    assert [r["attempt"] for r in cluster.records()] == [1, 2, 3]

    def outcome_lines() -> list[dict[str, Any]]:
        return [
            e
            for e in daemon.events()
            if e.get("event") in ("run_failed", "run_dead") and e.get("run_id") == run_id
        ]

    # The dead line is logged just after the transaction that made the run dead.
    wait_for(lambda: any(e["event"] == "run_dead" for e in outcome_lines()), 5, what="run_dead")
    lines = outcome_lines()
    assert [(e["event"], e["level"], e["attempt"]) for e in lines] == [
        ("run_failed", "warning", 1),
        ("run_failed", "warning", 2),
        ("run_dead", "error", 3),
    ]
    for line in lines[:2]:
        assert line["error_type"] == "Retry"
        assert datetime.fromisoformat(line["retry_at"]) <= datetime.now(UTC)  # after=0: now
    assert "retry_at" not in lines[2]
    assert lines[2]["error"] == "Retry: attempt 3"


def test_a_bad_handler_config_is_refused_with_the_key(cluster: Cluster) -> None:
    bad = cluster.config('\n[job_types.x]\nhandler = "no_such_module:fn"\n')
    daemon = cluster.start(bad, wait=False)
    assert daemon.wait(20) == 2
    assert "job_types.x.handler: cannot import module 'no_such_module'" in daemon.log()
    assert "Traceback" not in daemon.log()


def test_migrate_cli_is_idempotent_and_refuses_an_edited_file(empty_dsn: str) -> None:
    def migrate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgtick", "migrate", "--dsn", empty_dsn],
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = migrate()
    with connect(empty_dsn, "pgtick") as conn:
        recorded = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version")
        shipped = "".join(f"applied {version}_{name}\n" for version, name in recorded)
    assert (first.returncode, first.stdout) == (0, shipped)
    assert shipped.startswith("applied 0001_create_schema\n")
    second = migrate()
    assert (second.returncode, second.stdout) == (0, "schema 'pgtick' is up to date\n")
    with connect(empty_dsn, "pgtick") as conn:
        conn.execute("UPDATE schema_migrations SET sha256 = repeat('0', 64)")
    third = migrate()
    assert third.returncode == 2
    assert third.stderr.count("\n") == 1
    assert "migration 0001_create_schema.sql was changed after it was applied" in third.stderr


def test_unreachable_database_exits_3(cluster: Cluster) -> None:
    cluster.dsn = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    daemon = cluster.start(wait=False)
    assert daemon.wait(40) == 3
    assert "Traceback" not in daemon.log()
