"""Handlers for the correctness tests (tests/acceptance/test_correctness_*.py), imported by
`pgtick run` through jobs.py. Like every handler there, each execution appends to $JOBS_LOG."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any

from jobs import record
from pgtick.handlers import JobContext, job

POLL_SECONDS = 0.02


@job("hold")
def hold(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Keeps its thread, deaf to ctx.cancelled, while the file ``path`` exists (at most ``max``
    seconds), then returns normally: a handler blocked in a library call."""
    record(ctx)
    deadline = time.monotonic() + payload.get("max", 60.0)
    while os.path.exists(payload["path"]) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    record(ctx, "end")


@job("per_attempt")
def per_attempt(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Takes ``seconds[attempt - 1]`` (the last entry for later attempts), deaf to
    ctx.cancelled, and succeeds; records its start and its end."""
    record(ctx)
    seconds = payload["seconds"]
    time.sleep(seconds[min(ctx.attempt, len(seconds)) - 1])
    record(ctx, "end")


@job("exits")
def exits(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Application code that calls sys.exit()."""
    record(ctx)
    sys.exit(payload.get("code", 1))


BASE_EXCEPTIONS: dict[str, type[BaseException]] = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
}


@job("raises_base")
def raises_base(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A library that raises a BaseException that is not an Exception."""
    record(ctx)
    raise BASE_EXCEPTIONS[payload["kind"]]("from a library")


@job("kills_its_thread")
def kills_its_thread(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Returns normally, but leaves behind a timer that raises SystemExit asynchronously in the
    worker thread once the handler is over (as signal- or trace-based timeout libraries do): the
    thread dies outside any handler, which only the daemon's supervisor can notice."""
    target = threading.get_ident()

    def inject() -> None:
        time.sleep(payload.get("after", 0.3))
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(target), ctypes.py_object(SystemExit)
        )

    threading.Thread(target=inject, daemon=True).start()
    record(ctx)


@job("attentive")
def attentive(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits up to ``seconds[attempt - 1]`` for ctx.cancelled; once told to stop, takes
    ``cleanup`` seconds to wind down (as a real job finishing a write does), then returns."""
    record(ctx)
    seconds = payload["seconds"]
    told = ctx.cancelled.wait(seconds[min(ctx.attempt, len(seconds)) - 1])
    if told:
        time.sleep(payload.get("cleanup", 0.0))
    record(ctx, "end", cancelled=told)
