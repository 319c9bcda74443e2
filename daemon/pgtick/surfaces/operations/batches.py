"""Batches for the operator (``pgtick batch``, the console's batch page): create one from a
list of runs, add to it, close it, show it. The rules (who may add, when the callback fires)
are the schema's (migration 0026, docs/composition.md); these functions check the input and
call them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pgtick.errors import NotFoundError, UsageError
from pgtick.scheduling import steps
from pgtick.storage.store import Batch, NewRun, RunStore

MEMBER_KEYS = (
    "job_type",
    "payload",
    "run_at",
    "key",
    "max_attempts",
    "priority",
    "concurrency_key",
    "on_success",
    "on_dead",
)
MAX_BATCH_LINES = 1_000_000  # one file; add more with `pgtick batch add`
ADD_CHUNK_RUNS = 5000  # members per enqueue statement


def member(value: Any, where: str) -> NewRun:
    """One line of a JSON-lines file of members: an object with ``job_type`` and optionally
    ``payload``, ``run_at`` (ISO time), ``key``, ``max_attempts``, ``priority``,
    ``concurrency_key``, ``on_success``, ``on_dead``."""
    if not isinstance(value, Mapping):
        raise UsageError(f"{where}: expected a JSON object with job_type")
    unknown = sorted(set(value) - set(MEMBER_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(MEMBER_KEYS)})")
    job_type = value.get("job_type")
    if not isinstance(job_type, str) or not 1 <= len(job_type) <= 200:
        raise UsageError(f"{where}.job_type: expected a job type name of 1 to 200 characters")
    payload = value.get("payload")
    if payload is not None and not isinstance(payload, Mapping):
        raise UsageError(f"{where}.payload: expected a JSON object")
    try:
        follow = steps.normalize(value.get("on_success"), value.get("on_dead"), where=where)
        run_at = None if value.get("run_at") is None else datetime.fromisoformat(value["run_at"])
    except (steps.StepError, TypeError, ValueError) as exc:
        message = str(exc) if isinstance(exc, steps.StepError) else f"{where}: {exc}"
        raise UsageError(message) from None
    for name in ("max_attempts", "priority"):
        if value.get(name) is not None and not isinstance(value[name], int):
            raise UsageError(f"{where}.{name}: expected an integer")
    return NewRun(
        job_type,
        payload,
        run_at,
        value.get("key"),
        value.get("max_attempts"),
        value.get("priority"),
        value.get("concurrency_key"),
        None,
        follow,
    )


def members_from_lines(lines: Iterable[str], source: str) -> list[NewRun]:
    """The members of a JSON-lines file (blank lines skipped), each checked."""
    out: list[NewRun] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(out) >= MAX_BATCH_LINES:
            raise UsageError(f"{source}: more than {MAX_BATCH_LINES} members in one file")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{source}:{n}: invalid JSON: {exc}") from None
        out.append(member(value, f"{source}:{n}"))
    return out


def callback_steps(value: Any) -> list[dict[str, Any]] | None:
    """A batch's callback (a job type name, a step, or a list of them) in its normal form."""
    try:
        follow = steps.normalize(value, where="callback")
    except steps.StepError as exc:
        raise UsageError(str(exc)) from None
    return None if follow is None else follow["on_success"]


def add_members(store: RunStore, batch_id: int, runs: Sequence[NewRun]) -> list[int]:
    """Add members to an open batch, in chunks (each chunk its own transaction; a closed
    batch refuses the first chunk it meets). Returns their run ids in input order."""
    ids: list[int] = []
    for i in range(0, len(runs), ADD_CHUNK_RUNS):
        chunk = [_in_batch(r, batch_id) for r in runs[i : i + ADD_CHUNK_RUNS]]
        ids += store.enqueue_many(chunk)
    return ids


def _in_batch(run: NewRun, batch_id: int) -> NewRun:
    return NewRun(
        run.job_type,
        run.payload,
        run.run_at,
        run.idempotency_key,
        run.max_attempts,
        run.priority,
        run.concurrency_key,
        run.traceparent,
        run.follow,
        batch_id,
    )


def create_batch(
    store: RunStore,
    runs: Sequence[NewRun],
    callback: list[dict[str, Any]] | None,
    *,
    close: bool = True,
) -> tuple[int, list[int], str]:
    """Open a batch, add ``runs``, and (``close``) close it: (batch id, run ids, state)."""
    batch_id = store.open_batch(callback)
    ids = add_members(store, batch_id, runs)
    state = store.close_batch(batch_id) if close else "open"
    return batch_id, ids, state


def close_batch(store: RunStore, batch_id: int) -> str:
    show_batch(store, batch_id)  # NotFoundError first
    return store.close_batch(batch_id)


def show_batch(store: RunStore, batch_id: int) -> Batch:
    if batch_id < 1:
        raise UsageError(f"BATCH_ID: not a batch id: {batch_id} (ids start at 1)")
    batch = store.get_batch(batch_id)
    if batch is None:
        raise NotFoundError(f"batch {batch_id} not found (never created, or dropped by retention)")
    return batch
