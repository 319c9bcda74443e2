"""Issue 22, finding 5: whoever enqueues cannot multiply the series. Thousands of distinct job
types in the runs table give the database-derived series of a live daemon the configured
types, the `metrics.other_job_types` busiest others and `job_type="other"`, summed, and the
scrape stays fast; `worker.refuse_undeclared_job_types` makes `pgtick enqueue` refuse them."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.dbhelp import Connection

from .cli import pgtick
from .conftest import Cluster, wait_for
from .test_metrics import sample, scrape

DISTINCT_TYPES = 5000
OTHERS = 3
SERIES_PER_TYPE = 7 + 3  # pgtick_runs per status, queue depth, oldest due, stuck
DECLARED = """
[job_types.declared]
command = ["/bin/true"]
"""


@pytest.mark.timeout(120)
def test_thousands_of_job_types_make_a_bounded_fast_scrape(
    conn: Connection, cluster: Cluster
) -> None:
    # 5 000 distinct types (an id in the type name), the busiest three with more runs.
    conn.execute(
        "SELECT pgtick.enqueue('app_bug_' || i, '{}', now() + interval '1 hour', NULL, NULL)"
        " FROM generate_series(1, %s) i",
        [DISTINCT_TYPES],
    )
    for busy, extra in (("busy_a", 30), ("busy_b", 20), ("busy_c", 10)):
        conn.execute(
            "SELECT pgtick.enqueue(%s, '{}', NULL, NULL, NULL) FROM generate_series(1, %s)",
            [busy, extra],
        )
    path = cluster.config(DECLARED)
    metrics = f'listen = "127.0.0.1:0"\nother_job_types = {OTHERS}'
    path.write_text(path.read_text().replace('listen = ""', metrics, 1))
    daemon = cluster.start(path)
    event = next(e for e in daemon.events() if e.get("event") == "http_listening")
    base = f"http://127.0.0.1:{event['port']}"
    wait_for(
        lambda: ("pgtick_queue_depth", frozenset({("job_type", "busy_a")})) in scrape(base),
        20,
        what="database-derived series",
    )
    started = time.perf_counter()
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        body = response.read().decode()
    seconds = time.perf_counter() - started
    families = {f.name: f for f in text_string_to_metric_families(body)}
    labelled = {
        s.labels["job_type"]
        for name in (
            "pgtick_runs",
            "pgtick_queue_depth",
            "pgtick_queue_oldest_due_seconds",
            "pgtick_runs_stuck",
        )
        for s in families[name].samples
    }
    # Configured (declared and the test jobs' record/... types), the 3 busiest, and other.
    assert {"busy_a", "busy_b", "busy_c", "other", "declared"} <= labelled
    assert not any(t.startswith("app_bug_") for t in labelled), sorted(labelled)[:10]
    db_series = sum(
        len(families[name].samples)
        for name in (
            "pgtick_runs",
            "pgtick_queue_depth",
            "pgtick_queue_oldest_due_seconds",
            "pgtick_runs_stuck",
        )
    )
    assert db_series == len(labelled) * SERIES_PER_TYPE
    # Exactly: the configured types (those the daemon pre-initialises its own counters for),
    # the 3 busiest others, and "other".
    configured = {s.labels["job_type"] for s in families["pgtick_run_attempts"].samples}
    assert "declared" in configured
    assert labelled == configured | {"busy_a", "busy_b", "busy_c", "other"}
    samples = scrape(base)
    assert sample(samples, "pgtick_runs", job_type="other", status="queued") == DISTINCT_TYPES
    assert sample(samples, "pgtick_runs", job_type="busy_a", status="queued") == 30
    assert sample(samples, "pgtick_queue_depth", job_type="busy_c") == 10
    assert sample(samples, "pgtick_queue_depth", job_type="other") == 0  # all in an hour
    # A direct connection is not mistaken for a pooler (LISTEN in use, nothing said).
    assert "notifications_unavailable" not in daemon.log()
    # Unbounded, the 5 000 types alone would be 50 000 series (several MB per scrape).
    assert sum(len(f.samples) for f in families.values()) < 5000
    assert len(body) < 1_000_000
    assert seconds < 1.0, f"a scrape took {seconds:.2f}s"


def test_enqueue_refuses_an_undeclared_job_type_when_configured(
    conn: Connection, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        "[worker]\nrefuse_undeclared_job_types = true\n\n"
        '[job_types.noop]\ncommand = ["/bin/true"]\n'
    )
    ok = pgtick(dsn, "enqueue", "noop", "--config", str(config))
    assert (ok.code, ok.err) == (0, [])
    refused = pgtick(dsn, "enqueue", "user_1234", "--config", str(config))
    assert refused.code == 2
    assert refused.err == [
        f"pgtick: job type 'user_1234' is not declared in {config}, and "
        "worker.refuse_undeclared_job_types is set: declare [job_types.NAME] or a @pgtick.job "
        "in worker.imports"
    ]
    row = conn.execute("SELECT count(*) FROM runs WHERE job_type = 'user_1234'").fetchone()
    assert row == (0,)
