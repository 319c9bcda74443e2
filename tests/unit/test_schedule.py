"""Cron occurrences in time zones: DST tables written out by hand, properties checked
against a minute-by-minute scan of the clock, validation messages, H hashing and jitter."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from pgtick.errors import ConfigError, ScheduleError
from pgtick.scheduling.cron import Cron, CronCache, jitter_offset, load_zone, validate_cron

ONE_MINUTE = timedelta(minutes=1)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

ZONES = (
    "UTC",
    "Europe/Amsterdam",
    "America/New_York",
    "Australia/Lord_Howe",  # the clock moves by 30 minutes
    "Asia/Kolkata",  # +05:30, no DST
    "America/Sao_Paulo",  # DST abolished in 2019
    "Pacific/Chatham",  # +12:45/+13:45, changes at 02:45/03:45
    "America/Santiago",  # changes at midnight
    "Europe/Dublin",  # "negative DST" in tzdata: winter is the daylight-saving side
    "Asia/Tehran",  # +03:30/+04:30 until 2022, at midnight
)


def utc(text: str) -> datetime:
    """'2026-03-29T01:00' -> an aware UTC datetime (expected values are written in UTC)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utcs(*texts: str) -> list[datetime]:
    return [utc(text) for text in texts]


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _transitions(name: str) -> list[datetime]:
    """Every change of the zone's UTC offset in 2020-2030, to the second (scan days, bisect)."""
    zone = ZoneInfo(name)
    found = []
    day = datetime(2019, 12, 31, tzinfo=UTC)
    while day < datetime(2031, 1, 1, tzinfo=UTC):
        following = day + timedelta(days=1)
        if _offset(zone, day) != _offset(zone, following):
            low, high = int(day.timestamp()), int(following.timestamp())
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(zone, datetime.fromtimestamp(middle, UTC)) == _offset(zone, following):
                    high = middle
                else:
                    low = middle
            found.append(datetime.fromtimestamp(high, UTC))
        day = following
    return found


TRANSITIONS = {name: _transitions(name) for name in ZONES}


# --- 1. DST tables (Debian cron's rules), each instant worked out by hand --------------------

# Europe/Amsterdam: 2026-03-29 01:00Z the clock goes 02:00 CET -> 03:00 CEST (02:xx never shows);
# 2026-10-25 01:00Z it goes 03:00 CEST -> 02:00 CET (02:xx shows twice: 00:xxZ then 01:xxZ).
# America/New_York: 2026-03-08 07:00Z 02:00 EST -> 03:00 EDT; 2026-11-01 06:00Z 02:00 EDT ->
# 01:00 EST (01:xx shows twice: 05:xxZ then 06:xxZ).
DST_TABLE = [
    # --- Amsterdam, spring forward
    pytest.param(
        "30 2 * * *",
        "Europe/Amsterdam",
        "2026-03-28T12:00",
        "2026-03-30T12:00",
        # no 02:30 on the 29th: once, at the end of the gap (03:00 CEST); then 02:30 CEST
        utcs("2026-03-29T01:00", "2026-03-30T00:30"),
        id="ams-spring-fixed",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Amsterdam",
        "2026-03-28T22:00",
        "2026-03-29T03:00",
        # 00:00, 01:00 CET, (02:00 skipped), 03:00, 04:00, 05:00 CEST: every UTC hour, once
        utcs(
            "2026-03-28T23:00",
            "2026-03-29T00:00",
            "2026-03-29T01:00",
            "2026-03-29T02:00",
            "2026-03-29T03:00",
        ),
        id="ams-spring-hourly",
    ),
    pytest.param(
        "*/30 * * * *",
        "Europe/Amsterdam",
        "2026-03-28T23:00",
        "2026-03-29T02:00",
        utcs(
            "2026-03-28T23:30",
            "2026-03-29T00:00",
            "2026-03-29T00:30",
            "2026-03-29T01:00",
            "2026-03-29T01:30",
            "2026-03-29T02:00",
        ),
        id="ams-spring-every-30",
    ),
    pytest.param(
        "30 * * * *",
        "Europe/Amsterdam",
        "2026-03-28T23:00",
        "2026-03-29T02:00",
        # every hour: 02:30 is skipped, not moved to 03:00 (the cadence stays on :30)
        utcs("2026-03-28T23:30", "2026-03-29T00:30", "2026-03-29T01:30"),
        id="ams-spring-hourly-at-30",
    ),
    pytest.param(
        "*/30 2 * * *",
        "Europe/Amsterdam",
        "2026-03-28T12:00",
        "2026-03-30T00:15",
        # neither 02:00 nor 02:30 exists on the 29th, and a wildcard schedule (minute starts
        # with '*') has no occurrence in the gap: nothing that day; 02:00 CEST on the 30th
        utcs("2026-03-30T00:00"),
        id="ams-spring-every-30-in-2am",
    ),
    # --- Amsterdam, fall back
    pytest.param(
        "30 2 * * *",
        "Europe/Amsterdam",
        "2026-10-24T12:00",
        "2026-10-26T12:00",
        # 02:30 CEST (00:30Z) only, not 02:30 CET (01:30Z); then 02:30 CET on the 26th
        utcs("2026-10-25T00:30", "2026-10-26T01:30"),
        id="ams-fall-fixed",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Amsterdam",
        "2026-10-24T22:00",
        "2026-10-25T03:00",
        # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET, 04:00 CET
        utcs(
            "2026-10-24T23:00",
            "2026-10-25T00:00",
            "2026-10-25T01:00",
            "2026-10-25T02:00",
            "2026-10-25T03:00",
        ),
        id="ams-fall-hourly",
    ),
    pytest.param(
        "*/30 * * * *",
        "Europe/Amsterdam",
        "2026-10-24T23:00",
        "2026-10-25T02:00",
        utcs(
            "2026-10-24T23:30",
            "2026-10-25T00:00",
            "2026-10-25T00:30",
            "2026-10-25T01:00",
            "2026-10-25T01:30",
            "2026-10-25T02:00",
        ),
        id="ams-fall-every-30",
    ),
    pytest.param(
        "*/30 2 * * *",
        "Europe/Amsterdam",
        "2026-10-24T12:00",
        "2026-10-25T12:00",
        # minute starts with '*': both passes of 02:xx, 02:00/02:30 CEST then 02:00/02:30 CET
        utcs("2026-10-25T00:00", "2026-10-25T00:30", "2026-10-25T01:00", "2026-10-25T01:30"),
        id="ams-fall-every-30-in-2am",
    ),
    # --- New York, spring forward
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00",
        "2026-03-09T12:00",
        # 02:30 does not exist on the 8th: 03:00 EDT; then 02:30 EDT on the 9th
        utcs("2026-03-08T07:00", "2026-03-09T06:30"),
        id="nyc-spring-fixed",
    ),
    pytest.param(
        "*/10 2 * * *",
        "America/New_York",
        "2026-03-07T12:00",
        "2026-03-09T12:00",
        # wildcard (minute starts with '*'): no run at all on the 8th, not even at 03:00 EDT;
        # 02:00-02:50 EDT on the 9th
        utcs(*(f"2026-03-09T06:{m:02d}" for m in range(0, 60, 10))),
        id="nyc-spring-wildcard-in-2am",
    ),
    pytest.param(
        "30 */2 * * *",
        "America/New_York",
        "2026-03-08T04:00",
        "2026-03-08T12:00",
        # wildcard hour: 00:30 EST, (02:30 in the gap: nothing), 04:30, 06:30 EDT
        utcs("2026-03-08T05:30", "2026-03-08T08:30", "2026-03-08T10:30"),
        id="nyc-spring-wildcard-hour",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-03-08T04:00",
        "2026-03-08T09:00",
        # 00:00, 01:00 EST, (02:00 skipped), 03:00, 04:00, 05:00 EDT
        utcs(
            "2026-03-08T05:00",
            "2026-03-08T06:00",
            "2026-03-08T07:00",
            "2026-03-08T08:00",
            "2026-03-08T09:00",
        ),
        id="nyc-spring-hourly",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        "2026-03-08T05:30",
        "2026-03-08T08:00",
        utcs(
            "2026-03-08T06:00",
            "2026-03-08T06:30",
            "2026-03-08T07:00",
            "2026-03-08T07:30",
            "2026-03-08T08:00",
        ),
        id="nyc-spring-every-30",
    ),
    # --- New York, fall back: the repeated hour is 01:xx, so 02:30 happens once anyway
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        "2026-11-02T12:00",
        utcs("2026-11-01T07:30", "2026-11-02T07:30"),
        id="nyc-fall-fixed-2am",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        "2026-11-02T12:00",
        # 01:30 EDT (05:30Z) only, not 01:30 EST (06:30Z)
        utcs("2026-11-01T05:30", "2026-11-02T06:30"),
        id="nyc-fall-fixed-1am",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T03:00",
        "2026-11-01T08:00",
        # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST
        utcs(
            "2026-11-01T04:00",
            "2026-11-01T05:00",
            "2026-11-01T06:00",
            "2026-11-01T07:00",
            "2026-11-01T08:00",
        ),
        id="nyc-fall-hourly",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        "2026-11-01T04:30",
        "2026-11-01T07:00",
        utcs(
            "2026-11-01T05:00",
            "2026-11-01T05:30",
            "2026-11-01T06:00",
            "2026-11-01T06:30",
            "2026-11-01T07:00",
        ),
        id="nyc-fall-every-30",
    ),
    pytest.param(
        "*/30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        "2026-11-01T12:00",
        utcs("2026-11-01T05:00", "2026-11-01T05:30", "2026-11-01T06:00", "2026-11-01T06:30"),
        id="nyc-fall-every-30-in-1am",
    ),
    pytest.param(
        "*/30 2 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        "2026-11-01T12:00",
        utcs("2026-11-01T07:00", "2026-11-01T07:30"),
        id="nyc-fall-every-30-in-2am",
    ),
    # --- Australia/Lord_Howe: 2026-04-04 15:00Z 02:00 +11 -> 01:30 +10:30 (01:30-01:59 twice);
    # croniter's own time-zone mode drops the second pass here.
    pytest.param(
        "*/10 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T14:20",
        "2026-04-04T15:30",
        utcs(
            "2026-04-04T14:30",
            "2026-04-04T14:40",
            "2026-04-04T14:50",
            "2026-04-04T15:00",
            "2026-04-04T15:10",
            "2026-04-04T15:20",
            "2026-04-04T15:30",
        ),
        id="lhi-fall-every-10",
    ),
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00",
        "2026-04-05T12:00",
        # 01:45 +11 on the 4th and 5th (local); not 01:45 +10:30 (15:15Z) on the 5th
        utcs("2026-04-03T14:45", "2026-04-04T14:45"),
        id="lhi-fall-fixed",
    ),
    pytest.param(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00",
        "2026-10-05T00:00",
        # 2026-10-03 15:30Z 02:00 +10:30 -> 02:30 +11: 02:15 runs at 02:30 +11 once
        utcs("2026-10-03T15:30", "2026-10-04T15:15"),
        id="lhi-spring-fixed",
    ),
    # --- Pacific/Chatham: 2026-04-04 14:00Z 03:45 +13:45 -> 02:45 +12:45 (02:45-03:44 twice)
    pytest.param(
        "*/5 2 * * *",
        "Pacific/Chatham",
        "2026-04-04T12:00",
        "2026-04-04T15:00",
        utcs(
            # first pass of 02:00 .. 02:55 (+13:45)
            *(f"2026-04-04T12:{m:02}" for m in range(15, 60, 5)),
            *(f"2026-04-04T13:{m:02}" for m in range(0, 15, 5)),
            # second pass of 02:45, 02:50, 02:55 (+12:45)
            "2026-04-04T14:00",
            "2026-04-04T14:05",
            "2026-04-04T14:10",
        ),
        id="cht-fall-every-5-in-2am",
    ),
]


@pytest.mark.parametrize(("expr", "zone", "after", "until", "expected"), DST_TABLE)
def test_dst_table(expr: str, zone: str, after: str, until: str, expected: list[datetime]) -> None:
    got = list(Cron.parse(expr, zone, "table").occurrences(utc(after), utc(until)))
    assert got == expected
    assert all(t.tzinfo is UTC for t in got)


def test_start_inside_the_repeated_hour_first_pass() -> None:
    # after = 02:10 CEST: the second pass (02:00 CET = 01:00Z) belongs to an earlier wall time
    cron = Cron.parse("*/30 * * * *", "Europe/Amsterdam")
    got = list(cron.occurrences(utc("2026-10-25T00:10"), utc("2026-10-25T01:45")))
    assert got == utcs("2026-10-25T00:30", "2026-10-25T01:00", "2026-10-25T01:30")


def test_start_inside_the_repeated_hour_second_pass() -> None:
    amsterdam = ZoneInfo("Europe/Amsterdam")
    cron = Cron.parse("*/30 * * * *", "Europe/Amsterdam")
    expected = utcs("2026-10-25T01:30", "2026-10-25T02:00")
    # the same instant three ways: UTC, local with fold=1, and a fixed offset
    for after in (
        utc("2026-10-25T01:10"),
        datetime(2026, 10, 25, 2, 10, fold=1, tzinfo=amsterdam),
        datetime(2026, 10, 25, 2, 10, tzinfo=timezone(timedelta(hours=1))),
    ):
        assert list(cron.occurrences(after, utc("2026-10-25T02:00"))) == expected


def test_fixed_time_between_the_two_instances_does_not_run_again() -> None:
    cron = Cron.parse("30 2 * * *", "Europe/Amsterdam")
    assert list(cron.occurrences(utc("2026-10-25T00:45"), utc("2026-10-25T23:00"))) == []
    assert cron.next_after(utc("2026-10-25T00:45")) == utc("2026-10-26T01:30")


def test_interval_is_half_open() -> None:
    cron = Cron.parse("0 * * * *")
    got = list(cron.occurrences(utc("2026-01-01T10:00"), utc("2026-01-01T12:00")))
    assert got == utcs("2026-01-01T11:00", "2026-01-01T12:00")
    assert list(cron.occurrences(utc("2026-01-01T12:00"), utc("2026-01-01T12:00"))) == []
    assert list(cron.occurrences(utc("2026-01-01T12:00"), utc("2026-01-01T11:00"))) == []


def test_latest_at_or_before() -> None:
    fixed = Cron.parse("30 2 * * *", "Europe/Amsterdam")
    # after both 02:30s of 2026-10-25: the latest occurrence is the first one
    assert fixed.latest_at_or_before(utc("2026-10-25T01:45")) == utc("2026-10-25T00:30")
    assert fixed.latest_at_or_before(utc("2026-10-25T00:30")) == utc("2026-10-25T00:30")
    assert fixed.latest_at_or_before(utc("2026-10-25T00:29:59")) == utc("2026-10-24T00:30")
    leap = Cron.parse("0 0 29 2 *")
    assert leap.latest_at_or_before(utc("2026-06-01T00:00")) == utc("2024-02-29T00:00")
    # nothing before the start of the calendar
    assert Cron.parse("0 12 * * *").latest_at_or_before(utc("0001-01-01T00:30")) is None


def test_next_n_and_next_after() -> None:
    cron = Cron.parse("0 9 * * 1-5", "America/New_York")
    # Friday 2026-03-06 .. Tuesday 2026-03-10: the weekend in between, EST then EDT
    assert cron.next_n(utc("2026-03-06T00:00"), 3) == utcs(
        "2026-03-06T14:00", "2026-03-09T13:00", "2026-03-10T13:00"
    )
    assert cron.next_after(utc("2026-03-06T14:00")) == utc("2026-03-09T13:00")
    assert cron.next_n(utc("2026-03-06T00:00"), 0) == []
    with pytest.raises(ValueError, match="count"):
        cron.next_n(utc("2026-03-06T00:00"), -1)


def test_end_of_the_calendar_is_not_an_error() -> None:
    assert Cron.parse("0 0 1 1 *").next_n(utc("9998-06-01T00:00"), 5) == utcs("9999-01-01T00:00")


# --- 2. Properties over generated expressions, zones and instants -------------------------


@dataclass(frozen=True)
class Expr:
    """A generated expression with the sets it stands for, so the test can match it itself."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None  # None: '*'
    months: frozenset[int]
    weekdays: frozenset[int] | None  # None: '*'; 0 = Sunday

    @property
    def fixed(self) -> bool:
        minute, hour = self.text.split()[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        day_ok = self.days is None or wall.day in self.days
        weekday_ok = self.weekdays is None or wall.isoweekday() % 7 in self.weekdays
        if self.days is not None and self.weekdays is not None:
            return day_ok or weekday_ok  # both restricted: either one (cron's OR rule)
        return day_ok and weekday_ok


MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
Field = tuple[str, frozenset[int]]


def _atoms(low: int, high: int, names: tuple[str, ...] | None) -> st.SearchStrategy[Field]:
    """One list item: n, a-b, a-b/s, a/s (never a-a, which croniter reads as the whole field)."""
    number = st.integers(low, high).map(lambda n: (str(n), frozenset({n})))
    if names is not None:
        first = low

        def named(n: int) -> Field:
            return names[n - first], frozenset({n})

        number = number | st.integers(low, low + len(names) - 1).map(named)

    def span(start: int) -> st.SearchStrategy[Field]:
        return st.tuples(st.integers(start + 1, high), st.integers(1, high - start)).map(
            lambda end_step: (
                f"{start}-{end_step[0]}" + (f"/{end_step[1]}" if end_step[1] > 1 else ""),
                frozenset(range(start, end_step[0] + 1, end_step[1])),
            )
        )

    def start_step(start: int) -> st.SearchStrategy[Field]:
        return st.integers(1, high - low).map(
            lambda step: (f"{start}/{step}", frozenset(range(start, high + 1, step)))
        )

    starts = st.integers(low, high - 1)
    return number | starts.flatmap(span) | starts.flatmap(start_step)


def _listed(low: int, high: int, names: tuple[str, ...] | None = None) -> st.SearchStrategy[Field]:
    return st.lists(_atoms(low, high, names), min_size=1, max_size=3).map(
        lambda items: (
            ",".join(text for text, _ in items),
            frozenset().union(*(s for _, s in items)),
        )
    )


def _field(low: int, high: int, names: tuple[str, ...] | None = None) -> st.SearchStrategy[Field]:
    every = frozenset(range(low, high + 1))
    star = st.just(("*", every))
    star_step = st.integers(2, high - low).map(
        lambda step: (f"*/{step}", frozenset(range(low, high + 1, step)))
    )
    return st.one_of(star, star_step, _listed(low, high, names))


def _weekday_field() -> st.SearchStrategy[Field]:
    # 7 is Sunday too; croniter maps it to 0.
    sunday_seven = st.just(("7", frozenset({0})))
    return _field(0, 6, WEEKDAY_NAMES) | st.just(("1-7", frozenset(range(7)))) | sunday_seven


EVERY_MONTH = frozenset(range(1, 13))
MINUTE_FIELDS = _field(0, 59)
MINUTE_LISTS = _listed(0, 59)  # fixed-time when the hour is listed too
HOUR_FIELDS = _field(0, 23)
DAY_FIELDS = _field(1, 31)
MONTH_FIELDS = _field(1, 12, MONTH_NAMES)
WEEKDAY_FIELDS = _weekday_field()


@st.composite
def expressions(draw: st.DrawFn) -> Expr:
    minute, minutes = draw(MINUTE_FIELDS)
    hour, hours = draw(HOUR_FIELDS)
    day, days = draw(DAY_FIELDS)
    month, months = draw(MONTH_FIELDS)
    weekday, weekdays = draw(WEEKDAY_FIELDS)
    # A list that covers the whole field is '*' to croniter only sometimes (it depends on the
    # other day field); keep the generated expressions clear of that corner.
    if day != "*" and len(days) == 31:
        day = "*"
    if weekday != "*" and len(weekdays) == 7:
        weekday = "*"
    return Expr(
        f"{minute} {hour} {day} {month} {weekday}",
        minutes,
        hours,
        None if day == "*" else days,
        months,
        None if weekday == "*" else weekdays,
    )


@st.composite
def zone_and_start(draw: st.DrawFn) -> tuple[str, datetime]:
    """A zone and an instant in 2020-2030, usually within hours of one of its clock changes."""
    zone = draw(st.sampled_from(ZONES))
    changes = TRANSITIONS[zone]
    if changes and draw(st.integers(0, 3)) != 0:  # three times in four: near a change
        change = draw(st.sampled_from(changes))
        start = change + timedelta(seconds=draw(st.integers(-5 * 3600, 3 * 3600)))
    else:
        start = draw(
            st.datetimes(datetime(2020, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC))
        )
    # Any aware datetime is accepted: hand it over in some zone or other.
    shown_in = draw(st.sampled_from([UTC, ZoneInfo(zone), timezone(timedelta(hours=-3))]))
    return zone, start.astimezone(shown_in)


@st.composite
def aimed_scenarios(draw: st.DrawFn) -> tuple[Expr, str, datetime, datetime]:
    """An expression, a zone and a start near one of its clock changes, the expression's hours
    being the ones the change skips or repeats: a random expression rarely fires in the one hour
    a year that matters."""
    zone_name = draw(st.sampled_from([name for name in ZONES if TRANSITIONS[name]]))
    zone = ZoneInfo(zone_name)
    change = draw(st.sampled_from(TRANSITIONS[zone_name]))
    # Mostly a window that spans the change: start up to 5 h before it, end up to 3 h after.
    start = change - timedelta(seconds=draw(st.integers(-3600, 5 * 3600)))
    until = change + timedelta(seconds=draw(st.integers(-600, 3 * 3600)))
    walls = (
        (change - timedelta(seconds=1)).astimezone(zone).replace(tzinfo=None),
        change.astimezone(zone).replace(tzinfo=None),
    )
    wall, last = min(walls) - timedelta(hours=1), max(walls) + timedelta(hours=1)
    near = set()
    while wall <= last:
        near.add(wall.hour)
        wall += timedelta(minutes=30)
    if draw(st.booleans()):
        hours = sorted(near)
    else:
        hours = draw(st.lists(st.sampled_from(sorted(near)), min_size=1, unique=True))
    minute, minutes = draw(st.one_of(MINUTE_LISTS, MINUTE_FIELDS))
    hour = ",".join(str(h) for h in sorted(hours))
    expr = Expr(f"{minute} {hour} * * *", minutes, frozenset(hours), None, EVERY_MONTH, None)
    return expr, zone_name, start, until


def _second_pass(local: datetime) -> bool:
    """True for the second instance of a wall-clock time that happens twice."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _skipped_walls(zone: ZoneInfo, instant: datetime) -> list[datetime]:
    """The wall-clock times the clock jumped over at ``instant`` (empty unless it jumped)."""
    jump = _offset(zone, instant) - _offset(zone, instant - timedelta(seconds=1))
    wall = instant.astimezone(zone).replace(tzinfo=None)
    return [wall - ONE_MINUTE * k for k in range(1, int(jump / ONE_MINUTE) + 1)]


def check_occurrences(
    got: list[datetime],
    matches: Callable[[datetime], bool],
    zone_name: str,
    after: datetime,
    until: datetime,
    *,
    fixed: bool,
) -> None:
    zone = ZoneInfo(zone_name)
    assert all(t.tzinfo is UTC for t in got)
    assert all(after < t <= until for t in got)
    assert all(earlier < later for earlier, later in pairwise(got)), "not strictly increasing"
    walls = []
    for instant in got:
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        walls.append(wall)
        if matches(wall):
            assert not (fixed and _second_pass(local)), f"{local}: second instance, fixed time"
            if _second_pass(local):
                event("second pass of a repeated time")
            continue
        event("end of a gap")
        # The one allowed mismatch: the end of a spring-forward gap holding a matching time.
        skipped = _skipped_walls(zone, instant)
        assert skipped, f"{instant} = {local} does not match and is not the end of a gap"
        assert any(matches(w) for w in skipped), f"{local}: no matching time in the gap"
        assert fixed, f"{local}: a wildcard schedule has no occurrence in a gap, no shift"
    if fixed:
        assert len(set(walls)) == len(walls), "a fixed-time schedule ran a wall time twice"


def scan_clock(expr: Expr, zone_name: str, after: datetime, until: datetime) -> list[datetime]:
    """The expected instants, minute by minute along the UTC axis: the slow, obvious way."""
    zone = ZoneInfo(zone_name)
    found = []
    instant = after.astimezone(UTC).replace(second=0, microsecond=0) + ONE_MINUTE
    while instant <= until:
        local = instant.astimezone(zone)
        skipped = _skipped_walls(zone, instant)
        if expr.fixed and any(expr.matches(wall) for wall in skipped):
            found.append(instant)  # the end of a gap that swallowed a matching time
        elif expr.matches(local.replace(tzinfo=None)) and not (expr.fixed and _second_pass(local)):
            found.append(instant)
        instant += ONE_MINUTE
    return found


def _parse_or_reject(text: str, zone: str) -> Cron:
    try:
        return Cron.parse(text, zone, "prop")
    except ScheduleError as exc:
        # strict validation refuses days a month never has ("31 in feb,apr"): not our subject
        assert "can never occur" in str(exc)
        reject()


def _check_against_scan(expr: Expr, zone: str, after: datetime, until: datetime) -> None:
    cron = _parse_or_reject(expr.text, zone)
    assert cron.fixed_time == expr.fixed
    got = list(cron.occurrences(after, until))
    check_occurrences(got, expr.matches, zone, after, until, fixed=expr.fixed)
    assert got == scan_clock(expr, zone, after, until)


@PROPERTY_SETTINGS
@given(expressions(), zone_and_start(), st.integers(1, 2 * 24 * 60))
def test_occurrences_match_a_scan_of_the_clock(
    expr: Expr, zone_start: tuple[str, datetime], window_minutes: int
) -> None:
    zone, after = zone_start
    if len(expr.minutes) * len(expr.hours) > 120:  # dense: keep the example fast
        window_minutes = min(window_minutes, 6 * 60)
    _check_against_scan(expr, zone, after, after + timedelta(minutes=window_minutes))


@PROPERTY_SETTINGS
@given(aimed_scenarios())
def test_occurrences_around_clock_changes_match_a_scan_of_the_clock(
    scenario: tuple[Expr, str, datetime, datetime],
) -> None:
    expr, zone, after, until = scenario
    _check_against_scan(expr, zone, after, until)


# Expressions whose day rules (L, #, W) or macros the test does not re-implement: croniter.match
# judges each wall time instead. The flags are written by hand: (expression, fixed, every hour).
CRON_SHORTHANDS = [
    ("0 0 L * *", True, False),
    ("30 2 L 2 *", True, False),
    ("0 12 * * L5", True, False),
    ("30 2 * * L0", True, False),  # last Sunday: Europe's change days
    ("*/15 2 * * L0", False, False),
    ("0 * * * L0", False, True),
    ("30 1 * * 0#1", True, False),  # first Sunday: New York's November change
    ("30 2 * * 0#2", True, False),  # second Sunday: New York's March change
    ("*/20 * * * 0#1", False, True),
    ("0 9 * * 1#2", True, False),
    ("30 1 15W * *", True, False),
    ("0 0 1W * *", True, False),
    ("@hourly", False, True),
    ("@daily", True, False),
    ("@midnight", True, False),
    ("@weekly", True, False),
    ("@monthly", True, False),
    ("@yearly", True, False),
    ("@annually", True, False),
]


@PROPERTY_SETTINGS
@given(st.sampled_from(CRON_SHORTHANDS), zone_and_start(), st.integers(1, 40 * 24 * 60))
def test_special_expressions_match(
    special: tuple[str, bool, bool], zone_start: tuple[str, datetime], window_minutes: int
) -> None:
    text, fixed, every_hour = special
    zone, after = zone_start
    cron = Cron.parse(text, zone, "prop")
    assert cron.fixed_time == fixed
    if every_hour:
        window_minutes = min(window_minutes, 2 * 24 * 60)
    until = after + timedelta(minutes=window_minutes)
    got = list(cron.occurrences(after, until))

    def matches(wall: datetime) -> bool:
        return bool(croniter.match(text, wall))

    check_occurrences(got, matches, zone, after, until, fixed=fixed)


@PROPERTY_SETTINGS
@given(expressions(), zone_and_start(), st.integers(0, 12))
def test_next_n_agrees_with_occurrences(
    expr: Expr, zone_start: tuple[str, datetime], count: int
) -> None:
    zone, start = zone_start
    cron = _parse_or_reject(expr.text, zone)
    first = cron.next_n(start, count)
    assert first == list(islice(cron.occurrences(start, FAR_FUTURE), count))
    assert cron.next_n(start, count + 1)[:count] == first
    assert cron.next_after(start) == cron.next_n(start, 1)[0]


@settings(max_examples=60, deadline=None)
@given(expressions(), zone_and_start())
def test_latest_at_or_before_is_the_last_occurrence(
    expr: Expr, zone_start: tuple[str, datetime]
) -> None:
    zone, at = zone_start
    cron = _parse_or_reject(expr.text, zone)
    latest = cron.latest_at_or_before(at)
    assert latest is not None  # every generated expression fires at least every few years
    assert latest <= at
    assert list(cron.occurrences(latest, at)) == []
    assert cron.next_after(latest - timedelta(microseconds=1)) == latest


@settings(max_examples=40, deadline=None)
@given(
    expressions(),
    zone_and_start(),
    st.lists(st.integers(-3 * 24 * 3600, 3 * 24 * 3600), min_size=1, max_size=12),
)
def test_the_cache_answers_as_the_cron_does(
    expr: Expr, zone_start: tuple[str, datetime], steps: list[int]
) -> None:
    """CronCache (the metrics' schedules) at times walking forward and back by up to 3 days:
    every answer the uncached one, whichever answer it kept."""
    zone, at = zone_start
    cron = _parse_or_reject(expr.text, zone)
    cache = CronCache(cron)
    for step in steps:
        at += timedelta(seconds=step)
        assert cache.latest_at_or_before(at) == cron.latest_at_or_before(at)
        assert cache.next_after(at) == cron.next_after(at)
        # Again at the same time, from the cache, and at its answers' own edges.
        assert cache.latest_at_or_before(at) == cron.latest_at_or_before(at)
        upcoming = cron.next_after(at)
        assert cache.latest_at_or_before(upcoming) == upcoming
        assert cache.next_after(upcoming - timedelta(microseconds=1)) == upcoming


def test_the_cache_asks_croniter_once_per_occurrence() -> None:
    cron = Cron.parse("0 3 * * *")
    cache = CronCache(cron)
    asked = []
    original = Cron.latest_at_or_before

    def counted(self: Cron, at: datetime) -> datetime | None:
        asked.append(at)
        return original(self, at)

    at = utc("2026-12-03T12:00")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Cron, "latest_at_or_before", counted)
        for minute in range(0, 24 * 60, 15):  # every 15 s would do the same, 4 times as often
            assert cache.latest_at_or_before(at + timedelta(minutes=minute)) is not None
    # 12:00 asks; 03:00 the next day (minute 900) asks again; nothing else does.
    assert asked == [at, utc("2026-12-04T03:00")]
    # A cron that never fires again: no upcoming occurrence, asked once.
    never = CronCache(Cron.parse("0 0 29 2 *"))
    end = datetime(9999, 3, 1, tzinfo=UTC)
    assert never.next_after(end) is None
    assert never.next_after(end + timedelta(days=1)) is None


# --- 3. Validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("@reboot", "@reboot is not supported: pgtick has no notion of boot"),
        ("@REBOOT", "@reboot is not supported"),
        ("R * * * *", "R in the minute field is not supported"),
        ("0 R(1-5) * * *", "R in the hour field is not supported"),
        ("1,R * * * *", "use H"),
        (
            "0 0 * * * *",
            "6 fields: pgtick takes 5 (minute hour day month weekday); "
            "croniter would read the 6th as seconds",
        ),
        ("0 0 0 * * * 2026", "7 fields: pgtick takes 5"),
        ("* * * *", "4 fields: pgtick takes 5 (minute hour day month weekday)"),
        ("daily", "1 field: pgtick takes 5"),
        ("", "empty cron expression"),
        ("0 0 31 2 *", "Day(s) [31] can never occur in month(s) [2]"),
        ("0 0 30 2 *", "can never occur"),
        ("61 * * * *", "minute field '61': out of range"),
        ("0-70 * * * *", "minute field '0-70': out of range"),
        ("0 24 * * *", "hour field '24': out of range"),
        ("0 0 * 13 *", "month field '13': out of range"),
        ("*/0 * * * *", "minute field '*/0': step '0' is not acceptable"),
        ("0 0 * * 1#6", "day-of-week field '1#6'"),
        ("a b c d e", "minute field 'a': not a number, range, step or known name"),
        ("0 0 1W,2 * *", "'W' can only be used with a single day value"),
        ("@fortnightly", "unknown macro '@fortnightly'"),
    ],
)
def test_refusals_say_why(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        validate_cron(expr, "job")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # so the CLI exits 2
    with pytest.raises(ScheduleError):
        Cron.parse(expr, "UTC", "job")


@pytest.mark.parametrize(
    "expr",
    [
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "@midnight",
        "@DAILY",
        "  0 3 * * *  ",
        "0 0 L * *",
        "0 12 * * L5",
        "0 9 * * mon#2",
        "0 0 15W * *",
        "H H * * *",
        "H/15 H(9-17) * * mon-fri",
        "0 0 29 2 *",
        "0 0 ? * *",
    ],
)
def test_accepted(expr: str) -> None:
    validate_cron(expr, "job")
    assert Cron.parse(expr, "Europe/Amsterdam", "job").next_after(utc("2026-01-01T00:00"))


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("30 2 * * *", True),
        ("0,30 2,3 * * *", True),
        ("0-59 2 * * *", True),  # Vixie's rule looks at the first character only
        ("@daily", True),
        ("H H * * *", True),
        ("0 * * * *", False),
        ("*/30 * * * *", False),
        ("*/30 2 * * *", False),
        ("0 */2 * * *", False),
        ("@hourly", False),
        ("H * * * *", False),
    ],
)
def test_fixed_time(expr: str, fixed: bool) -> None:
    assert Cron.parse(expr, "UTC", "job").fixed_time is fixed


@pytest.mark.parametrize("name", ["Mars/Base", "America", "", "../etc/passwd", "utc"])
def test_unknown_zone(name: str) -> None:
    with pytest.raises(ScheduleError, match=f"^unknown time zone '{name}'$"):
        load_zone(name)
    with pytest.raises(ScheduleError, match="unknown time zone"):
        Cron.parse("0 0 * * *", name)


def test_host_dependent_zones_are_refused() -> None:
    with pytest.raises(ScheduleError, match="localtime"):
        load_zone("localtime")
    with pytest.raises(ScheduleError, match="leap seconds"):
        load_zone("right/Europe/Amsterdam")
    assert load_zone("Europe/Amsterdam") == ZoneInfo("Europe/Amsterdam")


def test_naive_datetimes_are_refused() -> None:
    cron = Cron.parse("0 * * * *")
    naive = datetime(2026, 1, 1)
    aware = utc("2026-01-01T00:00")
    with pytest.raises(ValueError, match="timezone-aware"):
        list(cron.occurrences(naive, aware))
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.occurrences(aware, naive)  # refused at the call, not at the first next()
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.next_after(naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.latest_at_or_before(naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.next_n(naive, 3)
    with pytest.raises(ValueError, match="timezone-aware"):
        jitter_offset("job", naive, 10, aware)


def test_h_is_hashed_on_the_name() -> None:
    # Pinned: if croniter ever hashes differently, every H schedule in the field moves.
    start = utc("2026-01-01T00:00")
    assert Cron.parse("H H * * *", "UTC", "nightly_cleanup").next_n(start, 2) == utcs(
        "2026-01-01T18:24", "2026-01-02T18:24"
    )
    assert Cron.parse("H H * * *", "UTC", "send_invoice_emails").next_after(start) == utc(
        "2026-01-01T19:50"
    )
    assert Cron.parse("H/15 * * * *", "UTC", "nightly_cleanup").next_n(start, 4) == utcs(
        "2026-01-01T00:09", "2026-01-01T00:24", "2026-01-01T00:39", "2026-01-01T00:54"
    )


def test_h_is_deterministic_and_spreads() -> None:
    start = utc("2026-01-01T00:00")
    names = [f"job_{i}" for i in range(40)]
    first = [Cron.parse("H H * * *", "UTC", name).next_after(start) for name in names]
    again = [Cron.parse("H H * * *", "UTC", name).next_after(start) for name in names]
    assert first == again
    assert len(set(first)) >= 30


# --- 4. Jitter ---------------------------------------------------------------------------------

occurrence_instants = st.datetimes(
    datetime(2020, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC)
).map(lambda t: t.replace(second=0, microsecond=0))


@PROPERTY_SETTINGS
@given(
    st.text(max_size=30),
    occurrence_instants,
    st.floats(0, 7 * 86400),
    st.floats(0.001, 40 * 86400),
)
def test_jitter_bounds(name: str, occurrence: datetime, jitter: float, gap: float) -> None:
    following = occurrence + timedelta(seconds=gap)
    real_gap = (following - occurrence).total_seconds()  # after timedelta's rounding
    if real_gap <= 0:
        reject()
    offset = jitter_offset(name, occurrence, jitter, following)
    assert 0 <= offset <= jitter
    assert offset < real_gap
    if real_gap > 2:
        assert offset <= real_gap - 1  # a one-second margin before the next occurrence
    assert occurrence + timedelta(seconds=offset) < following
    # deterministic, and independent of how the instant is written
    assert jitter_offset(name, occurrence, jitter, following) == offset
    shown = occurrence.astimezone(ZoneInfo("Asia/Kolkata"))
    assert jitter_offset(name, shown, jitter, following) == offset


def test_jitter_is_pinned_and_spreads() -> None:
    # Pinned: the same on every machine and every release, or daemons would disagree.
    occurrence, following = utc("2026-03-29T01:00"), utc("2026-03-30T00:30")
    assert jitter_offset("nightly_cleanup", occurrence, 300, following) == pytest.approx(
        137.21344330918123, abs=1e-9
    )
    assert jitter_offset("send_invoice_emails", occurrence, 300, following) == pytest.approx(
        84.67941042828622, abs=1e-9
    )
    assert jitter_offset("job", occurrence, 0, following) == 0
    hourly = [utc("2026-01-01T00:00") + timedelta(hours=h) for h in range(200)]
    offsets = [jitter_offset("job", t, 60, t + timedelta(hours=1)) for t in hourly]
    assert len(set(offsets)) == len(offsets)
    assert min(offsets) < 10 and max(offsets) > 50


def test_jitter_refusals() -> None:
    occurrence = utc("2026-01-01T00:00")
    with pytest.raises(ValueError, match="jitter"):
        jitter_offset("job", occurrence, -1, occurrence + ONE_MINUTE)
    with pytest.raises(ValueError, match="jitter"):
        jitter_offset("job", occurrence, math.nan, occurrence + ONE_MINUTE)
    with pytest.raises(ValueError, match="after"):
        jitter_offset("job", occurrence, 10, occurrence)


@pytest.mark.parametrize(
    ("expr", "field"),
    [("5-5 * * * *", "minute field '5-5'"), ("0 3-3 * * *", "hour field '3-3'"),
     ("0 0 * * mon-MON", "day-of-week field 'mon-MON'"), ("1-1/3 * * * *", "minute field")],
)  # fmt: skip
def test_ranges_with_equal_ends_are_refused(expr: str, field: str) -> None:
    # croniter 7 reads "3-3" as the whole field: `0 3-3 * * *` would run every hour.
    with pytest.raises(ScheduleError, match="range with equal ends") as refused:
        validate_cron(expr, "s")
    assert field in str(refused.value)
