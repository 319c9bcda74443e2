"""`after` between schedules (issue 48, docs/composition.md): "the same period" is the other
schedule's latest occurrence at or before this one, each computed in its own zone, compared
as UTC instants, across the DST changes of Europe/Amsterdam."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta

import pytest

from pgtick.config import Config, config_from_mapping
from pgtick.errors import ConfigError
from pgtick.scheduling.cron import Cron
from pgtick.scheduling.period import wait, waited_occurrence

AMS = "Europe/Amsterdam"


def load_text(text: str) -> Config:
    return config_from_mapping(tomllib.loads(text))


def _local(cron: Cron, at: datetime) -> str:
    return at.astimezone(cron.zone).strftime("%Y-%m-%d %H:%M %Z")


@pytest.mark.parametrize(
    ("day", "label"),
    [
        ("2026-03-28", "before spring"),
        ("2026-03-29", "spring forward"),
        ("2026-10-25", "fall back"),
        ("2026-10-26", "after fall"),
    ],
)
def test_a_report_waits_for_the_same_nights_billing_across_dst(day: str, label: str) -> None:
    billing = Cron.parse("30 2 * * *", AMS, "billing")  # 02:30 does not exist on 03-29
    report = Cron.parse("0 6 * * *", AMS, "report")
    start = datetime.fromisoformat(f"{day}T00:00:00+00:00") - timedelta(hours=3)
    occurrence = report.next_after(start)
    upstream = waited_occurrence(billing, occurrence)
    assert upstream is not None
    assert _local(report, occurrence)[:10] == _local(billing, upstream)[:10] == day, label
    if day == "2026-03-29":
        assert _local(billing, upstream) == "2026-03-29 03:00 CEST"  # the end of the gap
    if day == "2026-10-25":
        assert _local(billing, upstream) == "2026-10-25 02:30 CEST"  # the first 02:30 only


def test_different_crons_and_zones() -> None:
    nightly = Cron.parse("0 2 * * *", AMS, "billing")
    hourly_ny = Cron.parse("15 * * * *", "America/New_York", "report")
    t = hourly_ny.next_after(datetime(2026, 3, 29, 10, 0, tzinfo=UTC))  # 06:15 New York
    # Every hourly occurrence waits for the last Amsterdam night's billing: that night 02:00
    # did not exist, it ran at 03:00 CEST (01:00 UTC).
    assert waited_occurrence(nightly, t) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    stored = wait("billing", nightly, t, 3600, "run")
    assert stored == {
        "schedule": "billing",
        "occurrence": "2026-03-29T01:00:00+00:00",
        "deadline": (t + timedelta(hours=1)).isoformat(),
        "missed": "run",
    }


def test_after_config_keys_and_refusals() -> None:
    cfg = load_text(
        '[job_types.x]\ncommand = ["true"]\n'
        '[schedules.billing]\njob_type = "x"\ncron = "0 2 * * *"\n'
        '[schedules.report]\njob_type = "x"\ncron = "0 6 * * *"\nafter = "billing"\n'
        'after_deadline = "3h"\nafter_missed = "run"\n'
    )
    assert cfg.schedules["report"].after_on == {
        "schedule": "billing",
        "deadline_seconds": 10800.0,
        "missed": "run",
    }
    circle = (
        '[job_types.x]\ncommand = ["true"]\n'
        '[schedules.a]\njob_type = "x"\ncron = "0 2 * * *"\nafter = "b"\n'
        '[schedules.b]\njob_type = "x"\ncron = "0 6 * * *"\nafter = "a"\n'
    )
    with pytest.raises(ConfigError, match=r"schedules wait in a circle \(a -> b -> a\)"):
        load_text(circle)
    with pytest.raises(ConfigError, match="after_missed: must be one of skip, run"):
        load_text(
            '[job_types.x]\ncommand = ["true"]\n[schedules.a]\njob_type = "x"\n'
            'cron = "0 2 * * *"\nafter = "b"\nafter_missed = "maybe"\n'
        )
