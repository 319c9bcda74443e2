"""`pgtick run` as real processes on a real PostgreSQL: write a config, start, signal, wait."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import Connection, Runs, connect

HERE = Path(__file__).resolve().parent
START_TIMEOUT_SECONDS = 60.0
# worker.processes of the daemons the tests start unless a test says: 1 (one process, no
# supervisor), written into every config since the default is one per CPU; the tests of
# several processes say so, and PGTICK_TEST_PROCESSES=2 runs the suite's daemons as supervisors.
PROCESSES = int(os.environ.get("PGTICK_TEST_PROCESSES", "1"))

BASE_CONFIG = """
[worker]
threads = {threads}
{processes}prefetch = {prefetch}
lease = "{lease}"
heartbeat = "{heartbeat}"
poll_interval = "{poll_interval}"
shutdown_grace = "{grace}"
imports = ["jobs"]

[ticker]
reaper_interval = "{reaper}"

[metrics]
listen = ""

[logging]
format = "json"
level = "{level}"
"""


class Daemon:
    """One `pgtick run` process."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def workers(self) -> set[int]:
        """The pids of its live worker processes (worker.processes above 1; from /proc)."""
        return worker_processes(self.pid)

    def family(self) -> set[int]:
        """The pids its handlers run in: its own, or its worker processes'."""
        return {self.pid} | self.workers()


def worker_processes(parent: int) -> set[int]:
    """The live children of ``parent`` that multiprocessing spawned (not its resource
    tracker)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) != parent or stat[0] == "Z":
            continue
        try:
            if b"spawn_main" in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


class Cluster:
    """Starts daemons against one database and reads what their handlers recorded."""

    def __init__(self, dsn: str, tmp_path: Path) -> None:
        self.dsn = dsn
        self.tmp_path = tmp_path
        self.jobs_log = tmp_path / "jobs.log"
        self.jobs_log.touch()
        self.daemons: list[Daemon] = []

    def config(self, extra: str = "", **settings: Any) -> Path:
        values = {
            "threads": 8,
            "processes": PROCESSES,
            "prefetch": 0,
            "lease": "60s",
            "heartbeat": "20s",
            "poll_interval": "5s",
            "grace": "30s",
            "reaper": "10s",
            "level": "info",
        }
        values.update(settings)
        values["processes"] = f"processes = {json.dumps(values['processes'])}\n"
        path = self.tmp_path / f"config-{len(self.daemons)}-{time.monotonic_ns()}.toml"
        path.write_text(BASE_CONFIG.format(**values) + extra)
        return path

    def start(
        self,
        config: Path | None = None,
        *,
        wait: bool = True,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Daemon:
        config = config or self.config()
        log_path = self.tmp_path / f"daemon-{len(self.daemons)}.log"
        full_env = {
            **os.environ,
            "PGTICK_DSN": self.dsn,
            "JOBS_LOG": str(self.jobs_log),
            # The jobs' modules first, then the caller's path (a worktree's daemon/ under test
            # rather than the package the venv has installed).
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            **(env or {}),
        }
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgtick", "run", "--config", str(config), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
            )
        daemon = Daemon(proc, log_path)
        self.daemons.append(daemon)
        if wait:
            self.wait_registered(daemon)
        return daemon

    def wait_registered(self, daemon: Daemon) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if daemon.proc.poll() is not None:
                raise AssertionError(f"daemon exited {daemon.proc.returncode}:\n{daemon.log()}")
            if '"daemon_started"' in daemon.log():
                return
            time.sleep(0.05)
        raise AssertionError(f"daemon did not start:\n{daemon.log()}")

    def records(self) -> list[dict[str, Any]]:
        """The complete lines of the jobs' log: a handler may be writing the last one now."""
        text = self.jobs_log.read_text()
        complete = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line]

    def executions(self, event: str = "run") -> Counter[int]:
        return Counter(r["run_id"] for r in self.records() if r["event"] == event)

    def stop_all(self) -> None:
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGKILL)
                daemon.proc.wait(timeout=10)


@pytest.fixture
def conn(dsn: str) -> Iterator[Connection]:
    """An autocommit psycopg connection on the pgtick schema, for seeding and assertions (the
    acceptance tests see the database only through SQL, the CLI and the daemon)."""
    with connect(dsn) as connection:
        yield connection


@pytest.fixture
def store(dsn: str) -> Runs:
    """Runs enqueued through ``pgtick.enqueue`` and read back from the public tables."""
    return Runs(dsn)


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of the test's own, for tests that stop or restart it: doing that to the shared
    one would disturb other tests."""
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-own-pg-"))
    server = EmbeddedPostgres(data_dir, throwaway=True)
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def cluster(dsn: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(dsn, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def status_counts(conn: Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())


def left_behind(conn: Connection, worker_ids: list[str], held: set[int]) -> set[int]:
    """The runs a SIGKILLed daemon (its ``worker_ids``) left behind, read from its attempts
    once the others have finished them: every one it did not finish. A statement it sent as
    it died may commit after the caller's read of its running rows (``held``): a finish (that
    run ended there, once) or a claim (left behind too, unseen by that read). Checks that each
    held run was left behind or finished by it, that it left some, and that each it left
    behind is recorded lost, once."""
    attempts = conn.execute(
        "SELECT run_id, outcome FROM attempts WHERE worker_id = ANY(%s)", [worker_ids]
    ).fetchall()
    finished = {run_id for run_id, outcome in attempts if outcome == "succeeded"}
    outcomes = [outcome for _, outcome in attempts if outcome != "succeeded"]
    left = {run_id for run_id, outcome in attempts if outcome != "succeeded"}
    assert held - left <= finished
    assert left, "the victim left runs behind"
    assert outcomes == ["lost"] * len(left)
    return left
