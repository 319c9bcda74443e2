"""The console at scale: how long a GET of its pages takes with a big runs table.

    python -m bench console [--runs 1000000] [--requests 50]

Generates the runs by SQL (terminal runs over 10 job types, one a second back from now, some
dead, plus queued ones: 1 000 000 runs reach 11.6 days back), rolls their history up as the
daemons would have (migration 0023's roll_up_runs, reaching back 8 days, so the job type page's
7-day chart is full), starts a `pgtick run` with the console on a free loopback port (retention
30 days: every generated run stays), and times the overview, a job type's page (its 24-hour and
7-day charts from the rollups; issue 46, Must show 4), the runs page unfiltered, filtered by
status (dead), by job type, and the third page of a keyset walk (?before=ID), each
`--requests` times after one warm-up request. Prints p50/p90/p99/max per page and the rollups'
rows and size; fails when a page's p99 is 200 ms or more.
"""

from __future__ import annotations

import argparse
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from bench import common, scrape
from pgtick.storage.rollup import ROLLUP_SETTLE_SECONDS

CONFIG = """
[worker]
imports = ["bench.jobs"]
[metrics]
listen = ""
[web]
listen = "127.0.0.1:0"
[retention]
succeeded = "30d"
dead = "30d"
cancelled = "30d"
skipped = "30d"
[logging]
format = "json"
level = "info"
"""


def timed_get(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        body: str = response.read().decode()
    return time.perf_counter() - started, body


# The generated history rolled up this far back, a step of a day per statement.
ROLLUP_BACK_SECONDS = 8 * 86400.0
ROLLUP_STEP_MINUTES = 1440


def roll_up_history(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """The rollups of the generated runs, by the function the daemons call; their rows and
    size (bytes, indexes included) per table."""
    while True:
        row = conn.execute(
            "SELECT pgtick.roll_up_runs(%s, %s, %s)",
            [ROLLUP_SETTLE_SECONDS, ROLLUP_BACK_SECONDS, ROLLUP_STEP_MINUTES],
        ).fetchone()
        if row is None or int(row[0]) < ROLLUP_STEP_MINUTES:
            break
    sizes: dict[str, int] = {}
    for table in ("rollup_minutes", "rollup_hours"):
        row = conn.execute(
            f"SELECT count(*), (SELECT sum(pg_total_relation_size(relid))"
            f" FROM pg_partition_tree('pgtick.{table}')) FROM pgtick.{table}"
        ).fetchone()
        assert row is not None
        sizes[f"{table}_rows"], sizes[f"{table}_bytes"] = int(row[0]), int(row[1] or 0)
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs in the table")
    parser.add_argument("--requests", type=int, default=50, help="timed requests per page")


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    if args.runs < 1000 or args.requests < 1:
        raise common.BenchError("--runs must be at least 1000, --requests at least 1", code=2)
    record.options = {"runs": args.runs, "requests": args.requests}
    queued = max(1, args.runs // 100)
    proc = None
    results: dict[str, dict[str, float]] = {}
    rollups: dict[str, int] = {}
    with common.fresh_database(admin_dsn, "console") as dsn:
        try:
            print(f"generating {args.runs - queued:,} terminal + {queued:,} queued runs")
            with psycopg.connect(dsn, autocommit=True) as conn:
                scrape.generate(conn, args.runs - queued, queued)
                rollups = roll_up_history(conn)
            print("rollups: " + ", ".join(f"{k} {v:,}" for k, v in rollups.items()))
            proc, port = scrape.start_listening_daemon(tmp, dsn, CONFIG, "web.listen")
            base = f"http://127.0.0.1:{port}"
            _, first = timed_get(f"{base}/runs")
            ids = [int(m) for m in re.findall(r'href="/runs/(\d+)"', first)]
            before = sorted(ids)[0] if ids else args.runs
            pages = {
                "/": f"{base}/",
                "/types/type_3": f"{base}/types/type_3",
                "/runs": f"{base}/runs",
                "/runs?status=dead": f"{base}/runs?status=dead",
                "/runs?type=type_3": f"{base}/runs?type=type_3",
                "/runs?before=<page 3>": f"{base}/runs?before={max(1, before - 100)}",
            }
            for name, url in pages.items():
                timed_get(url)  # warm-up
                seconds = [timed_get(url)[0] * 1000 for _ in range(args.requests)]
                results[name] = common.distribution(seconds)
        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    rows = [
        (name, f"{d['p50']:.1f}", f"{d['p90']:.1f}", f"{d['p99']:.1f}", f"{d['max']:.1f}")
        for name, d in results.items()
    ]
    print()
    print(f"rows: {args.runs:,}")
    print(common.table(["page", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows))
    record.results = {"pages_ms": results, "rollups": rollups}
    slow = [name for name, d in results.items() if d["p99"] >= 200]
    if slow:
        raise common.BenchError(f"console page p99 at or above 200 ms: {slow}")
