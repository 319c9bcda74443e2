"""Throughput: how fast one `pgtick run` with default settings drains queued no-op runs.

    python bench/throughput.py [--runs 50000] [--threads N] [--prefetch N] [--dsn DSN]

Without --dsn it starts an embedded PostgreSQL (throwaway settings: fsync off). It enqueues
the runs first, then starts the daemon as a real process and times from its READY to the
last run's finish, on the database clock (min(started_at) .. max(finished_at)).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from pgtick import db, migrate
from pgtick.embedded import EmbeddedPostgres
from pgtick.store import NewRun, RunStore

HERE = Path(__file__).resolve().parent
ENQUEUE_BATCH = 5000
CONFIG = """
[worker]
imports = ["noop_jobs"]
threads = {threads}
prefetch = {prefetch}
[metrics]
listen = ""
[logging]
format = "json"
level = "warning"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=8, help="worker.threads (default 8)")
    parser.add_argument("--prefetch", type=int, default=0, help="worker.prefetch (default 0)")
    parser.add_argument("--dsn", help="admin DSN of a server to use (default: embedded)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgtick-bench-"))
    server = None if args.dsn else EmbeddedPostgres(tmp / "pg", throwaway=True)
    admin = args.dsn or server.dsn  # type: ignore[union-attr]
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS pgtick_bench WITH (FORCE)")
            conn.execute("CREATE DATABASE pgtick_bench")
        dsn = make_conninfo(admin, dbname="pgtick_bench")
        migrate.migrate(dsn, "pgtick")
        pool = db.make_pool(dsn, "pgtick", size=2)
        store = RunStore(pool)
        for start in range(0, args.runs, ENQUEUE_BATCH):
            count = min(ENQUEUE_BATCH, args.runs - start)
            store.enqueue_many([NewRun("noop") for _ in range(count)])
        config = tmp / "config.toml"
        config.write_text(CONFIG.format(threads=args.threads, prefetch=args.prefetch))
        env = {**os.environ, "PGTICK_DSN": dsn, "PYTHONPATH": str(HERE)}
        command = [sys.executable, "-m", "pgtick", "run", "--config", str(config)]
        if os.environ.get("BENCH_PROFILE"):
            command = ["py-spy", "record", "-o", os.environ["BENCH_PROFILE"], "-f", "raw",
                       "--", *command]  # fmt: skip
        daemon = subprocess.Popen(command, env=env)
        with pool.connection() as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                    "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgtick.runs"
                ).fetchone()
                assert row is not None
                if row[0] == args.runs:
                    break
                if daemon.poll() is not None:
                    raise SystemExit(f"daemon exited with {daemon.returncode}")
                time.sleep(0.2)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        seconds = float(row[1])
        pool.close()
        print(
            f"{args.runs} no-op runs drained in {seconds:.2f} s by one daemon "
            f"(threads={args.threads}, prefetch={args.prefetch}): "
            f"{args.runs / seconds:,.0f} runs/s  [{platform.node()}, {os.cpu_count()} cpus, "
            f"python {platform.python_version()}, {time.strftime('%Y-%m-%d')}]"
        )
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
