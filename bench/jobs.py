"""The handlers the bench daemons run, imported through ``worker.imports = ["bench.jobs"]``."""

from __future__ import annotations

import time
from typing import Any

from pgtick import JobContext, job

# Where ``stamp`` records when each run's handler started (wall clock of the daemon's host).
STARTS_DDL = """
CREATE TABLE IF NOT EXISTS public.bench_starts (
    run_id   bigint PRIMARY KEY,
    started  double precision NOT NULL
)
"""
HOLD_DEFAULT_SECONDS = 3600.0


@job("noop")
def noop(ctx: JobContext, payload: Any) -> None:
    """Does nothing: the throughput figures measure pgtick, not the handler."""


@job("stamp")
def stamp(ctx: JobContext, payload: Any) -> None:
    """Records time.time() at handler start, committed together with the run's success."""
    started = time.time()
    with ctx.transaction() as conn:
        conn.execute(
            "INSERT INTO public.bench_starts (run_id, started) VALUES (%s, %s)",
            [ctx.run_id, started],
        )


@job("hold")
def hold(ctx: JobContext, payload: Any) -> None:
    """Holds its thread (and the run's lease) until cancelled or ``payload.seconds`` pass."""
    seconds = float((payload or {}).get("seconds", HOLD_DEFAULT_SECONDS))
    ctx.cancelled.wait(seconds)


@job("burn")
def burn(ctx: JobContext, payload: Any) -> None:
    """Burns ``payload.seconds`` (1) of CPU in pure Python, the GIL held: what scales with
    worker.processes and not with threads."""
    deadline = time.thread_time() + float((payload or {}).get("seconds", 1.0))
    while time.thread_time() < deadline:
        pass
