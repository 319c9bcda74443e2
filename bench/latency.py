"""Pickup latency: enqueue -> handler start with idle workers (the NOTIFY path), p50/p99.

One daemon at default settings waits idle; the client enqueues one ``stamp`` run at a time,
taking time.time() right before its commit, every ``--interval`` seconds (longer than a run
takes, so the workers are idle each time). The handler records time.time() when it starts.
Both stamps come from the same host clock; the database clock is not involved.

``--pooler polling|listen-direct`` puts a real PgBouncer in transaction mode between the daemon
and the server (the client still enqueues directly): ``polling`` without
``database.listen_dsn`` (the daemon finds that NOTIFYs do not reach it and idle workers poll
every ``worker.poll_interval``), ``listen-direct`` with ``listen_dsn`` at the direct DSN.

``--flood BYTES`` first starts one run of a command printing BYTES of output (``yes | head
-c``; the daemon reads it at its output rate, about 16 s for 1 GiB) and measures the pickups
while that run runs: what a flooding job costs every other run (issue 20). The flood must
outlast the measurement; the part fails if it does not.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pgtick
from bench import common, jobs
from bench.pgbouncer import PgBouncer

DEFAULT_RUNS = 300
MIN_RUNS = 200
DEFAULT_INTERVAL_SECONDS = 0.05
SETTLE_SECONDS = 2.0
FINISH_TIMEOUT_SECONDS = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs (300, at least 200)")
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL_SECONDS, help="seconds between runs"
    )
    parser.add_argument(
        "--pooler",
        choices=["none", "polling", "listen-direct"],
        default="none",
        help="run the daemon through a PgBouncer in transaction mode (package pgbouncer)",
    )
    parser.add_argument(
        "--flood",
        type=int,
        default=0,
        metavar="BYTES",
        help="measure while a command prints this many bytes (e.g. 1073741824); 0: none",
    )
    common.add_settings_option(parser)


FLOOD_JOB = """
[job_types.flood]
command = ["/bin/sh", "-c", "yes 'flood flood flood flood' | head -c {bytes}"]
timeout = "10m"
"""


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.runs < MIN_RUNS:
        raise common.BenchError(f"--runs must be at least {MIN_RUNS}", 2)
    common.parse_settings(args.set)


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    settings = common.parse_settings(args.set)
    record.options = {
        "runs": args.runs,
        "interval": args.interval,
        "set": args.set,
        "pooler": args.pooler,
        "flood_bytes": args.flood,
    }
    with common.fresh_database(admin_dsn, "latency") as dsn, contextlib.ExitStack() as stack:
        with common.connect(dsn) as conn:
            conn.execute(jobs.STARTS_DDL)
        daemon_dsn, extra = dsn, ""
        if args.pooler != "none":
            # Its own directory directly under the temp dir: the unprivileged user PgBouncer
            # runs as cannot enter the bench's private one.
            workdir = Path(tempfile.mkdtemp(prefix="pgtick-bench-pgbouncer-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            bouncer = PgBouncer(admin_dsn, workdir)
            stack.callback(bouncer.close)
            daemon_dsn = bouncer.dsn(common.database_name(dsn))
            if args.pooler == "listen-direct":
                extra = f"\n[database]\nlisten_dsn = {common.toml_value(dsn)}\n"
        if args.flood:
            extra += FLOOD_JOB.format(bytes=args.flood)
        daemon = common.start_daemon(
            daemon_dsn,
            common.write_config(tmp / "latency.toml", settings, extra),
            tmp / "latency.log",
        )
        try:
            # Let the start-up claims, ticks and registration pass: idle means idle.
            time.sleep(SETTLE_SECONDS)
            flood = start_flood(dsn) if args.flood else None
            enqueued = enqueue_paced(dsn, args.runs, args.interval)
            if flood is not None:
                flood_running_at_end(dsn, flood)
            starts = wait_started(dsn, daemon, enqueued)
        finally:
            daemon.stop()
    ms = [(starts[run_id] - at) * 1000 for run_id, at in enqueued.items()]
    stats = common.distribution(ms)
    record.results = {"latency_ms": stats}
    print(
        common.table(
            ["runs", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"],
            [[stats["n"], stats["p50"], stats["p90"], stats["p99"], stats["max"], stats["mean"]]],
        )
    )


def start_flood(dsn: str) -> int:
    """Enqueue the flood run and wait until it runs (its output has begun)."""
    with common.connect(dsn) as conn:
        run_id = pgtick.enqueue(conn, "flood")

        def running() -> bool:
            row = conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone()
            return row is not None and row[0] == "running"

        common.wait_for(running, FINISH_TIMEOUT_SECONDS, "the flood run to start")
        time.sleep(SETTLE_SECONDS)  # well into its output
    return run_id


def flood_running_at_end(dsn: str, run_id: int) -> None:
    """The flood must have outlasted the measurement, or the figure is not one under flood."""
    with common.connect(dsn) as conn:
        row = conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone()
    if row is None or row[0] != "running":
        raise common.BenchError(
            f"the flood ended ({row[0] if row else 'gone'}) before the last pickup: raise --flood"
        )


def enqueue_paced(dsn: str, runs: int, interval: float) -> dict[int, float]:
    """Enqueue one run every ``interval`` seconds; {run id: time.time() right before commit}."""
    enqueued: dict[int, float] = {}
    next_at = time.monotonic()
    with common.connect(dsn) as conn:
        for _ in range(runs):
            with conn.transaction():
                run_id = pgtick.enqueue(conn, "stamp")
                at = time.time()
            enqueued[run_id] = at
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    return enqueued


def wait_started(dsn: str, daemon: common.Daemon, enqueued: dict[int, float]) -> dict[int, float]:
    """{run id: handler start} once every enqueued run has started and succeeded."""
    with common.connect(dsn) as conn:

        def all_started() -> dict[int, Any] | None:
            daemon.check_alive()
            rows = conn.execute(
                "SELECT s.run_id, s.started FROM public.bench_starts s"
                " JOIN runs r ON r.id = s.run_id AND r.status = 'succeeded'"
                " WHERE s.run_id = ANY(%s)",
                [list(enqueued)],
            ).fetchall()
            return dict(rows) if len(rows) == len(enqueued) else None

        started: dict[int, float] = common.wait_for(
            all_started, FINISH_TIMEOUT_SECONDS, f"{len(enqueued)} runs to start"
        )
    return started
