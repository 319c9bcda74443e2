"""A live `pgtick run`'s exposition: promtool accepts it, and it exports every series that the
dashboard and the alert rules query (so no panel or alert reads a name that does not exist)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..acceptance.conftest import Cluster, wait_for
from .contract import NOT_EXPORTED_YET
from .promql import (
    dashboard_expressions,
    dashboard_variable_queries,
    grafana_query_names,
    metric_names,
)
from .tools import GRAFANA, ROOT, alert_rules, run, tool

REFERENCE_METRICS = ROOT / "docs" / "reference" / "metrics.md"

# A job type of each kind and a schedule, so that every labelled series has a sample.
CONFIG = """
[job_types.cleanup]
command = ["true"]

[schedules.nightly]
job_type = "record"
cron = "0 3 * * *"
"""
# Series that Prometheus itself adds to every target, not the daemon.
PROMETHEUS_SERIES = {"up"}


@pytest.fixture
def exposition(dsn: str, tmp_path: Path) -> Iterator[str]:
    """The text of /metrics once the database-derived gauges are in it."""
    cluster = Cluster(dsn, tmp_path)
    try:
        path = cluster.config(CONFIG)
        path.write_text(path.read_text().replace('listen = ""', 'listen = "127.0.0.1:0"', 1))
        daemon = cluster.start(path)
        event = next(e for e in daemon.events() if e.get("event") == "http_listening")
        url = f"http://127.0.0.1:{event['port']}/metrics"

        def scrape() -> str | None:
            with urllib.request.urlopen(url, timeout=5) as response:
                body: str = response.read().decode()
            return body if "pgtick_db_collect_success 1.0" in body else None

        yield wait_for(scrape, timeout=20, interval=0.2, what="a scrape with database gauges")
    finally:
        cluster.stop_all()


SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def exported(text: str) -> set[str]:
    """Every series name an exposition offers: each sample's, and the names a declared family
    will have once it has samples (a labelled counter such as pgtick_db_errors has none until
    its first increment)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES.get(family.type, ("",)))
    return names


@pytest.mark.timeout(60)
def test_promtool_check_metrics_accepts_a_live_exposition(exposition: str) -> None:
    promtool = tool("promtool", "prometheus")
    code, out = run(promtool, "check", "metrics", stdin=exposition)
    assert (code, out) == (0, "")


@pytest.mark.timeout(60)
def test_every_series_the_dashboard_and_alerts_query_is_exported(exposition: str) -> None:
    names = exported(exposition)
    assert "pgtick_run_duration_seconds_bucket" in names
    wanted: dict[str, set[str]] = {}
    for expr in dashboard_expressions(GRAFANA / "dashboard.json"):
        for name in metric_names(expr):
            wanted.setdefault(name, set()).add(f"dashboard: {expr}")
    for query in dashboard_variable_queries(GRAFANA / "dashboard.json"):
        for name in grafana_query_names(query):
            wanted.setdefault(name, set()).add(f"dashboard variable: {query}")
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            wanted.setdefault(name, set()).add(f"alert {rule['alert']}")
    assert len(wanted) >= 20, sorted(wanted)
    missing = {name: where for name, where in wanted.items() if name not in names}
    assert set(missing) <= PROMETHEUS_SERIES | NOT_EXPORTED_YET, missing
    arrived = NOT_EXPORTED_YET & names
    assert not arrived, f"{arrived} are exported now: remove them from NOT_EXPORTED_YET"


@pytest.mark.timeout(60)
def test_the_metrics_reference_lists_every_pgtick_family_a_live_daemon_exports(
    exposition: str,
) -> None:
    """The generated reference is rendered from the collectors without a daemon; this checks
    it against a real one, so a family registered elsewhere cannot go unlisted."""
    listed = set(re.findall(r"^\| `(pgtick_\w+)`", REFERENCE_METRICS.read_text(), re.MULTILINE))
    live = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(exposition)
        if family.name.startswith("pgtick_")
        # The Prometheus text format shows a counter's or histogram's creation time as a
        # family of its own (<name>_created); it belongs to the family listed.
        and not family.name.endswith("_created")
    }
    assert len(live) >= 20, sorted(live)
    assert live <= listed, sorted(live - listed)
