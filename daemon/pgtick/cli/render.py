"""How the command line writes things: aligned tables, JSON documents, instants (UTC ISO 8601,
short table cells, a zone's wall clock), durations and cut-down text. The verbs choose what to
show; these functions decide how it looks, so every verb looks the same.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zoneinfo
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

MIN_FLEX_WIDTH = 10  # a last column narrower than this is left empty ("-")
MIN_CUT_WIDTH = 8  # fit_table cuts a column no narrower than this


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned to their widest cell, two spaces apart, no trailing blanks."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def cutting() -> bool:
    """Whether long values are cut to fit: on a terminal, or when ``COLUMNS`` says a width.
    Output piped elsewhere (``pgtick runs | grep 'disk full'``) keeps every value whole."""
    return "COLUMNS" in os.environ or sys.stdout.isatty()


def flex_width(header: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """What the terminal leaves for one more column after ``rows`` (cells under ``header``);
    0 when that is too little to be readable; no bound when nothing is cut (``cutting``)."""
    if not cutting():
        return sys.maxsize
    fixed = [max(len(line[i]) for line in [header, *rows]) for i in range(len(rows[0]))]
    room = shutil.get_terminal_size().columns - sum(fixed) - 2 * len(fixed)
    return 0 if room < MIN_FLEX_WIDTH else room


def fit_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], cuttable: Sequence[int]
) -> list[tuple[str, ...]]:
    """``rows`` with the ``cuttable`` columns cut, widest first, until the table fits the
    terminal (no column below MIN_CUT_WIDTH); whole when nothing is cut (``cutting``)."""
    if not cutting() or not rows:
        return [tuple(row) for row in rows]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    over = sum(widths) + 2 * (len(widths) - 1) - shutil.get_terminal_size().columns
    while over > 0:
        # One character at a time off the widest cuttable column that may still give one.
        open_ = [i for i in cuttable if widths[i] > max(MIN_CUT_WIDTH, len(header[i]))]
        if not open_:
            break
        widths[max(open_, key=lambda i: widths[i])] -= 1
        over -= 1
    return [tuple(cut(c, widths[i]) for i, c in enumerate(row)) for row in rows]


def print_json(doc: Any) -> None:
    """One JSON document, indented."""
    print(json.dumps(doc, indent=2))


def iso(value: datetime | None, *, whole_seconds: bool = False) -> str | None:
    """An instant as UTC ISO 8601 (None stays None); ``whole_seconds`` for aligned tables."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return (utc.replace(microsecond=0) if whole_seconds else utc).isoformat()


def offset_text(offset: timedelta | None) -> str:
    """A UTC offset the way ISO 8601 writes it: ``+02:00``, ``+05:45``, ``-03:30``."""
    total = round((offset or timedelta(0)).total_seconds())
    hours, rest = divmod(abs(total), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{'-' if total < 0 else '+'}{hours:02d}:{minutes:02d}"
    return f"{text}:{seconds:02d}" if seconds else text


def _wall_clock(local: datetime) -> str:
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({offset_text(local.utcoffset())})"


def local_text(at: datetime, zone: tzinfo) -> str:
    """What a zone's wall clock shows at ``at``: ``2026-10-25 02:30:00 CEST (+02:00)``; the
    offset tells the two passes of a repeated hour apart."""
    return _wall_clock(at.astimezone(zone))


def in_zone(at: datetime, timezone: str) -> str:
    """``local_text`` in a zone given by name; empty for a zone this machine does not know."""
    try:
        local = at.astimezone(zoneinfo.ZoneInfo(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return ""
    return _wall_clock(local)


def local_short(at: datetime, timezone: str) -> str:
    """A table cell on a zone's wall clock (``11-22 09:00 CET``); ``?`` for an unknown zone."""
    try:
        local = at.astimezone(zoneinfo.ZoneInfo(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "?"
    return f"{local:%m-%d %H:%M} {local.tzname()}"


def utc_cell(value: datetime | None, now: datetime) -> str:
    """A table cell in UTC, as precise as it needs to be next to ``now`` (like ``ls -l``):
    ``14:03:07`` today, ``01-05 12:00`` this year, ``2025-12-31`` before."""
    if value is None:
        return "-"
    at, today = value.astimezone(UTC), now.astimezone(UTC)
    if at.date() == today.date():
        return f"{at:%H:%M:%S}"
    if at.year == today.year:
        return f"{at:%m-%d %H:%M}"
    return f"{at:%Y-%m-%d}"


def seconds_text(seconds: float) -> str:
    """Seconds to the millisecond, without trailing zeros: ``1.5s``, ``30s``."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def duration_text(seconds: float) -> str:
    """Short and sortable by eye: 0.25s, 42s, 3m05s, 2h01m, 3d04h."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    whole = round(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def age_text(seconds: float | None) -> str:
    """How long ago, as ``duration_text``; ``-`` for never."""
    return "-" if seconds is None else duration_text(max(0.0, seconds))


def attempts_text(attempts: int, max_attempts: int | None) -> str:
    return f"{attempts}/{'-' if max_attempts is None else max_attempts}"


def one_line(text: str | None) -> str:
    """Text with every run of whitespace, newlines included, as one space."""
    return " ".join((text or "").split())


def cut(text: str, width: int) -> str:
    """At most ``width`` characters, an ellipsis marking a cut (whole when not ``cutting``)."""
    if len(text) <= width or not cutting():
        return text
    return text[: max(0, width - 1)] + "…"


def ids_text(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids) or "-"
