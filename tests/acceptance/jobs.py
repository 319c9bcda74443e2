"""Handlers used by the acceptance tests, imported by real `pgtick run` processes through
``worker.imports = ["jobs"]``. Every execution appends one line to $JOBS_LOG (O_APPEND, one
write per line), so the record survives database outages and SIGKILL alike."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pgtick

# The handler API's import path of earlier READMEs, kept working (README: Architecture).
from pgtick.handlers import JobContext, job


def record(ctx: JobContext, event: str = "run", **extra: Any) -> None:
    line = json.dumps(
        {
            "run_id": ctx.run_id,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "event": event,
            "t": time.time(),
            **extra,
        }
    )
    fd = os.open(os.environ["JOBS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@job("record")
def record_run(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Record the execution, optionally take a while."""
    record(ctx)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])


@job("stubborn")
def stubborn(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Ignores cancellation: sleeps its full time whatever happens."""
    record(ctx)
    time.sleep(payload["seconds"])
    record(ctx, "done")


@job("polite")
def polite(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits until told to stop (or `seconds`), recording when it saw the cancellation."""
    record(ctx)
    if ctx.cancelled.wait(payload.get("seconds", 60)):
        record(ctx, "cancelled")
        raise pgtick.Retry(message="cancelled")
    record(ctx, "done")


@job("effect")
def effect(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Records what effect_once answered for the shared key."""
    record(ctx, "effect", first=ctx.effect_once(payload["key"]))


@job("tx_fail")
def tx_fail(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Writes inside ctx.transaction(), then fails: neither the write nor success may stay."""
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO public.side_effects (run_id) VALUES (%s)", [ctx.run_id])
        if payload.get("fail"):
            raise RuntimeError("failed after writing")
    record(ctx)


@job("pickup")
def pickup(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Records when the handler started, for the pickup-latency test."""
    record(ctx, "started")


@job("retry_after")
def retry_after(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Asks for a retry after a chosen delay."""
    record(ctx)
    raise pgtick.Retry(after=payload["after"], message="not yet")


@job("give_up")
def give_up(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Fails for good: no retries left to try."""
    record(ctx)
    raise pgtick.Fail("invoice 42 does not exist")


@job("boom")
def boom(ctx: JobContext, payload: dict[str, Any]) -> None:
    """An ordinary bug."""
    record(ctx)
    raise ValueError("unexpected input " + "x" * 20_000)


@job("yielding")
def yielding(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Succeeds on its own after `seconds` unless told to stop first; either way it returns
    normally, so a cancelled run still hands the daemon a success that must be dropped."""
    record(ctx)
    if ctx.cancelled.wait(payload["seconds"]):
        record(ctx, "cancelled")
    else:
        record(ctx, "done")


@job("always_retry")
def always_retry(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Asks for a retry on every attempt, soon, until the run has no attempts left."""
    record(ctx)
    raise pgtick.Retry(after=payload.get("after", 0.0), message=f"attempt {ctx.attempt}")


@job("gated")
def gated(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits until the file ``gate`` exists (at most 60 s), then sleeps ``sleep``: a run as
    long as the test needs, however slowly the machine starts the test's other daemons."""
    record(ctx, gated=True)
    deadline = time.monotonic() + 60.0
    while not os.path.exists(payload["gate"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(payload.get("sleep", 0.0))


@job("span")
def span(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Records when it started and when it ended, to show two executions never overlap."""
    record(ctx)
    time.sleep(payload["sleep"])
    record(ctx, "end")


# The lifecycle bug and correctness tests' handlers register themselves on import (they use
# record()).
import correctness_jobs  # noqa: E402, F401
import lifecycle_jobs  # noqa: E402, F401


@job("burn")
def burn(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Burn ``seconds`` of CPU in pure Python (the GIL held throughout), then record."""
    record(ctx, "start")
    deadline = time.thread_time() + float(payload.get("seconds", 1.0))
    n = 0
    while time.thread_time() < deadline:
        n += 1
    record(ctx)
