"""The console's routes: the request -> page or action table, over the gate every request
passes (``gate.ConsoleBase``: the Host and session checks, the CSP nonce, the bounded page
read, the refusal of a POST that may not act, who acts).

Pages: the overview, runs, a run, a job type, the schedules, a bulk action's confirmation.
With ``web.token_file`` (operators) or ``web.viewer_token_file`` (viewers) set, ``/login``
takes a token and the person's name once and sets a signed, expiring, HttpOnly,
SameSite=Strict session cookie naming both (``guard``). Actions (retry, cancel, trigger,
pause, resume; a job type's pause, resume and limits; bulk retry and cancel) are POSTs that
carry an operator's session and its CSRF token, or the operators' token itself as
``Authorization: Bearer`` (scripts); a viewer's POST is refused (403) whatever it carries.

A wrong token holds back its own client only (``guard.Guessers``, keyed by the connection's
peer address). A logout is stored in the database, so every daemon's console refuses the
session: an action asks the database each time, a page takes an answer up to
``SESSION_CHECK_SECONDS`` old (one short query per session that often, not one per page).
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import urllib.parse
from http import HTTPStatus

from pgtick.errors import DatabaseError, NotFoundError, PgtickError, UsageError
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console import forms, guard
from pgtick.surfaces.console.fragments import (
    age,
    cut,
    query_string,
)
from pgtick.surfaces.console.gate import (
    CONTENT_SECURITY_POLICY,
    SECURITY_HEADERS,
    ConsoleBase,
    log,
)
from pgtick.surfaces.console.markup import static_file
from pgtick.surfaces.console.views import (
    RunFilters,
    batch_page,
    bulk_page,
    error_page,
    job_type_page,
    login_page,
    overview_page,
    run_page,
    runs_page,
    schedules_page,
)
from pgtick.surfaces.http import Handler, Request, Response, see_other
from pgtick.surfaces.http import html as html_response

PAGE_SIZE = 50
UPCOMING_COUNT = 5
STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".js": "text/javascript; charset=utf-8",
}
STATIC_FILES = ("console.css", "favicon.svg", "live.js")
# A job type's controls (its page's forms): pause and resume it fleet-wide, override its limits
# or give the config's back (issue 45's verbs).
TYPE_ACTIONS = ("pause-type", "resume-type", "limits", "reset-limits")

__all__ = ["CONTENT_SECURITY_POLICY", "SECURITY_HEADERS", "Console"]


class Console(ConsoleBase):
    """The console's route table over a store of its own (never the workers' pool)."""

    def routes(self) -> dict[tuple[str, str], Handler]:
        table: dict[tuple[str, str], Handler] = {
            ("GET", "/"): self._page(self._overview),
            ("GET", "/runs"): self._page(self._runs, self._filters),
            ("GET", "/runs/*"): self._page(self._run, self._run_id),
            ("GET", "/schedules"): self._page(self._schedules),
            ("GET", "/types/*"): self._page(self._job_type, self._job_type_name),
            ("GET", "/batches/*"): self._page(self._batch, self._batch_id),
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
    def _batch_id(request: Request) -> int:
        """The id in ``/batches/<id>``; anything else is no such page (404)."""
        try:
            return operations.parse_run_id(request.path.rsplit("/", 1)[1])
        except UsageError as exc:
            raise NotFoundError(str(exc).replace("run", "batch")) from None

    def _batch(self, request: Request, store: RunStore) -> str:
        batch = operations.show_batch(store, self._batch_id(request))
        return batch_page(batch, self._context(request, store.now(), store))

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
