"""Bulk retry and cancel of the runs matching a filter, in two steps, as the console does it:
``plan_filter_bulk`` counts the runs the filter matches now and returns their ids (the
confirmation shows the count and carries the ids); ``run_filter_bulk`` then changes exactly
those, in transactions of ``BULK_BATCH_ROWS``, each batch checked against the filter again
as it is changed. A run that came to match after the confirmation (one that went dead since)
is not among the ids, so it is left alone; one that stopped matching (retried by someone
else meanwhile) is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgtick.errors import UsageError
from pgtick.storage.store import RunStore
from pgtick.surfaces.operations.audit import Actor, record
from pgtick.surfaces.operations.runs import BULK_BATCH_ROWS, Action, check_statuses

# One confirmation carries at most this many ids (its form, some 8 bytes an id, stays far
# below the console's request size limit); more matching runs: the oldest this many, and the
# page says so (confirm again for the rest, or `pgtick retry --status --type`).
MAX_FILTER_BULK_RUNS = 10_000


@dataclass(frozen=True)
class FilterBulk:
    """A bulk retry or cancel of the runs matching a runs-page filter: the statuses among the
    filter's that the action accepts (all it accepts when the filter names none)."""

    action: Action
    statuses: tuple[str, ...]
    job_type: str | None
    schedule: str | None


@dataclass(frozen=True)
class FilterBulkPlan:
    """What the confirmation shows and carries: how many runs match now, and the ids (the
    oldest MAX_FILTER_BULK_RUNS of them)."""

    bulk: FilterBulk
    matching: int
    ids: list[int]


@dataclass(frozen=True)
class FilterBulkDone:
    """What a confirmed bulk action did: how many of the confirmed runs it changed, and how
    many of them no longer matched (or changed state under it) and were left alone."""

    confirmed: int
    changed: int

    @property
    def skipped(self) -> int:
        return self.confirmed - self.changed


def filter_bulk(
    action: Action, statuses: Sequence[str], job_type: str | None, schedule: str | None
) -> FilterBulk:
    """The bulk action on a filter; UsageError when none of its statuses is one the action
    accepts (retrying queued runs)."""
    wanted = check_statuses(statuses)
    accepted = [s for s in wanted if s in action.accepts] if wanted else list(action.accepts)
    if not accepted:
        raise UsageError(
            f"{action.verb}: the filter's statuses ({', '.join(wanted)}) include none that can "
            f"be {action.past} (only {', '.join(action.accepts)})"
        )
    return FilterBulk(action, tuple(accepted), job_type, schedule)


def plan_filter_bulk(
    store: RunStore, bulk: FilterBulk, limit: int = MAX_FILTER_BULK_RUNS
) -> FilterBulkPlan:
    """How many runs ``bulk`` matches now and the ids of the oldest ``limit`` of them."""
    matching = store.filter_count(bulk.statuses, bulk.job_type, bulk.schedule)
    ids = store.filter_ids(bulk.statuses, bulk.job_type, bulk.schedule, limit) if matching else []
    return FilterBulkPlan(bulk, matching, ids)


def run_filter_bulk(
    store: RunStore,
    bulk: FilterBulk,
    ids: Sequence[int],
    batch: int = BULK_BATCH_ROWS,
    *,
    actor: Actor | None = None,
) -> FilterBulkDone:
    """Retry or cancel the confirmed ``ids``, ``batch`` at a time (one transaction each), each
    batch narrowed to the runs that still match the filter just before it changes; recorded
    in the audit log once, as ``actor``'s, with the filter and the runs changed."""
    confirmed = sorted(set(ids))
    if not confirmed:
        raise UsageError(f"{bulk.action.verb}: no runs confirmed")
    if len(confirmed) > MAX_FILTER_BULK_RUNS:
        raise UsageError(
            f"{bulk.action.verb}: at most {MAX_FILTER_BULK_RUNS} runs at once, got {len(confirmed)}"
        )
    changed: list[int] = []
    for start in range(0, len(confirmed), batch):
        chunk = confirmed[start : start + batch]
        still = store.filter_ids(bulk.statuses, bulk.job_type, bulk.schedule, len(chunk), chunk)
        if still:
            changed.extend(bulk.action.apply(store, still))
    args = {
        "statuses": list(bulk.statuses),
        "type": bulk.job_type,
        "schedule": bulk.schedule,
        "confirmed": len(confirmed),
    }
    record(store, actor, bulk.action.verb, bulk.job_type, args, changed, len(changed))
    return FilterBulkDone(len(confirmed), len(changed))
