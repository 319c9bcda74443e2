"""Throughput: N no-op runs, enqueued by one SQL statement (with a NOTIFY) once the daemons are up
and idle, drained by `pgtick run` at default settings; timed on the database clock from the first
claim (min started_at) to the last finish (max finished_at) in the runs table. Every run must have
succeeded exactly once: one attempt row per run, outcome 'succeeded'. ``--sweep`` repeats it over
worker.threads x worker.prefetch, ``--daemons K`` drains with K daemons on one database."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import common

DEFAULT_RUNS = 20_000
DEFAULT_TIMEOUT_SECONDS = 1800.0
SWEEP_THREADS = (8, 16, 32)
SWEEP_PREFETCH = (0, 16, 64)
# How often the bench counts the unfinished runs. The count reads the whole live partition
# (13 ms a call at 100 000 runs, pg_stat_statements): every 0.25 s it took about 4 % of the
# server's time during a drain, which the peers' drains do not pay (their workers stop on
# their own). The timing comes from the runs table, not from this poll.
DRAIN_POLL_SECONDS = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs to drain (20000)")
    parser.add_argument(
        "--sweep", action="store_true", help="every worker.threads x worker.prefetch pair"
    )
    parser.add_argument("--threads-list", default=",".join(map(str, SWEEP_THREADS)))
    parser.add_argument("--prefetch-list", default=",".join(map(str, SWEEP_PREFETCH)))
    parser.add_argument("--daemons", type=int, default=1, help="daemons on one database (1)")
    common.add_settings_option(parser)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    parser.add_argument("--profile", help="record the (first) daemon with py-spy into this file")


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise common.BenchError(f"{option}: expected numbers separated by commas", 2) from exc
    if not values:
        raise common.BenchError(f"{option}: empty", 2)
    return values


def drain(
    admin_dsn: str,
    tmp: Path,
    runs: int,
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    daemons: int = 1,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    profile: str | None = None,
) -> dict[str, Any]:
    """One drain in a fresh database; returns runs/s and the checks, raises if a check fails."""
    settings = settings or {}
    with common.fresh_database(admin_dsn, "tp") as dsn:
        config = common.write_config(tmp / f"throughput-{time.monotonic_ns()}.toml", settings)
        # Every daemon is up and idle before the backlog appears, so none gets a head start.
        procs = [
            common.start_daemon(
                dsn,
                config,
                tmp / f"daemon-{time.monotonic_ns()}.log",
                profile=profile if i == 0 else None,
            )
            for i in range(daemons)
        ]
        try:
            with common.connect(dsn) as conn:
                cpu_before = cpu_seconds(conn, procs)
            started = time.monotonic()
            common.enqueue_noop(dsn, runs)
            with common.connect(dsn) as conn:

                def drained() -> bool:
                    for proc in procs:
                        proc.check_alive()
                    row = conn.execute(
                        "SELECT count(*) FROM runs WHERE status IN ('queued', 'running', 'failed')"
                    ).fetchone()
                    if row and row[0] == 0:
                        return True
                    time.sleep(DRAIN_POLL_SECONDS)
                    return False

                common.wait_for(drained, timeout, f"{runs} runs to finish")
                wall = time.monotonic() - started
                cpu_after = cpu_seconds(conn, procs)
                codes = [proc.stop() for proc in procs]
                result = measure(conn, runs)
        finally:
            for proc in procs:
                proc.kill()
    if any(code != 0 for code in codes):
        raise common.BenchError(f"daemon exit codes {codes} (expected 0 after SIGTERM)")
    result.update(daemons=daemons, settings=settings, client_wall_seconds=round(wall, 3))
    result.update(cpu_per_run(cpu_before, cpu_after, runs))
    return result


# /proc/PID/stat: utime and stime are fields 14 and 15, in clock ticks.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int, command: str | None = None) -> float | None:
    """CPU seconds a process has used (None: gone, or not ``command``: a server on another
    machine reports pids that mean nothing here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        name, fields = stat.split("(", 1)[1].rsplit(")", 1)
        if command is not None and name != command:
            return None
        values = fields.split()
        return (int(values[11]) + int(values[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a supervisor's worker processes), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def cpu_seconds(conn: Any, procs: Sequence[common.Daemon]) -> dict[str, dict[int, float]]:
    """CPU used so far by the daemons and by the server processes of the bench's database
    (read from /proc: only for a server on this machine)."""
    backends = [
        pid
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    ]
    out: dict[str, dict[int, float]] = {"daemon": {}, "server": {}}
    for pid in (p.pid for p in procs):
        # With worker.processes above 1 the daemon's work is done by its worker processes.
        for one in (pid, *children_of(pid)):
            if (used := process_cpu(one)) is not None:
                out["daemon"][one] = used
    for pid in backends:
        if (used := process_cpu(pid, "postgres")) is not None:
            out["server"][pid] = used
    return out


def cpu_per_run(
    before: Mapping[str, Mapping[int, float]], after: Mapping[str, Mapping[int, float]], runs: int
) -> dict[str, float | None]:
    """Microseconds of CPU per run from just before the enqueue to the end of the drain: the
    daemons' and the server's (its backends for this database; one that came and went
    meanwhile, such as the enqueue's, is not counted). What a change to the hot path costs a
    run, beside what it does to runs/s."""
    out: dict[str, float | None] = {}
    for kind in ("daemon", "server"):
        if not after[kind]:
            out[f"{kind}_cpu_us_per_run"] = None
            continue
        used = sum(t - before[kind].get(pid, 0.0) for pid, t in after[kind].items())
        out[f"{kind}_cpu_us_per_run"] = round(used * 1e6 / runs, 1)
    return out


def measure(conn: Any, runs: int) -> dict[str, Any]:
    """Timing from the runs table and the exactly-once checks from the attempts table."""
    statuses = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
    if statuses != {"succeeded": runs}:
        raise common.BenchError(f"expected {runs} succeeded runs, found {statuses}")
    attempts = conn.execute(
        """
        SELECT count(*), count(*) FILTER (WHERE n = 1 AND ok = 1), coalesce(sum(n), 0)
        FROM (SELECT run_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'succeeded') AS ok
              FROM attempts GROUP BY run_id) a
        """
    ).fetchone()
    runs_seen, exactly_once, total_attempts = attempts
    if not (runs_seen == exactly_once == total_attempts == runs):
        raise common.BenchError(
            f"not exactly once: {runs} runs, {runs_seen} with attempts, {exactly_once} with one "
            f"'succeeded' attempt, {total_attempts} attempt rows"
        )
    seconds = float(
        conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM runs"
        ).fetchone()[0]
    )
    per_daemon = [
        n
        for _, n in conn.execute(
            "SELECT worker_id, count(*) FROM attempts GROUP BY worker_id ORDER BY 2 DESC"
        ).fetchall()
    ]
    return {
        "runs": runs,
        "seconds": round(seconds, 3),
        "runs_per_second": round(runs / seconds, 1) if seconds > 0 else None,
        "exactly_once": True,
        "runs_per_daemon": per_daemon,
    }


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.runs < 1 or args.daemons < 1:
        raise common.BenchError("--runs and --daemons must be at least 1", 2)
    common.parse_settings(args.set)
    if args.profile:
        common.py_spy()
    if args.sweep:
        int_list(args.threads_list, "--threads-list")
        int_list(args.prefetch_list, "--prefetch-list")


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    base = common.parse_settings(args.set)
    record.options = {"runs": args.runs, "daemons": args.daemons, "set": args.set}
    if not args.sweep:
        result = drain(
            admin_dsn,
            tmp,
            args.runs,
            settings=base,
            daemons=args.daemons,
            timeout=args.timeout,
            profile=args.profile,
        )
        record.results = result
        print(
            common.table(
                [
                    "daemons",
                    "settings",
                    "runs",
                    "seconds",
                    "runs/s",
                    "runs per daemon",
                    "CPU µs/run: daemon",
                    "server",
                ],
                [
                    [
                        args.daemons,
                        settings_label(base) or "defaults",
                        args.runs,
                        result["seconds"],
                        result["runs_per_second"],
                        " / ".join(map(str, result["runs_per_daemon"])),
                        result["daemon_cpu_us_per_run"],
                        result["server_cpu_us_per_run"],
                    ]
                ],
            )
        )
        return
    threads = int_list(args.threads_list, "--threads-list")
    prefetch = int_list(args.prefetch_list, "--prefetch-list")
    record.options.update(threads=threads, prefetch=prefetch)
    rows: list[dict[str, Any]] = []
    for t in threads:
        for p in prefetch:
            settings = common.merged(base, {"worker": {"threads": t, "prefetch": p}})
            result = drain(
                admin_dsn,
                tmp,
                args.runs,
                settings=settings,
                daemons=args.daemons,
                timeout=args.timeout,
            )
            rows.append({"threads": t, "prefetch": p, **result})
            rps = result["runs_per_second"]
            print(f"  threads={t} prefetch={p}: {rps:,.0f} runs/s", flush=True)
    record.results = {"sweep": rows}
    print(
        common.table(
            ["threads", "prefetch", "runs", "seconds", "runs/s"],
            [
                [r["threads"], r["prefetch"], r["runs"], r["seconds"], r["runs_per_second"]]
                for r in rows
            ],
        )
    )


def settings_label(settings: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{s}.{k}={v}" for s, values in settings.items() for k, v in values.items())
