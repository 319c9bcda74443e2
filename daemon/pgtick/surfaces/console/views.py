"""The pages: each turns what ``operations`` returned (the view model: ``Overview``,
``RunPage``, ``RunDetail``, ``ScheduleView``) into a filled template. No database, no request;
the templates (``templates/``, Jinja2, autoescaped) hold the markup.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from pgtick.storage.store import STATUSES, Batch, ScheduleListing
from pgtick.surfaces import operations
from pgtick.surfaces.console.fragments import (
    Page,
    ago,
    chart,
    history_chart,
    id_ranges,
    render,
    runs_href,
    timeline,
    type_charts,
)
from pgtick.surfaces.http import Response
from pgtick.surfaces.http import html as html_response

OVERVIEW_REFRESH_SECONDS = 5  # scripts off: the page reloads itself (meta refresh)
# Scripts on: how often a page fetches itself again and swaps its data-live regions
# (static/live.js); one request in flight per open page.
OVERVIEW_LIVE_SECONDS = 2
RUNS_LIVE_SECONDS = 1
RUN_LIVE_SECONDS = 1
SCHEDULES_LIVE_SECONDS = 5
ERROR_CELL_CHARS = 120  # a run's last error in the listing; the detail page shows it whole

# An action form: (action, hidden fields, button label, dangerous)
Form = tuple[str, dict[str, object], str, bool]


def overview_page(ov: operations.Overview, page: Page) -> str:
    return render(
        "overview.html",
        page,
        "Overview",
        "overview",
        ov=ov,
        chart=chart(ov.succeeded_per_minute),
        small=type_charts(ov.finished_per_type, ov.queue_depth_per_type),
        refresh_seconds=OVERVIEW_REFRESH_SECONDS,
        live_seconds=OVERVIEW_LIVE_SECONDS,
    )


@dataclass(frozen=True)
class RunFilters:
    statuses: list[str]
    job_type: str | None
    schedule: str | None
    before: int | None

    def params(self) -> list[tuple[str, str]]:
        """The filter as query parameters (no page position)."""
        named = [("type", self.job_type), ("schedule", self.schedule)]
        return [("status", s) for s in self.statuses] + [(k, v) for k, v in named if v]

    def href(self, before: int | None = None) -> str:
        return runs_href(
            status=self.statuses, type=self.job_type, schedule=self.schedule, before=before
        )


def runs_page(rows: operations.RunPage, filters: RunFilters, page: Page) -> str:
    return render(
        "runs.html",
        page,
        "Runs",
        "runs",
        rows=rows,
        filters=filters,
        statuses=STATUSES,
        error_chars=ERROR_CELL_CHARS,
        live_seconds=RUNS_LIVE_SECONDS,
    )


def _run_forms(d: operations.RunDetail, page: Page) -> list[Form]:
    if not page.actions:
        return []
    forms: list[Form] = []
    if d.run.status in operations.RETRYABLE:
        forms.append(("retry", {"run_id": d.run.id}, "Retry", False))
    if d.run.status in operations.CANCELLABLE:
        forms.append(("cancel", {"run_id": d.run.id}, "Cancel", True))
    return forms


def _run_fields(d: operations.RunDetail) -> list[tuple[str, object]]:
    """The row's fields; times relative to the database's now, the instant on hover."""
    r = d.run
    now = d.db_now
    return [
        ("Status", r.status),  # the template shows a badge, and the schedule as a link
        ("Job type", r.job_type),
        ("Schedule", None),
        ("Scheduled for", ago(r.scheduled_for, now)),
        ("Run at", ago(r.run_at, now)),
        ("Attempts", f"{r.attempts} of {r.max_attempts}" if r.max_attempts else r.attempts),
        ("Idempotency key", r.idempotency_key),
        ("Priority", r.priority),
        ("Concurrency key", r.concurrency_key),
        ("Waiting", d.waiting),
        ("Locked by", r.locked_by),
        ("Lease until", ago(r.locked_until, now)),
        ("Started", ago(r.started_at, now)),
        ("Finished", ago(r.finished_at, now)),
        ("Created", ago(r.created_at, now)),
        ("Updated", ago(r.updated_at, now)),
        ("Error type", r.error_type),
    ]


# While a run is running its page reloads itself this often, so its output follows (no script).
RUN_REFRESH_SECONDS = 2
# Terminal escape sequences (colours, cursor moves) in what a job printed: shown as plain text.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


@dataclass(frozen=True)
class AttemptOutput:
    attempt: int
    lines: list[operations.OutputLine]


def attempt_outputs(lines: Sequence[operations.OutputLine]) -> list[AttemptOutput]:
    """Each attempt's lines (newest attempt first), escape sequences stripped."""
    by_attempt: dict[int, list[operations.OutputLine]] = {}
    for line in lines:
        clean = dataclasses.replace(line, text=_ANSI.sub("", line.text))
        by_attempt.setdefault(line.attempt, []).append(clean)
    return [AttemptOutput(a, by_attempt[a]) for a in sorted(by_attempt, reverse=True)]


def run_page(
    d: operations.RunDetail, page: Page, output: Sequence[operations.OutputLine] = ()
) -> str:
    return render(
        "run.html",
        page,
        f"Run {d.run.id}",
        "runs",
        run=d.run,
        detail=d,
        forms=_run_forms(d, page),
        fields=_run_fields(d),
        payload=json.dumps(d.run.payload, indent=2, ensure_ascii=False, sort_keys=True),
        result=None
        if d.result is None
        else json.dumps(d.result, indent=2, ensure_ascii=False, sort_keys=True),
        timeline=timeline(d.attempts, d.db_now),
        outputs=attempt_outputs(output),
        refresh_seconds=RUN_REFRESH_SECONDS if d.run.status == "running" else None,
        live_seconds=RUN_LIVE_SECONDS,
    )


JOB_TYPE_LIVE_SECONDS = 2


def job_type_page(view: operations.JobTypeView, page: Page) -> str:
    history = None
    if view.history is not None:
        hours = view.history.hours
        history = [
            history_chart("24h", "Last 24 hours", "-24 h", hours[-24:]),
            history_chart("7d", "Last 7 days", "-7 d", hours[-operations.HISTORY_HOURS :]),
        ]
    return render(
        "job_type.html",
        page,
        f"Job type {view.status.stats.job_type}",
        "overview",
        view=view,
        history=history,
        live_seconds=JOB_TYPE_LIVE_SECONDS,
    )


def bulk_page(plan: operations.FilterBulkPlan, page: Page) -> str:
    """The confirmation of a bulk retry or cancel: the count, and the form with the ids."""
    b = plan.bulk
    return render(
        "bulk.html",
        page,
        f"{b.action.verb.capitalize()} the matching runs",
        "runs",
        plan=plan,
        bulk=b,
        ids=id_ranges(plan.ids),
        back=runs_href(status=list(b.statuses), type=b.job_type, schedule=b.schedule),
    )


def _schedule_forms(s: ScheduleListing) -> list[Form]:
    forms: list[Form] = [("trigger", {"schedule": s.name}, "Trigger now", False)]
    if s.paused:
        forms.append(("resume", {"schedule": s.name}, "Resume", False))
    else:
        forms.append(("pause", {"schedule": s.name}, "Pause", True))
    return forms


def batch_page(batch: Batch, page: Page) -> str:
    """A batch: its state, counts by outcome, callback (docs/composition.md)."""
    return render(
        "batch.html",
        page,
        f"Batch {batch.id}",
        "runs",
        batch=batch,
        callback=", ".join(step["job_type"] for step in batch.callback or []) or "none",
        kept=", ".join(f"{s} {n}" for s, n in sorted(batch.kept.items())) or "none",
    )


def schedules_page(views: Sequence[operations.ScheduleView], page: Page) -> str:
    return render(
        "schedules.html",
        page,
        "Schedules",
        "schedules",
        views=views,
        schedule_forms=_schedule_forms,
        live_seconds=SCHEDULES_LIVE_SECONDS,
    )


def login_page(page: Page, ttl: str, roles: Sequence[str] = ("operator",)) -> str:
    return render("login.html", page, "Log in", ttl=ttl, roles=roles)


def error_page(status: int, message: str, page: Page) -> Response:
    title = f"{status} {HTTPStatus(status).phrase}"
    return html_response(status, render("error.html", page, title, message=message))
