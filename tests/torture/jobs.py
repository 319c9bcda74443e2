"""The Python handler of every torture job type, run by `pgtick run` in the daemons.

Each call appends its start, a tick every couple of seconds, and its end (returned normally,
or what it raised) to its daemon's history file, outside any transaction of the run; what it
does in between is its payload's behaviour (plan.BEHAVIOURS). The effect of ``tx`` runs is a
row of ``public.torture_effects`` written in ``ctx.transaction()``, together with the success.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import pgtick
from tests.torture.history import DAEMON_ENV, FAIL, HISTORY_ENV, INFO, INVOKE, OK, HistoryFile

TICK_SECONDS = 2.0
EFFECT = "INSERT INTO public.torture_effects (run_id, attempt, pid, t) VALUES (%s, %s, %s, %s)"
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS public.torture_effects (
    run_id  bigint NOT NULL,
    attempt int NOT NULL,
    pid     int NOT NULL,
    t       bigint NOT NULL
)
"""

_files: dict[int, HistoryFile] = {}  # by pid: a forked handler must not write into its parent's
_files_lock = threading.Lock()


class Cancelled(Exception):
    """ctx.cancelled was set while the handler waited: stop, and do not report a success."""


def history() -> HistoryFile:
    """This process's handler history file, opened on first use."""
    pid = os.getpid()
    with _files_lock:
        found = _files.get(pid)
        if found is None:
            directory = Path(os.environ[HISTORY_ENV])
            process = f"{os.environ.get(DAEMON_ENV, 'daemon')}:{pid}"
            found = _files[pid] = HistoryFile(directory / f"handlers-{pid}.jsonl", process)
        return found


def handle(ctx: pgtick.JobContext, payload: dict[str, Any]) -> None:
    """Do what the payload says, recording it."""
    behaviour = str(payload.get("b", "ok"))
    seconds = float(payload.get("s", 0.1))
    record: dict[str, Any] = {
        "run": ctx.run_id,
        "attempt": ctx.attempt,
        "job_type": ctx.job_type,
        "b": behaviour,
        "n": payload.get("n"),
        "ck": payload.get("k"),
        "sched": payload.get("sched"),
        "scheduled_for": ctx.scheduled_for.isoformat() if ctx.scheduled_for else None,
        "daemon": os.environ.get(DAEMON_ENV),
        "pid": os.getpid(),
    }
    if payload.get("claim_time"):
        record["claimed"] = claim_time(ctx.run_id)
    previous = payload.get("previous")
    if isinstance(previous, dict):  # a chain's step (docs/composition.md)
        record["prev"] = previous.get("run_id")
        record["prev_outcome"] = previous.get("outcome")
    if isinstance(payload.get("batch"), dict):  # a batch's callback, and the counts it got
        record["batch"] = payload["batch"]
    file = history()
    file.write(INVOKE, "handler", record)
    try:
        run_behaviour(ctx, behaviour, seconds, record)
    except BaseException as exc:
        file.write(FAIL, "handler", {**record, "error": type(exc).__name__})
        raise
    file.write(OK, "handler", record)


def run_behaviour(
    ctx: pgtick.JobContext, behaviour: str, seconds: float, record: dict[str, Any]
) -> None:
    if behaviour in ("ok", "long"):
        wait(ctx, seconds, record, cooperative=True)
    elif behaviour in ("overrun", "ignore", "linger", "stubborn"):
        wait(ctx, seconds, record, cooperative=False)
    elif behaviour == "fail":
        wait(ctx, seconds, record, cooperative=True)
        raise ValueError("fails every attempt")
    elif behaviour in ("flaky", "retry"):
        wait(ctx, seconds, record, cooperative=True)
        if ctx.attempt == 1:
            if behaviour == "retry":
                raise pgtick.Retry(after=1)
            raise ValueError("fails its first attempt")
    elif behaviour == "raise":
        raise RuntimeError("raised")
    elif behaviour == "exit":
        sys.exit(3)
    elif behaviour == "failhard":
        raise pgtick.Fail("failed for good")
    elif behaviour in ("tx", "txflaky"):
        wait(ctx, seconds, record, cooperative=True)
        with ctx.transaction() as conn:
            conn.execute(EFFECT, [ctx.run_id, ctx.attempt, os.getpid(), time.time_ns()])
            if behaviour == "txflaky" and ctx.attempt == 1:
                raise RuntimeError("raised inside ctx.transaction(): rolled back")
        history().write(OK, "effect", {"run": ctx.run_id, "attempt": ctx.attempt})
    else:
        raise ValueError(f"unknown behaviour {behaviour!r}")


def wait(
    ctx: pgtick.JobContext, seconds: float, record: dict[str, Any], *, cooperative: bool
) -> None:
    """Take ``seconds``, ticking into the history; a cooperative wait stops when cancelled."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        step = min(TICK_SECONDS, left)
        if cooperative:
            if ctx.cancelled.wait(step):
                raise Cancelled(f"cancelled after {seconds - left:.1f} s")
        else:
            time.sleep(step)
        if end - time.monotonic() > 0:
            history().write(INFO, "handler", {"run": record["run"], "attempt": record["attempt"]})


def claim_time(run_id: int) -> float | None:
    """The run's started_at (its claim, on the database clock) in Unix seconds: a rate limit
    counts claims."""
    try:
        with psycopg.connect(os.environ["PGTICK_DSN"], application_name="torture-handler") as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM started_at)::float8 FROM pgtick.runs WHERE id = %s",
                [run_id],
            ).fetchone()
    except psycopg.Error:
        return None
    return float(row[0]) if row and row[0] is not None else None
