"""Recovery: daemon A holds runs of a long handler, is SIGKILLed, and daemon B picks them up.

A starts alone and claims ``--held`` runs of ``hold`` (a handler that waits for an hour);
B starts idle. A is killed; the time is read from the database clock right after the kill.
Recovery of a run is the start of its attempt on B (attempts.started_at, database clock)
minus the kill. The bound is lease + reaper interval: the lease A renewed last expires at most
one lease after the kill, and the reaper looks at least once per interval. The config the
bench writes sets the three durations explicitly, at the product's defaults (worker.lease 60s,
worker.poll_interval 5s, ticker.reaper_interval 10s), and the figures are read from it;
``--set worker.lease=6s --set ticker.reaper_interval=2s`` for a quick run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench import common

DEFAULT_HELD = 8
MARGIN_SECONDS = 60.0
# What the bench's config sets (the product's defaults, written out); --set overrides them.
DURATIONS = {
    "worker": {"lease": "60s", "poll_interval": "5s"},
    "ticker": {"reaper_interval": "10s"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--held", type=int, default=DEFAULT_HELD, help="runs A holds (8)")
    common.add_settings_option(parser)


def durations(settings: dict[str, dict[str, Any]]) -> tuple[float, float, float]:
    """(lease, reaper interval, poll interval) in seconds, from the config's settings."""
    return (
        common.duration_seconds(settings["worker"]["lease"], "--set worker.lease"),
        common.duration_seconds(
            settings["ticker"]["reaper_interval"], "--set ticker.reaper_interval"
        ),
        common.duration_seconds(settings["worker"]["poll_interval"], "--set worker.poll_interval"),
    )


def config_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The daemons' settings: enough threads for every held run (B must be able to take them
    all at once), no shutdown grace, the durations, then --set."""
    return common.merged(
        {"worker": {"threads": max(args.held, 8), "shutdown_grace": "0s"}},
        DURATIONS,
        common.parse_settings(args.set),
    )


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.held < 1:
        raise common.BenchError("--held must be at least 1", 2)
    durations(config_settings(args))


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    settings = config_settings(args)
    lease, reaper, poll = durations(settings)
    record.options = {"held": args.held, "set": args.set, "lease": lease, "reaper": reaper}
    with common.fresh_database(admin_dsn, "recovery") as dsn:
        config = common.write_config(tmp / "recovery.toml", settings)
        a = common.start_daemon(dsn, config, tmp / "a.log")
        b = None
        try:
            with common.connect(dsn) as conn:
                conn.execute(
                    "INSERT INTO runs (job_type) SELECT 'hold' FROM generate_series(1, %s)",
                    [args.held],
                )
                conn.execute("SELECT pg_notify(current_schema(), 'hold')")
                held_by(conn, a, args.held, lease + MARGIN_SECONDS)
                b = common.start_daemon(dsn, config, tmp / "b.log")
                a.kill()
                killed_at, expires_at = common.one(
                    conn,
                    "SELECT clock_timestamp(), max(locked_until) FROM runs WHERE locked_by = %s",
                    [a.worker_id],
                )
                held_by(conn, b, args.held, lease + reaper + MARGIN_SECONDS)
                rows = conn.execute(
                    "SELECT extract(epoch FROM a.started_at - %s) FROM attempts a"
                    " WHERE a.worker_id = %s",
                    [killed_at, b.worker_id],
                ).fetchall()
                lost = common.one(
                    conn,
                    "SELECT count(*) FROM attempts WHERE worker_id = %s AND outcome = 'lost'",
                    [a.worker_id],
                )[0]
        finally:
            a.kill()
            if b is not None:
                b.stop(timeout=15)
    seconds = [float(row[0]) for row in rows]
    expiry = (expires_at - killed_at).total_seconds()
    worst = max(seconds)
    result = {
        "held": args.held,
        "lease_seconds": lease,
        "reaper_interval_seconds": reaper,
        "poll_interval_seconds": poll,
        "bound_seconds": lease + reaper,
        "lease_expired_after_kill_seconds": round(expiry, 3),
        "first_back_seconds": round(min(seconds), 3),
        "all_back_seconds": round(worst, 3),
        "within_bound": worst <= lease + reaper,
        "attempts_marked_lost": lost,
    }
    record.results = result
    print(
        common.table(
            [
                "held",
                "lease s",
                "reaper s",
                "poll s",
                "expired after s",
                "first back s",
                "all back s",
                "bound s",
                "within",
            ],
            [
                [
                    args.held,
                    lease,
                    reaper,
                    poll,
                    result["lease_expired_after_kill_seconds"],
                    result["first_back_seconds"],
                    result["all_back_seconds"],
                    lease + reaper,
                    "yes" if result["within_bound"] else "NO",
                ]
            ],
        )
    )
    if lost != args.held:
        raise common.BenchError(f"{lost} of A's {args.held} attempts were marked lost")


def held_by(conn: Any, daemon: common.Daemon, count: int, timeout: float) -> None:
    """Wait until ``count`` runs are running on ``daemon``."""

    def holding() -> bool:
        daemon.check_alive()
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE status = 'running' AND locked_by = %s",
            [daemon.worker_id],
        ).fetchone()
        if row[0] >= count:
            return True
        time.sleep(0.05)
        return False

    common.wait_for(holding, timeout, f"{count} runs running on {daemon.worker_id}")
