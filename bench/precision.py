"""Schedule precision: occurrence (scheduled_for) -> handler start, over live every-minute
schedules.

One daemon at default settings with ``--schedules`` schedules of ``* * * * *`` (no jitter)
whose ``stamp`` handler records time.time() when it starts. Every occurrence from the first
whole minute after the daemon started, for ``--minutes`` minutes, must have run once per
schedule; the delay is the handler's start minus the occurrence instant.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import common, jobs

DEFAULT_SCHEDULES = 10
DEFAULT_MINUTES = 3
FINISH_TIMEOUT_SECONDS = 60.0
MIN_LEAD_SECONDS = 5.0
SCHEDULE = """
[schedules.every_minute_{i}]
job_type = "stamp"
cron = "* * * * *"
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedules", type=int, default=DEFAULT_SCHEDULES, help="(10)")
    parser.add_argument("--minutes", type=int, default=DEFAULT_MINUTES, help="occurrences (3)")
    common.add_settings_option(parser)


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.schedules < 1 or args.minutes < 1:
        raise common.BenchError("--schedules and --minutes must be at least 1", 2)
    common.parse_settings(args.set)


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    settings = common.parse_settings(args.set)
    record.options = {"schedules": args.schedules, "minutes": args.minutes, "set": args.set}
    extra = "".join(SCHEDULE.format(i=i) for i in range(args.schedules))
    with common.fresh_database(admin_dsn, "precision") as dsn:
        with common.connect(dsn) as conn:
            conn.execute(jobs.STARTS_DDL)
        config = common.write_config(tmp / "precision.toml", settings, extra)
        daemon = common.start_daemon(dsn, config, tmp / "precision.log")
        try:
            first = next_minute(datetime.now(UTC))
            last = first + timedelta(minutes=args.minutes - 1)
            print(
                f"waiting for the occurrences {first:%H:%M} .. {last:%H:%M} UTC "
                f"of {args.schedules} schedules",
                flush=True,
            )
            delays = wait_delays(dsn, daemon, first, last, args.schedules * args.minutes)
        finally:
            daemon.stop()
    ms = [d * 1000 for d in delays]
    stats = common.distribution(ms)
    record.results = {"first": first, "last": last, "delay_ms": stats}
    print(
        common.table(
            ["runs", "p50 ms", "p90 ms", "p99 ms", "max ms", "min ms"],
            [[stats["n"], stats["p50"], stats["p90"], stats["p99"], stats["max"], stats["min"]]],
        )
    )


def next_minute(now: datetime) -> datetime:
    """The first whole minute at least ``MIN_LEAD_SECONDS`` after ``now`` (the daemon has
    just started: an occurrence a moment away would measure its start-up, not the ticker)."""
    minute = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    if (minute - now).total_seconds() < MIN_LEAD_SECONDS:
        minute += timedelta(minutes=1)
    return minute


def wait_delays(
    dsn: str, daemon: common.Daemon, first: datetime, last: datetime, expected: int
) -> list[float]:
    """Seconds from occurrence to handler start of every run in [first, last]."""
    deadline = (last - datetime.now(UTC)).total_seconds() + FINISH_TIMEOUT_SECONDS
    with common.connect(dsn) as conn:

        def done() -> list[tuple[Any, ...]] | None:
            daemon.check_alive()
            rows = conn.execute(
                "SELECT r.schedule_id, r.scheduled_for, s.started, r.status FROM runs r"
                " LEFT JOIN public.bench_starts s ON s.run_id = r.id"
                " WHERE r.scheduled_for BETWEEN %s AND %s",
                [first, last],
            ).fetchall()
            finished = [row for row in rows if row[3] not in ("queued", "running")]
            if len(finished) < expected:
                time.sleep(0.5)
                return None
            return rows

        rows = common.wait_for(done, max(deadline, 1.0), f"{expected} scheduled runs")
    if len(rows) != expected or any(row[3] != "succeeded" or row[2] is None for row in rows):
        statuses = sorted({str(row[3]) for row in rows})
        raise common.BenchError(
            f"expected {expected} succeeded scheduled runs, found {len(rows)} ({statuses})"
        )
    occurrences = {(row[0], row[1]) for row in rows}
    if len(occurrences) != expected:
        raise common.BenchError(f"an occurrence ran twice: {len(occurrences)} distinct")
    return [float(row[2]) - row[1].timestamp() for row in rows]
