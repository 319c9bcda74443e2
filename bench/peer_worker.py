"""One peer worker that drains its queue and exits, run by the peers part as its own process:

    python -m bench.peer_worker procrastinate DSN --concurrency 50
    python -m bench.peer_worker pgqueuer DSN --driver asyncpg --batch-size 50
    python -m bench.peer_worker chancy DSN --concurrency 200

Also the peers' schema install and bulk enqueue (``prepare``), through their own APIs. The
peers are imported by name (``require``), so this module type-checks without them installed.
oban runs from bench.peer_oban in a venv of its own (it needs Python >= 3.12); it shares
``until_drained`` from here, so this module imports nothing but the standard library and
psycopg.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

ENQUEUE_BATCH = 5000
DRAIN_POLL_SECONDS = 0.05


INSTALL_HINT = "install the peers: pip install -e '.[bench]'"


def require(name: str, hint: str = INSTALL_HINT) -> Any:
    """Import a peer package; ImportError names the package and how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"cannot import {name} ({exc}); {hint}") from exc


async def until_drained(dsn: str, busy: Callable[[], bool], pending_sql: str) -> None:
    """Return once the worker holds no job and ``pending_sql`` finds none still to run or to
    record: the stop of the peers without a drain mode of their own (chancy, oban). The table
    is read only while the worker is idle, so a busy drain pays nothing for the watch."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
            if busy():
                continue
            row = await (await conn.execute(pending_sql)).fetchone()
            if row is not None and not row[0]:
                return


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


# -- chancy -----------------------------------------------------------------------------------

# The queue every chancy worker declares (without upsert) when it starts: declared here first,
# with the bench's settings, so that it is the only queue and runs on the async executor.
CHANCY_QUEUE = "default"
CHANCY_PENDING = """
SELECT EXISTS (
    SELECT 1 FROM chancy_jobs WHERE state IN ('pending', 'retrying', 'running')
)
"""
# The no-op below by its import path (chancy stores the function's name with the job).
CHANCY_NOOP = "bench.peer_worker.chancy_noop"
# Worker.send_outgoing_interval: how often the worker writes its batch of finished jobs.
CHANCY_FLUSH_SECONDS = 0.1
# The bench's own table beside chancy's: each write of finished jobs, on the database clock.
CHANCY_FLUSHES = """
CREATE TABLE bench_chancy_flushes (
    at timestamptz NOT NULL DEFAULT statement_timestamp(),
    jobs int NOT NULL
)
"""


async def chancy_noop() -> None:
    """The same no-op as pgtick's, imported by name by chancy's async executor."""


def chancy_app(dsn: str, *plugins: Any) -> Any:
    """A chancy app at its defaults (default plugins on), logging warnings only: at INFO it
    logs a line per job pulled, which no production worker keeps."""
    chancy = require("chancy")
    log = logging.getLogger("chancy.bench")
    log.setLevel(logging.WARNING)
    return chancy.Chancy(dsn, log=log, plugins=list(plugins))


def chancy_flush_stamp() -> Any:
    """A chancy plugin stamping each write of finished jobs, in its transaction, with the
    database clock: chancy's completed_at is the worker's clock when the job returned, up to a
    flush interval before the outcome is written, and the other peers end on written outcomes.
    One small INSERT a flush (about ten a second), through chancy's documented hook for work
    that must commit with the job updates."""
    plugin: Any = require("chancy.plugin").Plugin

    class FlushStamp(plugin):  # type: ignore[misc]
        @staticmethod
        def get_identifier() -> str:
            return "bench.flush_stamp"

        async def on_jobs_updated_in_transaction(
            self, *, worker: Any, jobs: Any, cursor: Any
        ) -> None:
            await cursor.execute(
                "INSERT INTO bench_chancy_flushes (jobs) VALUES (%s)", (len(jobs),)
            )

    return FlushStamp()


async def chancy_prepare(dsn: str, runs: int) -> None:
    chancy = require("chancy")
    async with chancy_app(dsn) as app:
        await app.migrate()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(CHANCY_FLUSHES)
        job = chancy.Job(func=CHANCY_NOOP, queue=CHANCY_QUEUE)
        async for _ in app.push_many([job] * runs, batch_size=ENQUEUE_BATCH):
            pass


async def chancy_work(dsn: str, concurrency: int) -> None:
    """One worker on the queue at ``concurrency``, stopped once the queue is drained (chancy
    has no drain mode). The issue's settings by chancy 0.26.0's names: the async executor is
    ``executor=Chancy.Executor.Async``, eager polling ``Queue(eager_polling=True)``, the
    concurrency ``Queue(concurrency=...)``; the completion flush interval is no option of
    Queue or Worker but the worker's attribute ``send_outgoing_interval`` (1 s by default),
    set to CHANCY_FLUSH_SECONDS."""
    chancy = require("chancy")
    async with chancy_app(dsn, chancy_flush_stamp()) as app:
        queue = chancy.Queue(
            CHANCY_QUEUE,
            concurrency=concurrency,
            executor=chancy.Chancy.Executor.Async,
            eager_polling=True,
        )
        await app.declare(queue, upsert=True)
        worker = chancy.Worker(app)
        worker.send_outgoing_interval = CHANCY_FLUSH_SECONDS
        await worker.start()
        try:
            await until_drained(
                dsn, lambda: any(len(e) for e in worker.executors.values()), CHANCY_PENDING
            )
        finally:
            await worker.stop()


def run(args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    """The coroutine of the peer and the step (prepare or drain) the arguments name."""
    if args.prepare is not None:
        prepare = {
            "procrastinate": procrastinate_prepare,
            "pgqueuer": pgqueuer_prepare,
            "chancy": chancy_prepare,
        }
        return prepare[args.peer](args.dsn, args.prepare)
    if args.peer == "procrastinate":
        return procrastinate_work(args.dsn, args.concurrency)
    if args.peer == "chancy":
        return chancy_work(args.dsn, args.concurrency)
    return pgqueuer_work(args.dsn, args.driver, args.batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("peer", choices=["procrastinate", "pgqueuer", "chancy"])
    parser.add_argument("dsn")
    parser.add_argument("--prepare", type=int, metavar="RUNS", help="install and enqueue")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--driver", choices=["psycopg", "asyncpg"], default="psycopg")
    parser.add_argument("--batch-size", type=int, default=10)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
