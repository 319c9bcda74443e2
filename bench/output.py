"""Command output: the cost per run of a command handler that prints 10 lines, against one that
prints nothing, drained by one `pgtick run` at default settings. ``--rounds`` interleaved rounds
of ``--runs`` runs of each, each in a fresh database, timed on the database clock from the first
start to the last finish; reports the median seconds per run of each and the difference, the
cost of capturing, storing and logging 10 lines. Every run must have succeeded once."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench import common

DEFAULT_RUNS = 2000
DEFAULT_ROUNDS = 5
DEFAULT_TIMEOUT_SECONDS = 600.0
DRAIN_POLL_SECONDS = 0.25
# The two job types: the same shell, with and without 10 lines of output.
COMMANDS = {
    "quiet": ["/bin/sh", "-c", "exit 0"],
    "ten_lines": ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per drain (2000)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds (5)")
    common.add_settings_option(parser)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.runs < 1 or args.rounds < 1:
        raise common.BenchError("--runs and --rounds must be at least 1", 2)
    unknown = set(common.parse_settings(args.set)) - {"worker", "ticker", "logging"}
    if unknown:
        raise common.BenchError(
            f"--set: only worker.*, ticker.* and logging.* keys, not {sorted(unknown)}", 2
        )


def job_types_toml() -> str:
    return "".join(
        f"\n[job_types.{name}]\ncommand = {common.toml_value(argv)}\n"
        for name, argv in COMMANDS.items()
    )


def drain(admin_dsn: str, tmp: Path, job_type: str, args: argparse.Namespace) -> float:
    """Seconds per run of one drain of ``job_type`` in a fresh database."""
    with common.fresh_database(admin_dsn, "out") as dsn:
        config = common.write_config(
            tmp / f"output-{time.monotonic_ns()}.toml",
            common.parse_settings(args.set),
            extra=job_types_toml(),
        )
        daemon = common.start_daemon(dsn, config, tmp / f"daemon-{time.monotonic_ns()}.log")
        try:
            common.enqueue_noop(dsn, args.runs, job_type)
            with common.connect(dsn) as conn:

                def drained() -> bool:
                    daemon.check_alive()
                    left = common.one(
                        conn,
                        "SELECT count(*) FROM runs WHERE status IN ('queued', 'running', 'failed')",
                    )[0]
                    if left == 0:
                        return True
                    time.sleep(DRAIN_POLL_SECONDS)
                    return False

                common.wait_for(drained, args.timeout, f"{args.runs} {job_type} runs")
                daemon.stop()
                succeeded = common.one(
                    conn, "SELECT count(*) FROM runs WHERE status = 'succeeded'"
                )[0]
                if succeeded != args.runs:
                    raise common.BenchError(f"{succeeded} of {args.runs} {job_type} runs succeeded")
                seconds = float(
                    common.one(
                        conn,
                        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM runs",
                    )[0]
                )
        finally:
            daemon.kill()
    runs: int = args.runs
    return seconds / runs


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    record.options = {"runs": args.runs, "rounds": args.rounds, "set": args.set}
    per_run: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name in COMMANDS:  # interleaved, so drift on the machine hits both alike
            per_run[name].append(drain(admin_dsn, tmp, name, args))
    medians = {name: statistics.median(values) for name, values in per_run.items()}
    results: dict[str, Any] = {
        f"{name}_ms_per_run": round(value * 1000, 3) for name, value in medians.items()
    }
    results["ten_lines_extra_ms_per_run"] = round(
        (medians["ten_lines"] - medians["quiet"]) * 1000, 3
    )
    results["rounds_ms_per_run"] = {
        name: [round(v * 1000, 3) for v in values] for name, values in per_run.items()
    }
    record.results = results
    print(
        common.table(
            ["command", "ms per run (median)"],
            [[name, results[f"{name}_ms_per_run"]] for name in COMMANDS]
            + [["10 lines cost", results["ten_lines_extra_ms_per_run"]]],
        )
    )
