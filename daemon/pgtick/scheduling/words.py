"""A cron expression in words, as an operator reads it: ``0 3 * * *`` in Europe/Amsterdam is
"at 03:00 every day, Europe/Amsterdam". Pure; covers the shapes schedules mostly take (fixed
times, every N minutes or hours, days of the week, days of the month, months); anything else
(hashed H fields, L, W, #, steps over ranges) gets None, and the caller shows the expression
alone rather than a guess.
"""

from __future__ import annotations

import re

from pgtick.scheduling.cron import MACROS

DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_NAMES = {name[:3].lower(): i for i, name in enumerate(DAYS)}
_MONTH_NAMES = {name[:3].lower(): i + 1 for i, name in enumerate(MONTHS)}
_NUMBER = re.compile(r"\d{1,2}")
_STEP = re.compile(r"\*/(\d{1,2})")


def _values(field: str, names: dict[str, int], low: int, high: int) -> list[int] | None:
    """A list/range field's values (``1-5``, ``1,15``, ``mon-fri``), None for anything else."""
    out: list[int] = []
    for part in field.lower().split(","):
        ends = part.split("-")
        if len(ends) > 2:
            return None
        nums = []
        for end in ends:
            if _NUMBER.fullmatch(end):
                nums.append(int(end))
            elif end in names:
                nums.append(names[end])
            else:
                return None
        first, last = nums[0], nums[-1]
        if first > last:
            return None
        out.extend(range(first, last + 1))
    if not out or min(out) < low or max(out) > high:
        return None
    return sorted(set(out))


def _series(values: list[int], words: tuple[str, ...] | None = None, offset: int = 0) -> str:
    """``Monday to Friday``, ``Monday and Thursday``, ``1, 15 and 28``."""
    shown = [words[v - offset] if words else str(v) for v in values]
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{shown[0]} to {shown[-1]}"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + f" and {shown[-1]}"


def _days(dom: str, month: str, dow: str) -> str | None:
    """The day part: ``every day``, ``on Monday to Friday``, ``on day 1 of every month``,
    ``on 1 January``; None when it has no plain reading."""
    if dow != "*" and dom != "*":
        return None  # cron's either-or of the two fields: no plain reading
    months = None if month == "*" else _values(month, _MONTH_NAMES, 1, 12)
    if month != "*" and months is None:
        return None
    in_months = "" if months is None else f" in {_series(months, MONTHS, 1)}"
    if dow != "*":
        days = _values(dow, _NAMES, 0, 7)
        if days is None:
            return None
        days = sorted({d % 7 for d in days})
        return f"on {_series(days, DAYS)}{in_months}"
    if dom == "*":
        return "every day" + in_months
    dates = _values(dom, {}, 1, 31)
    if dates is None:
        return None
    if months is not None and len(months) == 1 and len(dates) == 1:
        return f"on {dates[0]} {MONTHS[months[0] - 1]}"
    noun = "day" if len(dates) == 1 else "days"
    return f"on {noun} {_series(dates)} of " + (
        "every month" if months is None else _series(months, MONTHS, 1)
    )


def _times(minute: str, hour: str) -> str | None:
    """The time part: ``at 03:00``, ``at 09:30 and 17:30``, ``every minute``, ``every 15
    minutes``, ``at minute 15 of every hour``, ``at minute 0 every 6 hours``."""
    minutes = _values(minute, {}, 0, 59) if minute != "*" else None
    hours = _values(hour, {}, 0, 23) if hour != "*" else None
    step_m, step_h = _STEP.fullmatch(minute), _STEP.fullmatch(hour)
    if minutes is not None and hours is not None and len(minutes) * len(hours) <= 4:
        times = [f"{h:02d}:{m:02d}" for h in hours for m in minutes]
        return "at " + _series_text(times)
    if minute == "*" and hour == "*":
        return "every minute"
    if step_m and hour == "*":
        return f"every {int(step_m.group(1))} minutes"
    if minutes is not None and hour == "*":
        return f"at minute {_series(minutes)} of every hour"
    if minutes is not None and step_h:
        return f"at minute {_series(minutes)} every {int(step_h.group(1))} hours"
    if minutes is not None and hours is not None:
        return f"at minute {_series(minutes)} of hours {_series(hours)}"
    return None


def _series_text(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def cron_in_words(expr: str, timezone: str) -> str | None:
    """``at 03:00 every day, Europe/Amsterdam``; None when the expression has no plain
    reading here (the caller shows it as written)."""
    fields = MACROS.get(expr.strip().lower(), expr).split()
    if len(fields) != 5:
        return None
    minute, hour, dom, month, dow = fields
    times, days = _times(minute, hour), _days(dom, month, dow)
    if times is None or days is None:
        return None
    clock_time = times.startswith("at ") and not times.startswith("at minute")
    # "every 5 minutes" says "every day" already; "at 03:00" does not
    text = times if days == "every day" and not clock_time else f"{times} {days}"
    return f"{text}, {timezone}"
