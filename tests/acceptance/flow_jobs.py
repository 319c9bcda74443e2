"""Handlers of the flow-control acceptance tests (tests/acceptance/test_flow_control.py), named
by ``handler = "flow_jobs:work"`` in their configs. Each execution appends a start and an end
line to $JOBS_LOG (tests/acceptance/jobs.py's record), with the run's concurrency key."""

from __future__ import annotations

import os
import time
from typing import Any

from jobs import record
from pgtick.handlers import JobContext


def work(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Record the start, take ``payload.sleep`` seconds (0 by default; ``retry_sleep`` on a
    later attempt) or, given ``payload.until``, wait until that file exists (at most 60 s),
    record the end."""
    record(ctx, "start", key=payload.get("customer"))
    seconds = payload.get("sleep", 0)
    if ctx.attempt > 1:
        seconds = payload.get("retry_sleep", seconds)
    time.sleep(seconds)
    deadline = time.monotonic() + 60
    while "until" in payload and not os.path.exists(payload["until"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    record(ctx, "end", key=payload.get("customer"))


def stuck(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Record the start; on the first attempt, block, deaf to ctx.cancelled, until the file
    ``payload.until`` exists (at most ``payload.at_most`` seconds, 60 by default); record the
    end."""
    record(ctx, "start", key=payload.get("customer"))
    if ctx.attempt == 1:
        deadline = time.monotonic() + payload.get("at_most", 60)
        while not os.path.exists(payload["until"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    record(ctx, "end", key=payload.get("customer"))
