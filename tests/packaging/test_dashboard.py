"""The Grafana dashboard's model: what makes it importable on any Grafana and readable."""

from __future__ import annotations

import json
import re
from typing import Any

from .promql import dashboard_expressions, grafana_query_names, metric_names
from .tools import GRAFANA, RUNBOOK_URL_PREFIX, load_yaml, readme_anchors

DASHBOARD = GRAFANA / "dashboard.json"
SUMMED = r"\bsum\s*(by\s*\([^)]*\)\s*)?\(\s*{gauge}\b"
RANGE_FUNCTIONS = re.compile(
    r"\b(rate|irate|increase|delta|deriv)\(([^()]|\([^()]*\))*?\[([^\]]*)\]"
)


def panels() -> list[dict[str, Any]]:
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    out: list[dict[str, Any]] = []
    for panel in model["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_dashboard_has_a_fixed_uid_and_the_datasource_and_job_type_variables() -> None:
    model = json.loads(DASHBOARD.read_text())
    assert model["uid"] == "pgtick-overview"
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job_type"]["type"] == "query"
    assert variables["job_type"]["includeAll"] and variables["job_type"]["multi"]


def test_dashboard_links_land_on_readme_sections() -> None:
    links = json.loads(DASHBOARD.read_text())["links"]
    assert links
    for link in links:
        assert link["url"].startswith(RUNBOOK_URL_PREFIX), link
        assert link["url"].removeprefix(RUNBOOK_URL_PREFIX) in readme_anchors(), link


def test_every_panel_queries_the_variable_datasource_and_has_a_unit() -> None:
    graphs = [p for p in panels() if p["type"] != "row"]
    assert len(graphs) >= 20
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_range_function_uses_the_rate_interval() -> None:
    ranges = [
        m.group(3)
        for expr in dashboard_expressions(DASHBOARD)
        for m in RANGE_FUNCTIONS.finditer(expr)
    ]
    assert len(ranges) >= 8
    assert set(ranges) == {"$__rate_interval"}


def test_dashboard_shows_what_the_issue_lists() -> None:
    """Queue depth and lag, throughput by outcome, failures, dead, stuck, duration and start
    delay quantiles, schedules, busy threads, database errors."""
    exprs = "\n".join(dashboard_expressions(DASHBOARD))
    for needle in (
        "pgtick_queue_depth",
        "pgtick_queue_oldest_due_seconds",
        "sum by (outcome) (rate(pgtick_run_attempts_total",
        'outcome="failed"',
        'status="dead"',
        "pgtick_runs_stuck",
        "histogram_quantile(0.99, sum by (job_type, le) (rate(pgtick_run_duration_seconds_bucket",
        "histogram_quantile(0.5, sum by (job_type, le) (rate(pgtick_run_start_delay_seconds_bucket",
        "pgtick_schedule_last_success_timestamp_seconds",
        "pgtick_schedules_overdue",
        "pgtick_worker_busy_threads",
        "pgtick_db_errors_total",
    ):
        assert needle in exprs, needle


def test_database_derived_gauges_are_never_summed_across_daemons() -> None:
    """Every daemon reports the same database-derived values: sum would multiply them."""
    gauges = (
        "pgtick_runs",
        "pgtick_queue_depth",
        "pgtick_queue_oldest_due_seconds",
        "pgtick_runs_stuck",
        "pgtick_schedule_last_success_timestamp_seconds",
        "pgtick_schedule_next_run_timestamp_seconds",
        "pgtick_schedules_overdue",
    )
    rules = load_yaml(GRAFANA / "alerts.yml")["groups"][0]["rules"]
    exprs = dashboard_expressions(DASHBOARD) + [rule["expr"] for rule in rules]
    for expr in exprs:
        for gauge in gauges:
            # the gauge directly under a sum, not first reduced by max
            assert not re.search(SUMMED.format(gauge=gauge), expr), expr


def test_the_name_extractor_reads_names_not_labels_functions_or_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (job_type, le) (rate(x_bucket{job_type=~"$job_type",'
        ' outcome="failed"}[$__rate_interval]))) / on (instance) group_left ignoring(le)'
        " max without (status) (y offset 1h) and time() - z > 3e2"
    )
    assert metric_names(expr) == {"x_bucket", "y", "z"}
    assert re.search(SUMMED.format(gauge="y"), "sum by (a) (y)")
    assert not re.search(SUMMED.format(gauge="y"), "sum(max by (a) (y))")
    assert grafana_query_names("label_values(pgtick_queue_depth, job_type)") == {
        "pgtick_queue_depth"
    }
