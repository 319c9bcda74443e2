"""The pages: each turns what ``operations`` returned (the view model: ``Overview``,
``RunPage``, ``RunDetail``, ``ScheduleView``) into a filled template. No database, no request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from pgtick.storage.store import STATUSES, Attempt, RunSummary, ScheduleListing
from pgtick.surfaces import operations
from pgtick.surfaces.console.fragments import (
    Page,
    action_form,
    actions_block,
    age,
    chart_svg,
    cut,
    layout,
    local,
    runs_href,
    status_badge,
    when,
)
from pgtick.surfaces.console.markup import Html, esc, join, render, tag
from pgtick.surfaces.http import Response
from pgtick.surfaces.http import html as html_response

OVERVIEW_REFRESH_SECONDS = 5
ERROR_CELL_CHARS = 120  # a run's last error in the listing; the detail page shows it whole


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
            forms.append(action_form(page, "retry", {"run_id": r.id}, "Retry"))
        if r.status in operations.CANCELLABLE:
            forms.append(action_form(page, "cancel", {"run_id": r.id}, "Cancel", danger=True))
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
            forms.append(action_form(page, "trigger", {"schedule": s.name}, "Trigger now"))
            if s.paused:
                forms.append(action_form(page, "resume", {"schedule": s.name}, "Resume"))
            else:
                forms.append(action_form(page, "pause", {"schedule": s.name}, "Pause", danger=True))
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


def login_page(page: Page, ttl: str) -> str:
    return layout(page, "Log in", "", render("login.html", ttl=ttl))


def error_page(status: int, message: str, page: Page) -> Response:
    title = f"{status} {HTTPStatus(status).phrase}"
    body = layout(page, title, "", render("error.html", message=message))
    return html_response(status, body)
