"""The console's gate: what every request goes through before and after its route's handler
(``routes``). Every request must name the console in its ``Host`` (421 otherwise: DNS
rebinding); beyond loopback, pages need a session unless ``web.public_reads``. An HTML
response gets a Content-Security-Policy with a nonce of its own, which the console's one
script (``static/live.js``) carries; every other response forbids scripts outright. A page
reads in one read-only transaction with a statement timeout, on the console's own small pool,
errors becoming error pages. A POST acts only with an operator's session (not logged out on
any daemon: the database is asked) and its CSRF token, or the operators' token as a bearer
header, and only from the console's own pages; who acts is the name the operator logged in
with.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from http import HTTPStatus

import structlog

from pgtick.errors import DatabaseError, NotFoundError, UsageError
from pgtick.storage.store import ClaimType, RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console import guard
from pgtick.surfaces.console.attention import Attention
from pgtick.surfaces.console.fragments import LOGIN_IN, LOGIN_OUT, Page, cut
from pgtick.surfaces.console.views import error_page
from pgtick.surfaces.http import Handler, Request, Response, see_other, text
from pgtick.surfaces.http import html as html_response

READ_TIMEOUT_SECONDS = 2.0  # one page's statements; the runs page answers in milliseconds
POOL_TIMEOUT_SECONDS = 2.0
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
OPEN_PATHS = ("/login", "/static/*")  # served without a session even when reads need one

log = structlog.get_logger("pgtick.console")


class ConsoleBase:
    """What every route of the console goes through: the Host and session checks, the CSP
    nonce of each response, the page's context (login, banner, flash), the bounded read of a
    page, the refusal of a POST that may not act, and who acts."""

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
        horizon_threshold_seconds: float = operations.DEFAULT_HORIZON_THRESHOLD_SECONDS,
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
            horizon_threshold_seconds=horizon_threshold_seconds,
            timeout_seconds=READ_TIMEOUT_SECONDS,
            pool_timeout_seconds=POOL_TIMEOUT_SECONDS,
        )
        self._request = threading.local()  # the CSP nonce of the response being built

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

    def _actor(self, request: Request) -> operations.Actor:
        """Who acts, as the audit log names them: the name the operator logged in under
        (issue 46), or, for the operators' token as a bearer header, the caller's address."""
        if self.sessions is not None:
            session = self.sessions.signed(guard.session_cookie(request.headers))
            if session is not None:
                return operations.Actor(session.name or "unnamed operator", "console")
        return operations.Actor(f"console token from {request.peer}", "console")
