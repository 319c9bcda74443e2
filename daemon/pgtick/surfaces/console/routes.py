"""The console's routes: the request -> page or action table over a store of its own.

GET pages read in one read-only transaction with a statement timeout, on the console's own
small pool; errors become error pages. Every request must name the console in its ``Host``
(421 otherwise: DNS rebinding). With ``web.token_file`` (operators) or ``web.viewer_token_file``
(viewers) set, ``/login`` takes a token and the person's name once and sets a signed, expiring,
HttpOnly, SameSite=Strict session cookie naming both (``guard``); actions (retry, cancel,
trigger, pause, resume) are POSTs that carry an operator's session and its CSRF token, or the
operators' token itself as ``Authorization: Bearer`` (scripts); a viewer's POST is refused
(403) whatever it carries, and a POST whose ``Origin`` or ``Sec-Fetch-Site`` says it came from
elsewhere is refused anyway. Beyond loopback, pages need
the session too unless ``web.public_reads``. One script, the console's own
``static/live.js`` (live updates), runs only with the nonce its page's
Content-Security-Policy names, a new one per response; every other response forbids scripts
outright, and every page works without it.

A wrong token holds back its own client only (``guard.Guessers``, keyed by the connection's
peer address). A logout is stored in the database, so every daemon's console refuses the
session: an action asks the database each time, a page takes an answer up to
``SESSION_CHECK_SECONDS`` old (one short query per session that often, not one per page).
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime
from http import HTTPStatus

import structlog

from pgtick.errors import DatabaseError, NotFoundError, PgtickError, UsageError
from pgtick.storage.store import ClaimType, RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console import forms, guard
from pgtick.surfaces.console.attention import Attention
from pgtick.surfaces.console.fragments import (
    LOGIN_IN,
    LOGIN_OUT,
    Page,
    age,
    cut,
    query_string,
)
from pgtick.surfaces.console.markup import static_file
from pgtick.surfaces.console.views import (
    RunFilters,
    bulk_page,
    error_page,
    job_type_page,
    login_page,
    overview_page,
    run_page,
    runs_page,
    schedules_page,
)
from pgtick.surfaces.http import Handler, Request, Response, see_other, text
from pgtick.surfaces.http import html as html_response

READ_TIMEOUT_SECONDS = 2.0  # one page's statements; the runs page answers in milliseconds
POOL_TIMEOUT_SECONDS = 2.0
PAGE_SIZE = 50
UPCOMING_COUNT = 5
FLASH_CHARS = 300
# How old an answer about a session's logout a page may use; actions always ask the database.
SESSION_CHECK_SECONDS = 5.0

CSP_TEMPLATE = (
    "default-src 'self'; script-src {scripts}; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
CONTENT_SECURITY_POLICY = CSP_TEMPLATE.format(scripts="'none'")


def page_policy(nonce: str) -> str:
    """A page's Content-Security-Policy: the scripts carrying ``nonce`` (live.js) may run."""
    return CSP_TEMPLATE.format(scripts=f"'nonce-{nonce}'")


SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Same-origin requests (the forms' POSTs) carry the real Origin; others get nothing.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".js": "text/javascript; charset=utf-8",
}
STATIC_FILES = ("console.css", "favicon.svg", "live.js")
# A job type's controls (its page's forms): pause and resume it fleet-wide, override its limits
# or give the config's back (issue 45's verbs).
TYPE_ACTIONS = ("pause-type", "resume-type", "limits", "reset-limits")
OPEN_PATHS = ("/login", "/static/*")  # served without a session even when reads need one

log = structlog.get_logger("pgtick.console")


class Console:
    """The console's route table over a store of its own (never the workers' pool)."""

    def __init__(
        self,
        store: RunStore,
        token: str | None,
        *,
        viewer_token: str | None = None,
        heartbeat_seconds: float,
        tick_interval_seconds: float = 1.0,
        listen_host: str = "127.0.0.1",
        hosts: tuple[str, ...] = (),
        session_ttl_seconds: float = 12 * 3600.0,
        public_reads: bool = False,
        limits: Sequence[ClaimType] = (),
    ) -> None:
        self.store = store
        self.limits = tuple(limits)  # job types with flow-control limits (the overview)
        self.token = token
        self.heartbeat_seconds = heartbeat_seconds
        self.tick_interval_seconds = tick_interval_seconds
        self.listen_host = listen_host
        self.hosts = hosts
        tokens = {guard.OPERATOR: token, guard.VIEWER: viewer_token}
        logins = {role: t for role, t in tokens.items() if t}
        self.sessions = guard.Sessions(logins, session_ttl_seconds) if logins else None
        # Pages need a session beyond loopback (payloads may hold personal data).
        self.reads_need_login = (
            self.sessions is not None and not public_reads and not guard.is_loopback(listen_host)
        )
        self._known = guard.KnownSessions()  # what the database said lately about logouts
        self.attention = Attention(
            store,
            heartbeat_seconds=heartbeat_seconds,
            tick_interval_seconds=tick_interval_seconds,
            limits=limits,
            timeout_seconds=READ_TIMEOUT_SECONDS,
            pool_timeout_seconds=POOL_TIMEOUT_SECONDS,
        )
        self._request = threading.local()  # the CSP nonce of the response being built

    def routes(self) -> dict[tuple[str, str], Handler]:
        table: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self._page(self._overview),
            ("GET", "/runs"): self._page(self._runs, self._filters),
            ("GET", "/runs/*"): self._page(self._run, self._run_id),
            ("GET", "/schedules"): self._page(self._schedules),
            ("GET", "/types/*"): self._page(self._job_type, self._job_type_name),
            ("GET", "/bulk"): self._bulk_confirmation,
            ("POST", "/actions/bulk"): self._bulk_action,
            ("GET", "/static/*"): self._static,
            ("GET", "/login"): self._login_form,
            ("POST", "/login"): self._login,
            ("POST", "/logout"): self._logout,
        }
        for name in ("retry", "cancel", "trigger", "pause", "resume"):
            table[("POST", f"/actions/{name}")] = functools.partial(self._action, name)
        for name in TYPE_ACTIONS:
            table[("POST", f"/actions/{name}")] = functools.partial(self._type_action, name)
        return {key: self._guarded(key[1], handler) for key, handler in table.items()}

    def _guarded(self, path: str, handler: Handler) -> Handler:
        """The Host check for every route; the session check for pages when reads need it."""

        def handle(request: Request) -> Response:
            self._request.nonce = secrets.token_urlsafe(16)
            response = checked(request)
            if response.content_type.startswith("text/html"):
                policy = {"Content-Security-Policy": page_policy(self._request.nonce)}
                response = dataclasses.replace(response, headers={**response.headers, **policy})
            return response

        def checked(request: Request) -> Response:
            host = request.headers.get("host")
            if not guard.host_allowed(host, self.listen_host, self.hosts):
                shown = cut(host, 60) if host else "(none)"
                log.warning("console_host_refused", host=shown, path=cut(request.path, 100))
                return text(HTTPStatus.MISDIRECTED_REQUEST, f"Host {shown!r} is not this console")
            if self.reads_need_login and request.method == "GET" and path not in OPEN_PATHS:
                try:
                    logged_in = self._session(request) is not None
                except DatabaseError as exc:
                    return self._unavailable(request, exc)
                if not logged_in:
                    return see_other("/login")
            return handler(request)

        return handle

    def _session(
        self, request: Request, store: RunStore | None = None, *, fresh: bool = False
    ) -> guard.Session | None:
        """The request's session, if it has one: signed by this token, not expired, and not
        logged out on any daemon. ``fresh`` asks the database (actions); otherwise an answer
        up to SESSION_CHECK_SECONDS old will do (pages). ``store``: the page's own, inside its
        read transaction (no second connection taken); the console's pool otherwise. Only a
        cookie this token signed is looked up. A DatabaseError leaves to the caller."""
        if self.sessions is None:
            return None
        session = self.sessions.signed(guard.session_cookie(request.headers))
        if session is None:
            return None
        logged_out = self._known.get(session.nonce, 0.0 if fresh else SESSION_CHECK_SECONDS)
        if logged_out is None:
            logged_out = (store or self.store).console_logged_out(session.nonce)
            self._known.put(session.nonce, logged_out)
        return None if logged_out else session

    def _context(
        self, request: Request, db_now: datetime | None = None, store: RunStore | None = None
    ) -> Page:
        """What the page shows besides its content. ``store``: the page's (a failure to look
        the session up fails the page); without it, an error page, shown logged out when the
        database cannot say."""
        flash = request.first("flash")
        shown = cut(flash, FLASH_CHARS) if flash else None
        attention = self.attention.items
        nonce = getattr(self._request, "nonce", "")
        if self.sessions is None:
            return Page(False, db_now, shown, attention=attention, nonce=nonce)
        try:
            session = self._session(request, store)
        except DatabaseError:
            if store is not None:
                raise
            session = None
        if session is None:
            return Page(False, db_now, shown, login=LOGIN_OUT, attention=attention, nonce=nonce)
        csrf = self.sessions.csrf(session.cookie)
        return Page(
            session.acts,
            db_now,
            shown,
            csrf=csrf,
            login=LOGIN_IN,
            attention=attention,
            who=session.who,
            nonce=nonce,
        )

    def _unavailable(self, request: Request, exc: DatabaseError) -> Response:
        log.warning("console_read_failed", path=request.path, error=str(exc))
        return error_page(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"the database did not answer in time: {exc}",
            self._context(request),
        )

    def _page(
        self,
        render_page: Callable[[Request, RunStore], str],
        check: Callable[[Request], object] | None = None,
    ) -> Handler:
        """A GET page: ``check`` refuses a malformed request before any database work, then
        one bounded read-only transaction; errors become error pages."""

        def handle(request: Request) -> Response:
            try:
                if check is not None:
                    check(request)
                self.attention.refresh()
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
                return self._unavailable(request, exc)

        return handle

    def _overview(self, request: Request, store: RunStore) -> str:
        ov = operations.overview(
            store, heartbeat_seconds=self.heartbeat_seconds, limits=self.limits
        )
        return overview_page(ov, self._context(request, ov.db_now, store))

    @staticmethod
    def _filters(request: Request) -> RunFilters:
        """The runs page's filters; a bad status or ``before`` is a UsageError (400)."""
        statuses = [s for s in request.query.get("status", []) if s]
        before_text = request.first("before") or ""
        before = None
        if before_text:
            try:
                before = operations.parse_run_id(before_text)
            except UsageError as exc:
                raise UsageError(f"before: {exc}") from None
        return RunFilters(
            operations.check_statuses(statuses),
            forms.name_filter(request, "type"),
            forms.name_filter(request, "schedule"),
            before,
        )

    def _runs(self, request: Request, store: RunStore) -> str:
        filters = self._filters(request)
        rows = operations.list_runs(
            store,
            statuses=filters.statuses,
            job_type=filters.job_type,
            schedule=filters.schedule,
            before=filters.before,
            limit=PAGE_SIZE,
        )
        now = rows.runs[0].db_now if rows.runs else store.now()
        return runs_page(rows, filters, self._context(request, now, store))

    @staticmethod
    def _run_id(request: Request) -> int:
        """The id in ``/runs/<id>``; anything else is no such page (404, like an unknown id)."""
        try:
            return operations.parse_run_id(request.path.rsplit("/", 1)[1])
        except UsageError as exc:
            raise NotFoundError(str(exc)) from None

    def _run(self, request: Request, store: RunStore) -> str:
        run_id = self._run_id(request)
        detail = operations.show_run(store, run_id, self.limits)
        output = operations.run_output(store, run_id) if detail.attempts else []
        return run_page(detail, self._context(request, detail.db_now, store), output)

    @staticmethod
    def _job_type_name(request: Request) -> str:
        """The name in ``/types/<name>``; one no job type can have is no such page (404)."""
        name = urllib.parse.unquote(request.path.rsplit("/", 1)[1])
        try:
            return operations.check_job_type(name)
        except UsageError as exc:
            raise NotFoundError(str(exc)) from None

    def _job_type(self, request: Request, store: RunStore) -> str:
        view = operations.job_type_view(
            store,
            self._job_type_name(request),
            heartbeat_seconds=self.heartbeat_seconds,
            limits=self.limits,
        )
        return job_type_page(view, self._context(request, view.db_now, store))

    # -- bulk retry and cancel of a filter ------------------------------------------------------

    def _bulk_confirmation(self, request: Request) -> Response:
        """GET /bulk?action=retry&status=dead&type=...: how many runs the filter matches now,
        and the form that acts on exactly those (their ids in it). Operators only."""
        try:
            context = self._context(request)
        except DatabaseError as exc:
            return self._unavailable(request, exc)
        if not context.actions:
            return error_page(
                HTTPStatus.FORBIDDEN, "bulk actions are for operators: log in as one", context
            )
        return self._page(self._bulk_page, forms.bulk_request)(request)

    def _bulk_page(self, request: Request, store: RunStore) -> str:
        plan = operations.plan_filter_bulk(store, forms.bulk_request(request))
        return bulk_page(plan, self._context(request, store.now(), store))

    def _bulk_action(self, request: Request) -> Response:
        """POST /actions/bulk: the confirmed ids, each still matching the filter, changed in
        bounded transactions; what was done, as a flash on the filtered runs page."""
        try:
            refusal = self._refusal(request)
        except DatabaseError as exc:
            log.warning("console_action", what="bulk", result=f"failed: {exc}")
            return self._unavailable(request, exc)
        if refusal is not None:
            log.warning("console_action", what="bulk", result=f"forbidden: {refusal}")
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        try:
            bulk, ids = forms.bulk_confirmed(request)
        except UsageError as exc:
            log.warning("console_action", what="bulk", result=str(exc))
            return error_page(HTTPStatus.BAD_REQUEST, str(exc), self._context(request))
        try:
            actor = self._actor(request)
            done = operations.run_filter_bulk(self.store, bulk, ids, actor=actor)
            message = forms.bulk_done(bulk, done)
        except PgtickError as exc:
            message = f"bulk {bulk.action.verb} refused: {exc}"
        log.info("console_action", what=f"bulk {bulk.action.verb}", ids=[len(ids)], result=message)
        return see_other(forms.back_to_runs(bulk, message))

    def _schedules(self, request: Request, store: RunStore) -> str:
        now = store.now()
        views = operations.schedule_views(store, now, UPCOMING_COUNT)
        return schedules_page(views, self._context(request, now, store))

    def _static(self, request: Request) -> Response:
        name = request.path.rsplit("/", 1)[1]
        suffix = name[name.rfind(".") :] if "." in name else ""
        if suffix not in STATIC_TYPES or name not in STATIC_FILES:
            return error_page(HTTPStatus.NOT_FOUND, "no such file", self._context(request))
        return Response(
            HTTPStatus.OK,
            STATIC_TYPES[suffix],
            static_file(name),
            {"Cache-Control": "public, max-age=3600"},
        )

    # -- login ---------------------------------------------------------------------------------

    def _login_form(self, request: Request) -> Response:
        if self.sessions is None:
            return error_page(
                HTTPStatus.NOT_FOUND,
                "no login: neither web.token_file nor web.viewer_token_file is set",
                self._context(request),
            )
        ttl = age(self.sessions.ttl_seconds) or ""
        nonce = secrets.token_urlsafe(16)
        context = dataclasses.replace(self._context(request), csrf=nonce)
        page = login_page(context, ttl, self.sessions.roles)
        response = html_response(HTTPStatus.OK, page)
        return dataclasses.replace(response, headers={"Set-Cookie": guard.login_form_cookie(nonce)})

    def _login(self, request: Request) -> Response:
        """The token, once, for a session cookie; after a wrong one, this client's next
        token is refused unchecked for a second (``guard.Guessers``)."""
        if self.sessions is None:
            return error_page(
                HTTPStatus.NOT_FOUND,
                "no login: neither web.token_file nor web.viewer_token_file is set",
                self._context(request),
            )
        refusal = guard.cross_site(request.headers)
        if refusal is not None:
            log.warning("console_login", result=f"forbidden: {refusal}")
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        if not guard.login_form_matches(
            request.headers, request.first(guard.CSRF_FIELD, form=True)
        ):
            log.warning("console_login", result="forbidden: missing or wrong CSRF token")
            return error_page(
                HTTPStatus.FORBIDDEN,
                "missing or wrong CSRF token: reload the login page and try again",
                self._context(request),
            )
        given = (request.first("token", form=True) or "").strip()
        name = guard.login_name(request.first("name", form=True) or "")
        wrong = self.sessions.token_refusal(given, request.peer)
        role = None if wrong is not None else self.sessions.token_role(given)
        if wrong is None and name is None:
            wrong = "give your name: the header and the audit log show it"
        if wrong is not None or role is None or name is None:
            wrong = wrong or "wrong token"
            log.warning("console_login", result=wrong)
            nonce = guard.session_cookie(request.headers, guard.LOGIN_COOKIE) or ""
            context = dataclasses.replace(self._context(request), flash=wrong, csrf=nonce)
            page = login_page(context, age(self.sessions.ttl_seconds) or "", self.sessions.roles)
            return html_response(HTTPStatus.FORBIDDEN, page)
        log.info("console_login", result="logged in", role=role, who=name)
        cookie = self.sessions.set_cookie(self.sessions.issue(role, name))
        return see_other("/", {"Set-Cookie": cookie})

    def _logout(self, request: Request) -> Response:
        """End the session on every daemon: its logout goes to the database, which every
        console asks (``_session``); then the browser's cookie is cleared."""
        try:
            refusal = self._refusal(request, acting=False)
            if refusal is None:
                assert self.sessions is not None  # a console without logins refuses every POST
                session = self.sessions.signed(guard.session_cookie(request.headers))
                if session is not None:  # none: a bearer header without a session
                    self.store.console_logout(session.nonce, session.expiry)
                    self._known.put(session.nonce, True)
        except DatabaseError as exc:
            log.warning("console_logout", result=f"failed: {exc}")
            return error_page(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the database did not answer, so the session is not logged out: {exc}",
                self._context(request),
            )
        if refusal is not None:
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        log.info("console_logout")
        return see_other("/login", {"Set-Cookie": guard.clear_cookie()})

    # -- actions ---------------------------------------------------------------------------------

    def _refusal(self, request: Request, *, acting: bool = True) -> str | None:
        """Why this POST may not act (``acting``; a logout only needs a session), or None:
        it must come from the console's own pages and carry either an operator's session (not
        logged out on any daemon: the database is asked, a DatabaseError leaves) and its CSRF
        token, or the operators' token as a bearer header. A viewer's is refused, CSRF token
        or not."""
        if self.sessions is None or (acting and guard.OPERATOR not in self.sessions.roles):
            return "read-only console: actions need web.token_file"
        refusal = guard.cross_site(request.headers)
        if refusal is not None:
            return refusal
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
            refusal = self.sessions.token_refusal(given, request.peer)
            if refusal is None and self.sessions.token_role(given) != guard.OPERATOR:
                refusal = "the viewers' token cannot act: actions need the operators' token"
            return refusal
        cookie = guard.session_cookie(request.headers)
        session = self.sessions.signed(cookie)
        if session is None:
            return "not logged in (or the session expired): log in at /login"
        if not self.sessions.csrf_matches(cookie, request.first(guard.CSRF_FIELD, form=True)):
            return "missing or wrong CSRF token: reload the page and try again"
        if acting and not session.acts:
            return f"{session.who} cannot act: viewers see the console, only operators act"
        if self._session(request, fresh=True) is None:
            return "this session was logged out: log in at /login"
        return None

    def _action(self, name: str, request: Request) -> Response:
        runs = name in ("retry", "cancel")
        target = (request.first("run_id" if runs else "schedule", form=True) or "").strip()
        shown = cut(target, 40)
        try:
            refusal = self._refusal(request)
        except DatabaseError as exc:
            log.warning("console_action", what=name, ids=[shown], result=f"failed: {exc}")
            return self._unavailable(request, exc)
        if refusal is not None:
            log.warning("console_action", what=name, ids=[shown], result=f"forbidden: {refusal}")
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        message = ""
        run_id = 0
        if runs:
            try:
                run_id = operations.parse_run_id(target)
            except UsageError as exc:
                message = f"run_id: {exc}"
        elif not target:
            message = "schedule: missing"
        if message:
            log.warning("console_action", what=name, ids=[shown], result=message)
            return error_page(HTTPStatus.BAD_REQUEST, message, self._context(request))
        back = f"/runs/{run_id}" if runs else "/schedules"
        try:
            message = self._apply(name, run_id, target, self._actor(request))
        except PgtickError as exc:  # not found, a state the action refuses, the database
            message = f"{name} refused: {exc}"
        log.info("console_action", what=name, ids=[shown], result=message)
        return see_other(f"{back}?{query_string([('flash', message)])}")

    def _actor(self, request: Request) -> operations.Actor:
        """Who acts, as the audit log names them: the name the operator logged in under
        (issue 46), or, for the operators' token as a bearer header, the caller's address."""
        if self.sessions is not None:
            session = self.sessions.signed(guard.session_cookie(request.headers))
            if session is not None:
                return operations.Actor(session.name or "unnamed operator", "console")
        return operations.Actor(f"console token from {request.peer}", "console")

    def _type_action(self, name: str, request: Request) -> Response:
        """A job type's control from its page: pause (with a reason), resume, limits (the
        fields given; empty ones stay), reset-limits. Recorded in the audit log under the
        operator's name by the schema's own functions."""
        target = (request.first("job_type", form=True) or "").strip()
        shown = cut(target, 40)
        try:
            refusal = self._refusal(request)
        except DatabaseError as exc:
            log.warning("console_action", what=name, ids=[shown], result=f"failed: {exc}")
            return self._unavailable(request, exc)
        if refusal is not None:
            log.warning("console_action", what=name, ids=[shown], result=f"forbidden: {refusal}")
            return error_page(HTTPStatus.FORBIDDEN, refusal, self._context(request))
        actor = self._actor(request)
        try:
            job_type = operations.check_job_type(target)
            change = forms.limit_change(request) if name == "limits" else None
        except UsageError as exc:
            log.warning("console_action", what=name, ids=[shown], result=str(exc))
            return error_page(HTTPStatus.BAD_REQUEST, str(exc), self._context(request))
        try:
            message = forms.apply_type_action(self.store, name, job_type, request, change, actor)
        except PgtickError as exc:
            message = f"{name} refused: {exc}"
        log.info("console_action", what=name, ids=[shown], who=actor.name, result=message)
        back = f"/types/{urllib.parse.quote(job_type, safe='')}"
        return see_other(f"{back}?{query_string([('flash', message)])}")

    def _apply(self, name: str, run_id: int, target: str, actor: operations.Actor) -> str:
        """Do the action (the target already checked); what happened, one line."""
        if name in ("retry", "cancel"):
            action = operations.RETRY if name == "retry" else operations.CANCEL
            changed = operations.change_runs(self.store, action, [run_id], actor=actor)
            if changed.changed:
                return f"run {run_id} {action.past}"
            return f"run {run_id} changed state meanwhile; nothing done"
        if name == "trigger":
            run = operations.trigger_schedule(self.store, target, actor=actor)
            return f"triggered {target}: run {run}"
        if name == "pause":
            operations.pause_schedule(self.store, target, actor=actor)
            return f"paused {target}"
        operations.resume_schedule(self.store, target, actor=actor)
        return f"resumed {target} (continues from now)"
