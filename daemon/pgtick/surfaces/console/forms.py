"""What the console reads from a request besides a run id: the name filters of the runs page,
and a bulk action's filter, confirmed ids and result line (pure: no database, no response).
"""

from __future__ import annotations

from pgtick.errors import UsageError
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
