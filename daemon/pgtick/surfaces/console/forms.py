"""What the console reads from a request besides a run id, and the job type controls it
asks for: the name filters of the runs page, a bulk action's filter, confirmed ids and result
line, a job type's new limits; ``apply_type_action`` calls the operations (no response here).
"""

from __future__ import annotations

from pgtick.errors import UsageError
from pgtick.storage.store import LimitChange, RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console.fragments import cut, parse_id_ranges, query_string, runs_href
from pgtick.surfaces.http import Request

BULK_ACTIONS = {"retry": operations.RETRY, "cancel": operations.CANCEL}


def name_filter(request: Request, field: str, *, form: bool = False) -> str | None:
    """A job type or schedule filter (None: not given). No name holds a NUL character, and
    the database refuses one: the client's mistake, not an outage."""
    value = (request.first(field, form=form) or "").strip() or None
    if value is not None and "\x00" in value:
        raise UsageError(f"{field}: contains a NUL character")
    return value


def bulk_request(request: Request, *, form: bool = False) -> operations.FilterBulk:
    """The bulk action and the runs filter of a confirmation page (query) or of its confirmed
    form; anything malformed is a UsageError (400)."""
    fields = request.form() if form else request.query
    name = request.first("action", form=form) or ""
    if name not in BULK_ACTIONS:
        raise UsageError(f"action: must be retry or cancel, got {cut(name, 20)!r}")
    return operations.filter_bulk(
        BULK_ACTIONS[name],
        [s for s in fields.get("status", []) if s],
        name_filter(request, "type", form=form),
        name_filter(request, "schedule", form=form),
    )


def bulk_confirmed(request: Request) -> tuple[operations.FilterBulk, list[int]]:
    """The confirmed form: its filter and the ids it carries, which must be as many as the
    count it showed; a UsageError (400) otherwise."""
    bulk = bulk_request(request, form=True)
    try:
        ids = parse_id_ranges(
            request.first("ids", form=True) or "", operations.MAX_FILTER_BULK_RUNS
        )
    except ValueError as exc:
        raise UsageError(f"ids: {exc}") from None
    if str(len(ids)) != (request.first("count", form=True) or "").strip():
        raise UsageError("count: does not match the ids confirmed; confirm again")
    return bulk, ids


def bulk_done(bulk: operations.FilterBulk, done: operations.FilterBulkDone) -> str:
    """``retried 495 of the 500 runs confirmed; 5 no longer matched ...``"""
    message = f"{bulk.action.past} {done.changed} of the {done.confirmed} runs confirmed"
    if done.skipped:
        message += f"; {done.skipped} no longer matched the filter and were left alone"
    return message


def back_to_runs(bulk: operations.FilterBulk, message: str) -> str:
    """The runs page of the bulk action's filter, with ``message`` as its flash."""
    back = runs_href(status=list(bulk.statuses), type=bulk.job_type, schedule=bulk.schedule)
    separator = "&" if "?" in back else "?"
    return f"{back}{separator}{query_string([('flash', message)])}"


def limit_change(request: Request) -> LimitChange:
    """The limits a job type's form sets (empty fields: unchanged); UsageError (400) for a
    value ``pgtick limits`` would refuse, or none at all."""
    change = operations.limit_change(*(request.first(f, form=True) for f in operations.LIMIT_NAMES))
    if change.empty:
        raise UsageError("limits: give at least one limit (or reset them to the config's)")
    return change


def apply_type_action(
    store: RunStore,
    name: str,
    job_type: str,
    request: Request,
    change: LimitChange | None,
    actor: operations.Actor,
) -> str:
    """Do a job type's control; what happened, one line."""
    if name == "pause-type":
        reason = cut(request.first("reason", form=True), 500) or None
        done = operations.pause_job_type(store, job_type, reason, actor)
        return f"paused {job_type} on every daemon" if done else f"{job_type} was paused already"
    if name == "resume-type":
        done = operations.resume_job_type(store, job_type, actor)
        return f"resumed {job_type}" if done else f"{job_type} was not paused"
    if name == "limits" and change is not None:
        operations.set_limits(store, job_type, change, actor)
        return f"limits of {job_type} changed on every daemon from its next claim"
    done = operations.reset_limits(store, job_type, actor)
    return f"limits of {job_type} back to the config's" if done else "no limit was overridden"
