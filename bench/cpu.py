"""CPU-bound handlers against ``worker.processes`` (issue 47, its CPU bar): ``--runs`` (8) runs
of a handler that burns ``--seconds`` (1) of CPU in pure Python, drained by one daemon once per
``--processes`` value (1,2), in a fresh database each, ``--rounds`` times interleaved. Reports
the median wall time from the enqueue to the last run's end, and that time in units of one
burner (the bar: about 4 with 2 processes, about 8 with 1, within 20 %). Run it on a quiet
machine: a figure taken beside other CPU load measures the load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench import common

DEFAULT_RUNS = 8
DEFAULT_SECONDS = 1.0
DEFAULT_PROCESSES = "1,2"
TIMEOUT_SECONDS = 300.0
POLL_SECONDS = 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="burners (8)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="CPU each (1)")
    parser.add_argument(
        "--processes", default=DEFAULT_PROCESSES, help="worker.processes values (1,2)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    common.add_settings_option(parser)


def counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise common.BenchError(f"--processes {text!r}: expected N,N,... (each at least 1)", 2)
    return values


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    counts(args.processes)
    if args.runs < 1 or args.seconds <= 0 or args.rounds < 1:
        raise common.BenchError("--runs, --seconds and --rounds must be positive", 2)
    common.parse_settings(args.set)


def drain(admin_dsn: str, tmp: Path, args: argparse.Namespace, processes: int) -> float:
    """Seconds from the enqueue of the burners to the end of the last one."""
    settings = common.parse_settings(args.set)
    worker = settings.setdefault("worker", {})
    worker["processes"] = processes
    worker.setdefault("threads", max(args.runs, 1))
    with common.fresh_database(admin_dsn, "cpu") as dsn:
        config = common.write_config(tmp / f"cpu-{time.monotonic_ns()}.toml", settings)
        daemon = common.start_daemon(dsn, config, tmp / f"cpu-{time.monotonic_ns()}.log")
        try:
            with common.connect(dsn) as conn:
                time.sleep(2.0)  # the worker processes up (spawned, handlers imported)
                started = time.monotonic()
                conn.execute(
                    "SELECT pgtick.enqueue('burn', jsonb_build_object('seconds', %s::float8))"
                    " FROM generate_series(1, %s)",
                    [args.seconds, args.runs],
                )

                def done() -> bool:
                    daemon.check_alive()
                    row = conn.execute(
                        "SELECT count(*) FROM runs WHERE status = 'succeeded'"
                    ).fetchone()
                    if row and row[0] == args.runs:
                        return True
                    time.sleep(POLL_SECONDS)
                    return False

                common.wait_for(done, TIMEOUT_SECONDS, f"{args.runs} burners")
                return time.monotonic() - started
        finally:
            daemon.stop()


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    values = counts(args.processes)
    record.options = {
        "runs": args.runs,
        "seconds": args.seconds,
        "processes": values,
        "rounds": args.rounds,
        "set": args.set,
    }
    times: dict[int, list[float]] = {n: [] for n in values}
    for round_no in range(1, args.rounds + 1):
        for n in values:
            seconds = drain(admin_dsn, tmp, args, n)
            times[n].append(seconds)
            print(f"  round {round_no}: processes = {n}: {seconds:.2f} s", flush=True)
    results: dict[str, Any] = {}
    rows = []
    for n, measured in times.items():
        median = statistics.median(measured)
        burners = median / args.seconds
        results[str(n)] = {"seconds": measured, "median_seconds": round(median, 3)}
        rows.append([n, args.runs, round(median, 2), round(burners, 2)])
    record.results = results
    print(common.table(["processes", "runs", "median s", "in burners"], rows))
