"""The console's routes: the request -> page or action table over a store of its own.

GET pages read in one read-only transaction with a statement timeout, on the console's own
small pool; errors become error pages. Actions (retry, cancel, trigger, pause, resume) are
POSTs carrying the token from ``web.token_file`` as a form field or ``Authorization:
Bearer``; there are no cookies, so a forged cross-site request has no credential to ride on,
and a POST whose ``Origin`` or ``Sec-Fetch-Site`` says it came from elsewhere is refused
anyway. No JavaScript: the Content-Security-Policy forbids scripts outright.
"""

from __future__ import annotations

import functools
import hmac
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from http import HTTPStatus

import structlog

from pgtick.errors import DatabaseError, NotFoundError, PgtickError, UsageError
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console.fragments import Page, cut, query_string
from pgtick.surfaces.console.markup import static_file
from pgtick.surfaces.console.views import (
    RunFilters,
    error_page,
    overview_page,
    run_page,
    runs_page,
    schedules_page,
)
from pgtick.surfaces.http import Handler, Request, Response, see_other
from pgtick.surfaces.http import html as html_response

READ_TIMEOUT_SECONDS = 2.0  # one page's statements; the runs page answers in milliseconds
POOL_TIMEOUT_SECONDS = 2.0
PAGE_SIZE = 50
UPCOMING_COUNT = 5
FLASH_CHARS = 300

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
            static_file(name),
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
