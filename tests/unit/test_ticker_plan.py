"""The ticker's pure planning: windows, catch-up, overlap timing, jitter, cursor."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from pgtick.core.ticker import plan, refusal
from pgtick.storage.store import ScheduleRow


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def row(
    cron: str,
    cursor: str | None,
    now: str,
    *,
    overlap: str = "allow",
    catchup: str = "latest",
    limit: int = 100,
    jitter: float = 0.0,
    tz: str = "UTC",
) -> ScheduleRow:
    return ScheduleRow(
        id=1, name="s", job_type="j", payload={}, cron=cron, timezone=tz, max_attempts=None,
        catchup=catchup, catchup_limit=limit, overlap=overlap, jitter_seconds=jitter,
        materialized_until=t(cursor) if cursor else None, db_now=t(now),
    )  # fmt: skip


def times(r: ScheduleRow, lookahead: float = 60, tick: float = 60) -> list[str]:
    p = plan(r, lookahead_seconds=lookahead, tick_seconds=tick)
    return [o.scheduled_for.strftime("%H:%M") for o in p.occurrences]


def test_allow_materializes_lookahead_ahead() -> None:
    r = row("* * * * *", "2026-11-22T10:00:00", "2026-11-22T10:00:30")
    p = plan(r, lookahead_seconds=60, tick_seconds=60)
    assert [o.scheduled_for for o in p.occurrences] == [t("2026-11-22T10:01:00")]
    assert p.until == t("2026-11-22T10:01:30")
    assert p.next_wake == t("2026-11-22T10:01:00")  # 10:02 minus the lookahead


def test_skip_materializes_only_what_is_due_and_wakes_at_the_next() -> None:
    r = row("* * * * *", "2026-11-22T10:00:00", "2026-11-22T10:01:00.2", overlap="skip")
    p = plan(r, lookahead_seconds=60, tick_seconds=60)
    assert [o.scheduled_for for o in p.occurrences] == [t("2026-11-22T10:01:00")]
    assert p.until == t("2026-11-22T10:01:00.2")
    assert p.next_wake == t("2026-11-22T10:02:00")


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [("latest", ["11:30"]), ("all", ["09:30", "10:30", "11:30"]), ("none", [])],
)
def test_downtime_of_three_hours(catchup: str, expected: list[str]) -> None:
    r = row("30 * * * *", "2026-11-22T09:00:00", "2026-11-22T12:00:00", catchup=catchup)
    assert times(r) == expected


def test_catchup_all_keeps_the_most_recent_limit() -> None:
    r = row("30 * * * *", "2026-11-22T01:00:00", "2026-11-22T12:00:00", catchup="all", limit=2)
    p = plan(r, lookahead_seconds=60, tick_seconds=60)
    assert [o.scheduled_for.strftime("%H:%M") for o in p.occurrences] == ["10:30", "11:30"]
    assert p.missed == 3  # "more than the limit" is all the ticker needs to warn


def test_latest_prefers_an_occurrence_that_is_on_time() -> None:
    r = row("30 * * * *", "2026-11-22T09:00:00", "2026-11-22T12:30:30")
    assert times(r) == ["12:30"]


def test_none_still_runs_an_occurrence_that_is_merely_seconds_late() -> None:
    # A deploy restarts the daemon 30 s after 12:30: that is not "missed".
    r = row("30 * * * *", "2026-11-22T12:29:00", "2026-11-22T12:30:30", catchup="none")
    assert times(r) == ["12:30"]


def test_new_schedule_starts_from_now() -> None:
    r = row("30 * * * *", None, "2026-11-22T12:30:30", catchup="all")
    assert times(r) == []


def test_cursor_never_moves_back() -> None:
    r = row("0 0 * * *", "2026-11-23T00:00:00", "2026-11-22T12:00:00")
    assert plan(r, lookahead_seconds=60, tick_seconds=60).until == t("2026-11-23T00:00:00")


def test_skip_with_jitter_waits_for_the_jittered_time() -> None:
    r = row("0 * * * *", "2026-11-22T11:59:00", "2026-11-22T12:00:00.5", overlap="skip",
            jitter=600)  # fmt: skip
    p = plan(r, lookahead_seconds=60, tick_seconds=60)
    assert p.occurrences == []  # 12:00 + offset is not due yet (offset > 0.5 s here)
    assert p.until < t("2026-11-22T12:00:00")
    assert p.next_wake is not None and t("2026-11-22T12:00:00") < p.next_wake
    later = plan(
        row("0 * * * *", p.until.isoformat()[:-6], p.next_wake.isoformat()[:-6], overlap="skip",
            jitter=600),
        lookahead_seconds=60, tick_seconds=60,
    )  # fmt: skip
    assert [(o.scheduled_for, o.run_at) for o in later.occurrences] == [
        (t("2026-11-22T12:00:00"), p.next_wake)
    ]


def test_jitter_delays_run_at_never_scheduled_for() -> None:
    r = row("0 * * * *", "2026-11-22T11:00:00", "2026-11-22T11:59:30", jitter=300)
    [o] = plan(r, lookahead_seconds=60, tick_seconds=60).occurrences
    assert o.scheduled_for == t("2026-11-22T12:00:00")
    assert timedelta(0) <= o.run_at - o.scheduled_for <= timedelta(seconds=300)


def test_stepping_through_time_creates_each_occurrence_once() -> None:
    cursor = "2026-10-24T00:00:00"
    seen: list[datetime] = []
    now = t(cursor)
    for _ in range(2 * 24 * 6):  # two days in 10-minute steps, across the DST change
        now += timedelta(minutes=10)
        r = row("*/30 * * * *", cursor, now.isoformat()[:-6], tz="Europe/Amsterdam")
        p = plan(r, lookahead_seconds=60, tick_seconds=60)
        seen += [o.scheduled_for for o in p.occurrences]
        cursor = p.until.isoformat()[:-6]
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen)
    assert all(b - a == timedelta(minutes=30) for a, b in itertools.pairwise(seen))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"cron": "5-5 * * * *"}, "schedules.s.cron: minute field '5-5': a range with equal ends"),
        ({"cron": "0 0 * * * *"}, "schedules.s.cron: 6 fields"),
        ({"tz": "Mars/Olympus"}, "schedules.s.timezone: unknown time zone 'Mars/Olympus'"),
        ({"catchup": "some"}, "schedules.s.catchup: must be one of latest, all, none"),
        ({"overlap": "queue"}, "schedules.s.overlap: must be one of skip, allow"),
        ({"limit": 0}, "schedules.s.catchup_limit: expected a positive integer"),
        ({"jitter": float("nan")}, "schedules.s.jitter: expected a duration"),
    ],
)
def test_a_row_is_refused_in_the_config_files_words(
    changes: dict[str, object], reason: str
) -> None:
    """The ticker checks a database row with the config file's own checks, naming the key."""
    kw: dict[str, object] = {"cron": "* * * * *", "cursor": None, "now": "2026-11-22T10:00:00"}
    kw.update(changes)
    refused = refusal(row(**kw))  # type: ignore[arg-type]
    assert refused is not None and refused.startswith(reason), refused
    assert "\n" not in refused


def test_a_row_the_config_accepts_is_not_refused() -> None:
    r = row("H 3 * * 1-5", None, "2026-11-22T10:00:00", overlap="skip", catchup="all",
            jitter=300, tz="Europe/Amsterdam")  # fmt: skip
    assert refusal(r) is None
