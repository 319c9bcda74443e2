"""The pieces pages are built from: times, ages, status badges, links to filtered run lists,
the action forms, the page layout and the throughput chart. All output goes through
``markup`` (escaped unless already ``Html``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pgtick
from pgtick.surfaces.console.markup import Html, esc, join, render, tag

CHART_WIDTH = 720
CHART_HEIGHT = 120
CHART_TOP_PADDING = 14
CHART_BOTTOM_PADDING = 16


def when(at: datetime | None) -> str | None:
    """An instant in UTC, to the second."""
    if at is None:
        return None
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


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


def status_badge(status: str | None) -> Html:
    if status is None:
        return esc(None)
    return tag('<span class="status status-$s">$s</span>', s=status)


def cut(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


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


LOGIN_NONE, LOGIN_OUT, LOGIN_IN = "", "out", "in"


@dataclass(frozen=True)
class Page:
    """What every page needs besides its content."""

    actions: bool  # a token is configured and this browser is logged in: show the action forms
    db_now: datetime | None = None
    flash: str | None = None
    csrf: str = ""  # the session's CSRF token, carried by every form
    login: str = LOGIN_NONE  # LOGIN_NONE: no token configured; LOGIN_OUT / LOGIN_IN


def _login_block(page: Page) -> Html:
    if page.login == LOGIN_IN:
        return tag(
            '<form method="post" action="/logout" class="logout">'
            '<input type="hidden" name="csrf" value="$csrf">'
            '<button type="submit" id="logout">Log out</button></form>',
            csrf=page.csrf,
        )
    if page.login == LOGIN_OUT:
        return Html('<a href="/login" id="login-link">Log in</a>')
    return Html("")


def layout(
    page: Page, title: str, current: str, content: Html, *, refresh_seconds: int | None = None
) -> str:
    nav = {f"nav_{name}": Html("") for name in ("overview", "runs", "schedules")}
    if current:
        nav[f"nav_{current}"] = Html(' class="current" aria-current="page"')
    flash = Html("")
    if page.flash:
        flash = tag('<p class="flash" role="status" id="flash">$m</p>\n', m=page.flash)
    refresh = Html("")
    if refresh_seconds is not None:
        refresh = tag('<meta http-equiv="refresh" content="$s">\n', s=refresh_seconds)
    mode = {LOGIN_IN: "actions enabled", LOGIN_OUT: "read-only (log in to act)"}
    return render(
        "base.html",
        title=title,
        refresh=refresh,
        flash=flash,
        content=content,
        mode=mode.get(page.login, "read-only"),
        login=_login_block(page),
        version=pgtick.__version__,
        db_now=f"{when(page.db_now)} UTC" if page.db_now else "-",
        **nav,
    )


def action_form(
    page: Page, action: str, fields: Mapping[str, object], label: str, *, danger: bool = False
) -> Html:
    """A POST form for one action: the hidden target fields, the session's CSRF token, a
    button (the session cookie is the credential)."""
    hidden = join(
        tag('<input type="hidden" name="$n" value="$v">', n=name, v=value)
        for name, value in {**fields, "csrf": page.csrf}.items()
    )
    return tag(
        '<form method="post" action="/actions/$action" class="action-$action">$hidden'
        '<button type="submit" class="$cls">$label</button></form>',
        action=action,
        hidden=hidden,
        label=label,
        cls="danger" if danger else "",
    )


def actions_block(forms: Sequence[Html]) -> Html:
    if not forms:
        return Html("")
    return Html('<div class="actions">' + "".join(forms) + "</div>")


def chart_svg(per_minute: Sequence[int] | None) -> Html:
    """Succeeded runs per minute as bars, oldest on the left; plain SVG, no script."""
    if per_minute is None:
        return Html('<p class="empty">Not available: the query ran out of time.</p>')
    peak = max(per_minute, default=0)
    n = max(1, len(per_minute))
    slot = CHART_WIDTH / n
    usable = CHART_HEIGHT - CHART_TOP_PADDING - CHART_BOTTOM_PADDING
    bars = []
    for i, count in enumerate(per_minute):
        height = 0.0 if peak == 0 else usable * count / peak
        minutes_ago = n - 1 - i
        bars.append(
            tag(
                '<rect class="bar" x="$x" y="$y" width="$w" height="$h"><title>$t</title></rect>',
                x=f"{i * slot + 1:.1f}",
                y=f"{CHART_TOP_PADDING + usable - height:.1f}",
                w=f"{max(1.0, slot - 2):.1f}",
                h=f"{height:.1f}",
                t=f"{count} succeeded, {minutes_ago} min ago"
                if minutes_ago
                else f"{count} succeeded, this minute",
            )
        )
    total = sum(per_minute)
    return tag(
        '<svg class="chart" id="throughput" viewBox="0 0 $w $h" role="img" '
        'aria-label="$label" xmlns="http://www.w3.org/2000/svg">'
        '<text x="2" y="10">peak $peak/min</text>$bars'
        '<line class="axis" x1="0" y1="$axis" x2="$w" y2="$axis"></line>'
        '<text x="2" y="$low">-60 min</text><text x="$right" y="$low" text-anchor="end">now</text>'
        "</svg>"
        '<p class="muted" id="throughput-total">$total succeeded in the last hour</p>',
        w=CHART_WIDTH,
        h=CHART_HEIGHT,
        label=f"{total} runs succeeded in the last hour, at most {peak} in one minute",
        peak=peak,
        bars=Html("".join(bars)),
        axis=CHART_HEIGHT - CHART_BOTTOM_PADDING,
        low=CHART_HEIGHT - 3,
        right=CHART_WIDTH - 2,
        total=total,
    )
