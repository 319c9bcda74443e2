"""The nemesis: the faults a fleet meets, each recorded when it begins and when it ends.

Daemons are SIGKILLed, SIGTERMed (and started again after a pause), frozen with SIGSTOP for
longer than the lease and thawed; pgtick's sessions are ended with pg_terminate_backend; the
server is restarted (only one of the run's own); an operator's transaction holds a running
run's row locked for longer than the lease (``UPDATE pgtick.runs SET priority = priority``
left open, as a psql session that touched it would), or a REPEATABLE READ snapshot for a while;
and once in some runs, this version's `pgtick migrate` under traffic and a rolling restart
(tests/torture/upgrade.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tests.torture.cluster import (
    START_TIMEOUT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    Daemons,
    Incarnation,
    Server,
    python_path,
)
from tests.torture.history import FAIL, INFO, INVOKE, OK, HistoryFile
from tests.torture.upgrade import MIGRATE_TIMEOUT_SECONDS, MIGRATE_TRIES, PREVIOUS_RELEASE

LOCK_TIMEOUT = "2s"  # the operator's UPDATE waits this long for a row a daemon is writing
# What an operator's psql session does to a running run's row before it wanders off.
TOUCH_RUN = "UPDATE pgtick.runs SET priority = priority WHERE id = %s AND status = 'running'"


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, application_name="torture-nemesis", connect_timeout=5)


@dataclass
class Nemesis:
    dsn: str
    server: Server
    daemons: Daemons
    history: HistoryFile
    # One restart of the server at a time: a second restart drawn while the first is down
    # waits for it (two at once stopped a stopped server, and the step failed).
    restarting: threading.Lock = field(default_factory=threading.Lock)

    def write(self, type_: str, f: str, value: Mapping[str, Any]) -> None:
        self.history.write(type_, f, value, process="nemesis")

    def kill(self, step: int, args: Mapping[str, Any]) -> None:
        inc = self.daemons.send(args["daemon"], signal.SIGKILL)
        if inc is None:
            self.write(INFO, "kill", {"skipped": "no daemon running in the slot", **args})
            return
        self.write(OK, "kill", {"daemon": inc.name, "pid": inc.pid, "step": step})
        time.sleep(args["restart_after"])
        self.daemons.start(args["daemon"])

    def term(self, step: int, args: Mapping[str, Any]) -> None:
        inc = self.daemons.send(args["daemon"], signal.SIGTERM)
        if inc is None:
            self.write(INFO, "term", {"skipped": "no daemon running in the slot", **args})
            return
        self.await_exit(inc, {"daemon": inc.name, "pid": inc.pid, "step": step})
        time.sleep(args["restart_after"])
        self.daemons.start(args["daemon"])

    def await_exit(self, inc: Incarnation, value: Mapping[str, Any]) -> None:
        """Record a SIGTERM sent to ``inc`` and wait (the stop timeout at most) for its exit."""
        self.write(INVOKE, "term", value)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while inc.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.write(OK, "term", {**value, "code": inc.proc.returncode})

    def freeze(self, step: int, args: Mapping[str, Any]) -> None:
        inc = self.daemons.current(args["daemon"])
        if inc is None:
            self.write(INFO, "freeze", {"skipped": "no daemon running in the slot", **args})
            return
        value = {"daemon": inc.name, "pid": inc.pid, "seconds": args["seconds"], "step": step}
        self.write(INVOKE, "freeze", value)
        try:
            inc.proc.send_signal(signal.SIGSTOP)
            time.sleep(args["seconds"])
        finally:
            if inc.alive():
                inc.proc.send_signal(signal.SIGCONT)
            self.write(OK, "freeze", value)

    def terminate_backend(self, step: int, args: Mapping[str, Any]) -> None:
        try:
            with connect(self.dsn) as conn:
                rows = conn.execute(
                    "SELECT pid, application_name FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'pgtick%%'"
                    " AND pid <> pg_backend_pid() ORDER BY pid"
                ).fetchall()
                if not rows:
                    self.write(INFO, "terminate-backend", {"skipped": "no pgtick session"})
                    return
                first = int(args["pick"] * len(rows))
                chosen = [
                    rows[(first + i) % len(rows)] for i in range(min(args["count"], len(rows)))
                ]
                self.write(
                    INVOKE,
                    "terminate-backend",
                    {"sessions": [[p, a] for p, a in chosen], "step": step},
                )
                for pid, _ in chosen:
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                conn.commit()
        except psycopg.Error as exc:
            self.write(FAIL, "terminate-backend", {"error": type(exc).__name__, "step": step})
            return
        self.write(OK, "terminate-backend", {"step": step})

    def pg_restart(self, step: int, args: Mapping[str, Any]) -> None:
        if not self.server.restartable:
            self.write(INFO, "pg-restart", {"skipped": "the server is not the run's own", **args})
            return
        with self.restarting:
            self.write(INVOKE, "pg-restart", {**args, "step": step})
            began = time.monotonic()
            try:
                self.server.stop(args["mode"])
                time.sleep(args["down"])
            finally:
                self.server.start()
        self.write(
            OK, "pg-restart", {**args, "step": step, "seconds": round(time.monotonic() - began, 2)}
        )

    def row_lock(self, step: int, args: Mapping[str, Any]) -> None:
        try:
            with connect(self.dsn) as conn:
                rows = conn.execute(
                    "SELECT id, locked_by, job_type FROM pgtick.runs WHERE status = 'running'"
                    " ORDER BY started_at, id"
                ).fetchall()
                conn.rollback()
                preferred = [r for r in rows if r[2] == args.get("job_type")]
                rows = preferred[::-1] or rows  # newest first of the type asked for
                if not rows:
                    self.write(INFO, "row-lock", {"skipped": "no running run", "step": step})
                    return
                run_id, holder, _ = rows[min(len(rows) - 1, int(args["pick"] * len(rows)))]
                conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
                locked = conn.execute(TOUCH_RUN, [run_id]).rowcount
                value = {"run": run_id, "holder": holder, "rows": locked, "step": step, **args}
                self.write(INVOKE, "row-lock", value)
                time.sleep(args["seconds"])
                if args["commit"]:
                    conn.commit()
                else:
                    conn.rollback()
        except psycopg.Error as exc:
            self.write(FAIL, "row-lock", {"error": type(exc).__name__, "step": step})
            return
        self.write(OK, "row-lock", value)

    def held_snapshot(self, step: int, args: Mapping[str, Any]) -> None:
        try:
            with connect(self.dsn) as conn:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute("SELECT count(*) FROM pgtick.runs").fetchone()
                self.write(INVOKE, "held-snapshot", {**args, "step": step})
                time.sleep(args["seconds"])
                conn.commit()
        except psycopg.Error as exc:
            self.write(FAIL, "held-snapshot", {"error": type(exc).__name__, "step": step})
            return
        self.write(OK, "held-snapshot", {**args, "step": step})

    def migrate(self, step: int, args: Mapping[str, Any]) -> None:
        """This version's `pgtick migrate` on the previous release's schema while clients
        enqueue and that release's daemons claim (again after a failure: the server may
        restart under it); then a rolling restart, one slot at a time, on this version."""
        self.write(INVOKE, "migrate", {"step": step, "from": PREVIOUS_RELEASE[:12]})
        env = {**os.environ, "PGTICK_DSN": self.dsn, "PGTICK_CONFIG": ""}
        env["PYTHONPATH"] = python_path(None)
        for attempt in range(1, MIGRATE_TRIES + 1):
            began = time.monotonic()
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "pgtick", "migrate"],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=MIGRATE_TIMEOUT_SECONDS,
                )
                code, error = done.returncode, done.stderr.strip()[-300:]
            except subprocess.TimeoutExpired:
                code, error = None, "timeout"
            seconds = round(time.monotonic() - began, 2)
            if code == 0:
                break
            self.write(INFO, "migrate", {"attempt": attempt, "exit": code, "error": error})
            time.sleep(2.0)
        else:
            self.write(FAIL, "migrate", {"step": step, "exit": code, "error": error})
            return
        self.daemons.upgraded.set()  # every start from now on runs this version
        self.write(OK, "migrate", {"step": step, "attempt": attempt, "seconds": seconds})
        self.rolling_restart(step)

    def rolling_restart(self, step: int) -> None:
        """SIGTERM each daemon of the previous release, wait for its exit, start this
        version in its slot (docs/operations: Rolling deploy)."""
        self.write(INVOKE, "upgrade", {"step": step})
        for slot in range(self.daemons.count):
            inc = self.daemons.current(slot)
            if inc is not None and inc.release == "previous":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(inc.pid, signal.SIGCONT)  # a frozen one cannot drain
                self.daemons.send(slot, signal.SIGTERM)
                value = {"daemon": inc.name, "pid": inc.pid, "step": step, "upgrade": True}
                self.await_exit(inc, value)
                if inc.alive():
                    self.write(FAIL, "upgrade", {"step": step, "daemon": inc.name})
                    return
            started = self.daemons.start(slot)
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while started is not None and not started.started and started.alive():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        left = [
            inc.name
            for slot in range(self.daemons.count)
            if (inc := self.daemons.current(slot)) is not None and inc.release == "previous"
        ]
        self.write(FAIL if left else OK, "upgrade", {"step": step, "left": left})
