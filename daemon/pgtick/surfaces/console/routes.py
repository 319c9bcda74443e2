"""The web console: server-rendered pages over ``operations``, the same facts as the CLI.

Pages are ``string.Template`` files shipped in ``templates/`` whose every placeholder is
filled through ``esc`` (``html.escape`` with quotes), so a payload or an error holding markup
shows as text; only ``Html`` values, built here from escaped parts, go in unescaped. No
JavaScript: the overview refreshes with ``<meta http-equiv=refresh>``, and the Content-Security-
Policy forbids scripts outright.

Actions (retry, cancel, trigger, pause, resume) are POSTs carrying the token from
``web.token_file`` as a form field or ``Authorization: Bearer``; there are no cookies, so a
forged cross-site request has no credential to ride on, and a POST whose ``Origin`` or
``Sec-Fetch-Site`` says it came from elsewhere is refused anyway. Reads run in a read-only
transaction with a statement timeout, on the console's own small pool.
"""

from __future__ import annotations

import functools
import hmac
import html
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from importlib import resources
from string import Template
from typing import Any

import structlog

import pgtick
from pgtick.errors import DatabaseError, NotFoundError, PgtickError, UsageError
from pgtick.storage.store import STATUSES, Attempt, RunStore, RunSummary, ScheduleListing
from pgtick.surfaces import operations
from pgtick.surfaces.http import Handler, Request, Response, see_other
from pgtick.surfaces.http import html as html_response

READ_TIMEOUT_SECONDS = 2.0  # one page's statements; the runs page answers in milliseconds
POOL_TIMEOUT_SECONDS = 2.0
OVERVIEW_REFRESH_SECONDS = 5
PAGE_SIZE = 50
UPCOMING_COUNT = 5
ERROR_CELL_CHARS = 120  # a run's last error in the listing; the detail page shows it whole
FLASH_CHARS = 300
CHART_WIDTH = 720
CHART_HEIGHT = 120
CHART_TOP_PADDING = 14
CHART_BOTTOM_PADDING = 16

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}

log = structlog.get_logger("pgtick.console")


# -- escaping and templates ----------------------------------------------------------------------


class Html(str):
    """Markup that is already safe: built from templates and escaped values only."""

    __slots__ = ()


def esc(value: object) -> Html:
    """``value`` as HTML text (quotes too, so it is safe in a quoted attribute); ``Html``
    passes through unchanged, None shows as a dash."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("-")
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[object], sep: str = "\n") -> Html:
    """Escaped parts joined by a separator (a literal, not data)."""
    return Html(sep.join(esc(p) for p in parts))


def tag(template: str, **values: object) -> Html:
    """A small inline template (a literal in this module) with every value escaped."""
    return Html(Template(template).substitute({k: esc(v) for k, v in values.items()}))


@functools.cache
def _template(name: str) -> Template:
    text = resources.files(__package__).joinpath("templates", name).read_text("utf-8")
    return Template(text)


def render(name: str, /, **values: object) -> Html:
    """A template file from ``templates/`` with every value escaped (``Html`` as is)."""
    return Html(_template(name).substitute({k: esc(v) for k, v in values.items()}))


@functools.cache
def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


# -- small formatting helpers --------------------------------------------------------------------


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


# -- page context and layout ---------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """What every page needs besides its content."""

    actions: bool  # a token is configured: show the action forms
    db_now: datetime | None = None
    flash: str | None = None


def layout(
    page: Page, title: str, current: str, content: Html, *, refresh_seconds: int | None = None
) -> str:
    nav = {f"nav_{name}": Html("") for name in ("overview", "runs", "schedules")}
    nav[f"nav_{current}"] = Html(' class="current" aria-current="page"')
    flash = Html("")
    if page.flash:
        flash = tag('<p class="flash" role="status" id="flash">$m</p>\n', m=page.flash)
    refresh = Html("")
    if refresh_seconds is not None:
        refresh = tag('<meta http-equiv="refresh" content="$s">\n', s=refresh_seconds)
    mode = "actions enabled (token)" if page.actions else "read-only"
    return render(
        "base.html",
        title=title,
        refresh=refresh,
        flash=flash,
        content=content,
        mode=mode,
        version=pgtick.__version__,
        db_now=f"{when(page.db_now)} UTC" if page.db_now else "-",
        **nav,
    )


def action_form(
    action: str, fields: Mapping[str, object], label: str, *, danger: bool = False
) -> Html:
    """A POST form for one action: the hidden target fields, a token field, a button. The
    token is typed (or filled in by a password manager), never written into the page."""
    hidden = join(
        tag('<input type="hidden" name="$n" value="$v">', n=name, v=value)
        for name, value in fields.items()
    )
    return tag(
        '<form method="post" action="/actions/$action" class="action-$action">$hidden'
        '<input type="password" name="token" placeholder="token" required '
        'autocomplete="current-password" aria-label="token for $label">'
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


# -- the pages -----------------------------------------------------------------------------------


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


def _schedule_state(listing: ScheduleListing) -> str:
    if not listing.paused:
        return "active"
    reason = {"removed": "gone from config", "invalid": "invalid", "operator": "operator"}
    why = reason.get(listing.paused_reason or "", listing.paused_reason)
    return f"paused ({why})" if why else "paused"


def _last_run(listing: ScheduleListing) -> Html:
    if listing.last_status is None:
        return esc(None)
    at = when(listing.last_scheduled_for) or "(triggered)"
    return Html(f"{status_badge(listing.last_status)} {esc(at)}")


def overview_page(ov: operations.Overview, page: Page) -> str:
    rows = []
    for t in ov.job_types:
        s = t.stats
        rows.append(
            tag(
                '<tr data-job-type="$name"><td><a href="$href">$name</a></td>'
                '<td class="num due">$due</td><td class="num">$oldest</td>'
                '<td class="num">$scheduled</td><td class="num running">$running</td>'
                '<td class="num stuck$stuck_cls">$stuck</td>'
                '<td class="num retry">$retry</td>'
                '<td class="num dead"><a href="$dead_href">$dead</a></td>'
                '<td class="num$unserved">$live</td></tr>',
                name=s.job_type,
                href=runs_href(type=s.job_type),
                due=s.due,
                oldest=age(s.oldest_due_seconds),
                scheduled=s.scheduled,
                running=s.running,
                stuck=s.stuck,
                stuck_cls=" attention" if s.stuck else "",
                retry=s.awaiting_retry,
                dead=s.dead_recent,
                dead_href=runs_href(status="dead", type=s.job_type),
                live=t.live_workers,
                unserved=" attention" if t.unserved else "",
            )
        )
    if not rows:
        rows.append(
            Html(
                '<tr><td colspan="9" class="empty">'
                "No queued, running or recently dead runs.</td></tr>"
            )
        )
    workers = [
        tag(
            '<tr><td><code>$id</code></td><td>$host</td><td class="num">$pid</td>'
            '<td>$version</td><td class="num">$busy / $threads</td><td>$types</td>'
            '<td class="$cls">$beat ago$stale</td></tr>',
            id=w.worker.id,
            host=w.worker.hostname,
            pid=w.worker.pid,
            version=w.worker.version,
            busy=w.worker.busy,
            threads=w.worker.threads,
            types=", ".join(w.worker.job_types) or "-",
            beat=age(w.worker.heartbeat_age_seconds),
            cls="stale" if w.stale else "",
            stale=" (stale)" if w.stale else "",
        )
        for w in ov.workers
    ] or [Html('<tr><td colspan="7" class="empty">No live daemons.</td></tr>')]
    schedules = [
        tag(
            '<tr><td><a href="/schedules#schedule-$name">$name</a></td><td>$type</td>'
            "<td>$state</td><td>$next</td><td>$last</td><td>$ok</td></tr>",
            name=v.listing.name,
            type=v.listing.job_type,
            state=_schedule_state(v.listing),
            next=when(v.upcoming[0]) if v.upcoming else None,
            last=_last_run(v.listing),
            ok=when(v.listing.last_success_at),
        )
        for v in ov.schedules
    ] or [Html('<tr><td colspan="6" class="empty">No schedules.</td></tr>')]
    content = render(
        "overview.html",
        job_type_rows=Html("\n".join(rows)),
        chart=chart_svg(ov.succeeded_per_minute),
        worker_rows=Html("\n".join(workers)),
        schedule_rows=Html("\n".join(schedules)),
    )
    return layout(page, "Overview", "overview", content, refresh_seconds=OVERVIEW_REFRESH_SECONDS)


@dataclass(frozen=True)
class RunFilters:
    statuses: list[str]
    job_type: str | None
    schedule: str | None
    before: int | None

    def href(self, before: int | None = None) -> str:
        return runs_href(
            status=self.statuses, type=self.job_type, schedule=self.schedule, before=before
        )


def runs_page(page_rows: operations.RunPage, filters: RunFilters, page: Page) -> str:
    boxes = join(
        tag(
            '<label><input type="checkbox" name="status" value="$s"$checked> $s</label>',
            s=status,
            checked=Html(" checked") if status in filters.statuses else Html(""),
        )
        for status in STATUSES
    )
    links = join(
        (
            tag(
                '<a href="$href" class="status-link" data-status="$s">$s</a>',
                s=s,
                href=runs_href(status=s, type=filters.job_type, schedule=filters.schedule),
            )
            for s in STATUSES
        ),
        " ",
    )
    rows = [_run_row(r) for r in page_rows.runs] or [
        Html('<tr><td colspan="8" class="empty">No runs match.</td></tr>')
    ]
    pager = []
    if filters.before is not None:
        pager.append(tag('<a href="$h" id="newest">« Newest</a>', h=filters.href()))
    if page_rows.next_before is not None:
        older = filters.href(page_rows.next_before)
        pager.append(tag('<a href="$h" id="older">Older »</a>', h=older))
    content = render(
        "runs.html",
        status_boxes=boxes,
        job_type=filters.job_type or "",
        schedule=filters.schedule or "",
        status_links=links,
        run_rows=Html("\n".join(rows)),
        pager=Html(" ".join(pager)),
    )
    return layout(page, "Runs", "runs", content)


def _run_row(r: RunSummary) -> Html:
    return tag(
        '<tr data-run-id="$id"><td class="num"><a href="/runs/$id">$id</a></td><td>$type</td>'
        '<td>$status</td><td class="num">$attempts</td><td>$run_at</td><td>$finished</td>'
        "<td>$schedule</td><td>$error</td></tr>",
        id=r.id,
        type=r.job_type,
        status=status_badge(r.status),
        attempts=f"{r.attempts}/{r.max_attempts}" if r.max_attempts else r.attempts,
        run_at=when(r.run_at),
        finished=when(r.finished_at),
        schedule=r.schedule,
        error=cut(r.last_error, ERROR_CELL_CHARS),
    )


def _attempt_rows(attempts: Sequence[Attempt]) -> Html:
    if not attempts:
        return Html('<p class="empty">No attempts yet.</p>')
    rows = []
    for a in attempts:
        seconds = None if a.finished_at is None else (a.finished_at - a.started_at).total_seconds()
        detail = Html("")
        if a.error:
            detail = tag(
                '<tr class="attempt-error"><td colspan="6"><pre>$e</pre></td></tr>', e=a.error
            )
        rows.append(
            tag(
                '<tr class="attempt" data-attempt="$n"><td class="num">$n</td>'
                "<td><code>$worker</code></td>"
                "<td>$started</td><td>$finished</td><td>$outcome</td><td>$etype</td></tr>$detail",
                n=a.attempt,
                worker=a.worker_id,
                started=when(a.started_at),
                finished=f"{when(a.finished_at)} ({seconds:.3f}s)" if seconds is not None else None,
                outcome=status_badge(a.outcome) if a.outcome else "running",
                etype=a.error_type,
                detail=detail,
            )
        )
    return Html(
        '<div class="scroll"><table id="attempts"><thead><tr><th class="num">#</th><th>Worker</th>'
        "<th>Started (UTC)</th><th>Finished (UTC)</th><th>Outcome</th><th>Error type</th></tr>"
        "</thead><tbody>" + "".join(rows) + "</tbody></table></div>"
    )


def run_page(d: operations.RunDetail, page: Page) -> str:
    r = d.run
    schedule: object = None
    if d.schedule is not None:
        schedule = tag(
            '<a href="$h">$name</a> (<code>$cron</code> $zone)',
            h=runs_href(schedule=d.schedule.name),
            name=d.schedule.name,
            cron=d.schedule.cron,
            zone=d.schedule.timezone,
        )
    fields: list[tuple[str, object]] = [
        ("Status", status_badge(r.status)),
        ("Job type", r.job_type),
        ("Schedule", schedule),
        ("Scheduled for", when(r.scheduled_for)),
        ("Run at", when(r.run_at)),
        ("Attempts", f"{r.attempts} of {r.max_attempts}" if r.max_attempts else r.attempts),
        ("Idempotency key", r.idempotency_key),
        ("Locked by", r.locked_by),
        ("Lease until", when(r.locked_until)),
        ("Started", when(r.started_at)),
        ("Finished", when(r.finished_at)),
        ("Created", when(r.created_at)),
        ("Updated", when(r.updated_at)),
        ("Error type", r.error_type),
    ]
    field_rows = join(tag("<tr><th>$k</th><td>$v</td></tr>", k=k, v=v) for k, v in fields)
    forms = []
    if page.actions:
        if r.status in operations.RETRYABLE:
            forms.append(action_form("retry", {"run_id": r.id}, "Retry"))
        if r.status in operations.CANCELLABLE:
            forms.append(action_form("cancel", {"run_id": r.id}, "Cancel", danger=True))
    last_error = Html("")
    if r.last_error:
        last_error = tag(
            '<section><h2>Last error</h2><pre id="last-error">$e</pre></section>', e=r.last_error
        )
    effects = Html("")
    if d.effects:
        item = "<li><code>$k</code> at $t</li>"
        items = (tag(item, k=e.key, t=when(e.created_at)) for e in d.effects)
        effects = Html("<section><h2>Effects</h2><ul>" + join(items, "") + "</ul></section>")
    content = render(
        "run.html",
        actions=actions_block(forms),
        field_rows=field_rows,
        payload=json.dumps(r.payload, indent=2, ensure_ascii=False, sort_keys=True),
        last_error=last_error,
        attempts=_attempt_rows(d.attempts),
        effects=effects,
    )
    return layout(page, f"Run {r.id}", "runs", content)


def schedules_page(views: Sequence[operations.ScheduleView], page: Page) -> str:
    cards = []
    for v in views:
        s = v.listing
        if v.upcoming:
            upcoming: Html = Html(
                '<div class="scroll"><table class="upcoming"><thead><tr><th>UTC</th>'
                "<th>Local time</th></tr></thead><tbody>"
                + "".join(
                    str(tag("<tr><td>$u</td><td>$l</td></tr>", u=when(at), l=local(at, v.zone)))
                    for at in v.upcoming
                )
                + "</tbody></table></div>"
            )
        else:
            reason = v.error or ("paused" if s.paused else "none")
            upcoming = tag('<p class="empty">None ($r).</p>', r=reason)
        forms = []
        if page.actions:
            forms.append(action_form("trigger", {"schedule": s.name}, "Trigger now"))
            if s.paused:
                forms.append(action_form("resume", {"schedule": s.name}, "Resume"))
            else:
                forms.append(action_form("pause", {"schedule": s.name}, "Pause", danger=True))
        detail = Html("")
        if s.paused and s.paused_detail:
            detail = tag('<p class="error-text">$d</p>', d=s.paused_detail)
        cards.append(
            render(
                "schedule_card.html",
                anchor=s.name,
                name=s.name,
                state=_schedule_state(s),
                state_class="paused" if s.paused else "active",
                paused_detail=detail,
                job_type=s.job_type,
                cron=s.cron,
                zone=s.timezone,
                overlap=s.overlap,
                catchup=s.catchup,
                last_run=_last_run(s),
                last_success=when(s.last_success_at),
                runs_href=runs_href(schedule=s.name),
                upcoming=upcoming,
                actions=actions_block(forms),
            )
        )
    content = render(
        "schedules.html",
        cards=Html("\n".join(cards)) if cards else Html('<p class="empty">No schedules.</p>'),
    )
    return layout(page, "Schedules", "schedules", content)


def error_page(status: int, message: str, page: Page) -> Response:
    title = f"{status} {HTTPStatus(status).phrase}"
    body = layout(page, title, "", render("error.html", message=message))
    return html_response(status, body)


# -- the routes ----------------------------------------------------------------------------------

RunAction = Callable[[RunStore, int], str]


class Console:
    """The console's route table over a store of its own (never the workers' pool)."""

    def __init__(self, store: RunStore, token: str | None, *, heartbeat_seconds: float) -> None:
        self.store = store
        self.token = token
        self.heartbeat_seconds = heartbeat_seconds

    def routes(self) -> dict[tuple[str, str], Handler]:
        table: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self._page(self._overview),
            ("GET", "/runs"): self._page(self._runs),
            ("GET", "/runs/*"): self._page(self._run),
            ("GET", "/schedules"): self._page(self._schedules),
            ("GET", "/static/*"): self._static,
        }
        for name in ("retry", "cancel", "trigger", "pause", "resume"):
            table[("POST", f"/actions/{name}")] = functools.partial(self._action, name)
        return table

    def _context(self, request: Request, db_now: datetime | None = None) -> Page:
        flash = request.first("flash")
        return Page(self.token is not None, db_now, cut(flash, FLASH_CHARS) if flash else None)

    def _page(self, render_page: Callable[[Request, RunStore], str]) -> Handler:
        """A GET page: read in one bounded read-only transaction; errors become error pages."""

        def handle(request: Request) -> Response:
            try:
                with self.store.reading(
                    "console",
                    statement_timeout_seconds=READ_TIMEOUT_SECONDS,
                    pool_timeout_seconds=POOL_TIMEOUT_SECONDS,
                ) as store:
                    return html_response(HTTPStatus.OK, render_page(request, store))
            except NotFoundError as exc:
                return error_page(HTTPStatus.NOT_FOUND, str(exc), self._context(request))
            except UsageError as exc:
                return error_page(
                    HTTPStatus.BAD_REQUEST, str(exc).removeprefix("--"), self._context(request)
                )
            except DatabaseError as exc:
                log.warning("console_read_failed", path=request.path, error=str(exc))
                return error_page(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    f"the database did not answer in time: {exc}",
                    self._context(request),
                )

        return handle

    def _overview(self, request: Request, store: RunStore) -> str:
        ov = operations.overview(store, heartbeat_seconds=self.heartbeat_seconds)
        return overview_page(ov, self._context(request, ov.db_now))

    def _runs(self, request: Request, store: RunStore) -> str:
        statuses = [s for s in request.query.get("status", []) if s]
        before_text = request.first("before") or ""
        before = None
        if before_text:
            if not before_text.isascii() or not before_text.isdigit():
                raise UsageError(f"before: not a run id: {before_text!r}")
            before = int(before_text)
        filters = RunFilters(
            operations.check_statuses(statuses),
            (request.first("type") or "").strip() or None,
            (request.first("schedule") or "").strip() or None,
            before,
        )
        rows = operations.list_runs(
            store,
            statuses=filters.statuses,
            job_type=filters.job_type,
            schedule=filters.schedule,
            before=filters.before,
            limit=PAGE_SIZE,
        )
        now = rows.runs[0].db_now if rows.runs else store.now()
        return runs_page(rows, filters, self._context(request, now))

    def _run(self, request: Request, store: RunStore) -> str:
        text = request.path.rsplit("/", 1)[1]
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise UsageError(f"not a run id: {text!r}")
        detail = operations.show_run(store, int(text))
        return run_page(detail, self._context(request, detail.db_now))

    def _schedules(self, request: Request, store: RunStore) -> str:
        now = store.now()
        views = operations.schedule_views(store, now, UPCOMING_COUNT)
        return schedules_page(views, self._context(request, now))

    def _static(self, request: Request) -> Response:
        name = request.path.rsplit("/", 1)[1]
        suffix = name[name.rfind(".") :] if "." in name else ""
        if suffix not in STATIC_TYPES or name not in ("console.css", "favicon.svg"):
            return error_page(HTTPStatus.NOT_FOUND, "no such file", self._context(request))
        return Response(
            HTTPStatus.OK,
            STATIC_TYPES[suffix],
            _static(name),
            {"Cache-Control": "public, max-age=3600"},
        )

    # -- actions ---------------------------------------------------------------------------------

    def _refusal(self, request: Request) -> str | None:
        """Why this POST may not act, or None."""
        if self.token is None:
            return "read-only console: actions need web.token_file"
        # Browsers say where a request comes from: another site (or another port of this
        # host) is refused. Under Referrer-Policy no-referrer a form's Origin is "null", so
        # only a real Origin is compared with the Host.
        fetch_site = request.headers.get("sec-fetch-site", "same-origin").lower()
        if fetch_site not in ("same-origin", "none"):
            return f"{fetch_site} request refused"
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            host = request.headers.get("host", "")
            if urllib.parse.urlsplit(origin).netloc.lower() != host.lower() or not host:
                return "request from another origin refused"
        given = request.first("token", form=True)
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return "wrong or missing token"
        return None

    def _action(self, name: str, request: Request) -> Response:
        runs = name in ("retry", "cancel")
        target = (request.first("run_id" if runs else "schedule", form=True) or "").strip()
        refusal = self._refusal(request)
        if refusal is not None:
            log.warning("console_action", what=name, ids=[target], result=f"forbidden: {refusal}")
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        if runs and not (target.isascii() and target.isdigit() and int(target) >= 1):
            message = f"run_id: not a run id: {target!r}"
        elif not target:
            message = "schedule: missing"
        else:
            message = ""
        if message:
            log.warning("console_action", what=name, ids=[target], result=message)
            return error_page(HTTPStatus.BAD_REQUEST, message, self._context(request))
        back = f"/runs/{int(target)}" if runs else "/schedules"
        try:
            message = self._apply(name, target)
        except PgtickError as exc:  # not found, a state the action refuses, the database
            message = f"{name} refused: {exc}"
        log.info("console_action", what=name, ids=[target], result=message)
        return see_other(f"{back}?{query_string([('flash', message)])}")

    def _apply(self, name: str, target: str) -> str:
        """Do the action (the target already checked); what happened, one line."""
        if name in ("retry", "cancel"):
            action = operations.RETRY if name == "retry" else operations.CANCEL
            changed = operations.change_runs(self.store, action, [int(target)])
            if changed.changed:
                return f"run {int(target)} {action.past}"
            return f"run {int(target)} changed state meanwhile; nothing done"
        if name == "trigger":
            return f"triggered {target}: run {operations.trigger_schedule(self.store, target)}"
        if name == "pause":
            operations.pause_schedule(self.store, target)
            return f"paused {target}"
        operations.resume_schedule(self.store, target)
        return f"resumed {target} (continues from now)"
