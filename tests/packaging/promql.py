"""Metric names out of PromQL expressions (the dashboard's and the alert rules'), by a regular
expression over identifiers: what is left after removing strings, label matchers, durations,
grouping label lists, Grafana variables, functions and keywords is a series name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_FUNCTION_WORDS = """abs absent absent_over_time avg_over_time ceil changes clamp clamp_max
    clamp_min count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp
    floor histogram_quantile holt_winters hour idelta increase irate label_join label_replace
    last_over_time ln log10 log2 max_over_time min_over_time minute month predict_linear
    present_over_time quantile_over_time rate resets round scalar sgn sort sort_desc sqrt
    stddev_over_time stdvar_over_time sum_over_time time timestamp vector year
    sum min max avg group stddev stdvar count count_values bottomk topk quantile
    by without on ignoring group_left group_right and or unless offset bool atan2 inf nan
    label_values"""
FUNCTIONS = frozenset(_FUNCTION_WORDS.split())
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_DURATION = re.compile(r"\b(\d+(ms|s|m|h|d|w|y))+\b")
_NUMBER = re.compile(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", re.IGNORECASE)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,")


def metric_names(expr: str) -> set[str]:
    """The series names an expression reads."""
    text = _VARIABLE.sub(" ", _STRING.sub(" ", expr))
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(r"\1 ", _RANGE.sub(" ", text))
    text = _NUMBER.sub(" ", _DURATION.sub(" ", text))
    return {name for name in _IDENT.findall(text) if name not in FUNCTIONS}


def grafana_query_names(query: str) -> set[str]:
    """A template variable's query: label_values(metric, label) reads metric, not label."""
    names = set(_LABEL_VALUES.findall(query))
    rest = _LABEL_VALUES.sub("(", query)
    return names if names else metric_names(rest)


def dashboard_expressions(path: Path) -> list[str]:
    """Every target expression of every panel, rows' nested panels included."""
    dashboard: dict[str, Any] = json.loads(path.read_text())
    exprs: list[str] = []
    stack: list[dict[str, Any]] = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        exprs.extend(t["expr"] for t in panel.get("targets", []))
    return exprs


def dashboard_variable_queries(path: Path) -> list[str]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out
