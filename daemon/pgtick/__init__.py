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
    """
    from pgtick.observability import tracecontext
    from pgtick.storage.store import NewRun, enqueue_on

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
        ),
    )


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
    "enqueue",
    "job",
    "result",
    "wait",
]
