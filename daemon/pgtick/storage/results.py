"""Results of runs (docs/composition.md, Results): the bound on a handler's return value, its
encoding as stored, and the application's reads (``pgtick.result``, ``pgtick.wait``).

A result is stored with the attempt that produced it (``attempts_history.result``, migration
0024), so it lives and is dropped with that attempt's partition. Reads go through the
schema's ``result(run_id)`` SQL function, the one definition of "a run's result"; waiting polls
it (no LISTEN: it works through a transaction pooler).
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
from psycopg import sql

RESULT_MAX_BYTES = 1024 * 1024  # 1 MiB of JSON text per attempt
WAIT_POLL_SECONDS = 0.5
TERMINAL = ("succeeded", "dead", "cancelled", "skipped")


class ResultError(ValueError):
    """A return value that cannot be stored: not JSON, or larger than the bound."""


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KiB"


def encode(value: Any, limit: int = RESULT_MAX_BYTES) -> str | None:
    """The JSON text stored for ``value`` (None: nothing to store); raises ResultError with a
    one-line reason past the bound or for a value JSON cannot carry."""
    if value is None:
        return None
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultError(f"result: not JSON: {type(exc).__name__}: {exc}") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ResultError(
            f"result: {_size(size)} of JSON is over the bound of {_size(limit)} "
            "(store large results elsewhere and return a reference)"
        )
    if "\\u0000" in text or "\x00" in text:
        raise ResultError("result: contains a NUL character, which PostgreSQL's jsonb refuses")
    return text


def from_stdout(stdout_tail: str, limit: int = RESULT_MAX_BYTES) -> str | None:
    """A command's result: its last non-empty line of stdout, parsed as JSON (None: no
    output); raises ResultError when that line is not JSON."""
    lines = [line for line in stdout_tail.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError as exc:
        raise ResultError(f"result: the last line of stdout is not JSON: {exc}") from None
    return encode(value, limit)


def result(conn: psycopg.Connection[Any], run_id: int, *, schema: str = "pgtick") -> Any:
    """The result of run ``run_id``'s succeeded attempt, as Python values (None: none yet,
    nothing returned, or the run was pruned)."""
    row = conn.execute(
        sql.SQL("SELECT {}.result(%s)").format(sql.Identifier(schema)), (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def wait(
    conn: psycopg.Connection[Any],
    run_id: int,
    *,
    timeout: float,
    schema: str = "pgtick",
    poll_seconds: float = WAIT_POLL_SECONDS,
) -> tuple[str, Any]:
    """Poll until run ``run_id`` is terminal or ``timeout`` seconds pass; returns (status,
    result). Each poll is one short statement in autocommit or the caller's transaction (a
    REPEATABLE READ transaction would see the same snapshot forever: use autocommit). Raises
    TimeoutError naming the last status; LookupError if the run does not exist."""
    deadline = time.monotonic() + timeout
    query = sql.SQL("SELECT status, {s}.result(id) FROM {s}.runs WHERE id = %s").format(
        s=sql.Identifier(schema)
    )
    while True:
        row = conn.execute(query, (run_id,)).fetchone()
        if row is None:
            raise LookupError(f"run {run_id}: no such run (never enqueued, or pruned)")
        status, value = row
        if status in TERMINAL:
            return str(status), value
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"run {run_id}: still {status} after {timeout:g}s")
        time.sleep(min(poll_seconds, left))
