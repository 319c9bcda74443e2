"""What pages are built from besides their templates: times, ages and cuts as an operator reads
them (the templates' filters), links to filtered run lists, the state every page shows
(``Page``), the charts' geometry, and ``render``, which fills a template of
``templates/`` through the one environment ``markup`` builds (autoescaping every value).
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pgtick
from pgtick.storage.store import Attempt, RollupBucket, ScheduleListing
from pgtick.surfaces.console.markup import environment

CHART_WIDTH = 720
CHART_HEIGHT = 120
CHART_TOP_PADDING = 14
CHART_BOTTOM_PADDING = 16

SMALL_WIDTH = 240
SMALL_HEIGHT = 64
SMALL_TOP_PADDING = 12
TIMELINE_WIDTH = 720
TIMELINE_ROW_HEIGHT = 18
TIMELINE_LABEL_WIDTH = 40
TIMELINE_AXIS_HEIGHT = 16

LOGIN_NONE, LOGIN_OUT, LOGIN_IN = "", "out", "in"


def when(at: datetime | None) -> str | None:
    """An instant in UTC, to the second."""
    if at is None:
        return None
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def relative(at: datetime, now: datetime) -> str:
    """How long ago (or from now) ``at`` is, in one rounded unit: ``42 s ago``, ``2 min ago``,
    ``in 3 h``, ``5 d ago``."""
    seconds = (now - at).total_seconds()
    whole = abs(seconds)
    if whole < 60:
        text = f"{whole:.0f} s"
    elif whole < 3600:
        text = f"{whole // 60:.0f} min"
    elif whole < 86400:
        text = f"{whole // 3600:.0f} h"
    else:
        text = f"{whole // 86400:.0f} d"
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def ago(at: datetime | None, now: datetime | None) -> Any:
    """``at`` as an operator reads it at a glance, ``<time title="2026-12-02 03:04:05 UTC">2
    min ago</time>``: relative to the database's ``now``, the exact instant on hover (and in
    ``datetime``); a dash for None, the instant alone when ``now`` is unknown. Escaped markup
    (Markup), for the templates."""
    from markupsafe import Markup, escape

    if at is None:
        return "-"
    exact = f"{when(at)} UTC"
    if now is None:
        return exact
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        escape(at.astimezone(UTC).isoformat()), escape(exact), escape(relative(at, now))
    )


def cron_words(cron: str, timezone: str) -> str | None:
    """A schedule's cron in words (``at 03:00 every day, Europe/Amsterdam``), None when it
    has no plain reading."""
    from pgtick.surfaces.operations import cron_in_words

    return cron_in_words(cron, timezone)


def local(at: datetime, zone: str) -> str:
    """An instant on a zone's wall clock with the zone's abbreviation and offset."""
    from zoneinfo import ZoneInfo

    shown = at.astimezone(ZoneInfo(zone))
    offset = shown.strftime("%z")
    return f"{shown:%Y-%m-%d %H:%M:%S} {shown.tzname()} ({offset[:3]}:{offset[3:]})"


def age(seconds: float | None) -> str | None:
    """A duration as an operator reads it: 42s, 3m 5s, 2h 10m, 3d 4h."""
    if seconds is None:
        return None
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def cut(text: str | None, limit: int) -> str | None:
    """One line of at most ``limit`` characters."""
    if text is None:
        return None
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def dash(value: object) -> object:
    """None shows as a dash."""
    return "-" if value is None else value


def schedule_state(listing: ScheduleListing) -> str:
    if not listing.paused:
        return "active"
    reason = {"removed": "gone from config", "invalid": "invalid", "operator": "operator"}
    why = reason.get(listing.paused_reason or "", listing.paused_reason)
    return f"paused ({why})" if why else "paused"


def query_string(params: Sequence[tuple[str, str]]) -> str:
    return urllib.parse.urlencode(params)


def runs_href(**filters: Any) -> str:
    """A /runs URL with the given filters (lists repeat the key)."""
    params: list[tuple[str, str]] = []
    for key, value in filters.items():
        if value is None or value == "":
            continue
        for one in value if isinstance(value, list | tuple) else [value]:
            params.append((key, str(one)))
    return "/runs" + (f"?{query_string(params)}" if params else "")


def id_ranges(ids: Sequence[int]) -> str:
    """Run ids as a form carries them: ``1-500,503,610-612`` (sorted, runs of consecutive ids
    as ranges), so a confirmation of thousands of neighbouring runs stays a short field."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_id_ranges(text: str, limit: int) -> list[int]:
    """The ids of ``id_ranges``'s text, at most ``limit`` of them; anything else, or more,
    is a ValueError naming what is wrong."""
    ids: list[int] = []
    for part in filter(None, text.split(",")):
        low, dash_, high = part.partition("-")
        digits = (low, high) if dash_ else (low,)
        if not all(d.isascii() and d.isdigit() for d in digits):
            raise ValueError(f"not a run id or range: {part[:40]!r}")
        first, last = int(low), int(high or low)
        if not 0 < first <= last or last - first + len(ids) >= limit:
            raise ValueError(f"more than {limit} run ids, or a backwards range: {part[:40]!r}")
        ids.extend(range(first, last + 1))
    return sorted(set(ids))


@dataclass(frozen=True)
class Page:
    """What every page needs besides its content."""

    actions: bool  # a token is configured and this browser is logged in: show the action forms
    db_now: datetime | None = None
    flash: str | None = None
    csrf: str = ""  # the session's CSRF token, carried by every form
    login: str = LOGIN_NONE  # LOGIN_NONE: no token configured; LOGIN_OUT / LOGIN_IN
    # The ATTENTION items of `pgtick status` (operations.status's problems); None: not known
    # (the database did not answer in time).
    attention: tuple[str, ...] | None = ()
    who: str = ""  # the login: "alice (operator)", "bob (viewer)"
    nonce: str = ""  # the response's CSP nonce: the live-update script runs only with it


@functools.cache
def _environment() -> Any:
    filters: dict[str, Callable[..., Any]] = {
        "when": when,
        "ago": ago,
        "cron_words": cron_words,
        "local": local,
        "age": age,
        "cut": cut,
        "dash": dash,
        "schedule_state": schedule_state,
    }
    names = {"runs_href": runs_href, "query_string": query_string, "version": pgtick.__version__}
    return environment(filters, names)


def render(
    name: str,
    page: Page,
    title: str,
    current: str = "",
    *,
    refresh_seconds: int | None = None,
    live_seconds: float | None = None,
    **context: Any,
) -> str:
    """A page from ``templates/name`` (which extends ``base.html``), every value escaped;
    ``current`` names the navigation entry shown as the current one. ``live_seconds``: the
    page updates its ``data-live`` regions this often (static/live.js); ``refresh_seconds``:
    it reloads itself this often when scripts are off."""
    template = _environment().get_template(name)
    return str(
        template.render(
            page=page,
            title=title,
            current=current,
            refresh_seconds=refresh_seconds,
            live_seconds=live_seconds,
            **context,
        )
    )


@dataclass(frozen=True)
class Bar:
    x: str
    y: str
    width: str
    height: str
    title: str


@dataclass(frozen=True)
class Chart:
    """Succeeded runs per minute as bars, oldest on the left: the geometry of a plain SVG."""

    bars: list[Bar]
    peak: int
    total: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    axis: int = CHART_HEIGHT - CHART_BOTTOM_PADDING
    low: int = CHART_HEIGHT - 3
    right: int = CHART_WIDTH - 2


def chart(per_minute: Sequence[int] | None) -> Chart | None:
    """The throughput chart, or None when the counts could not be read in time."""
    if per_minute is None:
        return None
    peak = max(per_minute, default=0)
    n = max(1, len(per_minute))
    slot = CHART_WIDTH / n
    usable = CHART_HEIGHT - CHART_TOP_PADDING - CHART_BOTTOM_PADDING
    bars = []
    for i, count in enumerate(per_minute):
        height = 0.0 if peak == 0 else usable * count / peak
        minutes_ago = n - 1 - i
        bars.append(
            Bar(
                x=f"{i * slot + 1:.1f}",
                y=f"{CHART_TOP_PADDING + usable - height:.1f}",
                width=f"{max(1.0, slot - 2):.1f}",
                height=f"{height:.1f}",
                title=f"{count} succeeded, {minutes_ago} min ago"
                if minutes_ago
                else f"{count} succeeded, this minute",
            )
        )
    return Chart(bars, peak, sum(per_minute))


@dataclass(frozen=True)
class Span:
    """One attempt on the time line: its row, where it starts and how wide it is."""

    attempt: int
    outcome: str  # succeeded, failed, lost, released, or running
    x: str
    y: str
    width: str
    title: str


@dataclass(frozen=True)
class Timeline:
    """A run's attempts on one time axis, from the first start to the last end (or now), so
    the gaps between them are the waits before each retry."""

    spans: list[Span]
    started: str
    ended: str
    height: int
    width: int = TIMELINE_WIDTH
    label_width: int = TIMELINE_LABEL_WIDTH
    row_height: int = TIMELINE_ROW_HEIGHT


def timeline(attempts: Sequence[Attempt], now: datetime) -> Timeline | None:
    """The time line of ``attempts`` (None without any); a running one ends at ``now``."""
    if not attempts:
        return None
    begin = min(a.started_at for a in attempts)
    end = max([a.finished_at or now for a in attempts] + [begin])
    total = max((end - begin).total_seconds(), 0.001)
    usable = TIMELINE_WIDTH - TIMELINE_LABEL_WIDTH - 4
    spans = []
    for row, a in enumerate(sorted(attempts, key=lambda a: a.attempt)):
        finished = a.finished_at or now
        start = (a.started_at - begin).total_seconds() / total * usable
        width = max(2.0, (finished - a.started_at).total_seconds() / total * usable)
        seconds = (finished - a.started_at).total_seconds()
        outcome = a.outcome or "running"
        spans.append(
            Span(
                attempt=a.attempt,
                outcome=outcome,
                x=f"{TIMELINE_LABEL_WIDTH + start:.1f}",
                y=f"{row * TIMELINE_ROW_HEIGHT + 2}",
                width=f"{min(width, usable - start + 2):.1f}",
                title=f"attempt {a.attempt}: {outcome} after {seconds:.3f}s, "
                f"started {when(a.started_at)} UTC on {a.worker_id}",
            )
        )
    height = len(spans) * TIMELINE_ROW_HEIGHT + TIMELINE_AXIS_HEIGHT
    return Timeline(spans, when(begin) or "", when(end) or "", height)


@dataclass(frozen=True)
class SmallChart:
    """One job type's last hour: succeeded runs per minute as bars, dead ones stacked on top
    in red; ``peak`` is the busiest minute's sum."""

    job_type: str
    succeeded: list[Bar]
    dead: list[Bar]
    total_succeeded: int
    total_dead: int
    peak: int
    width: int = SMALL_WIDTH
    height: int = SMALL_HEIGHT


def _small_bars(
    counts: Sequence[int], peak: int, what: str, below: Sequence[int] | None = None
) -> list[Bar]:
    """Bars for ``counts``, stacked on ``below`` (the same minutes' other counts) if given."""
    slot = SMALL_WIDTH / max(1, len(counts))
    usable = SMALL_HEIGHT - SMALL_TOP_PADDING - 2
    bars = []
    for i, count in enumerate(counts):
        if not count:
            continue
        height = usable * count / peak
        base = usable * (below[i] if below else 0) / peak
        minutes_ago = len(counts) - 1 - i
        when_text = f"{minutes_ago} min ago" if minutes_ago else "this minute"
        bars.append(
            Bar(
                x=f"{i * slot:.1f}",
                y=f"{SMALL_TOP_PADDING + usable - base - height:.1f}",
                width=f"{max(1.0, slot - 0.5):.1f}",
                height=f"{height:.1f}",
                title=f"{count} {what}, {when_text}",
            )
        )
    return bars


def small_charts(
    per_type: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None,
) -> list[SmallChart] | None:
    """The per-job-type charts, by job type name; None when the counts ran out of time."""
    if per_type is None:
        return None
    charts = []
    for job_type in sorted(per_type):
        succeeded, dead = per_type[job_type]
        peak = max([ok + bad for ok, bad in zip(succeeded, dead, strict=True)] + [1])
        charts.append(
            SmallChart(
                job_type,
                _small_bars(succeeded, peak, "succeeded"),
                _small_bars(dead, peak, "dead", below=succeeded),
                sum(succeeded),
                sum(dead),
                peak,
            )
        )
    return charts


@dataclass(frozen=True)
class DepthChart:
    """One job type's queue over the last hour: the runs due and waiting to start at each
    minute as bars, oldest on the left; ``now`` is the newest minute's."""

    job_type: str
    bars: list[Bar]
    peak: int
    now: int
    width: int = SMALL_WIDTH
    height: int = SMALL_HEIGHT


def depth_chart(job_type: str, counts: Sequence[int]) -> DepthChart:
    peak = max(counts, default=0)
    bars = _small_bars(counts, max(peak, 1), "due and waiting")
    return DepthChart(job_type, bars, peak, counts[-1] if counts else 0)


@dataclass(frozen=True)
class TypeCharts:
    """A job type's pictures side by side; a part is None when its read ran out of time."""

    job_type: str
    finished: SmallChart | None
    depth: DepthChart | None


def type_charts(
    finished: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None,
    depth: Mapping[str, Sequence[int]] | None,
) -> list[TypeCharts] | None:
    """Per job type that finished or waited in the window, its finished and depth charts (a
    type missing from one of them shows zeros there); None when both reads ran out of time."""
    if finished is None and depth is None:
        return None
    lengths = [len(ok) for ok, _ in (finished or {}).values()]
    lengths += [len(counts) for counts in (depth or {}).values()]
    zeros = [0] * max(lengths, default=0)
    types = sorted(set(finished or {}) | set(depth or {}))
    small: dict[str, SmallChart] = {}
    if finished is not None:
        filled = {t: finished.get(t, (zeros, zeros)) for t in types}
        small = {c.job_type: c for c in small_charts(filled) or []}
    return [
        TypeCharts(
            t,
            small.get(t),
            None if depth is None else depth_chart(t, depth.get(t, zeros)),
        )
        for t in types
    ]


@dataclass(frozen=True)
class HistoryTotals:
    """A window's sums from the rollups; ``mean`` is the succeeded runs' mean run time."""

    succeeded: int
    failed: int
    lost: int
    dead: int
    cancelled: int
    mean: str | None


@dataclass(frozen=True)
class HistoryChart:
    """A job type's hours over a window (24 hours, 7 days) from the rollups: succeeded runs as
    bars, the attempts that failed or were lost stacked on top in red; ``days`` are the x of
    each UTC midnight inside the window."""

    key: str  # 24h, 7d: the chart's id is chart-KEY
    label: str  # "Last 24 hours"
    since: str  # the left end's label
    succeeded: list[Bar]
    failures: list[Bar]
    days: list[str]
    totals: HistoryTotals
    peak: int
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    axis: int = CHART_HEIGHT - CHART_BOTTOM_PADDING
    low: int = CHART_HEIGHT - 3
    right: int = CHART_WIDTH - 2


def _mean(seconds: float, count: int) -> str | None:
    if not count:
        return None
    mean = seconds / count
    return f"{mean:.2f}s" if mean < 60 else age(mean)


def history_chart(key: str, label: str, since: str, hours: Sequence[RollupBucket]) -> HistoryChart:
    """The chart of ``hours`` (oldest first, one per hour)."""
    n = max(1, len(hours))
    slot = CHART_WIDTH / n
    usable = CHART_HEIGHT - CHART_TOP_PADDING - CHART_BOTTOM_PADDING
    peak = max([h.succeeded + h.failures for h in hours] + [1])
    succeeded: list[Bar] = []
    failures: list[Bar] = []
    days: list[str] = []
    for i, h in enumerate(hours):
        x, width = f"{i * slot:.1f}", f"{max(1.0, slot - 0.5):.1f}"
        if i and h.start.astimezone(UTC).hour == 0:
            days.append(f"{i * slot:.1f}")
        title = (
            f"{h.start.astimezone(UTC):%a %d %b %H:00} UTC: {h.succeeded} succeeded, "
            f"{h.failures} attempts failed or lost, {h.dead} dead"
        )
        ok = usable * h.succeeded / peak
        bad = usable * h.failures / peak
        if h.succeeded:
            y = f"{CHART_TOP_PADDING + usable - ok:.1f}"
            succeeded.append(Bar(x, y, width, f"{ok:.1f}", title))
        if h.failures:
            y = f"{CHART_TOP_PADDING + usable - ok - bad:.1f}"
            failures.append(Bar(x, y, width, f"{bad:.1f}", title))
    done = sum(h.succeeded for h in hours)
    totals = HistoryTotals(
        succeeded=done,
        failed=sum(h.failed for h in hours),
        lost=sum(h.lost for h in hours),
        dead=sum(h.dead for h in hours),
        cancelled=sum(h.cancelled for h in hours),
        mean=_mean(sum(h.run_seconds for h in hours), done),
    )
    return HistoryChart(key, label, since, succeeded, failures, days, totals, peak)
