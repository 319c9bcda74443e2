"""Pausing a job type fleet-wide (issue 45, Must show 1): with four daemons draining a backlog,
`pgtick pause` stops every new start of the type within one poll interval (measured from the
database, sampled every 10 ms), its runs stay queued, the pause outlives a restart of every
daemon, its schedules hold (queued, run after the resume) or skip (recorded skipped) as each
says, and `pgtick resume` starts them again at once."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection

# Timing bars: run alone, after the parallel part of `make test` (docs/development.md).
pytestmark = pytest.mark.serial

DAEMONS = 4
POLL_SECONDS = 1.0
RUN_SECONDS = 0.1
BACKLOG = 3000

SCHEDULES = """
[job_types.work]
handler = "flow_jobs:work"

[schedules.held]
job_type = "work"
cron = "* * * * *"
overlap = "allow"
catchup = "all"
on_pause = "hold"

[schedules.skipped]
job_type = "work"
cron = "* * * * *"
overlap = "allow"
catchup = "all"
on_pause = "skip"
"""


@contextmanager
def sampling(dsn: str, query: str, every: float = 0.01) -> Iterator[list[tuple[Any, ...]]]:
    """Run ``query`` every ``every`` seconds on a connection of its own while the block runs;
    every result row is collected."""
    seen: list[tuple[Any, ...]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SET search_path TO pgtick")
            while not stop.is_set():
                seen.extend(c.execute(query).fetchall())
                stop.wait(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)


def _one(conn: Connection, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _start_fleet(cluster: Cluster, config: Any) -> None:
    for _ in range(DAEMONS):
        cluster.start(config)


def _stop_fleet(cluster: Cluster) -> None:
    for daemon in cluster.daemons:
        if daemon.proc.poll() is None:
            daemon.signal(signal.SIGTERM)
    for daemon in cluster.daemons:
        assert daemon.wait(60) == 0, daemon.log()


def _runs_of(
    conn: Connection, schedule: str, since: datetime, until: datetime | None = None
) -> dict[str, int]:
    """{status: runs} of the schedule's runs created after ``since`` (and created and due by
    ``until``: the ticker makes an occurrence ahead of its time, and one due after the resume
    stays queued until then, however early a loaded machine's tick created it)."""
    return dict(
        conn.execute(
            "SELECT r.status, count(*) FROM runs r JOIN schedules s ON s.id = r.schedule_id"
            " WHERE s.name = %s AND r.created_at > %s"
            " AND r.created_at < coalesce(%s::timestamptz, 'infinity')"
            " AND r.run_at <= coalesce(%s::timestamptz, 'infinity') GROUP BY r.status",
            [schedule, since, until, until],
        ).fetchall()
    )


@pytest.mark.timeout(240)
def test_a_paused_type_starts_nothing_after_a_poll_interval_across_restarts_and_resumes(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    config = cluster.config(SCHEDULES, threads=8, prefetch=0, poll_interval="1s")
    _start_fleet(cluster, config)
    conn.execute(
        "SELECT enqueue('work', %s::jsonb) FROM generate_series(1, %s)",
        [f'{{"sleep": {RUN_SECONDS}}}', BACKLOG],
    )
    wait_for(
        lambda: _one(conn, "SELECT count(*) FROM runs WHERE status = 'succeeded'") > 200,
        30,
        0.05,
        "the backlog draining",
    )
    running_query = "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'running'"
    with sampling(dsn, f"SELECT clock_timestamp(), ({running_query})") as paused_samples:
        done = pgtick(dsn, "pause", "work", "--reason", "provider down")
        assert done.code == 0, done.err
        paused_at = _one(conn, "SELECT paused_at FROM job_type_controls WHERE job_type = 'work'")
        time.sleep(POLL_SECONDS + 2.0)
    queued = _one(conn, "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'queued'")
    assert queued > BACKLOG / 3, "the backlog should still be waiting"
    # No start later than one poll interval after the pause (NOTIFY makes it milliseconds).
    last_start = _one(conn, "SELECT max(started_at) FROM runs WHERE job_type = 'work'")
    assert last_start <= paused_at + timedelta(seconds=POLL_SECONDS), (last_start, paused_at)
    # Sampled every 10 ms: once the runs started before it ended, nothing ran.
    quiet_from = paused_at + timedelta(seconds=POLL_SECONDS + RUN_SECONDS + 0.5)
    late = [(at, n) for at, n in paused_samples if at > quiet_from and n > 0]
    assert not late, late[:5]
    assert len(paused_samples) > 200

    status = pgtick(dsn, "status")
    assert "paused job types" in status.text, status.text
    assert "provider down" in status.text
    waiting = _one(conn, "SELECT min(id) FROM runs WHERE job_type = 'work' AND status = 'queued'")
    shown = pgtick(dsn, "show", str(waiting))
    assert "its job type is paused" in shown.text and "provider down" in shown.text, shown.text

    # Every daemon restarts while the type is paused; meanwhile four minutes of both schedules'
    # occurrences were missed (their cursors put back): the start-up tick makes them now.
    _stop_fleet(cluster)
    conn.execute(
        "UPDATE schedules SET materialized_until = now() - interval '4 minutes', next_due_at = NULL"
    )
    rewound_at = _one(conn, "SELECT now()")
    _start_fleet(cluster, config)
    time.sleep(POLL_SECONDS + 1.0)
    assert _one(conn, "SELECT max(started_at) FROM runs WHERE job_type = 'work'") == last_start
    held = _runs_of(conn, "held", rewound_at)
    skipped = _runs_of(conn, "skipped", rewound_at)
    assert held.get("queued", 0) >= 3 and set(held) == {"queued"}, held
    assert skipped.get("skipped", 0) >= 3 and set(skipped) == {"skipped"}, skipped

    done = pgtick(dsn, "resume", "work")
    assert done.code == 0, done.err
    resumed_at = _one(conn, "SELECT now()")
    wait_for(
        lambda: (
            _one(
                conn,
                "SELECT count(*) FROM runs WHERE status IN ('queued', 'running') AND run_at <= %s",
                [resumed_at],
            )
            == 0
        ),
        60,
        0.1,
        "every held run done",
    )
    first_after = _one(conn, "SELECT min(started_at) FROM runs WHERE started_at > %s", [resumed_at])
    assert first_after - resumed_at < timedelta(seconds=POLL_SECONDS), first_after - resumed_at
    # What the pause held ran; what it skipped stays skipped (occurrences materialized after
    # the resume are queued as ever).
    held = _runs_of(conn, "held", rewound_at, resumed_at)
    assert held.get("succeeded", 0) >= 3 and set(held) == {"succeeded"}, held
    assert set(_runs_of(conn, "skipped", rewound_at, resumed_at)) == {"skipped"}
    assert (
        _one(conn, "SELECT count(*) FROM runs WHERE payload ? 'sleep' AND status <> 'succeeded'")
        == 0
    )
