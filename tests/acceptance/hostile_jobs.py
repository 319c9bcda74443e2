"""Handlers that fail in ways a result can hardly be stored, fork, or race their own
heartbeat, for the tests that name them (``[job_types.NAME] handler = "hostile_jobs:..."``)."""

from __future__ import annotations

import os
import time
from typing import Any

from jobs import record
from pgtick.handlers import JobContext


def nul_error(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Fails with a message holding a NUL character (binary data quoted in an error)."""
    record(ctx)
    raise ValueError("bad record: \x00\x01")


def plain(ctx: JobContext, payload: Any) -> None:
    """Records its execution; touches nothing of its payload."""
    record(ctx)
    if isinstance(payload, dict) and payload.get("sleep"):
        time.sleep(payload["sleep"])


def forker(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Forks a helper process that does its part and exits with sys.exit(), the usual way
    a Python program ends (as a daemonizing or worker-spawning library does)."""
    record(ctx)
    time.sleep(payload.get("before", 0.0))
    pid = os.fork()
    if pid == 0:
        record(ctx, "child")
        raise SystemExit(0)
    record(ctx, "forked", child=pid)


def retry_far(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Asks for a retry far in the future (a timedelta computed from bad data)."""
    record(ctx)
    import pgtick

    raise pgtick.Retry(after=payload["after"], message="later")


def bad_filename(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Fails on a file whose name is not UTF-8: Python decodes it with surrogateescape, so
    the error's text holds a lone surrogate."""
    record(ctx)
    name = os.fsdecode(b"/nonexistent/report-\xff.csv")
    raise ValueError(f"cannot parse {name}")
