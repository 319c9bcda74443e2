"""A no-op handler for the benchmarks (imported by the daemon via worker.imports)."""

from __future__ import annotations

from typing import Any

from pgtick import JobContext, job


@job("noop")
def noop(ctx: JobContext, payload: Any) -> None:
    """Does nothing: the benchmark measures pgtick, not the handler."""
