"""The operator's verbs on runs: list, show, enqueue, retry, cancel, prune. The state rules of
retry and cancel live here, nowhere else.

Times given as a ``timedelta`` are relative to the database clock (``--since 90m`` is 90
minutes before the database's now), so a client with a wrong clock still asks the right thing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TextIO

from pgtick import config as config_mod
from pgtick.config import Config, RetentionConfig
from pgtick.core import handlers
from pgtick.errors import ConfigError, NotFoundError, PgtickError, UsageError
from pgtick.observability.progress import Progress
from pgtick.storage.store import (
    PRUNE_BUSY_RETRIES,
    STATUSES,
    TERMINAL_STATUSES,
    Attempt,
    ClaimType,
    EffectKey,
    NewRun,
    Run,
    RunQuery,
    RunStore,
    RunSummary,
    ScheduleRef,
)
from pgtick.surfaces.operations.audit import Actor, record
from pgtick.surfaces.operations.controls import effective_limits
from pgtick.surfaces.operations.flow import describe_limits
from pgtick.surfaces.operations.output import OutputLine, output_tail

# The state rules: which runs an operator may retry (back to queued, due now) or cancel.
RETRYABLE = ("failed", "dead", "cancelled")
CANCELLABLE = ("queued", "running", "failed")
# A bulk retry or cancel of more runs than this needs an explicit confirmation.
CONFIRM_ABOVE_ROWS = 100
# Bulk changes run in transactions of at most this many runs, so they never hold many row
# locks at once against the daemons claiming and finishing runs.
BULK_BATCH_ROWS = 500
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 10_000
# `pgtick enqueue` refuses a bigger --payload: a run's payload travels with every claim and
# sits in the row for its retention; large data belongs elsewhere, referenced by the payload.
# (The SQL function enqueue() itself leaves the limit to PostgreSQL's, 255 MB of jsonb.)
MAX_PAYLOAD_BYTES = 1024 * 1024
# An idempotency key is a btree index entry, which PostgreSQL caps at about 2700 bytes.
MAX_KEY_BYTES = 1000
# Run ids are bigint.
MAX_RUN_ID = 2**63 - 1
# A run id as text is at most this long (2^63-1 has 19 digits; leading zeros are allowed);
# anything longer is refused before int(), which refuses 4 300 digits and more with a traceback.
RUN_ID_TEXT_CHARS = 40
SHOWN_TEXT_CHARS = 24

# A time argument: an instant, or a duration back from (or ahead of) the database's now.
When = datetime | timedelta


def parse_run_id(text: str) -> int:
    """A run id typed by an operator (CLI argument, console path, query or form field): decimal
    digits naming 1..2^63-1; anything else is a UsageError "not a run id: ..." that quotes the
    text cut short (it may be 5 000 digits long). The CLI and the console share this one rule."""
    shown = text if len(text) <= SHOWN_TEXT_CHARS else f"{text[:SHOWN_TEXT_CHARS]}…"
    digits = text.strip()
    if not digits.isascii() or not digits.isdigit():
        raise UsageError(f"not a run id: {shown!r}")
    significant = digits.lstrip("0")
    if len(significant) > RUN_ID_TEXT_CHARS or int(significant or "0") > MAX_RUN_ID:
        raise UsageError(f"not a run id: {shown!r} (larger than any bigint)")
    value = int(significant or "0")
    if value < 1:
        raise UsageError(f"not a run id: {shown!r} (ids start at 1)")
    return value


def check_statuses(statuses: Sequence[str], allowed: Sequence[str] = STATUSES) -> list[str]:
    """The given status names, refused with the valid ones listed when one is unknown."""
    for status in statuses:
        if status not in allowed:
            raise UsageError(
                f"--status: unknown status {status!r} (valid: {', '.join(allowed)})"
                if status not in STATUSES
                else f"--status: {status!r} is not allowed here (valid: {', '.join(allowed)})"
            )
    return list(dict.fromkeys(statuses))


def _ago(store: RunStore, when: When | None) -> datetime | None:
    """An instant from an argument where a duration means "that long ago"."""
    if when is None or isinstance(when, datetime):
        return when
    return store.now() - when


# -- runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPage:
    """One page of the listing; ``next_before`` is the next page's ``--before`` (None: last)."""

    runs: list[RunSummary]
    next_before: int | None


def list_runs(
    store: RunStore,
    *,
    statuses: Sequence[str] = (),
    job_type: str | None = None,
    schedule: str | None = None,
    since: When | None = None,
    before: int | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
) -> RunPage:
    """Runs newest first, one page below ``before``."""
    wanted = check_statuses(statuses)
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise UsageError(f"--limit: must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    if before is not None and before < 1:
        raise UsageError(f"--before: must be a run id (at least 1), got {before}")
    query = RunQuery(
        statuses=wanted or None,
        job_type=job_type,
        schedule=schedule,
        since=_ago(store, since),
        before=before,
        limit=limit + 1,
    )
    rows = store.list_runs(query)
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(rows, rows[-1].id if more else None)


# -- show ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunDetail:
    """Everything known about one run: the row, each attempt, its schedule, its effects, the
    last lines of its output."""

    run: Run
    attempts: list[Attempt]
    schedule: ScheduleRef | None
    effects: list[EffectKey]
    db_now: datetime
    output: list[OutputLine] = field(default_factory=list)  # the tail of the latest output
    waiting: str | None = None  # why a due run is not starting (a limit), None: not held back

    @property
    def result(self) -> Any:
        """The run's result: its succeeded attempt's (the schema's result() says the same)."""
        for a in reversed(self.attempts):
            if a.outcome == "succeeded":
                return a.result
        return None


def show_run(store: RunStore, run_id: int, limits: Sequence[ClaimType] = ()) -> RunDetail:
    """One run in full; NotFoundError when there is no such run. With the config's ``limits``,
    a due run held back by one says which."""
    if run_id < 1:
        raise UsageError(f"RUN_ID: not a run id: {run_id} (ids start at 1)")
    run = store.get_run(run_id)
    if run is None:
        raise NotFoundError(f"run {run_id} not found")
    schedule = None if run.schedule_id is None else store.schedule_of_run(run.schedule_id)
    return RunDetail(
        run,
        store.get_attempts(run_id),
        schedule,
        store.effect_keys(run_id),
        store.now(),
        output_tail(store, run_id),
        _waiting(store, run, limits),
    )


def _waiting(store: RunStore, run: Run, limits: Sequence[ClaimType]) -> str | None:
    """Why this due run is held back: its job type paused, or its limits (None: it is not).
    The limits in force: the config's (``limits``) with what an operator changed at runtime."""
    if run.status not in ("queued", "failed"):
        return None
    after = run.after_on
    if after and "released" not in after:
        then = "skipped" if after.get("missed") == "skip" else "run anyway"
        return (
            f"after {after['schedule']}: waits for its occurrence {after['occurrence']} to"
            f" succeed, until {after['deadline']} (then {then})"
        )
    control = store.job_type_controls().get(run.job_type)
    if control is not None and control.paused:
        why = f": {control.paused_reason}" if control.paused_reason else ""
        return (
            f"its job type is paused (by {control.paused_by}{why}): it starts after"
            f" `pgtick resume {run.job_type}`"
        )
    config = [t for t in limits if t.job_type == run.job_type]
    controls = {run.job_type: control} if control is not None else {}
    mine = effective_limits(config, controls)
    if not mine:
        return None
    flows = store.flow_state(mine, run.id)
    if not flows or flows[0].due == 0:
        return None  # not due yet
    flow = flows[0]
    limits_text = describe_limits(mine[0])
    if flow.waiting_concurrency:
        return (
            f"held back by a concurrency limit ({limits_text}; {flow.running} held now):"
            " it starts when a run of its type or key finishes"
        )
    if flow.waiting_rate:
        return (
            f"held back by a rate limit ({limits_text}; {flow.started} started in the"
            " window): it starts when the window allows"
        )
    return None


# -- retry and cancel ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """An operator's state change: its name, the states it accepts, the store call doing it,
    and what else may refuse it (a one-line reason, or None)."""

    verb: str  # "retry" / "cancel"
    past: str  # "retried" / "cancelled"
    accepts: tuple[str, ...]
    apply: Callable[[RunStore, Sequence[int]], list[int]]
    refuse: Callable[[RunStore, Sequence[int]], str | None] | None = None


def _still_held(store: RunStore, run_ids: Sequence[int]) -> str | None:
    """A run cancelled while it ran stays held by its daemon until the handler has stopped:
    retrying it before then would start a second copy next to the one still running."""
    held = store.held_after_cancel(run_ids)
    if not held:
        return None
    run_id, holder, seconds_left = held[0]
    others = f" (and {len(held) - 1} more)" if len(held) > 1 else ""
    return (
        f"cannot retry run {run_id} yet{others}: it was cancelled while running on {holder}, "
        f"whose handler has not stopped; try again in a few seconds (at the latest in "
        f"{max(1, seconds_left)}s, when its lease ends)"
    )


RETRY = Action("retry", "retried", RETRYABLE, RunStore.retry, _still_held)
CANCEL = Action("cancel", "cancelled", CANCELLABLE, RunStore.cancel)


@dataclass(frozen=True)
class Changed:
    """What a retry or cancel did; ``missed`` changed state between the check and the change."""

    changed: list[int]
    missed: list[int]


def _ids_text(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def change_runs(
    store: RunStore, action: Action, run_ids: Sequence[int], *, actor: Actor | None = None
) -> Changed:
    """Retry or cancel the given runs, all or none: an unknown id is NotFoundError, a run in a
    state the action does not accept is UsageError naming its status; nothing changes then.
    Recorded in the audit log as ``actor``'s, with the runs it changed."""
    ids = sorted(set(run_ids))
    if not ids:
        raise UsageError(f"{action.verb}: give run ids, or --status and --type")
    if bad := [i for i in ids if i < 1]:
        raise UsageError(f"RUN_ID: not a run id: {bad[0]} (ids start at 1)")
    statuses = store.run_statuses(ids)
    missing = [i for i in ids if i not in statuses]
    if missing:
        noun = "run" if len(missing) == 1 else "runs"
        raise NotFoundError(f"{noun} {_ids_text(missing)} not found")
    refused = {i: s for i, s in statuses.items() if s not in action.accepts}
    if refused:
        first = min(refused)
        others = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise UsageError(
            f"cannot {action.verb} run {first}: it is {refused[first]}{others}; only "
            f"{', '.join(action.accepts)} runs can be {action.past}"
        )
    reason = None if action.refuse is None else action.refuse(store, ids)
    if reason is not None:
        raise UsageError(reason)
    changed = action.apply(store, ids)
    record(store, actor, action.verb, None, {"run_ids": ids[:100]}, run_ids=changed)
    return Changed(changed, sorted(set(ids) - set(changed)))


@dataclass(frozen=True)
class Bulk:
    """A bulk retry or cancel: every run of one status and job type (since a time)."""

    action: Action
    status: str
    job_type: str
    since: datetime | None


def plan_bulk(
    store: RunStore, action: Action, status: str, job_type: str, since: When | None
) -> tuple[Bulk, int]:
    """The bulk change and how many runs it would touch now (for the confirmation)."""
    check_statuses([status], action.accepts)
    if not job_type:
        raise UsageError(f"{action.verb}: --type is required with --status")
    bulk = Bulk(action, status, job_type, _ago(store, since))
    return bulk, store.count_bulk(bulk.status, bulk.job_type, bulk.since)


def run_bulk(
    store: RunStore, bulk: Bulk, batch: int = BULK_BATCH_ROWS, *, actor: Actor | None = None
) -> int:
    """Apply a bulk change in batches of ``batch`` runs; how many runs changed (recorded in
    the audit log as ``actor``'s, once, with the filter and the runs)."""
    total, after = 0, 0
    changed: list[int] = []
    while True:
        ids = store.bulk_ids(bulk.status, bulk.job_type, bulk.since, after, batch)
        if not ids:
            break
        done = bulk.action.apply(store, ids)
        total += len(done)
        changed.extend(done[: max(0, 1000 - len(changed))])
        after = ids[-1]
    args = {
        "status": bulk.status,
        "type": bulk.job_type,
        "since": None if bulk.since is None else bulk.since.isoformat(),
    }
    record(store, actor, bulk.action.verb, bulk.job_type, args, changed, total)
    return total


# -- prune -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    """Per status: the age cutoff used and how many runs were (or, dry run, would be) deleted."""

    older_than_seconds: dict[str, float]
    counts: dict[str, int]
    dry_run: bool

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def prune(
    store: RunStore,
    retention: RetentionConfig,
    *,
    older_than: When | None = None,
    statuses: Sequence[str] = (),
    dry_run: bool = False,
    progress_stream: TextIO | None = None,
    actor: Actor | None = None,
) -> Pruned:
    """Remove terminal runs finished longer ago than ``older_than`` (default: each status's
    retention), with their attempts and output: the partitions wholly past the cutoff are
    dropped, the rest deleted in bounded batches. Each status's deletion reports its progress
    (rows, rate, time left) to the log and, if it is a terminal, to ``progress_stream``."""
    wanted = check_statuses(statuses, TERMINAL_STATUSES) if statuses else TERMINAL_STATUSES
    cutoffs = retention.by_status()
    if older_than is not None:
        seconds = (
            older_than.total_seconds()
            if isinstance(older_than, timedelta)
            else (store.now() - older_than).total_seconds()
        )
        if seconds <= 0:
            raise UsageError(
                "--older-than: must be in the past (more than 0s ago); it would delete "
                "every finished run"
            )
        cutoffs = dict.fromkeys(cutoffs, seconds)
    used = {status: cutoffs[status] for status in wanted}
    if dry_run:
        counts = {status: store.count_prunable(status, age) for status, age in used.items()}
        return Pruned(used, counts, dry_run)
    # Whole partitions first (no row is deleted), then the rows of those a cutoff splits.
    dropped = dict.fromkeys(used, 0)
    if older_than is not None and set(used) == set(TERMINAL_STATUSES):
        # A cutoff shorter than the configured retention: keep the history of the runs kept.
        changes = store.prune_partitions(used)
    else:
        changes = store.maintain_partitions(
            used, delete_default=False, busy_retries=PRUNE_BUSY_RETRIES
        )
    for change in changes:
        if change.action == "dropped" and change.status is not None:
            dropped[change.status] += change.rows
    counts = {}
    for status, age in used.items():
        progress = Progress(
            f"prune {status}", store.count_prunable(status, age), stream=progress_stream
        )
        counts[status] = dropped[status] + store.prune(status, age, on_batch=progress.advance)
        progress.finish()
    args = {"older_than_seconds": used, "counts": counts}
    record(store, actor, "prune", None, args, runs_affected=sum(counts.values()))
    return Pruned(used, counts, dry_run)


# -- enqueue ---------------------------------------------------------------------------------------


def check_new_run(
    job_type: str, idempotency_key: str | None, concurrency_key: str | None = None
) -> None:
    """Refuse, before anything is written, what no daemon could run or the table would refuse."""
    try:
        config_mod.job_type_name("TYPE: job type", job_type)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    for option, key in (("--key", idempotency_key), ("--concurrency-key", concurrency_key)):
        if key is None:
            continue
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{option}: not valid UTF-8") from None
        if "\x00" in key:
            raise UsageError(f"{option}: a NUL character, which PostgreSQL's text refuses")
    if idempotency_key is not None:
        size = len(idempotency_key.encode("utf-8"))
        if not 0 < size <= MAX_KEY_BYTES:
            raise UsageError(f"--key: must be 1 to {MAX_KEY_BYTES} bytes, got {size}")


def enqueue(
    store: RunStore,
    job_type: str,
    payload: dict[str, Any] | None = None,
    *,
    when: When | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
    traceparent: str | None = None,
    follow: dict[str, Any] | None = None,
    batch_id: int | None = None,
) -> int:
    """Add a run (or find the one its idempotency key names); its id. A duration ``when``
    counts from the database's clock, like every time pgtick compares. ``traceparent``: the
    trace it is enqueued in (docs/tracing.md); ``follow``: its chain, ``batch_id``: its open
    batch (docs/composition.md)."""
    run_at = store.now() + when if isinstance(when, timedelta) else when
    return store.enqueue(
        NewRun(
            job_type,
            payload,
            run_at,
            idempotency_key,
            max_attempts,
            priority,
            concurrency_key,
            traceparent,
            follow,
            batch_id,
        )
    )


def declares_job_type(config: Config, job_type: str) -> bool | None:
    """Whether the config in use (its [job_types] or the @pgtick.job handlers of its
    worker.imports) declares ``job_type``; None when its handlers cannot be imported here."""
    if job_type in config.job_types:
        return True
    if not config.worker.imports:
        return False
    try:
        return job_type in handlers.resolve(config)
    except (PgtickError, ImportError):
        return None
