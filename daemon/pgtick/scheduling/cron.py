"""Occurrences of a cron expression in an IANA time zone, as UTC instants.

The single source of truth for "when does this schedule fire": the ticker materializes runs with
it and ``pgtick schedules next`` prints with it, so the two can never disagree. Pure: no I/O and
no clock; every instant is passed in.

croniter does only the calendar arithmetic, on naive wall-clock times. Turning a wall-clock time
into instants is done here, because croniter's own time-zone mode skips the second pass of a
repeated hour when the clock moves back by other than a whole hour (``*/10 * * * *`` in
Australia/Lord_Howe loses 01:30-01:50 the second time round) and returns both passes of a
fixed-time schedule. The rules:

- a wall-clock time that falls in a spring-forward gap fires once, at the end of the gap, for a
  fixed-time schedule (Vixie cron: neither minute nor hour field starts with ``*``); a wildcard
  schedule has no occurrence inside the gap at all (Debian's cron treats both kinds this way,
  so ``30 2 * * *`` runs at 03:00 and ``*/10 2 * * *`` skips the day);
- a wall-clock time that happens twice fires at both instants, except that a fixed-time schedule
  (Vixie cron: neither minute nor hour field starts with ``*``) fires at the first only;
- instants are compared and deduplicated in UTC only.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

from croniter import CroniterBadDateError, CroniterError, croniter

from pgtick.errors import ScheduleError

# Expanded here rather than by croniter: given a hash_id (which H needs), croniter turns
# "@daily" into a hashed time of day with a hashed seconds field.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
CRON_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
CRON_FIELD_COUNT = len(CRON_FIELD_NAMES)
FIVE_FIELDS_HINT = "pgtick takes 5 (minute hour day month weekday)"

# The largest single change of a zone's UTC offset we allow for when looking back for the second
# pass of a repeated hour (real zones change by at most two hours at once).
MAX_CLOCK_CHANGE_HOURS = 3
# How far latest_at_or_before looks back: croniter's own horizon for "no match".
SEARCH_WINDOW_YEARS = 50
# latest_at_or_before scans windows of 64 min, 8.5 h, 2.8 d, ... back until one holds an occurrence.
LATEST_FIRST_WINDOW_MINUTES = 64
LATEST_WINDOW_GROWTH = 8
# A jittered run_at stays at least this far before the next occurrence, when the gap allows.
JITTER_MARGIN_SECONDS = 1.0

_ONE_MINUTE = timedelta(minutes=1)
_SEARCH_WINDOW = timedelta(days=366 * SEARCH_WINDOW_YEARS)
# CronCache asks croniter again at least this often, however rare the occurrences.
CACHE_RECHECK = timedelta(days=1)
_MAX_UTC = datetime.max.replace(tzinfo=UTC)
_MIN_UTC = datetime.min.replace(tzinfo=UTC)
# Same split as croniter: ASCII whitespace only (a no-break space is not a field separator).
_FIELD_SPLIT_RE = re.compile(r"\S+", re.ASCII)
# croniter's R (random) syntax: a new value at every parse, i.e. at every daemon restart.
# "5-5" or "mon-mon/2": croniter reads a range with equal ends as the whole field.
_SAME_ENDS_RE = re.compile(r"^(\w+)-(\w+)(/\d+)?$", re.ASCII)
_RANDOM_RE = re.compile(r"^r(\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE | re.ASCII)
# croniter echoes the expression in its messages: "[61 * * * *] is not acceptable, out of range".
_CRONITER_ECHO_RE = re.compile(r"^\[[^\]]*\]\s*(is not acceptable)?[\s,.:]*")
_FIELD_INDEX_RE = re.compile(r" in field \d+")


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``, or ScheduleError; the message leaves naming the key to the caller.

    Zones that differ between hosts are refused too: occurrences must be the same everywhere.
    """
    if name == "localtime":
        raise ScheduleError("'localtime' is this host's zone, not an IANA name; name the zone")
    if name.startswith("right/"):
        raise ScheduleError(f"time zone {name!r} counts leap seconds; use {name[6:]!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: empty, absolute or "../" keys; OSError: a directory such as "America".
        raise ScheduleError(f"unknown time zone {name!r}") from None


def validate_cron(expr: str, name: str) -> None:
    """Refuse, with a one-line reason, any expression pgtick does not run."""
    _compile(expr, name)


def _compile(expr: str, name: str) -> str:
    """The expression as five fields (macros expanded), after every check of validate_cron."""
    text = expr.strip()
    if not text:
        raise ScheduleError(f"empty cron expression: {FIVE_FIELDS_HINT}, or @daily etc.")
    fields = _FIELD_SPLIT_RE.findall(_expand_macro(text) if text.startswith("@") else text)
    count = len(fields)
    if count == 6:
        raise ScheduleError(f"6 fields: {FIVE_FIELDS_HINT}; croniter would read the 6th as seconds")
    if count == 7:
        raise ScheduleError(
            f"7 fields: {FIVE_FIELDS_HINT}; croniter would read the 6th as seconds "
            "and the 7th as the year"
        )
    if count != CRON_FIELD_COUNT:
        raise ScheduleError(f"{count} field{'s' if count != 1 else ''}: {FIVE_FIELDS_HINT}")
    for field_name, value in zip(CRON_FIELD_NAMES, fields, strict=True):
        for item in value.split(","):
            same = _SAME_ENDS_RE.match(item)
            if same and same.group(1).lower() == same.group(2).lower():
                raise ScheduleError(
                    f"{field_name} field {item!r}: a range with equal ends means the whole "
                    f"field to croniter (every value), not just {same.group(1)}; "
                    f"write {same.group(1)}"
                )
        if any(_RANDOM_RE.match(item) for item in value.split(",")):
            raise ScheduleError(
                f"R in the {field_name} field is not supported: it picks a new random value at "
                "every restart; use H, which is hashed on the schedule name and stays put"
            )
    five = " ".join(fields)
    hash_id = name.encode()
    try:
        croniter.expand(five, hash_id=hash_id, strict=True)
    except CroniterError as exc:
        raise ScheduleError(_explain_refusal(five, fields, hash_id, exc)) from None
    try:
        croniter(five, datetime(2000, 1, 1), hash_id=hash_id).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError(
            f"cron expression {five!r} never fires (no match within {SEARCH_WINDOW_YEARS} years)"
        ) from None
    return five


def _expand_macro(text: str) -> str:
    macro = text.lower()
    if macro == "@reboot":
        raise ScheduleError("@reboot is not supported: pgtick has no notion of boot")
    five = MACROS.get(macro)
    if five is None:
        raise ScheduleError(
            f"unknown macro {text!r}: use @hourly, @daily, @weekly, @monthly or @yearly, "
            "or five fields"
        )
    return five


def _explain_refusal(five: str, fields: list[str], hash_id: bytes, exc: CroniterError) -> str:
    """Name the field croniter refused when one field alone is the problem."""
    for index, value in enumerate(fields):
        probe = ["*"] * CRON_FIELD_COUNT
        probe[index] = value
        try:
            croniter.expand(" ".join(probe), hash_id=hash_id, strict=True)
        except CroniterError as field_exc:
            reason = _croniter_reason(field_exc)
            return f"{CRON_FIELD_NAMES[index]} field {value!r}: {reason}"
    return f"cron expression {five!r} refused: {_croniter_reason(exc)}"


def _croniter_reason(exc: CroniterError) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = _CRONITER_ECHO_RE.sub("", lines[-1] if lines else "")
    # Drop croniter's internals: "step '0' in field 0 ...", "...syntax.  Cron: '...' dow={3}".
    reason = _FIELD_INDEX_RE.sub("", reason)
    reason = reason.split("  ", 1)[0].rstrip(".")
    if not reason or reason.endswith("out of bands"):
        # "is not acceptable" alone (an unknown name), or croniter's word for out of range.
        return "out of range" if reason else "not a number, range, step or known name"
    return reason


@dataclass(frozen=True)
class Cron:
    """A validated cron expression in a time zone; H is hashed on ``name``."""

    expr: str
    timezone: str = "UTC"
    name: str = ""
    _five: str = field(init=False, repr=False, compare=False)
    _zone: zoneinfo.ZoneInfo = field(init=False, repr=False, compare=False)
    _hash_id: bytes = field(init=False, repr=False, compare=False)
    _fixed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        five = _compile(self.expr, self.name)
        minute, hour = five.split()[:2]
        object.__setattr__(self, "_zone", load_zone(self.timezone))
        object.__setattr__(self, "_five", five)
        object.__setattr__(self, "_hash_id", self.name.encode())
        object.__setattr__(self, "_fixed", not minute.startswith("*") and not hour.startswith("*"))

    @classmethod
    def parse(cls, expr: str, timezone: str = "UTC", name: str = "") -> Cron:
        """Validate both the expression and the zone; ScheduleError says which and why."""
        return cls(expr, timezone, name)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The schedule's time zone, for showing occurrences in local time."""
        return self._zone

    @property
    def fixed_time(self) -> bool:
        """Vixie cron's rule: a repeated wall-clock time fires only at its first instance, and
        a wall-clock time in a spring-forward gap fires at the end of the gap (a wildcard
        schedule does neither)."""
        return self._fixed

    def occurrences(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """UTC instants t with after < t <= until, strictly increasing."""
        start = _as_utc(after, "after")
        stop = _as_utc(until, "until")
        return self._occurrences(start, stop)

    def next_after(self, after: datetime) -> datetime:
        """The first occurrence after ``after``; ScheduleError if croniter finds none."""
        for instant in self._occurrences(_as_utc(after, "after"), _MAX_UTC):
            return instant
        raise ScheduleError(f"cron {self.expr!r} does not fire after {after.isoformat()}")

    def latest_at_or_before(self, at: datetime) -> datetime | None:
        """The most recent occurrence <= at (catch-up "latest"), within SEARCH_WINDOW_YEARS."""
        end = _as_utc(at, "at")
        newer = end
        width = timedelta(minutes=LATEST_FIRST_WINDOW_MINUTES)
        while True:
            older = _shift(end, -width)
            found = self._first_in(older, newer)
            if found is not None:
                return self._last_in(found, newer)
            if width >= _SEARCH_WINDOW or older <= _MIN_UTC:
                return None
            newer = older
            width = min(width * LATEST_WINDOW_GROWTH, _SEARCH_WINDOW)

    def next_n(self, start: datetime, count: int) -> list[datetime]:
        """The first ``count`` occurrences after ``start`` (``pgtick schedules next``)."""
        if count < 0:
            raise ValueError("count must be >= 0")
        return list(islice(self._occurrences(_as_utc(start, "start"), _MAX_UTC), count))

    def _first_in(self, after: datetime, until: datetime) -> datetime | None:
        return next(self._occurrences(after, until), None)

    def _last_in(self, known: datetime, until: datetime) -> datetime:
        """The last occurrence <= until, given ``known``, one of them: bisect, because the span
        can hold years of every-minute occurrences (``* * 29 2 *``)."""
        best, high = known, until
        # Invariant: best is an occurrence and none lies in (high, until].
        while (following := self._first_in(best, high)) is not None:
            best = following
            middle = best + (high - best) / 2
            probe = self._first_in(middle, high)
            if probe is None:
                high = middle
            else:
                best = probe
        return best

    def _occurrences(self, start: datetime, stop: datetime) -> Iterator[datetime]:
        last = start
        for instant in self._instants_in_order(start):
            if instant > stop:
                return
            if instant > last:  # deduplicate, in UTC
                last = instant
                yield instant

    def _instants_in_order(self, start: datetime) -> Iterator[datetime]:
        """Every firing instant of the wall times from ``_first_wall(start)`` on, in UTC order.

        Wall times come in increasing order and so do their first instants, but the second
        pass of a repeated hour comes after later wall times' first instants: a small heap
        holds those back until their turn. Equal instants may come out twice.
        """
        pending: list[datetime] = []
        try:
            for wall in self._walls(self._first_wall(start)):
                first, second = self._instants(wall)
                if first is None:
                    continue
                heapq.heappush(pending, first)
                if second is not None:
                    heapq.heappush(pending, second)
                # Nothing later can come before ``first``: later wall times start no earlier.
                while pending and pending[0] <= first:
                    yield heapq.heappop(pending)
        except OverflowError:
            pass  # the end of datetime's calendar (year 9999): nothing further is representable
        while pending:
            yield heapq.heappop(pending)

    def _first_wall(self, start: datetime) -> datetime:
        """A wall-clock time early enough that no wall time before it has an instant > start.

        Normally the local time of ``start``; when the clock is about to go back, the second
        pass of the repeated hour belongs to wall times before it, so go back by the change.
        """
        offsets = [
            _offset(self._zone, _shift(start, timedelta(hours=hours)))
            for hours in range(MAX_CLOCK_CHANGE_HOURS + 1)
        ]
        try:
            return start.replace(tzinfo=None) + min(offsets) - _ONE_MINUTE
        except OverflowError:
            return datetime.min

    def _walls(self, before: datetime) -> Iterator[datetime]:
        """Naive wall-clock times matching the expression, strictly after ``before``."""
        it = croniter(self._five, before, hash_id=self._hash_id)
        while True:
            try:
                wall: datetime = it.get_next(datetime)
            except ValueError:
                # CroniterBadDateError: no match within croniter's horizon; plain ValueError:
                # croniter stepped past year 9999.
                return
            yield wall

    def _instants(self, wall: datetime) -> tuple[datetime | None, datetime | None]:
        """The UTC instants at which wall-clock time ``wall`` fires: none, one, or two."""
        zone = self._zone
        local = wall.replace(tzinfo=zone)  # fold=0: the first instance of a repeated time
        first = local.astimezone(UTC)
        if first.astimezone(zone).replace(tzinfo=None) != wall:
            # In a spring-forward gap: this wall time never shows on the clock.
            return (_gap_end(zone, wall), None) if self._fixed else (None, None)
        if self._fixed:
            return first, None
        repeat = wall.replace(tzinfo=zone, fold=1)
        if repeat.utcoffset() == local.utcoffset():
            return first, None
        return first, repeat.astimezone(UTC)


class CronCache:
    """A schedule's latest occurrence by a time and its next after one, computed again only
    when the time leaves the span the last answer holds for (between two occurrences): the
    metrics ask both at every read of the database, and croniter takes about a millisecond a
    call (ten schedules: 11 ms of a scrape). Answers as ``Cron`` does, at any time given."""

    def __init__(self, cron: Cron) -> None:
        self.cron = cron
        self._latest: tuple[datetime, datetime, datetime | None] | None = None  # from, until
        self._next: tuple[datetime, datetime | None] | None = None  # from, the answer

    def latest_at_or_before(self, at: datetime) -> datetime | None:
        """``Cron.latest_at_or_before``: the answer holds from that occurrence (or from ``at``
        when there is none) until the next, and at most CACHE_RECHECK."""
        at = _as_utc(at, "at")
        if self._latest is not None:
            start, until, value = self._latest
            if start <= at < until:
                return value
        value = self.cron.latest_at_or_before(at)
        start = at if value is None else value
        following = self._next_after(start)
        until = start + CACHE_RECHECK
        if following is not None:
            until = min(until, following)
        self._latest = (start, until, value)
        return value

    def next_after(self, at: datetime) -> datetime | None:
        """``Cron.next_after``, None for a cron that never fires again: the answer holds from
        the time it was asked for until it."""
        at = _as_utc(at, "at")
        if self._next is not None:
            start, value = self._next
            if start <= at and (value is None or at < value):
                return value
        value = self._next_after(at)
        self._next = (at, value)
        return value

    def _next_after(self, at: datetime) -> datetime | None:
        try:
            return self.cron.next_after(at)
        except ScheduleError:
            return None


def _gap_end(zone: zoneinfo.ZoneInfo, wall: datetime) -> datetime:
    """The instant the clock jumps over ``wall`` (a time in a gap): the end of the gap."""
    # PEP 495: in a gap, fold=1 uses the offset after the change (an instant before it) and
    # fold=0 the offset before (an instant after it); bisect between them to the second.
    low = math.floor(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = math.ceil(wall.replace(tzinfo=zone, fold=0).timestamp())
    offset_after = _offset(zone, datetime.fromtimestamp(high, UTC))
    while high - low > 1:
        middle = (low + high) // 2
        if _offset(zone, datetime.fromtimestamp(middle, UTC)) == offset_after:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _offset(zone: zoneinfo.ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    if offset is None:  # pragma: no cover - a ZoneInfo always has an offset
        raise ValueError(f"zone {zone.key} has no UTC offset")
    return offset


def _shift(instant: datetime, delta: timedelta) -> datetime:
    """instant + delta, clamped to datetime's range."""
    try:
        return instant + delta
    except OverflowError:
        return _MAX_UTC if delta > timedelta(0) else _MIN_UTC


def _as_utc(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got naive {value.isoformat()}")
    return value.astimezone(UTC)


def jitter_offset(
    name: str, occurrence: datetime, jitter_seconds: float, next_occurrence: datetime
) -> float:
    """Seconds to delay one occurrence's run_at: a hash, so every daemon picks the same delay.

    0 <= offset <= jitter_seconds, and the jittered run_at stays before the next occurrence
    (by JITTER_MARGIN_SECONDS when the gap allows).
    """
    if not math.isfinite(jitter_seconds) or jitter_seconds < 0:
        raise ValueError(f"jitter must be a finite number of seconds >= 0, got {jitter_seconds}")
    this = _as_utc(occurrence, "occurrence")
    gap_seconds = (_as_utc(next_occurrence, "next_occurrence") - this).total_seconds()
    if gap_seconds <= 0:
        raise ValueError("next_occurrence must be after occurrence")
    if gap_seconds > 2 * JITTER_MARGIN_SECONDS:
        cap = min(jitter_seconds, gap_seconds - JITTER_MARGIN_SECONDS)
    else:
        cap = min(jitter_seconds, gap_seconds / 2)
    key = json.dumps([name, this.isoformat()]).encode()
    digest = hashlib.blake2b(key, digest_size=8, person=b"pgtick-jitter").digest()
    # 53 bits: exactly representable as a float, so the fraction is < 1.
    fraction = (int.from_bytes(digest, "big") >> 11) / float(1 << 53)
    return fraction * cap
