"""The oban peer (oban 0.7.0, the Python port of Elixir's Oban), run by the peers part with the
Python of its own venv, .venv-oban: oban needs Python >= 3.12 and the bench's venv is 3.11.

    .venv-oban/bin/python -m bench.peer_oban DSN --prepare 20000
    .venv-oban/bin/python -m bench.peer_oban DSN --limit 200
    .venv-oban/bin/python -m bench.peer_oban --version

``--prepare`` installs oban's schema and enqueues the jobs through ``Oban.enqueue_many``; the
drain runs one embedded Oban with the one queue ``default`` at ``--limit`` (the issue's "queue
limit ~200" is ``queues={"default": {"limit": 200}}``), the way ``oban start`` runs it (uvloop,
orjson for psycopg's JSON, oban's default pool of 1-10 connections; the rest at oban's
defaults), and stops it once the queue is drained: oban has no drain mode of its own.
Imports only the standard library, psycopg and bench.peer_worker (never pgtick), so it runs
in that venv and type-checks under 3.11.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Coroutine
from typing import Any

from bench import peer_worker
from bench.peer_worker import ENQUEUE_BATCH, until_drained

QUEUE = "default"
# Jobs still to run or to record: the drain is over when none is left.
PENDING = """
SELECT EXISTS (
    SELECT 1 FROM oban_jobs
    WHERE state IN ('available', 'scheduled', 'executing', 'retryable')
)
"""
SETUP_HINT = "make .venv/.bench-installed (it creates .venv-oban with Python >= 3.12)"


def require(name: str) -> Any:
    """Import a package of the oban venv; ImportError says how that venv is made."""
    return peer_worker.require(name, SETUP_HINT)


def noop_worker() -> Any:
    """The oban worker of the same no-op as pgtick's, registered under its class name."""
    oban = require("oban")

    @oban.worker(queue=QUEUE)
    class Noop:
        async def process(self, job: Any) -> None:
            """The same no-op as pgtick's."""

    return Noop


def use_orjson() -> None:
    """psycopg's JSON through orjson, as ``oban start`` sets it."""
    orjson = require("orjson")
    json = require("psycopg.types.json")
    json.set_json_dumps(orjson.dumps)
    json.set_json_loads(orjson.loads)


async def prepare(dsn: str, runs: int) -> None:
    """Install the schema and enqueue ``runs`` jobs, through a client-mode Oban (no queues)."""
    oban = require("oban")
    schema = require("oban.schema")
    worker = noop_worker()
    pool = await oban.Oban.create_pool(dsn)
    try:
        await schema.install(pool)
        client = oban.Oban(pool=pool)
        for start in range(0, runs, ENQUEUE_BATCH):
            count = min(ENQUEUE_BATCH, runs - start)
            await client.enqueue_many([worker.new({}) for _ in range(count)])
    finally:
        await pool.close()


async def work(dsn: str, limit: int) -> None:
    """Drain the queue with one Oban at queue limit ``limit``; stop once nothing is pending."""
    oban = require("oban")
    noop_worker()
    pool = await oban.Oban.create_pool(dsn)
    instance = oban.Oban(pool=pool, queues={QUEUE: {"limit": limit}})

    def busy() -> bool:
        info = instance.check_queue(QUEUE)
        return bool(info and info.running)

    try:
        async with instance:
            await until_drained(dsn, busy, PENDING)
    finally:
        await pool.close()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop, as ``oban start`` does."""
    require("uvloop").run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dsn", nargs="?")
    parser.add_argument("--prepare", type=int, metavar="RUNS", help="install and enqueue")
    parser.add_argument("--limit", type=int, default=10, help="the queue's limit (oban's: 10)")
    parser.add_argument("--version", action="store_true", help="print oban's version")
    args = parser.parse_args()
    try:
        if args.version:
            require("oban")
            print(importlib.metadata.version("oban"))
            return
        if not args.dsn:
            parser.error("DSN is required")
        use_orjson()
        if args.prepare is not None:
            run(prepare(args.dsn, args.prepare))
        else:
            run(work(args.dsn, args.limit))
    except ImportError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
