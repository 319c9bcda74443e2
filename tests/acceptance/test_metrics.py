"""Metrics and health against a real PostgreSQL: a live ``pgtick run`` scraped over HTTP, and
the endpoint's behaviour with the database gone (the queries behind the metrics:
tests/integration/test_metrics_queries.py)."""

from __future__ import annotations

import concurrent.futures
import signal
import socket
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgtick
from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import STATUSES, Connection, NewRun, Runs, migrate

from .conftest import Cluster, Daemon, status_counts, wait_for

# How long the daemon keeps one aggregate query's result (README: Metrics and health).
DB_CACHE_SECONDS = 5.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# Every required series, and the claim histogram the dashboard reads: (type, label names);
# counters are named without _total here.
REQUIRED = {
    "pgtick_runs": ("gauge", {"job_type", "status"}),
    "pgtick_queue_depth": ("gauge", {"job_type"}),
    "pgtick_queue_oldest_due_seconds": ("gauge", {"job_type"}),
    "pgtick_runs_stuck": ("gauge", {"job_type"}),
    "pgtick_run_attempts": ("counter", {"job_type", "outcome"}),
    "pgtick_run_duration_seconds": ("histogram", {"job_type", "outcome"}),
    "pgtick_run_start_delay_seconds": ("histogram", {"job_type"}),
    "pgtick_schedule_last_success_timestamp_seconds": ("gauge", {"schedule"}),
    "pgtick_schedule_next_run_timestamp_seconds": ("gauge", {"schedule"}),
    "pgtick_ticker_last_tick_timestamp_seconds": ("gauge", set()),
    "pgtick_leases_lost": ("counter", {"job_type"}),
    "pgtick_claim_duration_seconds": ("histogram", set()),
    "pgtick_worker_threads": ("gauge", set()),
    "pgtick_worker_busy_threads": ("gauge", set()),
    "pgtick_db_errors": ("counter", {"operation"}),
    "pgtick_schedules_overdue": ("gauge", set()),
    "pgtick_draining": ("gauge", set()),
    "pgtick_db_collect_success": ("gauge", set()),
    "pgtick_build_info": ("gauge", {"version"}),
}


SCHEDULES = """
[job_types.boom]
backoff_base = "1h"

[schedules.yearly_report]
job_type = "record"
cron = "0 3 1 1 *"

[schedules.orphan]
job_type = "record"
cron = "0 0 1 1 *"
"""
METRICS_LISTEN = 'listen = "127.0.0.1:0"'


def start_with_metrics(cluster: Cluster, extra: str = "", **settings: Any) -> tuple[Daemon, str]:
    """A daemon serving metrics on a free port; returns it and its base URL."""
    path = cluster.config(extra, **settings)
    path.write_text(path.read_text().replace('listen = ""', METRICS_LISTEN, 1))
    daemon = cluster.start(path)
    event = next(e for e in daemon.events() if e.get("event") == "http_listening")
    assert event["key"] == "metrics.listen"
    return daemon, f"http://127.0.0.1:{event['port']}"


def get(url: str, accept: str = "") -> tuple[int, str, str]:
    """Status, content type and body; error statuses too."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def scrape(base: str) -> Samples:
    """Every sample of a scrape, keyed by name and labels, parsed by prometheus_client."""
    status, content_type, body = get(base + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def check_declarations(base: str) -> None:
    """Each required family has its type, and every sample exactly its label names."""
    families = {f.name: f for f in text_string_to_metric_families(get(base + "/metrics")[2])}
    for name, (kind, labels) in REQUIRED.items():
        assert families[name].type == kind, name
        for s in families[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)


@pytest.mark.timeout(120)
def test_metrics_of_a_running_daemon_match_the_database(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 1: every required series, with values for a state this test prepared."""
    now = store.now()
    # Handled runs, each due 30 s before it can start (start delay) and sleeping 0.2 s.
    for _ in range(3):
        store.enqueue(NewRun("record", {"sleep": 0.2}, run_at=now - timedelta(seconds=30)))
    for _ in range(2):
        store.enqueue(NewRun("give_up"))  # Fail: dead at once
    store.enqueue(NewRun("boom"))  # fails, waits for a retry
    daemon, base = start_with_metrics(cluster, SCHEDULES, reaper="1h", threads=4)
    wait_for(
        lambda: status_counts(conn) == {"succeeded": 3, "dead": 2, "failed": 1},
        30,
        what="the handled runs to finish",
    )
    # A type no daemon handles: two due runs; one more running on a lease about to expire.
    conn.execute(
        "INSERT INTO runs (job_type, run_at) VALUES"
        " ('nobody', now() - interval '120 seconds'), ('nobody', now() - interval '60 seconds')"
    )
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, started_at)"
        " VALUES ('nobody', 'running', 1, 'gone', now() + interval '1 second', now())"
    )
    # Both schedules exist since last year. yearly_report succeeded for its latest occurrence a
    # day ago; orphan's latest occurrence has a run that never started (not due until later):
    # it is overdue. (An occurrence the ticker passed without a run, on purpose, is not.)
    conn.execute("UPDATE schedules SET created_at = now() - interval '400 days'")
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, run_at)"
        " SELECT id, make_timestamptz(extract(year FROM now())::int, 1, 1, 0, 0, 0, 'UTC'),"
        "        'record', now() + interval '1 hour'"
        " FROM schedules WHERE name = 'orphan'"
    )
    [(last_success, latest)] = conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, started_at, finished_at)"
        " SELECT id, make_timestamptz(extract(year FROM now())::int, 1, 1, 3, 0, 0, 'UTC'),"
        "        'record', 'succeeded', now() - interval '1 day', now() - interval '1 day'"
        " FROM schedules WHERE name = 'yearly_report'"
        " RETURNING extract(epoch FROM finished_at)::float8, scheduled_for"
    ).fetchall()

    def settled() -> Samples | None:
        samples = scrape(base)
        terminal_counted = sample(samples, "pgtick_runs", job_type="record", status="succeeded")
        stuck = sample(samples, "pgtick_runs_stuck", job_type="nobody")
        return samples if terminal_counted == 4 and stuck == 1 else None

    samples = wait_for(settled, 30, 0.5, "the recount and the expired lease")
    db_now = store.now().timestamp()

    def value(name: str, **labels: str) -> float:
        return sample(samples, name, **labels)

    assert value("pgtick_db_collect_success") == 1
    # pgtick_runs: every status of every type, exact for this state.
    in_db = dict(
        ((t, s), n)
        for t, s, n in conn.execute("SELECT job_type, status, count(*) FROM runs GROUP BY 1, 2")
    )
    for job_type in ("record", "give_up", "boom", "nobody", "polite"):
        for status in STATUSES:
            assert value("pgtick_runs", job_type=job_type, status=status) == in_db.get(
                (job_type, status), 0
            ), (job_type, status)
    assert value("pgtick_queue_depth", job_type="nobody") == 2
    assert value("pgtick_queue_depth", job_type="record") == 0
    oldest = value("pgtick_queue_oldest_due_seconds", job_type="nobody")
    assert 120 <= oldest <= 120 + (db_now - now.timestamp()) + 1
    assert value("pgtick_queue_oldest_due_seconds", job_type="record") == 0
    assert value("pgtick_runs_stuck", job_type="nobody") == 1
    assert value("pgtick_runs_stuck", job_type="record") == 0
    # Ended attempts by outcome as the attempts view has them (the running 'nobody' run is an
    # open one there, with no outcome yet).
    attempts = dict(
        ((t, o), n)
        for t, o, n in conn.execute(
            "SELECT r.job_type, a.outcome, count(*) FROM attempts a JOIN runs r ON r.id = a.run_id"
            " WHERE a.outcome IS NOT NULL GROUP BY 1, 2"
        )
    )
    assert conn.execute(
        "SELECT a.worker_id, a.outcome FROM attempts a JOIN runs r ON r.id = a.run_id"
        " WHERE r.job_type = 'nobody'"
    ).fetchall() == [("gone", None)]
    assert attempts == {("record", "succeeded"): 3, ("give_up", "failed"): 2, ("boom", "failed"): 1}
    for job_type in ("record", "give_up", "boom", "polite"):
        for outcome in ("succeeded", "failed", "lost", "released"):
            expected = attempts.get((job_type, outcome), 0)
            labels = {"job_type": job_type, "outcome": outcome}
            assert value("pgtick_run_attempts_total", **labels) == expected
            assert value("pgtick_run_duration_seconds_count", **labels) == expected
    # Durations: each record run slept 0.2 s.
    record_ok = {"job_type": "record", "outcome": "succeeded"}
    assert 0.6 <= value("pgtick_run_duration_seconds_sum", **record_ok) < 3
    assert value("pgtick_run_duration_seconds_bucket", le="0.1", **record_ok) == 0
    assert value("pgtick_run_duration_seconds_bucket", le="+Inf", **record_ok) == 3
    # Start delay: the record runs were due 30 s before the daemon started.
    assert value("pgtick_run_start_delay_seconds_count", job_type="record") == 3
    assert value("pgtick_run_start_delay_seconds_sum", job_type="record") >= 90
    assert value("pgtick_run_start_delay_seconds_bucket", job_type="record", le="10.0") == 0
    assert value("pgtick_run_start_delay_seconds_bucket", job_type="record", le="300.0") == 3
    assert value("pgtick_run_start_delay_seconds_count", job_type="give_up") == 2
    # Schedules: last success, next occurrence, overdue (orphan's occurrence never started).
    assert value(
        "pgtick_schedule_last_success_timestamp_seconds", schedule="yearly_report"
    ) == pytest.approx(last_success)
    assert value("pgtick_schedule_last_success_timestamp_seconds", schedule="orphan") == 0
    next_year = datetime(latest.year + 1, 1, 1, 3, tzinfo=UTC).timestamp()
    assert (
        value("pgtick_schedule_next_run_timestamp_seconds", schedule="yearly_report") == next_year
    )
    assert (
        value("pgtick_schedule_next_run_timestamp_seconds", schedule="orphan")
        == datetime(latest.year + 1, 1, 1, tzinfo=UTC).timestamp()
    )
    assert value("pgtick_schedules_overdue") == 1
    # Process-local series.
    assert abs(value("pgtick_ticker_last_tick_timestamp_seconds") - db_now) < 120
    assert value("pgtick_leases_lost_total", job_type="record") == 0
    assert value("pgtick_worker_threads") == 4
    assert value("pgtick_worker_busy_threads") == 0
    assert value("pgtick_draining") == 0
    assert value("pgtick_build_info", version=pgtick.__version__) == 1
    # Every claim's round trip, found runs or not: at least the claims of the runs above, each
    # well under the largest finite bucket on an idle test server.
    claims = value("pgtick_claim_duration_seconds_count")
    assert claims >= 1
    assert 0 < value("pgtick_claim_duration_seconds_sum") < claims * 10
    assert value("pgtick_claim_duration_seconds_bucket", le="10.0") == claims
    assert value("pgtick_db_pool_max_connections", pool="pgtick") >= 4
    assert value("pgtick_db_pool_max_connections", pool="pgtick-metrics") == 2
    assert value("process_resident_memory_bytes") > 0
    assert any(name == "python_info" for name, _ in samples)
    check_declarations(base)
    # OpenMetrics for a scraper that asks for it.
    code, content_type, body = get(base + "/metrics", "application/openmetrics-text")
    assert code == 200 and content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert get(base + "/healthz")[:1] == (200,)
    assert get(base + "/readyz")[0::2] == (200, "ready\n")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0


def timed_get(url: str) -> tuple[float, int, str]:
    started = time.monotonic()
    code, _, body = get(url)
    return time.monotonic() - started, code, body


def snapshot_reads(dsn: str) -> int:
    """How often the aggregate query ran, counted by PostgreSQL itself: it is the only reader
    of terminal_run_counts while no recount is due."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
            " WHERE schemaname = 'pgtick' AND relname = 'terminal_run_counts'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(120)
def test_metrics_and_health_with_the_database_stopped(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Must show 2: 20 concurrent scrapes cost one aggregate query; with PostgreSQL stopped
    /metrics still answers within 1 s (pgtick_db_collect_success 0), /readyz is 503 and
    /healthz 200; the gauges come back with the database."""
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE outage")
    dsn = make_conninfo(own_server.dsn, dbname="outage")
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Counts fresh for a day: no recount touches terminal_run_counts during this test.
        conn.execute("UPDATE pgtick.terminal_run_counts_refresh SET refreshed_at = now() + '1 day'")
    # Building the table's primary key scanned it once; wait until the migration's backend
    # has reported that, so the count below starts from a settled value.
    baseline = wait_for(lambda: snapshot_reads(dsn), 15, 0.1, "the migration's statistics")
    cluster = Cluster(dsn, tmp_path)
    try:
        daemon, base = start_with_metrics(cluster)
        # The metrics pool's two sessions each ran the aggregate once as they opened (the
        # warm-up, no scrape yet): counted from after those.
        warmed = baseline + 2
        baseline = wait_for(
            lambda: (n := snapshot_reads(dsn)) >= warmed and n, 15, 0.1, "the warm-ups' reads"
        )
        # The first read starts the cache period (on a busy machine it may outlast a scrape's
        # wait; the read still completes and is kept).
        wait_for(
            lambda: sample(scrape(base), "pgtick_db_collect_success") == 1, 10, 0.1, "first read"
        )
        first_read_at = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            scrapes = list(pool.map(lambda _: scrape(base), range(20)))
            scrapes += list(pool.map(lambda _: scrape(base), range(20)))
        assert all(s[("pgtick_db_collect_success", frozenset())] == 1 for s in scrapes)

        # Reads up to here: one per cache period begun (one, unless this busy machine took
        # longer than a period for the 40 scrapes).
        periods = 1 + int((time.monotonic() - first_read_at) // DB_CACHE_SECONDS)
        # A fast stop ends every backend, which flushes its statistics first.
        own_server.stop("fast")
        seen_failure = False

        def scrape_fails_fast() -> bool:
            nonlocal seen_failure
            seconds, code, body = timed_get(base + "/metrics")
            assert code == 200
            assert seconds < 1.0, f"/metrics took {seconds:.2f}s with the database down"
            seen_failure = "pgtick_db_collect_success 0.0" in body
            return seen_failure

        wait_for(scrape_fails_fast, 20, 0.2, "pgtick_db_collect_success 0")
        for _ in range(3):  # every scrape stays fast while the database is gone
            assert scrape_fails_fast()
        samples = scrape(base)
        assert ("pgtick_queue_depth", frozenset({("job_type", "record")})) not in samples
        assert sample(samples, "pgtick_worker_threads") == 8  # process series still there
        assert sample(samples, "pgtick_db_errors_total", operation="metrics") >= 1
        seconds, code, body = timed_get(base + "/readyz")
        assert (code, seconds < 1.0) == (503, True)
        assert body.startswith("database: ") and body.count("\n") == 1
        assert timed_get(base + "/healthz")[1:] == (200, "ok\n")

        own_server.start()
        reads = snapshot_reads(dsn) - baseline
        assert 1 <= reads <= periods, (
            f"a scrape and 2 x 20 concurrent ones over {periods} cache period(s) made {reads} "
            "aggregate queries: one per period"
        )
        wait_for(lambda: get(base + "/readyz")[0] == 200, 30, 0.5, "ready again after the outage")
        assert sample(scrape(base), "pgtick_db_collect_success") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        cluster.stop_all()


def test_a_taken_metrics_port_is_exit_2_naming_the_key(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = cluster.config()
        path.write_text(path.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
        daemon = cluster.start(path, wait=False)
        assert daemon.wait(30) == 2
    assert f"metrics.listen: cannot listen on 127.0.0.1:{port}: address already in use" in (
        daemon.log()
    )
    assert "Traceback" not in daemon.log()


def test_the_metrics_sessions_are_warm_before_the_first_scrape(
    cluster: Cluster, conn: Connection
) -> None:
    """Both server sessions of the metrics pool have run the aggregate once (for no schedule)
    before anyone scrapes: a session's first read took 20-45 ms longer (its catalogs of every
    partition, schedule_health()'s plan), and the pool's two sessions take turns, so two cold
    scrapes of ten were over 100 ms (issue 47). Seen in the server's count of the calls of
    schedule_health(), which only the aggregate calls."""
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(
            sql.Identifier(conn.info.dbname)
        )
    )

    def calls() -> int:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE schemaname = 'pgtick' AND funcname = 'schedule_health'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    daemon, base = start_with_metrics(cluster)
    try:
        # Counts reach the server's statistics when a session goes idle (within 10 s).
        wait_for(lambda: calls() >= 2, 20, what="both sessions warmed up")
        assert calls() == 2  # one each, and nothing scraped
        assert sample(scrape(base), "pgtick_db_collect_success") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        cluster.stop_all()


@pytest.mark.timeout(120)
def test_at_a_steady_pace_the_aggregate_runs_before_the_scrape_not_during_it(
    cluster: Cluster, conn: Connection
) -> None:
    """Issue 47 (a scrape under 100 ms with 10 M runs): after two rounds of scrapes the daemon
    reads the database by itself shortly before the next round is due; that round's scrape
    shows what the read found (a run inserted after the second round) and sends no statement
    of its own. Seen in pg_stat_activity: when the metrics sessions last started one."""

    def metrics_sessions() -> tuple[datetime | None, bool]:
        """(the latest statement start of the metrics pool's sessions, all of them idle)"""
        row = conn.execute(
            "SELECT max(query_start), bool_and(state = 'idle') FROM pg_stat_activity"
            " WHERE application_name = 'pgtick-metrics'"
        ).fetchone()
        assert row is not None
        return row[0], bool(row[1])

    daemon, base = start_with_metrics(cluster)
    try:
        assert sample(scrape(base), "pgtick_db_collect_success") == 1
        time.sleep(DB_CACHE_SECONDS + 1.5)
        scrape(base)
        second, _ = metrics_sessions()
        assert second is not None
        conn.execute("INSERT INTO runs (job_type, run_at) VALUES ('nobody', now())")

        def read_ahead() -> datetime | None:
            started, idle = metrics_sessions()
            return started if started is not None and started > second and idle else None

        ahead = wait_for(read_ahead, DB_CACHE_SECONDS + 10, what="a read before the 3rd round")
        samples = scrape(base)
        assert sample(samples, "pgtick_queue_depth", job_type="nobody") == 1
        assert metrics_sessions()[0] == ahead  # the scrape sent nothing to the server
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        cluster.stop_all()
