"""Issue 19, Must show 2: another session holds a REPEATABLE READ snapshot; `pgtick status`
names it (pid, application name) and exits 5 past its threshold; a daemon's /metrics shows
its age, and the PgtickVacuumBlocked rule, fed the scraped series, fires; the same for the
least-privilege role with `pgtick grants --monitor`, and without it a clear note (the holder
is named, but its age is hidden from the role)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import yaml

from tests.dbhelp import Connection

from .cli import pgtick
from .conftest import Cluster, wait_for
from .roles import login_role
from .test_metrics import METRICS_LISTEN, Samples, sample, scrape, start_with_metrics

REPO = Path(__file__).resolve().parents[2]
APPLICATION = "nightly-report"
HELD_SECONDS = 3.0


@contextmanager
def held_snapshot(dsn: str) -> Iterator[int]:
    """A session (as the DSN's role) in a REPEATABLE READ transaction that has taken its
    snapshot and sits idle in transaction; yields its pid."""
    with psycopg.connect(dsn, application_name=APPLICATION) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgtick.runs")
        yield holder.info.backend_pid
        holder.rollback()


def horizon_age(base: str) -> float:
    return sample(scrape(base), "pgtick_db_horizon_age_seconds")


def humanize_duration(seconds: int) -> str:
    """Prometheus's humanizeDuration for whole seconds of a minute or more."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m {secs}s"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s"


def assert_alert_fires_on(samples: Samples, tmp_path: Path) -> None:
    """A promtool unit test of the real rule file whose input series start at the scraped
    values: the snapshot stays held (its age grows a minute per minute) while runs' dead
    tuples grow; the rule must fire at 25 minutes with its annotations, and not at 10."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus (.ci/run does)"
    age = int(sample(samples, "pgtick_db_horizon_age_seconds"))
    assert age >= HELD_SECONDS
    dead = {
        dict(labels)["table"]: int(value)
        for (name, labels), value in samples.items()
        if name == "pgtick_table_dead_tuples"
    }
    assert "runs" in dead
    series = [
        {
            "series": 'pgtick_db_horizon_age_seconds{job="pgtick", instance="live:9464"}',
            "values": f"{age}+60x40",
        }
    ] + [
        {
            "series": f'pgtick_table_dead_tuples{{job="pgtick", instance="live:9464", '
            f'table="{table}"}}',
            "values": f"{n}+{400 if table == 'runs' else 0}x40",
        }
        for table, n in sorted(dead.items())
    ]
    rules = yaml.safe_load((REPO / "grafana" / "alerts.yml").read_text())
    rule = next(
        r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "PgtickVacuumBlocked"
    )
    value = humanize_duration(age + 25 * 60)
    annotations = {
        key: text.replace("{{ $value | humanizeDuration }}", value)
        for key, text in rule["annotations"].items()
    }
    test = {
        "rule_files": [str(REPO / "grafana" / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "PgtickVacuumBlocked", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "PgtickVacuumBlocked",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning"}, "exp_annotations": annotations}
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "live.test.yml"
    path.write_text(yaml.safe_dump(test, width=1000))
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_status_and_metrics_name_the_session_holding_the_horizon(
    dsn: str, cluster: Cluster, tmp_path: Path
) -> None:
    _daemon, base = start_with_metrics(cluster)
    ok = pgtick(dsn, "status", "--horizon-threshold", "2s")
    assert ok.code == 0, ok.text + ok.err
    with held_snapshot(dsn) as pid:
        wait_for(lambda: horizon_age(base) >= HELD_SECONDS, 30, what="the horizon age scraped")
        samples = scrape(base)
        assert sample(samples, "pgtick_db_horizon_sessions_visible") == 1
        assert sample(samples, "pgtick_db_horizon_age_transactions") >= 0

        held = pgtick(dsn, "status", "--horizon-threshold", "2s")
        assert held.code == 5, held.text + held.err
        problem = next(line for line in held.out if line.startswith("  ! "))
        assert f"session pid {pid}" in problem and f"application '{APPLICATION}'" in problem
        assert "idle in transaction" in problem and "holds the MVCC horizon for" in problem

        doc = json.loads(pgtick(dsn, "status", "--json", "--horizon-threshold", "2s").text)
        holder = doc["horizon"]["holder"]
        assert (holder["kind"], holder["pid"], holder["application_name"]) == (
            "session",
            pid,
            APPLICATION,
        )
        assert holder["age_seconds"] >= HELD_SECONDS and not doc["healthy"]
        # Under the default threshold (15 minutes, the alert's) it is shown, not a problem.
        calm = pgtick(dsn, "status")
        assert calm.code == 0, calm.text
        assert f"MVCC horizon: held by session pid {pid}" in calm.text

        assert_alert_fires_on(samples, tmp_path)
    after = pgtick(dsn, "status", "--horizon-threshold", "2s")
    assert after.code == 0, after.text


@pytest.mark.timeout(120)
def test_least_privilege_role_sees_the_holder_only_with_the_monitor_grant(
    pg_admin_dsn: str, dsn: str, conn: Connection, cluster: Cluster
) -> None:
    with login_role(pg_admin_dsn, dsn) as role:
        grants = pgtick(dsn, "grants", role.name)
        assert grants.code == 0 and "pg_monitor" not in grants.text
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(grants.text.encode())
        path = cluster.config()
        path.write_text(path.read_text().replace('listen = ""', METRICS_LISTEN, 1))
        daemon = cluster.start(path, env={"PGTICK_DSN": role.dsn})
        event = next(e for e in daemon.events() if e.get("event") == "http_listening")
        base = f"http://127.0.0.1:{event['port']}"
        # Nothing of another role holds the horizon: no note (issue 44, item 9: it was
        # printed on every call of a role without pg_monitor).
        quiet = pgtick(role.dsn, "status")
        assert "note:" not in quiet.text + "\n".join(quiet.err), quiet.text
        with held_snapshot(dsn) as pid:  # a session of another role (the superuser)
            time.sleep(HELD_SECONDS)
            # Without pg_monitor the holder is named (pid, user, application: visible to
            # every role) but its age, state and client are hidden: shown, not judged.
            blind = pgtick(role.dsn, "status", "--horizon-threshold", "1s")
            assert blind.code == 0, blind.text + blind.err
            assert (
                f"MVCC horizon: held by session pid {pid} (user postgres, application "
                f"'{APPLICATION}'), age unknown" in blind.text
            )
            assert (
                f"note: role '{role.name}' cannot see the age, state and client of other "
                "roles' sessions (no pg_monitor)" in blind.text
            )
            assert "`pgtick grants ROLE --monitor` adds the grant" in blind.text
            wait_for(
                lambda: sample(scrape(base), "pgtick_db_horizon_sessions_visible") == 0,
                15,
                what="the metrics say other sessions are hidden",
            )

            monitor = pgtick(dsn, "grants", role.name, "--monitor")
            assert monitor.code == 0 and monitor.out[-1] == f'GRANT pg_monitor TO "{role.name}";'
            conn.execute(monitor.text.encode())  # as a superuser

            seen = pgtick(role.dsn, "status", "--horizon-threshold", "1s")
            assert seen.code == 5, seen.text + seen.err
            assert f"session pid {pid}" in seen.text and APPLICATION in seen.text
            assert "note:" not in seen.text
            wait_for(
                lambda: horizon_age(base) >= HELD_SECONDS,
                30,
                what="the role's daemon scrapes the holder's age",
            )
            assert sample(scrape(base), "pgtick_db_horizon_sessions_visible") == 1
