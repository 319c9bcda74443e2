"""The Grafana dashboard's model: what makes it importable on any Grafana and readable."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from .contract import DATABASE_GAUGES, NOT_EXPORTED_YET, documented, readme_metrics
from .docsite import RUNBOOKS, SITE_URL, page_of_url
from .promql import (
    dashboard_expressions,
    dashboard_variable_queries,
    grafana_query_names,
    metric_names,
)
from .tools import GRAFANA, alert_rules, run, tool

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


def test_dashboard_links_to_the_runbooks_of_the_docs_site() -> None:
    links = json.loads(DASHBOARD.read_text())["links"]
    assert [link["url"] for link in links if link["title"] == "Runbooks"] == [
        f"{SITE_URL}runbooks/"
    ]
    assert page_of_url(links[0]["url"]) == RUNBOOKS / "index.md"
    for link in links:
        page = page_of_url(link["url"])
        assert page is not None and page.is_file(), link


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


def test_database_health_and_flow_control_rows_show_what_their_alerts_read() -> None:
    """PgtickVacuumBlocked's horizon and dead tuples, PgtickFlowLimitSaturated's held-back runs,
    each under a row of its own."""
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    rows: dict[str, list[str]] = {}
    current = ""
    for panel in model["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            continue
        rows.setdefault(current, []).extend(t["expr"] for t in panel["targets"])
    health = "\n".join(rows["Database health"])
    assert "max(pgtick_db_horizon_age_seconds)" in health
    assert "max by (table) (pgtick_table_dead_tuples)" in health
    flow = "\n".join(rows["Flow control"])
    assert 'max by (job_type, reason) (pgtick_runs_waiting{job_type=~"$job_type"})' in flow


def test_database_derived_gauges_are_never_summed_across_daemons() -> None:
    """Every daemon reports the same database-derived values: sum would multiply them."""
    exprs = dashboard_expressions(DASHBOARD) + [rule["expr"] for rule in alert_rules()]
    for expr in exprs:
        for gauge in DATABASE_GAUGES:
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


def test_every_series_queried_is_documented_or_required() -> None:
    """Without a database: each name the dashboard and the rules read is in the README's
    metrics table (or a client collector's), or a required series still being added to the
    daemon. test_live_scrape checks the same names against a live exposition."""
    patterns = readme_metrics()
    assert {"pgtick_runs", "pgtick_run_attempts_total", "pgtick_db_pool_*"} <= patterns
    names = {name for expr in dashboard_expressions(DASHBOARD) for name in metric_names(expr)}
    names |= {n for q in dashboard_variable_queries(DASHBOARD) for n in grafana_query_names(q)}
    names |= {name for rule in alert_rules() for name in metric_names(rule["expr"])}
    unknown = {name for name in names if not documented(name, patterns | NOT_EXPORTED_YET)}
    assert not unknown, sorted(unknown)


def test_promtool_parses_every_panel_expression(tmp_path: Path) -> None:
    """Each target, with Grafana's variables filled in, as a recording rule promtool checks."""
    exprs = dashboard_expressions(DASHBOARD)
    filled = [
        expr.replace("$__rate_interval", "1m").replace("$job_type", ".*").replace("$instance", ".*")
        for expr in exprs
    ]
    assert not [expr for expr in filled if "$" in expr]
    rules = [{"record": f"pgtick:panel_{i}", "expr": expr} for i, expr in enumerate(filled)]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    code, out = run(tool("promtool", "prometheus"), "check", "rules", str(path))
    assert code == 0, out
    assert f"SUCCESS: {len(rules)} rules found" in out, out
