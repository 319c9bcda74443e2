"""Execute a plan: the server, the database, the daemons, the steps on time, a quiet end, a
clean stop, the final state; then the checker's verdict.

Timeline: the daemons start; operations and faults run at their plan times (operations on a
pool of client threads, faults on threads of their own, so a slow step does not hold back the
rest) until ``plan.active_seconds``; then the quiesce: every fault ends (frozen daemons thawed,
locks and snapshots let go, stopped daemons started again), no new work, and the daemons
finish what leases and retries allow; then SIGTERM to every daemon, and the final state read.
The history directory holds the plan, the config, the history files, the daemons' logs and
the final state: ``python -m tests.torture.checker DIR`` judges it again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg

from tests.torture import checker, report, upgrade
from tests.torture.cluster import Daemons, config_text, database, release_config, server
from tests.torture.faults import Nemesis
from tests.torture.history import (
    ATTEMPT_FIELDS,
    ATTEMPTS_COLUMNS,
    INFO,
    HistoryFile,
    read_directory,
)
from tests.torture.observer import Observer, StallWatch
from tests.torture.operations import Clients
from tests.torture.plan import Plan, draw

CLIENT_THREADS = 8
FAULT_THREADS = 8


@dataclass(frozen=True)
class Options:
    seed: int
    minutes: float
    daemons: int = 3
    only: tuple[str, ...] = ()
    dsn: str | None = None  # an admin DSN; None: an embedded server of the run's own
    keep: Path | None = None  # the history directory to write (kept); None: a temporary one
    processes: int = 1  # each daemon's worker.processes
    faults: float = 1.0  # every fault's rate times this


def execute(options: Options, out: TextIO) -> checker.Verdict:
    """Run the plan of ``options.seed`` and judge it; prints the seed first, then the report."""
    plan = draw(options.seed, options.minutes, options.daemons, options.only, options.faults)
    print(
        f"torture seed={plan.seed} minutes={plan.minutes:g} daemons={plan.daemons}"
        f" processes={options.processes} faults={plan.faults:g}"
        f" only={','.join(plan.only) or 'all'}",
        file=out,
        flush=True,
    )
    counts = plan.counts()
    print(
        "plan: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; active"
        f" {plan.active_seconds:.0f} s, quiesce {plan.quiesce_seconds:.0f} s",
        file=out,
        flush=True,
    )
    with directory(options.keep) as history_dir:
        (history_dir / "plan.json").write_text(plan.to_json())
        run_plan(plan, options.dsn, history_dir, out, options.processes)
        verdict = judge(history_dir)
        print(report.text(verdict), file=out, flush=True)
        if options.keep is None and verdict.violations:
            print("(history removed: --keep DIR keeps it)", file=out)
        return verdict


@contextlib.contextmanager
def directory(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="pgtick-torture-") as tmp:
        yield Path(tmp)


def judge(history_dir: Path) -> checker.Verdict:
    """The checker over a history directory written by a run."""
    raw = json.loads((history_dir / "plan.json").read_text())
    final = json.loads((history_dir / "final.json").read_text())
    return checker.check(raw, read_directory(history_dir), final)


def run_plan(
    plan: Plan, dsn: str | None, history_dir: Path, out: TextIO, processes: int = 1
) -> None:
    if plan.upgrade and processes != 1:
        raise RuntimeError(
            f"seed {plan.seed} starts on the previous release (the migrate fault), which has "
            "no worker.processes: run it with --processes 1, or --only without migrate"
        )
    logs = history_dir / "logs"
    logs.mkdir(exist_ok=True)
    config = history_dir / "config.toml"
    config.write_text(config_text(plan.world, processes))
    harness = HistoryFile(history_dir / "harness.jsonl", "harness")
    previous = upgrade.previous_code(history_dir) if plan.upgrade else None
    if previous is not None:
        release_config(config, previous).write_text(config_text(plan.world, None))
    with server(dsn) as srv, database(srv.admin_dsn, previous) as db_dsn:
        daemons = Daemons(db_dsn, config, history_dir, logs, harness, plan.daemons)
        daemons.previous = previous
        clients = Clients(db_dsn, config, plan.world, harness, daemons.code)
        nemesis = Nemesis(db_dsn, srv, daemons, harness)
        observer = Observer(db_dsn, harness)
        stalls = StallWatch(harness)
        for slot in range(plan.daemons):
            daemons.start(slot)
        daemons.wait_started()
        observing = threading.Thread(target=observer.run, daemon=True)
        observing.start()
        threading.Thread(target=stalls.run, daemon=True).start()
        harness.write(
            INFO,
            "start",
            {"seed": plan.seed, "restartable": srv.restartable, "processes": processes},
        )
        began = time.monotonic()
        try:
            run_steps(plan, began, clients, nemesis)
            harness.write(INFO, "quiesce", {})
            for slot in range(plan.daemons):
                daemons.start(slot)  # any slot left empty by a fault
            remaining = plan.active_seconds + plan.quiesce_seconds - (time.monotonic() - began)
            time.sleep(max(plan.quiesce_seconds / 2, remaining))
        finally:
            observer.stop_event.set()
            stalls.stop_event.set()
            observing.join(10)
            daemons.stop_all()
        harness.write(INFO, "end", {"seconds": round(time.monotonic() - began, 1)})
        final = final_state(db_dsn)
        final["leftover_processes"] = leftover_commands(history_dir)
        (history_dir / "final.json").write_text(json.dumps(final, default=str))
    harness.close()
    print(f"ran {time.monotonic() - began:.0f} s; history in {history_dir}", file=out, flush=True)


def run_steps(plan: Plan, began: float, clients: Clients, nemesis: Nemesis) -> None:
    actions: dict[str, Callable[[int, Mapping[str, Any]], None]] = {
        "enqueue": clients.enqueue,
        "key-race": clients.key_race,
        "cancel": clients.cancel,
        "retry": clients.retry,
        "prune": clients.prune,
        "pause": clients.pause,
        "limits": clients.limits,
        "chain": clients.chain,
        "batch": clients.batch,
        "kill": nemesis.kill,
        "term": nemesis.term,
        "freeze": nemesis.freeze,
        "terminate-backend": nemesis.terminate_backend,
        "pg-restart": nemesis.pg_restart,
        "row-lock": nemesis.row_lock,
        "held-snapshot": nemesis.held_snapshot,
        "migrate": nemesis.migrate,
    }
    faults = {
        "kill",
        "term",
        "freeze",
        "terminate-backend",
        "pg-restart",
        "row-lock",
        "held-snapshot",
        "migrate",
    }
    with (
        concurrent.futures.ThreadPoolExecutor(CLIENT_THREADS, "client") as ops,
        concurrent.futures.ThreadPoolExecutor(FAULT_THREADS, "fault") as nemeses,
    ):
        futures = []
        for index, step in enumerate(plan.steps):
            delay = began + step.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool = nemeses if step.kind in faults else ops
            futures.append(pool.submit(guarded, actions[step.kind], index, step.args))
        for future in futures:
            future.result()


def guarded(
    action: Callable[[int, Mapping[str, Any]], None], index: int, args: Mapping[str, Any]
) -> None:
    """A step that raises is a harness bug: say so and carry on with the others."""
    try:
        action(index, args)
    except Exception as exc:
        print(f"torture: step {index} raised {type(exc).__name__}: {exc}", flush=True)


FINAL_RUNS = """
SELECT r.id, r.status, r.job_type, r.idempotency_key, s.name, r.scheduled_for, r.attempts,
       r.locked_by, r.run_at > now(), r.error_type, r.payload->>'n',
       coalesce(r.concurrency_key, r.payload->>'k'), r.last_error,
       (r.payload->'previous'->>'run_id')::bigint, r.payload->'previous'->>'outcome',
       r.payload->'batch', r.batch_id, extract(epoch FROM r.finished_at)::float8
FROM pgtick.runs r LEFT JOIN pgtick.schedules s ON s.id = r.schedule_id
ORDER BY r.id
"""
BATCH_FIELDS = ("id", "state", "members", "succeeded", "dead", "cancelled", "callback_run_id")
FINAL_ATTEMPTS = f"SELECT {ATTEMPTS_COLUMNS} FROM pgtick.attempts ORDER BY run_id, attempt"


def final_state(dsn: str) -> dict[str, Any]:
    """Everything the checker reads from the database after the stop."""
    with psycopg.connect(dsn, application_name="torture-final") as conn:
        runs = [
            {
                "id": r[0],
                "status": r[1],
                "job_type": r[2],
                "key": r[3],
                "schedule": r[4],
                "scheduled_for": r[5].isoformat() if r[5] else None,
                "attempts": r[6],
                "locked_by": r[7],
                "future": r[8],
                "error_type": r[9],
                "n": r[10],
                "ck": r[11],
                "last_error": (r[12] or "")[:200],
                "prev": r[13],
                "prev_outcome": r[14],
                "batch": r[15],
                "batch_id": r[16],
                "finished": r[17],
            }
            for r in conn.execute(FINAL_RUNS).fetchall()
        ]
        attempts = [
            dict(zip(ATTEMPT_FIELDS, row, strict=True))
            for row in conn.execute(FINAL_ATTEMPTS).fetchall()
        ]
        effects = [
            {"run": r[0], "attempt": r[1], "rows": r[2]}
            for r in conn.execute(
                "SELECT run_id, attempt, count(*) FROM public.torture_effects GROUP BY 1, 2"
            ).fetchall()
        ]
        workers = [r[0] for r in conn.execute("SELECT id FROM pgtick.workers").fetchall()]
        batches = [
            dict(zip(BATCH_FIELDS, row, strict=True))
            for row in conn.execute(f"SELECT {', '.join(BATCH_FIELDS)} FROM pgtick.batches")
        ]
    return {
        "runs": runs,
        "attempts": attempts,
        "effects": effects,
        "workers": workers,
        "batches": batches,
    }


def leftover_commands(history_dir: Path) -> list[int]:
    """Command handlers still alive after every daemon stopped (each wrote its pid)."""
    alive = []
    for path in history_dir.glob("cmd-*.jsonl"):
        pid = int(path.stem.removeprefix("cmd-"))
        with contextlib.suppress(OSError):
            if "tests.torture.cmd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                errors="replace"
            ):
                alive.append(pid)
                os.kill(pid, signal.SIGKILL)  # the next run must not meet it
    return alive
