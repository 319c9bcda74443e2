"""The Prometheus alert rules: promtool accepts them and their unit tests pass, every rule
carries what an on-call engineer needs, and every runbook link lands on a README section."""

from __future__ import annotations

from typing import Any

from .tools import (
    GRAFANA,
    RUNBOOK_URL_PREFIX,
    alert_rules,
    load_yaml,
    readme_anchors,
    run,
    tool,
)

# What the issue asks alerts for, by the name the rules give them.
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
}


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
    anchors = readme_anchors()
    for rule in rules:
        name = rule["alert"]
        assert rule.get("for"), f"{name}: no for:"
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert url == f"{RUNBOOK_URL_PREFIX}alert-{name.lower()}", (name, url)
        assert url.removeprefix(RUNBOOK_URL_PREFIX) in anchors, f"{name}: no README heading"


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
