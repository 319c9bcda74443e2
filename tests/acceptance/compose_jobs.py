"""Handlers of the composition tests (results, chains, batches), named by `handler =` in
their configs. Each records its execution to $JOBS_LOG (jobs.record), so a count of runs
survives SIGKILL and restarts."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pgtick
from pgtick import JobContext


def record(ctx: JobContext, event: str = "run", **extra: Any) -> None:
    """One line per execution in $JOBS_LOG (one O_APPEND write: survives SIGKILL)."""
    line = json.dumps(
        {
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "event": event,
            "job_type": ctx.job_type,
            "t": time.time(),
            **extra,
        }
    )
    fd = os.open(os.environ["JOBS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def give(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Returns payload["give"], or a string of payload["bytes"] characters."""
    record(ctx)
    if "bytes" in payload:
        return "x" * payload["bytes"]
    return payload.get("give")


def in_transaction(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Commits its success in ctx.transaction(), its result set inside it."""
    with ctx.transaction():
        ctx.set_result({"in": "transaction"})
    record(ctx)


def step(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """A chain step: returns what it got from the run before it, one step further. Sleeps
    payload["sleep"] seconds first (so kills land mid-chain)."""
    record(ctx, previous=payload.get("previous"))
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if os.environ.get("COMPOSE_FAIL_ONCE") and ctx.attempt == 1 and payload.get("flaky"):
        raise RuntimeError("first attempt fails")
    previous = payload.get("previous") or {}
    got = previous.get("result") or {"path": []}
    return {"path": [*got["path"], ctx.job_type], "run_id": ctx.run_id}


def member(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """A batch member: fails until attempt payload["succeed_at"] (never when 0)."""
    record(ctx)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    at = payload.get("succeed_at", 1)
    if at == 0 or ctx.attempt < at:
        raise pgtick.Retry(after=0, message=f"attempt {ctx.attempt} fails")
    return {"n": payload.get("n")}


def callback(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A batch's callback (or a chain's on_dead): records what it was given."""
    record(ctx, "callback", payload=payload)


def fail(ctx: JobContext, payload: dict[str, Any]) -> None:
    record(ctx)
    raise pgtick.Fail("given up")


def bill(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """A billing run for `after`: its mode file ($JOBS_LOG.mode) says slow (sleeps, then
    succeeds) or dead (gives up at once)."""
    with open(os.environ["JOBS_LOG"] + ".mode", encoding="utf-8") as f:
        mode = f.read().strip()
    record(ctx, mode=mode)
    if mode == "dead":
        raise pgtick.Fail("billing failed")
    time.sleep(payload.get("sleep", 15))
    record(ctx, "billed")
    return {"billed": ctx.scheduled_for.isoformat() if ctx.scheduled_for else None}
