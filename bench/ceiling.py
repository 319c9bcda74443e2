"""The SQL ceiling: N no-op runs drained by pgtick's own claim and finish statements alone, no
Python, to tell how far the daemon is from what its statements allow on the same server.

The database is migrated and loaded as the throughput part's (``common.fresh_database``,
``common.enqueue_noop``), timed and checked as it is (``throughput.measure``: every run
succeeded, one 'succeeded' attempt row each, first claim to last finish on the database clock).
What drains it is the worker's SQL as the daemon sends it, rendered by ``pgtick.storage.sqlfile``
and sent through ``base.by_index`` (``planner_hints`` in the same pipeline; the finish also with
``lock_wait``): the ``claim`` block, for every job type a daemon of the same config handles,
``worker.threads + worker.prefetch`` runs at a time (a dispatcher's claim in a backlog of no-op
runs), and the ``succeed`` block, up to ``COMPLETE_BATCH_MAX`` (500) results at a time (the
completer's batch), each on its own connection of a pool made as the daemon's worker pool
(``db.make_pool``: prepared statements after 5 runs, so the generic plans the daemon runs). The
claim's lower bounds are kept by the daemon's ``ClaimBounds``, look backs included. One lane
(a claiming and a finishing loop) per worker process the config gives on this machine
(``worker.processes``), as each process claims and finishes on connections of its own.

A tight psycopg loop, not one on the server: a procedure with COMMITs could loop in PL/pgSQL,
but there the statements run as dynamic SQL, planned at every call rather than on the prepared
generic plans the daemon uses (the claim plans in about 0.8 ms and runs in 0.2), and one backend
would claim and finish in turn where the daemon does both at once. What stays of Python is per
batch (a few list operations and a thread hand-off per claim) and a tuple per run claimed: no
handler, no lifecycle, no completer, no metrics, no thread per run. Flow control's limits
(``claim_limited``) are not covered: a limited job type is a usage error.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import common, throughput
from pgtick.config.load import load_config
from pgtick.core import handlers
from pgtick.core.completer import COMPLETE_BATCH_MAX, FINISH_LOCK_WAIT_MS
from pgtick.core.keyset import ClaimBounds
from pgtick.core.worker import claim_type
from pgtick.storage import db
from pgtick.storage.base import MOVED_ROW_TRIES, SKIPPING_TRIES, Pool, by_index
from pgtick.storage.store import ClaimedRun, ClaimType

DEFAULT_TIMEOUT_SECONDS = throughput.DEFAULT_TIMEOUT_SECONDS
WORKER_ID = "sql-ceiling-{lane}"  # the attempts' worker_id: runs_per_daemon counts per lane

Claims = list[tuple[int, int]]  # (run id, attempt) of runs claimed, for the finish


@dataclass(frozen=True)
class Plan:
    """What a daemon of the config would send: its claim types, claim size and processes."""

    types: tuple[ClaimType, ...]
    claim_limit: int
    lanes: int


def plan(config_path: Path) -> Plan:
    """The claim's types and size and the worker processes, read from the config as the daemon
    reads it (the decorated job types of ``worker.imports`` included)."""
    config = load_config(config_path)
    job_types = handlers.resolve(config)
    types = tuple(claim_type(jt.config, jt.lease_seconds) for jt in job_types.values())
    limited = sorted(t.job_type for t in types if t.limited)
    if limited:
        raise common.BenchError(f"the SQL ceiling has no flow control: {limited} are limited", 2)
    worker = config.worker
    return Plan(types, worker.threads + worker.prefetch, worker.process_count)


def drain(
    admin_dsn: str,
    tmp: Path,
    runs: int,
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """One drain in a fresh database; returns runs/s and the checks, raises if a check fails."""
    settings = settings or {}
    with common.fresh_database(admin_dsn, "ceil") as dsn:
        common.enqueue_noop(dsn, runs)
        result = drain_loaded(dsn, tmp, runs, settings=settings, timeout=timeout)
    result["settings"] = settings
    return result


def drain_loaded(
    dsn: str,
    tmp: Path,
    runs: int,
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Drain the ``runs`` queued runs of a loaded database with the statements alone, then
    measure and check as the throughput part does."""
    config = common.write_config(tmp / f"ceiling-{time.monotonic_ns()}.toml", settings)
    how = plan(config)
    pool = db.make_pool(dsn, common.SCHEMA, size=2 * how.lanes, name="pgtick-ceiling", prepare=True)
    try:
        with common.connect(dsn) as conn:
            cpu_before = throughput.cpu_seconds(conn, [])
            client_before = time.process_time()
            started = time.monotonic()
            run_lanes(pool, how, timeout)
            wall = time.monotonic() - started
            client_used = time.process_time() - client_before
            cpu_after = throughput.cpu_seconds(conn, [])
            result = throughput.measure(conn, runs)
    finally:
        pool.close()
    result.update(
        lanes=how.lanes,
        claim_limit=how.claim_limit,
        finish_max=COMPLETE_BATCH_MAX,
        client_wall_seconds=round(wall, 3),
    )
    result.update(throughput.cpu_per_run(cpu_before, cpu_after, runs))
    # The loops' own CPU where the daemon's would be: what Python still costs a run here.
    result["daemon_cpu_us_per_run"] = round(client_used * 1e6 / runs, 1)
    return result


def run_lanes(pool: Pool, how: Plan, timeout: float) -> None:
    """Every lane's claiming and finishing loops until the queue is empty; the first error of
    any loop stops them all and is raised here."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(loop: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                loop()
            except BaseException as exc:  # raised again by the caller, in its thread
                errors.append(exc)
                stop.set()

        return body

    threads = []
    for lane in range(how.lanes):
        worker_id = WORKER_ID.format(lane=lane + 1)
        handoff: queue.SimpleQueue[Claims | None] = queue.SimpleQueue()
        threads += [
            threading.Thread(
                target=guarded(functools.partial(claim_loop, pool, how, worker_id, handoff, stop)),
                name=f"ceiling-claim-{lane + 1}",
            ),
            threading.Thread(
                target=guarded(functools.partial(finish_loop, pool, worker_id, handoff, stop)),
                name=f"ceiling-finish-{lane + 1}",
            ),
        ]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        stop.set()
        for thread in threads:
            thread.join(60)
        raise common.BenchError(f"SQL ceiling: not drained after {timeout:.0f} s")
    if errors:
        raise common.BenchError(f"SQL ceiling: {errors[0]!r}") from errors[0]


def moving(tries: int, send: Callable[[], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """``send`` again when a row it reached had moved partition since its snapshot, as the
    daemon's store does (``StoreBase._moving``, by the same ``db.moved_row``)."""
    for attempt in range(1, tries + 1):
        try:
            return send()
        except psycopg.Error as exc:
            if attempt == tries or not db.moved_row(exc):
                raise
    raise AssertionError("unreachable")


def claim_loop(
    pool: Pool,
    how: Plan,
    worker_id: str,
    handoff: queue.SimpleQueue[Claims | None],
    stop: threading.Event,
) -> None:
    """Claim back to back until a claim finds nothing; each batch goes to the finisher."""
    bounds = ClaimBounds()
    bounds.notifying = lambda: True  # as in a daemon whose listener is connected
    job_types = [t.job_type for t in how.types]
    try:
        with pool.connection() as conn:
            while not stop.is_set():
                lows, looks = bounds.for_claim()
                params = {
                    "worker_id": worker_id,
                    "job_types": job_types,
                    "leases": [t.lease_seconds for t in how.types],
                    "max_attempts": [t.max_attempts for t in how.types],
                    "lows": [lows.get(t) for t in job_types],
                    "looks": [t in looks for t in job_types],
                    "look_froms": [looks.get(t) for t in job_types],
                    "limit": how.claim_limit,
                }
                rows = moving(SKIPPING_TRIES, functools.partial(by_index, conn, "claim", params))
                claimed = [ClaimedRun(*row) for row in rows if row[0] is not None]
                bounds.claimed(claimed)
                bounds.found({str(row[1]): row[7] for row in rows if row[0] is None})
                if not claimed:
                    return
                handoff.put([(run.id, run.attempt) for run in claimed])
    finally:
        handoff.put(None)  # the finisher writes what it holds and ends


def finish_loop(
    pool: Pool, worker_id: str, handoff: queue.SimpleQueue[Claims | None], stop: threading.Event
) -> None:
    """Record successes as the completer does: whatever has been claimed, up to
    COMPLETE_BATCH_MAX runs a statement, until the claimer is done and nothing is left."""
    pending: Claims = []
    claiming = True
    with pool.connection() as conn:
        while not stop.is_set() and (claiming or pending):
            while claiming and len(pending) < COMPLETE_BATCH_MAX:
                try:
                    item = handoff.get(block=not pending)  # waits only with nothing to write
                except queue.Empty:
                    break
                if item is None:
                    claiming = False
                else:
                    pending += item
            batch, pending = pending[:COMPLETE_BATCH_MAX], pending[COMPLETE_BATCH_MAX:]
            if batch:
                succeed(conn, worker_id, batch)


def succeed(conn: db.Connection, worker_id: str, batch: Sequence[tuple[int, int]]) -> None:
    """One ``succeed`` statement for ``batch``, sent as the completer's finish sends it; every
    run of it must have been recorded (the claim guard let each through)."""
    ordered = sorted(batch)  # the statement finds each id by binary search (runs.by_id)
    params = {
        "worker_id": worker_id,
        "ids": db.Ints(run_id for run_id, _ in ordered),
        "attempts": db.Ints(attempt for _, attempt in ordered),
        "results": None,
    }
    send = functools.partial(by_index, conn, "succeed", params, lock_wait_ms=FINISH_LOCK_WAIT_MS)
    rows = moving(MOVED_ROW_TRIES, send)
    done = sum(1 for row in rows if row[0] is not None)
    if done != len(ordered):
        raise common.BenchError(f"succeed recorded {done} of {len(ordered)} claimed runs")
