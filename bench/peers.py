"""Peers side by side: the same N no-op jobs on the same server, drained by pgtick at default
settings, by procrastinate (concurrency 1, its default, and 50), by pgqueuer (psycopg and
asyncpg drivers, batch size 10, its default, and 50), by chancy (async executor, concurrency
200, eager polling, finished jobs written every 0.1 s) and by oban (queue limit 200), each in
its own fresh database, with pgtick's ratio to each.

Each peer installs its schema and enqueues the jobs through its own API, then one worker
process of it drains the queue and exits (procrastinate ``wait=False``, pgqueuer drain mode;
chancy's worker and oban, which have no drain mode, are stopped once nothing is left to run or
to record). Each is timed on its own table, database clock: procrastinate from the first
'started' to the last 'succeeded' in procrastinate_events; pgqueuer from the first 'picked' to
the last 'successful' in pgqueuer_log; chancy from the first started_at (set by its claim) in
chancy_jobs to the last write of finished jobs (its completed_at is the worker's clock when a
job returned, written up to 0.1 s later, so a plugin stamps each write in bench_chancy_flushes,
in its transaction); oban from the first attempted_at (its claim) to the last completed_at
(its ack) in oban_jobs; pgtick as in the throughput part. Each must have run every job exactly
once. The peers come from the ``bench`` extra (pinned versions): pip install -e '.[bench]';
oban needs Python >= 3.12 and runs from .venv-oban, which make .venv/.bench-installed creates.

Each round also drains the same N runs with pgtick's claim and finish statements alone, no
Python (bench/ceiling.py; --no-ceiling skips it): the "SQL ceiling" row, and pgtick's ratio to
it, tell how much of what the statements allow the daemon reaches on this server, this hour.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import ceiling, common, throughput
from bench.peer_worker import require

DEFAULT_RUNS = throughput.DEFAULT_RUNS
DEFAULT_TIMEOUT_SECONDS = 1800.0
PREPARE_TIMEOUT_SECONDS = 600.0
# The packages each peer imports in this venv; oban's are in its own (OBAN_PYTHON).
PEER_PACKAGES = {
    "procrastinate": ("procrastinate",),
    "pgqueuer": ("pgqueuer", "asyncpg"),
    "chancy": ("chancy",),
    "oban": (),
}
# oban 0.7.0 needs Python >= 3.12: its venv, made by `make .venv/.bench-installed`.
OBAN_VENV = common.REPO_DIR / ".venv-oban"
OBAN_PYTHON = OBAN_VENV / "bin" / "python"


@dataclass(frozen=True)
class Peer:
    """One peer configuration: how its worker is started and how it is measured."""

    name: str
    setting: str
    args: tuple[str, ...]
    fastest: bool = False  # the configuration the throughput bar compares with


PEERS = (
    Peer("procrastinate", "concurrency 1 (default)", ("--concurrency", "1")),
    Peer("procrastinate", "concurrency 50", ("--concurrency", "50"), fastest=True),
    Peer("pgqueuer", "psycopg, batch 10 (default)", ("--driver", "psycopg")),
    Peer("pgqueuer", "psycopg, batch 50", ("--driver", "psycopg", "--batch-size", "50")),
    Peer("pgqueuer", "asyncpg, batch 10 (default)", ("--driver", "asyncpg")),
    Peer(
        "pgqueuer",
        "asyncpg, batch 50",
        ("--driver", "asyncpg", "--batch-size", "50"),
        fastest=True,
    ),
    Peer(
        "chancy",
        "async, concurrency 200, eager, flush 0.1 s",
        ("--concurrency", "200"),
        fastest=True,
    ),
    Peer("oban", "queue limit 200", ("--limit", "200"), fastest=True),
)

PROCRASTINATE_MEASURE = """
SELECT
    (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
    count(*) FILTER (WHERE type = 'started'),
    count(DISTINCT job_id) FILTER (WHERE type = 'started'),
    count(*) FILTER (WHERE type = 'succeeded'),
    extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                     - min(at) FILTER (WHERE type = 'started'))
FROM procrastinate_events
"""
PGQUEUER_MEASURE = """
SELECT
    count(*) FILTER (WHERE status = 'successful'),
    count(*) FILTER (WHERE status = 'picked'),
    count(DISTINCT job_id) FILTER (WHERE status = 'picked'),
    count(DISTINCT job_id) FILTER (WHERE status = 'successful'),
    extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                     - min(created) FILTER (WHERE status = 'picked'))
FROM pgqueuer_log
"""
# chancy counts an attempt when it finishes (attempts), so a sum of N over N succeeded jobs is
# one run each; started_at is set by the claim (database clock). Its completed_at is the
# worker's clock when the job returned, written up to a flush later, so the end is the last
# write of finished jobs, stamped in that transaction (bench.peer_worker.chancy_flush_stamp),
# and the jobs those writes carried must be N: each outcome written once.
CHANCY_MEASURE = """
SELECT
    count(*) FILTER (WHERE state = 'succeeded'),
    coalesce(sum(attempts), 0),
    count(*) FILTER (WHERE started_at IS NOT NULL),
    (SELECT coalesce(sum(jobs), 0) FROM bench_chancy_flushes),
    extract(epoch FROM (SELECT max(at) FROM bench_chancy_flushes) - min(started_at))
FROM chancy_jobs
"""
# oban counts an attempt when it claims a job (attempt, attempted_at); the ack sets
# completed_at; both on the database clock.
OBAN_MEASURE = """
SELECT
    count(*) FILTER (WHERE state = 'completed'),
    coalesce(sum(attempt), 0),
    count(*) FILTER (WHERE attempted_at IS NOT NULL),
    count(*) FILTER (WHERE completed_at IS NOT NULL),
    extract(epoch FROM max(completed_at) - min(attempted_at))
FROM oban_jobs
"""
# Per peer: (jobs done, starts, jobs started, jobs finished, seconds first start to last finish).
MEASURES = {
    "procrastinate": PROCRASTINATE_MEASURE,
    "pgqueuer": PGQUEUER_MEASURE,
    "chancy": CHANCY_MEASURE,
    "oban": OBAN_MEASURE,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="jobs per peer (20000)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat pgtick and every peer this many times, interleaved; the table shows the "
        "median jobs/s of each and the median of the per-round ratios (one run on a shared "
        "2-core machine varies by tens of percent)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated peer names to run (procrastinate, pgqueuer, chancy, oban)",
    )
    parser.add_argument(
        "--fastest",
        action="store_true",
        help="only each peer's fastest configuration, the one the bar names (procrastinate "
        "concurrency 50, pgqueuer asyncpg batch 50; chancy and oban have one each): rounds of "
        "a large --runs in minutes",
    )
    parser.add_argument(
        "--processes",
        default="",
        metavar="N,...",
        help="drain pgtick once per value of worker.processes given (e.g. 1,2 or 1,auto) in "
        "each round: the per-process ratio and the multi-process one side by side; the peers' "
        "ratio column is to the last value (default: the config's, no --set)",
    )
    parser.add_argument(
        "--no-ceiling",
        action="store_true",
        help="skip the SQL ceiling (pgtick's claim and finish statements alone, drained next to "
        "pgtick in every round)",
    )
    common.add_settings_option(parser)


def process_counts(text: str) -> list[int | str | None]:
    """``--processes 1,2,auto``: the worker.processes of each pgtick drain (None: as --set or
    the default says)."""
    if not text.strip():
        return [None]
    out: list[int | str | None] = []
    for item in text.split(","):
        value = item.strip()
        if value == "auto":
            out.append(value)
        elif value.isdigit() and int(value) >= 1:
            out.append(int(value))
        else:
            raise common.BenchError(f"--processes {text!r}: expected N,... or auto", 2)
    return out


def check_installed(only: set[str] | None) -> dict[str, str | None]:
    """The versions of the packages of the peers to run; fail with a line naming the first
    that does not import (a missing peer must stop the run, never drop out of the table)."""
    versions: dict[str, str | None] = {}
    for name in dict.fromkeys(p.name for p in PEERS if not only or p.name in only):
        if name == "oban":
            versions["oban"] = oban_version()
        for package in PEER_PACKAGES[name]:
            try:
                require(package)
            except ImportError as exc:
                raise common.BenchError(str(exc), 2) from exc
            versions[package] = importlib.metadata.version(package)
    return versions


def oban_version() -> str:
    """oban's version in its venv, or a BenchError saying what is missing: no venv (no Python
    >= 3.12 on the machine when make ran), or oban not importable in it."""
    where = OBAN_PYTHON.relative_to(common.REPO_DIR)
    if not OBAN_PYTHON.exists():
        raise common.BenchError(
            f"cannot run oban: no {where} (oban 0.7.0 needs Python >= 3.12); make "
            ".venv/.bench-installed creates .venv-oban from python3.12, python3.13 or a pyenv "
            "3.12/3.13",
            2,
        )
    proc = subprocess.run(
        [str(OBAN_PYTHON), "-m", "bench.peer_oban", "--version"],
        capture_output=True,
        text=True,
        cwd=common.REPO_DIR,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise common.BenchError(f"cannot run oban with {where}: {lines[-1]}", 2)
    return proc.stdout.strip()


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.runs < 1:
        raise common.BenchError("--runs must be at least 1", 2)
    common.parse_settings(args.set)
    only = selected(args.only)
    process_counts(args.processes)
    if args.rounds < 1:
        raise common.BenchError("--rounds must be at least 1", 2)
    check_installed(only)


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    only = selected(args.only)
    versions = check_installed(only)
    record.options = {
        "runs": args.runs,
        "set": args.set,
        "peers": versions,
        "rounds": args.rounds,
        "fastest": args.fastest,
        "processes": args.processes,
        "ceiling": not args.no_ceiling,
    }
    counts = process_counts(args.processes)
    peers = [
        peer
        for peer in PEERS
        if (not only or peer.name in only) and (peer.fastest or not args.fastest)
    ]
    pgtick_rounds: list[dict[str, Any]] = []
    by_count: dict[str, list[dict[str, Any]]] = {}
    peer_rounds: dict[Peer, list[dict[str, Any]]] = {peer: [] for peer in peers}
    ceiling_rounds: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        label = f"round {round_no}: " if args.rounds > 1 else ""
        for count in counts:
            settings = common.parse_settings(args.set)
            if count is not None:
                settings.setdefault("worker", {})["processes"] = count
            name = "defaults" if count is None else f"processes = {count}"
            pgtick = throughput.drain(
                admin_dsn, tmp, args.runs, settings=settings, timeout=args.timeout
            )
            by_count.setdefault(name, []).append(pgtick)
            pgtick_rps = pgtick["runs_per_second"]
            print(f"  {label}pgtick ({name}): {pgtick_rps:,.0f} runs/s", flush=True)
        pgtick_rounds.append(pgtick)
        if not args.no_ceiling:
            # With the last pgtick drain's settings: its processes are the ceiling's lanes.
            top = ceiling.drain(admin_dsn, tmp, args.runs, settings=settings, timeout=args.timeout)
            top["pgtick_ratio"] = round(pgtick_rps / top["runs_per_second"], 2)
            ceiling_rounds.append(top)
            rps = top["runs_per_second"]
            print(f"  {label}SQL ceiling ({ceiling_setting(top)}): {rps:,.0f} runs/s", flush=True)
        for peer in peers:
            result = drain_peer(admin_dsn, tmp, peer, args.runs, args.timeout)
            result["pgtick_ratio"] = round(pgtick_rps / result["runs_per_second"], 2)
            peer_rounds[peer].append(result)
            rps = result["runs_per_second"]
            print(f"  {label}{peer.name} ({peer.setting}): {rps:,.0f} runs/s", flush=True)
    record.results = {
        "pgtick": pgtick_rounds[0] if args.rounds == 1 else pgtick_rounds,
        "peers": [r for peer in peers for r in peer_rounds[peer]],
    }
    if ceiling_rounds:
        record.results["ceiling"] = ceiling_rounds[0] if args.rounds == 1 else ceiling_rounds
    if len(by_count) > 1:
        record.results["pgtick_by_processes"] = by_count
    pgtick_median = statistics.median(r["runs_per_second"] for r in pgtick_rounds)
    table_rows: list[list[Any]] = [
        [
            "pgtick",
            name,
            args.runs,
            statistics.median(r["seconds"] for r in results),
            statistics.median(r["runs_per_second"] for r in results),
            round(statistics.median(r["runs_per_second"] for r in results) / pgtick_median, 2),
        ]
        for name, results in by_count.items()
    ]
    if ceiling_rounds:
        table_rows.append(
            [
                "SQL ceiling",
                ceiling_setting(ceiling_rounds[0]),
                args.runs,
                statistics.median(r["seconds"] for r in ceiling_rounds),
                statistics.median(r["runs_per_second"] for r in ceiling_rounds),
                round(statistics.median(r["pgtick_ratio"] for r in ceiling_rounds), 2),
            ]
        )
    for peer in peers:
        results = peer_rounds[peer]
        table_rows.append(
            [
                peer.name,
                peer.setting,
                args.runs,
                statistics.median(r["seconds"] for r in results),
                statistics.median(r["runs_per_second"] for r in results),
                round(statistics.median(r["pgtick_ratio"] for r in results), 2),
            ]
        )
    if args.rounds > 1:
        print(f"medians over {args.rounds} interleaved rounds (pgtick x: median per-round ratio)")
    print(common.table(["queue", "setting", "jobs", "seconds", "jobs/s", "pgtick x"], table_rows))


def ceiling_setting(result: dict[str, Any]) -> str:
    """The ceiling's row label: its batch sizes and lanes (claim and finish connections)."""
    lanes = result["lanes"]
    return (
        f"claim {result['claim_limit']}, succeed <= {result['finish_max']}, "
        f"{lanes} lane{'s' if lanes != 1 else ''}"
    )


def selected(only: str | None) -> set[str] | None:
    """The peer names given to --only (None: all)."""
    if not only:
        return None
    names = {name.strip() for name in only.split(",")}
    unknown = sorted(names - {p.name for p in PEERS})
    if unknown:
        raise common.BenchError(f"--only: unknown peers {unknown}", 2)
    return names


def peer_command(peer: Peer, dsn: str, *extra: str) -> list[str]:
    """The peer's process: oban with its venv's Python, the others with this one."""
    if peer.name == "oban":
        return [str(OBAN_PYTHON), "-m", "bench.peer_oban", dsn, *extra]
    return [sys.executable, "-m", "bench.peer_worker", peer.name, dsn, *extra]


def run_logged(command: list[str], log_path: Path, timeout: float, what: str) -> float:
    """Run a peer process to completion; its output goes to ``log_path``. Returns seconds."""
    started = time.monotonic()
    with log_path.open("ab") as log_file:
        try:
            proc = subprocess.run(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                cwd=common.REPO_DIR,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise common.BenchError(f"{what}: still running after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        log = common.tail(log_path.read_text(errors="replace"))
        raise common.BenchError(f"{what}: exit {proc.returncode}; log:\n{log}")
    return time.monotonic() - started


def drain_peer(admin_dsn: str, tmp: Path, peer: Peer, runs: int, timeout: float) -> dict[str, Any]:
    """Install, enqueue and drain one peer in a fresh database; measured from its own table."""
    label = f"{peer.name} ({peer.setting})"
    log_path = tmp / f"{peer.name}-{time.monotonic_ns()}.log"
    with common.fresh_database(admin_dsn, peer.name, pgtick_schema=False) as dsn:
        run_logged(
            peer_command(peer, dsn, "--prepare", str(runs)),
            log_path,
            PREPARE_TIMEOUT_SECONDS,
            f"{label} prepare",
        )
        wall = run_logged(peer_command(peer, dsn, *peer.args), log_path, timeout, label)
        with common.connect(dsn) as conn:
            done, picks, picked_jobs, finished, seconds = common.one(conn, MEASURES[peer.name])
    if not (done == picks == picked_jobs == finished == runs) or not seconds:
        raise common.BenchError(
            f"{label}: not every job ran exactly once: {runs} jobs, {done} done, "
            f"{picks} starts of {picked_jobs} jobs, {finished} finished"
        )
    seconds = float(seconds)
    return {
        "peer": peer.name,
        "setting": peer.setting,
        "runs": runs,
        "seconds": round(seconds, 3),
        "runs_per_second": round(runs / seconds, 1),
        "client_wall_seconds": round(wall, 3),
    }
