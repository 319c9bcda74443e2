"""The system under test: one PostgreSQL, one database, and N `pgtick run` processes.

The server is an embedded PostgreSQL of the run's own, durable (fsync and synchronous_commit
on: the nemesis crashes it), or the one --dsn names (then it is never restarted). Each daemon
slot holds one process at a time; a slot's successive processes are its incarnations
(``d1#3``: slot 1, third start). Every start, exit and signal is written to the harness's
history.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtick.embedded import EmbeddedPostgres
from tests.torture.history import DAEMON_ENV, FAIL, HISTORY_ENV, INFO, INVOKE, OK, HistoryFile
from tests.torture.jobs import EFFECTS_DDL
from tests.torture.plan import POLL_SECONDS, SCHEDULED_TYPE, TICK_SECONDS, JobType, World

# The config of the previous release's processes (the migrate fault), beside config.toml.
PREVIOUS_CONFIG = "config-previous.toml"

REPO_DIR = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 45.0
HANDLER = "tests.torture.jobs:handle"
COMMAND = [sys.executable, "-m", "tests.torture.cmd"]


class Server:
    """The PostgreSQL the run uses; restartable only when it is the run's own."""

    def __init__(self, admin_dsn: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_dsn = admin_dsn
        self._embedded = embedded

    @property
    def restartable(self) -> bool:
        return self._embedded is not None

    def stop(self, mode: str) -> None:
        assert self._embedded is not None
        self._embedded.stop(mode)

    def start(self) -> None:
        assert self._embedded is not None
        self._embedded.start()


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[Server]:
    """``dsn`` (an admin DSN), else a throwaway embedded PostgreSQL removed afterwards."""
    if dsn:
        yield Server(dsn, None)
        return
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-torture-pg-"))
    # Not throwaway: fsync and synchronous_commit stay on, so that a restart in immediate mode
    # (a crash) loses no commit the server acknowledged (with them off, seed 10 lost two).
    embedded = EmbeddedPostgres(data_dir / "pg", throwaway=False)
    try:
        yield Server(embedded.dsn, embedded)
    finally:
        with contextlib.suppress(Exception):
            embedded.start()  # a restart fault may have left it stopped: close() needs it up
        embedded.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def python_path(code: Path | None) -> str:
    """PYTHONPATH for a pgtick process: ``code`` (another release's ``daemon`` folder) first,
    then this repository (the harness's handlers), then what the harness was given."""
    parts = [str(code) if code else None, str(REPO_DIR), os.environ.get("PYTHONPATH")]
    return os.pathsep.join(filter(None, parts))


@contextlib.contextmanager
def database(admin_dsn: str, code: Path | None = None) -> Iterator[str]:
    """A fresh database migrated by `pgtick migrate` (of the release in ``code``, None: this
    one), with the effects table; dropped after."""
    name = f"torture_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(admin_dsn, dbname=name)
    try:
        env = {
            **os.environ,
            "PGTICK_DSN": dsn,
            "PGTICK_CONFIG": "",
            "PYTHONPATH": python_path(code),
        }
        done = subprocess.run(
            [sys.executable, "-m", "pgtick", "migrate"], capture_output=True, text=True, env=env
        )
        if done.returncode != 0:
            raise RuntimeError(f"pgtick migrate failed: {done.stderr.strip()[:500]}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(EFFECTS_DDL)
        yield dsn
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(admin_dsn, autocommit=True) as conn,
        ):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def job_type_table(job_type: JobType) -> str:
    keys: dict[str, Any] = {
        "max_attempts": job_type.max_attempts,
        "backoff": "fixed",
        "backoff_base": "1s",
        "jitter": 0.0,
    }
    if job_type.command:
        keys["command"] = COMMAND
    else:
        keys["handler"] = HANDLER
    if job_type.timeout is not None:
        keys["timeout"] = f"{job_type.timeout:g}s"
    if job_type.max_running is not None:
        keys["max_running"] = job_type.max_running
    if job_type.max_running_per_key is not None:
        keys["max_running_per_key"] = job_type.max_running_per_key
        keys["concurrency_key"] = "payload.k"
    if job_type.rate is not None:
        keys["rate"] = job_type.rate
    body = "".join(f"{k} = {toml(v)}\n" for k, v in keys.items())
    return f"\n[job_types.{job_type.name}]\n{body}"


def release_config(config: Path, code: Path | None) -> Path:
    """The config a process of the release in ``code`` reads (None: this one; else the
    previous release's, written beside it without the keys that release does not know)."""
    return config if code is None else config.with_name(PREVIOUS_CONFIG)


def config_text(world: World, processes: int | None = 1) -> str:
    """The config every daemon (and the operator's CLI) reads; ``processes``: each daemon's
    worker.processes (above 1: a supervisor and its worker processes, issue 47; always written,
    the default being one per CPU), None for the previous release, which has no such key."""
    text = f"""\
[worker]
threads = {world.threads}
{f"processes = {processes}" if processes is not None else ""}
prefetch = {world.prefetch}
lease = "{world.lease_seconds:g}s"
poll_interval = "{POLL_SECONDS:g}s"
shutdown_grace = "{world.grace_seconds:g}s"

[ticker]
interval = "{TICK_SECONDS:g}s"
reaper_interval = "{world.reaper_seconds:g}s"

[metrics]
listen = ""

[logging]
format = "json"
level = "info"
job_output = false

[retention]
""" + "".join(f"{status} = {toml(value)}\n" for status, value in world.retention.items())
    for job_type in (*world.job_types, SCHEDULED_TYPE):
        text += job_type_table(job_type)
    for s in world.schedules:
        payload = {"b": "ok", "s": round(s.seconds, 1), "sched": s.name}
        text += (
            f"\n[schedules.{s.name}]\njob_type = {toml(SCHEDULED_TYPE.name)}\n"
            f"cron = {toml(s.cron)}\noverlap = {toml(s.overlap)}\ncatchup = {toml(s.catchup)}\n"
            f"payload = {toml(payload)}\n"
        )
    return text


@dataclass
class Incarnation:
    """One process of a daemon slot."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    worker_id: str = ""
    started: bool = False
    told: str = ""  # the signal the harness sent it ("" none): an exit after it is expected
    release: str = "current"  # or "previous": started before the upgrade (the migrate fault)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 8) -> list[str]:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return []

    def logged(self, text: str) -> bool:
        with contextlib.suppress(OSError):
            return text in self.log_path.read_text(errors="replace")
        return False

    def worker_exits(self) -> list[tuple[int, int, str]]:
        """(pid, when in ns, worker id) of each worker process that ended, as its supervisor
        logged it (worker.processes above 1: a Python handler ends with its worker process,
        which may be well before the supervisor does)."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if '"worker_process_exited"' not in line and '"worker_process_died"' not in line:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    e = json.loads(line)
                    at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
                    out.append((int(e["pid"]), int(at.timestamp() * 1e9), e.get("worker_id", "")))
        return out


@dataclass
class Daemons:
    """The daemon slots: start, signal, restart, watch; every change goes into the history."""

    dsn: str
    config: Path
    directory: Path  # the history directory (handlers write there)
    logs: Path
    history: HistoryFile
    count: int
    slots: list[Incarnation | None] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    waiters: list[threading.Thread] = field(default_factory=list)
    # The previous release's code while the run has not been upgraded (the migrate fault):
    # every start before it runs that release, every start after it this one.
    previous: Path | None = None
    upgraded: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.slots = [None] * self.count
        self.starts = [0] * self.count

    def code(self) -> Path | None:
        """The release a process started now runs: the previous one until the upgrade."""
        return None if self.upgraded.is_set() else self.previous

    def env(self, name: str, code: Path | None) -> dict[str, str]:
        return {
            **os.environ,
            "PGTICK_DSN": self.dsn,
            "PYTHONPATH": python_path(code),
            HISTORY_ENV: str(self.directory),
            DAEMON_ENV: name,
        }

    def start(self, slot: int) -> Incarnation | None:
        """Start a new incarnation in ``slot`` unless one is alive there."""
        with self.lock:
            current = self.slots[slot]
            if current is not None and current.alive():
                return None
            if self.stopping.is_set():
                return None
            self.starts[slot] += 1
            name = f"d{slot}#{self.starts[slot]}"
            code = self.code()
            log_path = self.logs / f"{name.replace('#', '-')}.log"
            config = release_config(self.config, code)
            with log_path.open("wb") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "pgtick", "run", "--config", str(config)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=self.env(name, code),
                )
            release = "previous" if code else "current"
            incarnation = Incarnation(name, proc, log_path, release=release)
            self.slots[slot] = incarnation
        self.history.write(
            INVOKE, "daemon", {"daemon": name, "slot": slot, "pid": proc.pid, "release": release}
        )
        threading.Thread(target=self._wait_started, args=(incarnation,), daemon=True).start()
        waiter = threading.Thread(target=self._wait_exit, args=(incarnation, slot), daemon=True)
        waiter.start()
        self.waiters.append(waiter)
        return incarnation

    def _wait_started(self, inc: Incarnation) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline and inc.alive():
            for line in inc.log_tail(400):
                if '"daemon_started"' in line:
                    with contextlib.suppress(ValueError):
                        inc.worker_id = str(json.loads(line).get("worker_id", ""))
                    inc.started = True
                    self.history.write(
                        OK,
                        "daemon",
                        {"daemon": inc.name, "pid": inc.pid, "worker_id": inc.worker_id},
                    )
                    return
            time.sleep(0.1)

    def wait_started(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [s for s in self.slots if s is not None]
            if all(s.started for s in live):
                return
            for s in live:
                if not s.alive():
                    raise RuntimeError(
                        f"daemon {s.name} exited {s.proc.returncode}: {s.log_tail()}"
                    )
            time.sleep(0.1)
        raise RuntimeError("daemons did not start")

    def current(self, slot: int) -> Incarnation | None:
        inc = self.slots[slot % self.count]
        return inc if inc is not None and inc.alive() else None

    def send(self, slot: int, signum: signal.Signals) -> Incarnation | None:
        """Signal the live incarnation of ``slot``; None if none is alive."""
        inc = self.current(slot)
        if inc is None:
            return None
        if signum == signal.SIGKILL or (signum == signal.SIGTERM and not inc.told):
            inc.told = signum.name  # a SIGKILL during a SIGTERM's drain: killed, as told
        with contextlib.suppress(ProcessLookupError):
            os.kill(inc.pid, signum)
        return inc

    def _wait_exit(self, inc: Incarnation, slot: int) -> None:
        """Record the exit as soon as it happens (a thread blocked on it, not a poll: the
        checker ends a Python handler's execution there) and whether the harness asked for
        it; start a slot whose daemon exited on its own again (the checker reports the exit)."""
        code = inc.proc.wait()
        for pid, at, worker_id in inc.worker_exits():
            self.history.write(
                INFO,
                "worker-exit",
                {"daemon": inc.name, "pid": pid, "at": at, "worker_id": worker_id},
            )
        value = {
            "daemon": inc.name,
            "pid": inc.pid,
            "code": code,
            "told": inc.told,
            "started": inc.started,
            "worker_id": inc.worker_id,
            "log_tail": [] if inc.told == "SIGKILL" else inc.log_tail(),
            # Said anywhere in its log (a worker process's line comes before the others'
            # summaries, out of the tail): the documented exit 1 of a drain.
            "unwritten": inc.told != "SIGKILL" and inc.logged('"results_not_written"'),
        }
        self.history.write(OK if inc.told else FAIL, "daemon-exit", value)
        if not inc.told and not self.stopping.is_set():
            threading.Timer(1.0, self.start, args=(slot,)).start()

    def stop_all(self) -> None:
        """SIGCONT (a frozen one cannot drain), SIGTERM, wait; SIGKILL what does not exit."""
        self.stopping.set()
        live = [s for s in self.slots if s is not None and s.alive()]
        self.history.write(INVOKE, "stop", {"daemons": [s.name for s in live]})
        for inc in live:
            inc.told = inc.told or "SIGTERM"
            with contextlib.suppress(ProcessLookupError):
                os.kill(inc.pid, signal.SIGCONT)
                os.kill(inc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for inc in live:
            try:
                inc.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.history.write(INFO, "stop-timeout", {"daemon": inc.name, "pid": inc.pid})
                inc.told = "SIGKILL"
                inc.proc.kill()
                inc.proc.wait(10)
        for waiter in list(self.waiters):
            waiter.join(10)  # every exit written before the final state is read
        self.history.write(OK, "stop", {"daemons": [s.name for s in live]})
