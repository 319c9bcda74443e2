"""What the product contract says about the series and columns that the dashboard, the alert
rules and the runbooks read, ahead of a daemon that may not provide all of them yet."""

from __future__ import annotations

import fnmatch
import re

from .tools import ROOT

METRICS_PAGE = ROOT / "docs" / "metrics.md"

# Read from the database by one aggregate query: every daemon reports the same value, so
# dashboards and rules reduce them across daemons with max, never sum.
DATABASE_GAUGES = (
    "pgtick_runs",
    "pgtick_queue_depth",
    "pgtick_queue_oldest_due_seconds",
    "pgtick_runs_stuck",
    "pgtick_schedule_last_success_timestamp_seconds",
    "pgtick_schedule_next_run_timestamp_seconds",
    "pgtick_schedules_overdue",
    "pgtick_runs_waiting",
    "pgtick_db_horizon_age_seconds",
    "pgtick_table_dead_tuples",
    "pgtick_batches_open",
    "pgtick_runs_waiting_dependency",
)

# Required series that the daemon does not export yet, used by an alert or a panel ahead of
# the work that adds them (none now). A name leaves this set as soon as the daemon exports it
# (test_live_scrape fails until it does).
NOT_EXPORTED_YET: frozenset[str] = frozenset()

# Required columns that the schema does not have yet, as table.column; the runbooks' SQL uses
# them. Same rule: out as soon as a migration adds it (test_runbook_sql fails until it does).
NOT_MIGRATED_YET: frozenset[str] = frozenset()

# Series that come from prometheus_client's own collectors (the Metrics and health page names
# them under its table) and from Prometheus itself.
CLIENT_SERIES = ("process_*", "python_info")
PROMETHEUS_SERIES = ("up",)
SAMPLE_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def readme_metrics() -> set[str]:
    """The series names (or name patterns, such as pgtick_db_pool_*) of the table in the docs'
    Metrics and health page (the README's section before the docs site took it over)."""
    section = METRICS_PAGE.read_text()
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Za-z_:*][A-Za-z0-9_:*]*)`", first_cell))
    return names


def documented(name: str, patterns: set[str]) -> bool:
    """Whether a series name is one of the patterns, a counter's or histogram's sample of one,
    a client collector's series or Prometheus's own."""
    candidates = {*patterns, *CLIENT_SERIES, *PROMETHEUS_SERIES}
    return any(
        fnmatch.fnmatchcase(name, pattern + suffix)
        for pattern in candidates
        for suffix in SAMPLE_SUFFIXES
    )
