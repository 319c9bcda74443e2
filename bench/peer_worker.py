"""One peer worker that drains its queue and exits, run by the peers part as its own process:

    python -m bench.peer_worker procrastinate DSN --concurrency 50
    python -m bench.peer_worker pgqueuer DSN --driver asyncpg --batch-size 50

Also the peers' schema install and bulk enqueue (``prepare``), through their own APIs. The
peers are imported by name (``require``), so this module type-checks without them installed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from typing import Any

from psycopg.conninfo import conninfo_to_dict

ENQUEUE_BATCH = 5000


def require(name: str) -> Any:
    """Import a peer package; ImportError names the package and how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"cannot import {name} ({exc}); install the peers: pip install -e '.[bench]'"
        ) from exc


# -- procrastinate ----------------------------------------------------------------------------


def procrastinate_app(dsn: str) -> Any:
    procrastinate = require("procrastinate")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop() -> None:
        """The same no-op as pgtick's."""

    app.task(name="noop")(noop)
    return app


async def procrastinate_prepare(dsn: str, runs: int) -> None:
    app = procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        for start in range(0, runs, ENQUEUE_BATCH):
            await task.batch_defer_async(*({} for _ in range(min(ENQUEUE_BATCH, runs - start))))


async def procrastinate_work(dsn: str, concurrency: int) -> None:
    app = procrastinate_app(dsn)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=False)


# -- pgqueuer ---------------------------------------------------------------------------------


async def pgqueuer_driver(dsn: str, driver: str) -> Any:
    """A pgqueuer driver over one connection of the given kind."""
    pgqueuer = require("pgqueuer")
    if driver == "asyncpg":
        asyncpg = require("asyncpg")
        params = conninfo_to_dict(dsn)
        conn = await asyncpg.connect(
            host=params.get("host"),
            port=params.get("port"),
            user=params.get("user"),
            password=params.get("password"),
            database=params.get("dbname"),
        )
        return pgqueuer.AsyncpgDriver(conn)
    psycopg = require("psycopg")
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return pgqueuer.PsycopgDriver(conn)


async def pgqueuer_prepare(dsn: str, runs: int) -> None:
    pgqueuer = require("pgqueuer")
    queries = pgqueuer.Queries(await pgqueuer_driver(dsn, "psycopg"))
    await queries.install()
    for start in range(0, runs, ENQUEUE_BATCH):
        count = min(ENQUEUE_BATCH, runs - start)
        await queries.enqueue(["noop"] * count, [None] * count, [0] * count)


async def pgqueuer_work(dsn: str, driver: str, batch_size: int) -> None:
    pgqueuer = require("pgqueuer")
    types = require("pgqueuer.types")
    qm = pgqueuer.QueueManager(pgqueuer.Queries(await pgqueuer_driver(dsn, driver)))

    async def noop(job: Any) -> None:
        """The same no-op as pgtick's."""

    qm.entrypoint("noop")(noop)
    await qm.run(batch_size=batch_size, mode=types.QueueExecutionMode.drain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("peer", choices=["procrastinate", "pgqueuer"])
    parser.add_argument("dsn")
    parser.add_argument("--prepare", type=int, metavar="RUNS", help="install and enqueue")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--driver", choices=["psycopg", "asyncpg"], default="psycopg")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    if args.peer == "procrastinate":
        if args.prepare is not None:
            asyncio.run(procrastinate_prepare(args.dsn, args.prepare))
        else:
            asyncio.run(procrastinate_work(args.dsn, args.concurrency))
    elif args.prepare is not None:
        asyncio.run(pgqueuer_prepare(args.dsn, args.prepare))
    else:
        asyncio.run(pgqueuer_work(args.dsn, args.driver, args.batch_size))


if __name__ == "__main__":
    main()
