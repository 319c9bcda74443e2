"""The Prometheus alert rules: promtool accepts them and their unit tests pass, every rule
carries what an on-call engineer needs, and every runbook link lands on a page of the docs site
that is about that rule."""

from __future__ import annotations

import re
from typing import Any

from .contract import DATABASE_GAUGES
from .docsite import RUNBOOKS_URL, headings, page_of_url, runbook_page_name, runbook_pages
from .tools import GRAFANA, ROOT, alert_rules, load_yaml, run, tool

OPERATIONS = ROOT / "docs" / "operations" / "index.md"

# What the issues ask alerts for, by the name the rules give them.
REQUIRED_ALERTS = {
    "PgtickDaemonAbsent",
    "PgtickTickerStalled",
    "PgtickScheduleOverdue",
    "PgtickScheduleMissed",
    "PgtickQueueLagHigh",
    "PgtickBacklogGrowing",
    "PgtickRunsStuck",
    "PgtickHighFailureRate",
    "PgtickRunsDead",
    "PgtickDbMetricsFailing",
    "PgtickVacuumBlocked",
}
# A database-derived gauge read under max (by ...), possibly through one function on the way.
UNDER_MAX = re.compile(r"\bmax\s*(by\s*\([^)]*\)\s*)?\(\s*(\w+\(\s*)?$")


def test_promtool_check_rules_accepts_the_rules() -> None:
    promtool = tool("promtool", "prometheus")
    code, out = run(promtool, "check", "rules", str(GRAFANA / "alerts.yml"))
    assert code == 0, out
    assert f"SUCCESS: {len(alert_rules())} rules found" in out, out


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    promtool = tool("promtool", "prometheus")
    code, out = run(promtool, "test", "rules", "alerts.test.yml", cwd=GRAFANA)
    assert code == 0, out
    assert "SUCCESS" in out, out


def test_every_required_alert_exists_with_for_severity_annotations_and_runbook() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    assert set(names) >= REQUIRED_ALERTS, REQUIRED_ALERTS - set(names)
    for rule in rules:
        name = rule["alert"]
        assert rule.get("for"), f"{name}: no for:"
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert url == f"{RUNBOOKS_URL}{runbook_page_name(name)}/", (name, url)
        page = page_of_url(url)
        assert page is not None and page.is_file(), f"{name}: {url} has no page in docs/"
        assert headings(page, 1) == [name], f"{page.name} is not about {name}"


def test_every_runbook_page_is_for_an_existing_rule() -> None:
    """No orphans: a page whose rule was renamed or removed goes with it."""
    linked = {page_of_url(rule["annotations"]["runbook_url"]) for rule in alert_rules()}
    orphans = [page.name for page in runbook_pages() if page not in linked]
    assert not orphans, orphans


def test_database_derived_gauges_in_rules_are_reduced_with_max() -> None:
    """Every daemon reports the same database-derived values: without max, a rule fires once
    per daemon; under sum, it multiplies them."""
    for rule in alert_rules():
        for gauge in DATABASE_GAUGES:
            for match in re.finditer(rf"\b{gauge}\b", rule["expr"]):
                assert UNDER_MAX.search(rule["expr"][: match.start()]), (rule["alert"], gauge)


def test_operations_page_links_every_alert_to_its_runbook_page() -> None:
    """The operations page keeps a short table, alert -> one line -> its runbook page."""
    text = OPERATIONS.read_text()
    section = text[text.index("\n## Alerts and runbooks") :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    rows = dict(
        re.findall(r"^\| `(Pgtick\w+)` \|.*\]\((\.\./runbooks/[a-z-]+\.md)\)", section, re.M)
    )
    assert rows == {
        rule["alert"]: f"../runbooks/{runbook_page_name(rule['alert'])}.md"
        for rule in alert_rules()
    }


def _covered(series: str, expected: list[dict[str, Any]]) -> bool:
    """Whether an input series carries every label (but severity) of some expected alert."""
    labels = series[series.find("{") + 1 : series.rfind("}")] if "{" in series else ""
    pairs = {
        p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip().strip('"')
        for p in labels.split(",")
        if "=" in p
    }
    for alert in expected:
        wanted = {k: str(v) for k, v in alert["exp_labels"].items() if k != "severity"}
        if all(pairs.get(k) == v for k, v in wanted.items()):
            return True
    return False


def test_every_alert_has_a_history_that_fires_it_and_one_that_does_not() -> None:
    """promtool compares the full list of alerts at each eval time, so a quiet history is either
    a test expecting no alert, or an input series next to a firing one that no expected alert
    matches."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for group in load_yaml(GRAFANA / "alerts.test.yml")["tests"]:
        series = [s["series"] for s in group["input_series"]]
        for case in group["alert_rule_test"]:
            expected = case["exp_alerts"]
            if expected:
                fires.add(case["alertname"])
                if any(not _covered(s, expected) for s in series):
                    quiet.add(case["alertname"])
            else:
                quiet.add(case["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert fires == names, names ^ fires
    assert quiet == names, names ^ quiet
