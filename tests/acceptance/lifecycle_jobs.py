"""Handlers for the lifecycle bug tests (tests/acceptance/test_lifecycle_bugs.py), imported
by `pgtick run` through jobs.py."""

from __future__ import annotations

import time
from typing import Any

from psycopg_pool import PoolTimeout

from jobs import record
from pgtick import JobContext, job


@job("commit_then_linger")
def commit_then_linger(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Commits its success through ctx.transaction(), then keeps its thread a while: the
    heartbeats meanwhile find the lease gone (the commit cleared it) and must not treat the
    run as lost."""
    with ctx.transaction() as conn:
        conn.execute("SELECT 1")
    record(ctx, "committed")
    told_to_stop = ctx.cancelled.wait(payload["linger"])
    record(ctx, "cancelled" if told_to_stop else "done")


@job("hog")
def hog(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Application code that holds every free connection of the daemon's pool for a while
    (as nested transactions or a library with its own connections would)."""
    pool = ctx._store.pool
    held = []
    try:
        while len(held) < payload["connections"]:
            try:
                held.append(pool.getconn(timeout=0.2))
            except PoolTimeout:
                break
        record(ctx, "hogging", connections=len(held))
        time.sleep(payload["seconds"])
    finally:
        for conn in held:
            pool.putconn(conn)
    record(ctx, "done")
