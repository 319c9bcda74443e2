"""What each verb shows: the JSON documents and the text of runs, a run and schedules (status's
are in ``status.py``).
The field names and columns are the CLI's contract (docs/cli.md, Command line); how a time, a
duration or a table looks is ``render``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgtick.cli.render import (
    attempts_text,
    cut,
    cutting,
    duration_text,
    fit_table,
    flex_width,
    in_zone,
    iso,
    one_line,
    print_table,
    utc_cell,
)
from pgtick.storage.store import Attempt, Run, RunSummary, ScheduleListing
from pgtick.surfaces import operations

# -- schedules -------------------------------------------------------------------------------------

SCHEDULE_COLUMNS = (
    "NAME",
    "JOB TYPE",
    "CRON",
    "TIMEZONE",
    "STATE",
    "NEXT",
    "LAST RUN",
    "LAST OK",
)
# NAME, JOB TYPE, TIMEZONE: `schedules --json` has them whole, and each schedule's owner (the
# table has no room for it within 100 columns).
SCHEDULE_CUTTABLE = (0, 1, 3)


def schedule_owner(listing: ScheduleListing) -> str:
    """The service whose config owns it, or ``database`` (created at runtime)."""
    return "database" if listing.service is None else f"service {listing.service}"


def schedule_state(listing: ScheduleListing) -> str:
    if not listing.paused:
        return "active"
    if listing.paused_reason == operations.PAUSED_REASON_REMOVED:
        return "removed" if listing.service is None else "paused (gone from config)"
    if listing.paused_reason == operations.PAUSED_REASON_INVALID:
        return "paused (invalid)"
    return "paused"


def schedule_fields(line: operations.ScheduleLine) -> dict[str, Any]:
    listing = line.listing
    return {
        "name": listing.name,
        "job_type": listing.job_type,
        "cron": listing.cron,
        "timezone": listing.timezone,
        "state": schedule_state(listing),
        "paused_reason": listing.paused_reason,
        "paused_detail": listing.paused_detail,
        "next_at": iso(line.next_at),
        "last_status": listing.last_status,
        "last_scheduled_for": iso(listing.last_scheduled_for),
        "last_success_at": iso(listing.last_success_at),
        "service": listing.service,
        "owner": schedule_owner(listing),
        "on_pause": listing.on_pause,
    }


def schedule_cells(line: operations.ScheduleLine, *, short_times: bool) -> tuple[str, ...]:
    """One row of the listing; ``short_times``: instants as short cells next to the database's
    now (a terminal), else whole ISO 8601 (piped, for scripts)."""
    listing = line.listing

    def at(value: datetime | None) -> str:
        if short_times:
            return utc_cell(value, line.db_now)
        return iso(value, whole_seconds=True) or "-"

    last_run = "-"
    if listing.last_status is not None:
        # A triggered run has no occurrence.
        occurrence = listing.last_scheduled_for
        when = "(triggered)" if occurrence is None else at(occurrence)
        last_run = f"{listing.last_status} {when}"
    return (
        listing.name,
        listing.job_type,
        listing.cron,
        listing.timezone,
        schedule_state(listing),
        at(line.next_at),
        last_run,
        at(listing.last_success_at),
    )


def schedule_table(lines: Sequence[operations.ScheduleLine]) -> list[tuple[str, ...]]:
    """The listing's rows: on a terminal short times and the names, job types and zones cut
    to fit its width (issue 44: 170 columns wide before); piped, every value whole."""
    rows = [schedule_cells(line, short_times=cutting()) for line in lines]
    return fit_table(SCHEDULE_COLUMNS, rows, SCHEDULE_CUTTABLE)


# -- runs ------------------------------------------------------------------------------------------

RUN_COLUMNS = (
    "ID",
    "JOB TYPE",
    "STATUS",
    "ATT",
    "RUN_AT",
    "STARTED",
    "FINISHED",
    "TOOK",
    "LAST ERROR",
)
MAX_JOB_TYPE_WIDTH = 16


def _run_seconds(run: RunSummary) -> float | None:
    """How long the run ran (so far, if it is running)."""
    if run.started_at is None:
        return None
    end = run.finished_at if run.finished_at is not None else run.db_now
    if run.status != "running" and run.finished_at is None:
        return None  # failed, awaiting retry: the attempt's end is in `show`
    return max(0.0, (end - run.started_at).total_seconds())


def summary_fields(run: RunSummary) -> dict[str, Any]:
    return {
        "id": run.id,
        "job_type": run.job_type,
        "status": run.status,
        "attempts": run.attempts,
        "max_attempts": run.max_attempts,
        "schedule": run.schedule,
        "run_at": iso(run.run_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "duration_seconds": _run_seconds(run),
        "last_error": run.last_error,
    }


def print_runs(runs: Sequence[RunSummary]) -> None:
    """Aligned columns; the last error gets whatever the terminal has left (none when that is
    too little: `pgtick show ID` has it)."""
    rows = [
        (
            str(r.id),
            cut(r.job_type, MAX_JOB_TYPE_WIDTH),
            r.status,
            attempts_text(r.attempts, r.max_attempts),
            utc_cell(r.run_at, r.db_now),
            utc_cell(r.started_at, r.db_now),
            utc_cell(r.finished_at, r.db_now),
            "-" if (d := _run_seconds(r)) is None else duration_text(d),
        )
        for r in runs
    ]
    room = flex_width(RUN_COLUMNS[:-1], rows)
    errors = [cut(one_line(r.last_error), room) or "-" for r in runs]
    print_table(RUN_COLUMNS, [(*row, e) for row, e in zip(rows, errors, strict=True)])


# -- one run ---------------------------------------------------------------------------------------


def _attempt_seconds(a: Attempt) -> float | None:
    return None if a.finished_at is None else (a.finished_at - a.started_at).total_seconds()


def detail_fields(d: operations.RunDetail) -> dict[str, Any]:
    r = d.run
    return {
        "id": r.id,
        "job_type": r.job_type,
        "status": r.status,
        "payload": r.payload,
        "idempotency_key": r.idempotency_key,
        "attempts": r.attempts,
        "max_attempts": r.max_attempts,
        "run_at": iso(r.run_at),
        "scheduled_for": iso(r.scheduled_for),
        "created_at": iso(r.created_at),
        "updated_at": iso(r.updated_at),
        "started_at": iso(r.started_at),
        "finished_at": iso(r.finished_at),
        "locked_by": r.locked_by,
        "locked_until": iso(r.locked_until),
        "last_error": r.last_error,
        "error_type": r.error_type,
        "priority": r.priority,
        "concurrency_key": r.concurrency_key,
        "waiting": d.waiting,
        "result": d.result,
        "attempt_history": [
            {
                "attempt": a.attempt,
                "worker": a.worker_id,
                "started_at": iso(a.started_at),
                "finished_at": iso(a.finished_at),
                "duration_seconds": _attempt_seconds(a),
                "outcome": a.outcome,
                "error_type": a.error_type,
                "error": a.error,
                "result": a.result,
            }
            for a in d.attempts
        ],
        "schedule": None
        if d.schedule is None
        else {
            "name": d.schedule.name,
            "cron": d.schedule.cron,
            "timezone": d.schedule.timezone,
            "scheduled_for_local": None
            if r.scheduled_for is None
            else in_zone(r.scheduled_for, d.schedule.timezone) or None,
        },
        "effects": [{"key": e.key, "created_at": iso(e.created_at)} for e in d.effects],
        "output_tail": [output_fields(line) for line in d.output],
    }


RESULT_SHOWN_CHARS = 2000  # of a result's JSON on the terminal; --json has it whole


def _result_text(value: Any) -> str:
    text = json.dumps(value)
    if len(text) > RESULT_SHOWN_CHARS:
        return text[:RESULT_SHOWN_CHARS] + f"… ({len(text)} characters; --json has it whole)"
    return text


def _open_attempt(r: Run) -> str:
    """What the open attempt is doing. A run cancelled, or past its timeout, while its handler
    ran stays held, its attempt open, until its daemon has seen the handler stop."""
    if r.status == "cancelled":
        return "stopping (cancelled)"
    if r.timed_out_running:
        return "stopping (timed out)"
    return "running"


def print_detail(d: operations.RunDetail) -> None:
    r = d.run
    tried = attempts_text(r.attempts, r.max_attempts)
    print(f"run {r.id}: {r.job_type}, {r.status}, attempt {tried}")
    held = None if r.locked_by is None else f"{r.locked_by} until {iso(r.locked_until)}"
    error = None if r.last_error is None else f"[{r.error_type}] {one_line(r.last_error)}"
    lines: list[tuple[str, str | None]] = [
        ("payload", json.dumps(r.payload)),
        ("idempotency key", r.idempotency_key),
        ("priority", None if r.priority == 0 else str(r.priority)),
        ("concurrency key", r.concurrency_key),
        ("waiting", d.waiting),
        ("created", iso(r.created_at)),
        ("run_at", iso(r.run_at)),
        ("started", iso(r.started_at)),
        ("finished", iso(r.finished_at)),
        ("locked by", held),
        ("last error", error),
        ("result", None if d.result is None else _result_text(d.result)),
    ]
    if d.schedule is not None:
        s = d.schedule
        origin = f"{s.name} ({s.cron}, {s.timezone})"
        if r.scheduled_for is not None:
            origin += f", occurrence {iso(r.scheduled_for)}"
            local = in_zone(r.scheduled_for, s.timezone)
            if local:
                origin += f" = {local}"
        else:
            origin += ", triggered by hand"
        lines.append(("schedule", origin))
    for label, value in lines:
        if value is not None:
            print(f"  {label + ':':<17}{value}")
    print(f"attempts ({len(d.attempts)}):" if d.attempts else "attempts: none yet")
    for a in d.attempts:
        took = _attempt_seconds(a)
        outcome = a.outcome or _open_attempt(r)
        error = a.error
        if a.outcome == "lost" and a.error == CANCELLED_ATTEMPT_ERROR:
            # Stored as lost (the attempts table has no cancelled outcome); it was not lost.
            outcome, error = "cancelled by an operator", None
        head = f"  #{a.attempt} {outcome} on {a.worker_id}, started {iso(a.started_at)}"
        if took is not None:
            head += f", took {duration_text(took)}"
        if a.error_type:
            head += f", {a.error_type}"
        print(head)
        for line in (error or "").rstrip().splitlines():
            print(f"      {line}")
    print(f"effects ({len(d.effects)}):" if d.effects else "effects: none")
    for e in d.effects:
        print(f"  {e.key}  ({iso(e.created_at)})")
    _print_output_tail(d)


def _print_output_tail(d: operations.RunDetail) -> None:
    if not d.output:
        return
    print(f"output (last lines of attempt {d.output[-1].attempt}; all: pgtick logs {d.run.id}):")
    for out in d.output:
        print(f"  {output_text(out)}")


# -- output ----------------------------------------------------------------------------------------

# Control characters (ESC of ANSI sequences included) are shown, not obeyed, on a terminal.
_CONTROLS = {c: "\ufffd" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}


def output_text(line: operations.OutputLine) -> str:
    """One line of output as ``pgtick logs`` prints it: time into the attempt, stream, text."""
    if line.is_marker:
        return f"… {line.omitted_bytes} bytes omitted …"
    return f"+{line.offset_ms / 1000:.3f}s {line.stream} {line.text.translate(_CONTROLS)}"


def output_fields(line: operations.OutputLine) -> dict[str, Any]:
    """One line of output as ``pgtick logs --json`` prints it (one JSON object per line)."""
    if line.is_marker:
        return {"attempt": line.attempt, "omitted_bytes": line.omitted_bytes}
    return {
        "attempt": line.attempt,
        "offset_ms": line.offset_ms,
        "stream": line.stream,
        "text": line.text,
    }


# The error an attempt ended by an operator's cancel is recorded with (queries.sql:
# acknowledge_cancel, reap_cancelled, retry), outcome 'lost'.
CANCELLED_ATTEMPT_ERROR = "cancelled by operator"


def attempt_ended(number: int, outcome: str, run: Run) -> str:
    """How ``logs --follow`` says the attempt it followed ended, and what the run does next
    (a failed attempt with a retry pending is not the end of the run)."""
    how = {
        "lost": "was lost (its daemon stopped, or its lease ended)",
        "released": "was given back unstarted at its daemon's stop",
        "cancelled": "was cancelled by an operator",
    }.get(outcome, outcome)
    said = f"attempt {number} {how}"
    if outcome in ("succeeded", "cancelled"):
        return said
    if run.attempts > number and run.status == "running":
        return f"{said}; attempt {run.attempts} has started"
    if run.status == "dead":
        return f"{said}; the run is dead after {run.attempts} attempts (pgtick retry {run.id})"
    if run.status in ("failed", "queued"):
        return f"{said}; the run will retry at {iso(run.run_at, whole_seconds=True)}"
    return f"{said}; the run is {run.status}"
