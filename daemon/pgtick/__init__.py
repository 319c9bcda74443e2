"""pgtick: scheduled and deferred background jobs out of the PostgreSQL you already have."""

from __future__ import annotations

from datetime import datetime
from importlib import metadata as _metadata
from typing import Any

import psycopg

from pgtick.errors import (
    ConfigError,
    DatabaseError,
    Fail,
    NotFoundError,
    PgtickError,
    Retry,
)

try:  # one source: the pyproject version, as installed
    __version__ = _metadata.version("pgtick")
except _metadata.PackageNotFoundError:  # pragma: no cover - a bare source tree
    __version__ = "0+unknown"

from pgtick.core.handlers import JobContext, job

DEFAULT_SCHEMA = "pgtick"


def enqueue(
    conn: psycopg.Connection[Any],
    job_type: str,
    payload: dict[str, Any] | None = None,
    *,
    run_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
    traceparent: str | None = None,
    on_success: Any = None,
    on_dead: Any = None,
    batch: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> int:
    """Enqueue a run inside the caller's own transaction; returns its id.

    Nothing is visible to daemons until the caller commits, so a job is enqueued exactly when
    the business change that needs it is. An ``idempotency_key`` that already exists returns
    the existing run's id and changes nothing. A higher ``priority`` is claimed first among
    due runs of its type (None: the job type's default, as its daemons' config says);
    ``concurrency_key`` is what ``max_running_per_key`` and ``rate_per_key`` count by
    (default: the job type's ``concurrency_key`` payload field).

    The run is stored with the trace it was enqueued in (docs/tracing.md): ``traceparent``
    (a W3C header value; one that is not valid is ignored, as W3C says), or by default the
    caller's current OpenTelemetry span, if the caller uses OpenTelemetry (pgtick never
    imports it here).

    ``on_success`` / ``on_dead``: what to enqueue when the run ends so (a job type name, a
    step ``{"job_type": ..., "payload": {...}, "on_success": ...}``, or a list of them),
    enqueued in the transaction that records the outcome, with ``payload["previous"]``
    saying which run ended and its result (docs/composition.md). ``batch``: the open batch
    (``open_batch``) the run is a member of. A chain refused raises ValueError.
    """
    from pgtick.observability import tracecontext
    from pgtick.scheduling import steps
    from pgtick.storage.store import NewRun, enqueue_on

    follow = steps.normalize(on_success, on_dead)
    traceparent = tracecontext.valid(traceparent) if traceparent else tracecontext.current()
    return enqueue_on(
        conn,
        schema,
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
            batch,
        ),
    )


def open_batch(
    conn: psycopg.Connection[Any], *, callback: Any = None, schema: str = DEFAULT_SCHEMA
) -> int:
    """Open a batch in the caller's transaction; returns its id. Add members with
    ``enqueue(..., batch=id)`` until ``close_batch``; once closed and every member terminal,
    ``callback`` (a job type, a step or a list of them) is enqueued exactly once, its
    payload's ``batch`` holding the id and the counts by outcome (docs/composition.md)."""
    from pgtick.scheduling import steps
    from pgtick.storage import batches

    follow = steps.normalize(callback, where="callback")
    return batches.open_on(conn, schema, None if follow is None else follow["on_success"])


def close_batch(
    conn: psycopg.Connection[Any], batch_id: int, *, schema: str = DEFAULT_SCHEMA
) -> str:
    """No more members for ``batch_id``; returns "done" when every member was terminal
    already (the callback is enqueued in this transaction), else "closed"."""
    from pgtick.storage import batches

    return batches.close_on(conn, schema, batch_id)


def result(conn: psycopg.Connection[Any], run_id: int, *, schema: str = DEFAULT_SCHEMA) -> Any:
    """What run ``run_id``'s handler returned when it succeeded (None: not succeeded, returned
    nothing, or pruned); the schema's ``result(run_id)`` SQL function reads the same."""
    from pgtick.storage import results

    return results.result(conn, run_id, schema=schema)


def wait(
    conn: psycopg.Connection[Any],
    run_id: int,
    *,
    timeout: float,
    schema: str = DEFAULT_SCHEMA,
) -> tuple[str, Any]:
    """Wait for run ``run_id`` to end; returns (status, result). Polls (no LISTEN, so it works
    through a transaction pooler); use an autocommit connection. Raises TimeoutError."""
    from pgtick.storage import results

    return results.wait(conn, run_id, timeout=timeout, schema=schema)


__all__ = [
    "ConfigError",
    "DatabaseError",
    "Fail",
    "JobContext",
    "NotFoundError",
    "PgtickError",
    "Retry",
    "__version__",
    "close_batch",
    "enqueue",
    "job",
    "open_batch",
    "result",
    "wait",
]
