"""Logs of a real `pgtick run` on a pipe, through a database outage: one JSON shape for every
line (structlog and psycopg records alike), run context on the lines logged during a run, and
the configured DSN's password nowhere."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import Connection, NewRun, Runs, migrate

from .conftest import Cluster, wait_for

PASSWORD = "Pw-7f3c9e-not-in-any-log"
LEADING_KEYS = ["timestamp", "level", "event", "logger"]
ISO_UTC = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"

# Handlers that log from inside their run, through structlog and through the standard library.
CHATTY_JOBS = """
import logging

import structlog

from pgtick import job


@job("chatty")
def chatty(ctx, payload):
    structlog.get_logger("chatty").info("chatty_structlog", step=1)
    logging.getLogger("chatty.stdlib").warning("chatty stdlib line %s", ctx.run_id)
    if payload.get("fail"):
        raise RuntimeError("chatty failed")
"""


def parse(text: str) -> list[dict[str, Any]]:
    """Every line of the daemon's output as JSON; fails on the first line that is not."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}") from None
    return lines


@pytest.mark.timeout(120)
def test_daemon_logs_on_a_pipe(own_server: EmbeddedPostgres, tmp_path: Path) -> None:
    """Must show 5: every line JSON with the shared fields, run lines carry the run's fields,
    the DSN password given in the config never appears, not even around connection errors."""
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE logs")
    admin_dsn = make_conninfo(own_server.dsn, dbname="logs")
    migrate(admin_dsn)
    (tmp_path / "chatty_jobs.py").write_text(CHATTY_JOBS)
    secret_dsn = make_conninfo(admin_dsn, password=PASSWORD)
    cluster = Cluster(admin_dsn, tmp_path)
    config = cluster.config(f"\n[database]\ndsn = {json.dumps(secret_dsn)}\n", heartbeat="1s")
    config.write_text(config.read_text().replace('imports = ["jobs"]', 'imports = ["chatty_jobs"]'))
    env = {"PGTICK_DSN": "", "PYTHONPATH": str(tmp_path)}  # the DSN comes from the config file
    try:
        daemon = cluster.start(config, env=env)
        store = Runs(admin_dsn)
        ok = store.enqueue(NewRun("chatty"))
        bad = store.enqueue(NewRun("chatty", {"fail": True}))

        def handled() -> bool:
            events = [e.get("event") for e in daemon.events()]
            return events.count("chatty_structlog") == 2

        wait_for(handled, 30, what="both runs to log")
        # An outage: the connections that failed are told in one line, with psycopg's error
        # (its pool's own warnings are counted into the outage, issue 44 item 10).
        own_server.stop("fast")
        wait_for(
            lambda: any(e.get("event") == "database_unreachable" for e in daemon.events()),
            30,
            0.2,
            "the outage's line",
        )
        own_server.start()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        cluster.stop_all()

    output = daemon.log()
    assert PASSWORD not in output
    assert PASSWORD[3:15] not in output
    lines = parse(output)
    for line in lines:
        assert list(line)[:4] == LEADING_KEYS, line
        assert re.match(ISO_UTC, line["timestamp"]), line
        assert line["level"] in {"debug", "info", "warning", "error", "critical"}, line
    loggers = {line["logger"] for line in lines}
    outages = [line for line in lines if line["event"] == "database_unreachable"]
    assert outages and all(line["error"] for line in outages), outages  # the error, no password
    assert {"chatty", "chatty.stdlib", "pgtick.service"} <= loggers
    during_runs = [line for line in lines if line["logger"] in {"chatty", "chatty.stdlib"}]
    assert len(during_runs) == 4
    for line in during_runs:
        assert line["job_type"] == "chatty"
        assert line["run_id"] in {ok, bad}
        assert line["attempt"] == 1
    stdlib_lines = [line for line in during_runs if line["logger"] == "chatty.stdlib"]
    assert {line["event"] for line in stdlib_lines} == {
        f"chatty stdlib line {ok}",
        f"chatty stdlib line {bad}",
    }


def test_run_outcomes_summary_and_shutdown_lines(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """What an operator reads: a warning per failed attempt with its retry time, an error per
    run going dead, no INFO line per success but a runs_summary per job type, and on SIGTERM
    how many runs it waits for, for how long, that a second signal stops at once, and at exit
    what finished and what was released."""
    daemon = cluster.start(cluster.config(grace="5s"))
    ok = store.enqueue_many([NewRun("record") for _ in range(3)])
    retried = store.enqueue_many([NewRun("retry_after", {"after": 3600})])
    dead = store.enqueue_many([NewRun("give_up")])
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM runs WHERE status IN ('succeeded', 'failed', 'dead')"
            ).fetchone()
            == (5,)
        ),
        15,
        what="five outcomes",
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    events = daemon.events()
    by_event: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_event.setdefault(e["event"], []).append(e)
    [failed] = by_event["run_failed"]
    assert failed["level"] == "warning" and failed["run_id"] == retried[0]
    assert failed["error_type"] == "Retry" and failed["attempt"] == 1
    assert failed["retry_at"] > failed["timestamp"]  # an hour from now
    [gone] = by_event["run_dead"]
    assert gone["level"] == "error" and gone["run_id"] == dead[0]
    assert "invoice 42" in gone["error"]
    assert "run_succeeded" not in by_event  # successes are counted, not logged at info
    summary = {e["job_type"]: e for e in by_event["runs_summary"]}
    assert summary["record"]["succeeded"] == len(ok) and summary["record"]["level"] == "info"
    assert summary["give_up"]["dead"] == 1 and summary["retry_after"]["failed"] == 1
    [draining] = by_event["draining"]
    assert draining["running"] == 0 and draining["grace_seconds"] == 5
    assert "second SIGTERM" in draining["message"]
    [drained] = by_event["drained"]
    assert (drained["finished"], drained["released"], drained["left_running"]) == (0, 0, 0)
