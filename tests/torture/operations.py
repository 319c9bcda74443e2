"""The clients: what applications and operators do, each call recorded before and after.

An enqueue is a transaction of the application's own, at the isolation level the plan chose,
through the SQL function or the Python API: it may read first (a REPEATABLE READ snapshot
is then taken before the enqueue), pauses, enqueues one to three runs, pauses, and commits or
rolls back. Its history line says what each enqueue answered (the run id, and whether this
transaction created it: its payload carries the transaction's tag ``n``) and how the
transaction ended: ``ok`` committed, ``fail`` rolled back or refused, ``info`` unknown (the
connection broke during COMMIT). A key race is two to four such transactions at once on one
fresh idempotency key. Cancel, retry and prune go through the `pgtick` CLI as an operator's do;
so do the runtime controls: a job type paused for some seconds then resumed, a limited type's
max_running changed or reset.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.types.json import Jsonb

import pgtick
from tests.torture.cluster import python_path, release_config
from tests.torture.history import FAIL, INFO, INVOKE, OK, HistoryFile
from tests.torture.plan import World

ISOLATION = {
    "read committed": IsolationLevel.READ_COMMITTED,
    "repeatable read": IsolationLevel.REPEATABLE_READ,
    "serializable": IsolationLevel.SERIALIZABLE,
}
CONNECT_TIMEOUT_SECONDS = 5
CLI_TIMEOUT_SECONDS = 120.0  # a CLI call took 57 s on the 2-core machine at load 18
SQL_ENQUEUE = (
    "SELECT pgtick.enqueue(%(job_type)s, %(payload)s, now() + make_interval(secs => %(in)s),"
    " %(key)s, NULL, %(priority)s, %(ck)s)"
)


COMP = "comp"
OUTCOMES = ("on_success", "on_dead")


def _step(
    spec: Mapping[str, Any], tag: str, specs: dict[str, dict[str, list[str]]]
) -> dict[str, Any]:
    """A plan's chain step as pgtick takes it, its payload tagged; ``specs`` gets each
    step's tag and the tags of its own steps."""
    step: dict[str, Any] = {
        "job_type": COMP,
        "payload": {"b": spec["b"], "s": spec["s"], "n": tag},
    }
    for outcome in OUTCOMES:
        nested = [
            _step(s, f"{tag}.{outcome[3]}{i}", specs) for i, s in enumerate(spec.get(outcome, ()))
        ]
        if nested:
            step[outcome] = nested
    specs[tag] = {o: [s["payload"]["n"] for s in step.get(o, [])] for o in OUTCOMES}
    return step


def _nonempty(follow: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {k: v for k, v in follow.items() if v}


def _json(steps: list[dict[str, Any]]) -> Jsonb | None:
    return Jsonb(steps) if steps else None


def payload_of(run: Mapping[str, Any], tag: str, world: World) -> dict[str, Any]:
    payload: dict[str, Any] = {"b": run["b"], "s": run["s"], "n": tag}
    if "ck" in run:
        payload["k"] = run["ck"]
    job_type = world.job_type(run["job_type"])
    if job_type is not None and job_type.rate is not None:
        payload["claim_time"] = True
    return payload


def connect(dsn: str, name: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, application_name=name, connect_timeout=CONNECT_TIMEOUT_SECONDS)


@dataclass
class Clients:
    dsn: str
    config: Path
    world: World
    history: HistoryFile
    # The release the operator's CLI runs (tests/torture/upgrade.py): None, this one.
    code: Callable[[], Path | None] = lambda: None

    # -- enqueue ---------------------------------------------------------------------------------

    def enqueue(self, step: int, args: Mapping[str, Any]) -> None:
        self.transaction(f"client-{step}", f"{step}", args)

    def key_race(self, step: int, args: Mapping[str, Any]) -> None:
        transactions: Sequence[Mapping[str, Any]] = args["transactions"]
        barrier = threading.Barrier(len(transactions))

        def one(index: int, tx: Mapping[str, Any]) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(5)
            self.transaction(f"client-{step}.{index}", f"{step}.{index}", tx, race=step)

        threads = [
            threading.Thread(target=one, args=(i, tx), daemon=True)
            for i, tx in enumerate(transactions)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def transaction(
        self, process: str, tag: str, tx: Mapping[str, Any], race: int | None = None
    ) -> None:
        runs = [
            {**run, "n": f"{tag}.{i}", "payload": payload_of(run, f"{tag}.{i}", self.world)}
            for i, run in enumerate(tx["runs"])
        ]
        shown = {k: v for k, v in tx.items() if k != "runs"}
        described = [{k: v for k, v in r.items() if k != "payload"} for r in runs]
        self.history.write(
            INVOKE, "enqueue", {**shown, "race": race, "runs": described}, process=process
        )
        answers: list[dict[str, Any]] = []
        committing = False
        try:
            with connect(self.dsn, "torture-client") as conn:
                conn.isolation_level = ISOLATION[tx["isolation"]]
                if tx["early_snapshot"]:
                    conn.execute("SELECT count(*) FROM pgtick.runs WHERE id = 0")
                time.sleep(tx["pause_before"])
                for run in runs:
                    run_id = self._enqueue_one(conn, tx["api"], run)
                    row = conn.execute(
                        "SELECT payload->>'n' FROM pgtick.runs WHERE id = %s", [run_id]
                    ).fetchone()
                    created = bool(row and row[0] == run["n"])
                    answers.append(
                        {"n": run["n"], "id": run_id, "created": created, "key": run["key"]}
                    )
                time.sleep(tx["pause_after"])
                if tx["rollback"]:
                    conn.rollback()
                    self.history.write(
                        FAIL,
                        "enqueue",
                        {"outcome": "rolled-back", "answers": answers},
                        process=process,
                    )
                    return
                committing = True
                conn.commit()
        except (psycopg.Error, pgtick.DatabaseError) as exc:
            cause = exc.__cause__ if isinstance(exc, pgtick.DatabaseError) else exc
            unknown = committing and isinstance(cause, psycopg.OperationalError)
            self.history.write(
                INFO if unknown else FAIL,
                "enqueue",
                {
                    "outcome": "unknown" if unknown else "error",
                    "error": type(cause).__name__,
                    "sqlstate": getattr(cause, "sqlstate", None),
                    "message": str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "",
                    "answers": answers,
                },
                process=process,
            )
            return
        self.history.write(
            OK, "enqueue", {"outcome": "committed", "answers": answers}, process=process
        )

    def _enqueue_one(self, conn: psycopg.Connection[Any], api: str, run: Mapping[str, Any]) -> int:
        ck = run.get("ck") if run.get("ck_arg") else None
        if api == "python":
            run_at = datetime.now(UTC) + timedelta(seconds=run["in"]) if run["in"] else None
            return pgtick.enqueue(
                conn,
                run["job_type"],
                run["payload"],
                run_at=run_at,
                idempotency_key=run["key"],
                priority=run["priority"],
                concurrency_key=ck,
            )
        row = conn.execute(
            SQL_ENQUEUE,
            {
                "job_type": run["job_type"],
                "payload": Jsonb(run["payload"]),
                "in": float(run["in"]),
                "key": run["key"],
                "priority": run["priority"],
                "ck": ck,
            },
        ).fetchone()
        assert row is not None
        return int(row[0])

    # -- the operator's CLI ----------------------------------------------------------------------

    def pick(self, status: str, job_type: str | None, fraction: float) -> int | None:
        """A run in ``status`` (of ``job_type``), the ``fraction``-th of them by start then id."""
        try:
            with connect(self.dsn, "torture-operator") as conn:
                rows = conn.execute(
                    "SELECT id FROM pgtick.runs WHERE status = %s"
                    " AND (%s::text IS NULL OR job_type = %s) ORDER BY started_at NULLS LAST, id",
                    [status, job_type, job_type],
                ).fetchall()
        except psycopg.Error:
            return None
        if not rows:
            return None
        return int(rows[min(len(rows) - 1, int(fraction * len(rows)))][0])

    def cli(self, step: int, verb: str, arguments: list[str], value: Mapping[str, Any]) -> None:
        process = f"operator-{step}"
        self.history.write(INVOKE, verb, {**value, "argv": arguments}, process=process)
        code = self.code()
        env = {**os.environ, "PGTICK_DSN": self.dsn, "PYTHONPATH": python_path(code)}
        config = release_config(self.config, code)
        command = [sys.executable, "-m", "pgtick", verb, "--config", str(config), *arguments]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=CLI_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            self.history.write(INFO, verb, {**value, "error": "timeout"}, process=process)
            return
        self.history.write(
            OK if done.returncode == 0 else FAIL,
            verb,
            {
                **value,
                "exit": done.returncode,
                "stdout": done.stdout.strip()[-300:],
                "stderr": done.stderr.strip()[-300:],
            },
            process=process,
        )

    def cancel(self, step: int, args: Mapping[str, Any]) -> None:
        run_id = self.pick(args["status"], args["job_type"], args["pick"])
        if run_id is None:
            self.history.write(
                INFO, "cancel", {"skipped": "no such run", **args}, process=f"operator-{step}"
            )
            return
        self.cli(step, "cancel", [str(run_id)], {"run": run_id, "seen": args["status"]})

    def retry(self, step: int, args: Mapping[str, Any]) -> None:
        run_id = self.pick(args["status"], args["job_type"], args["pick"])
        if run_id is None:
            self.history.write(
                INFO, "retry", {"skipped": "no such run", **args}, process=f"operator-{step}"
            )
            return
        self.cli(step, "retry", [str(run_id)], {"run": run_id, "seen": args["status"]})

    def pause(self, step: int, args: Mapping[str, Any]) -> None:
        """`pgtick pause TYPE`, then `pgtick resume TYPE` after ``args["seconds"]``."""
        job_type = args["job_type"]
        reason = ["--reason", f"torture step {step}"]
        self.cli(step, "pause", [job_type, *reason], {"job_type": job_type})
        time.sleep(args["seconds"])
        self.cli(step, "resume", [job_type], {"job_type": job_type})

    def limits(self, step: int, args: Mapping[str, Any]) -> None:
        """`pgtick limits TYPE --max-running N`, or ``--reset`` (max_running None)."""
        job_type, most = args["job_type"], args["max_running"]
        change = ["--reset"] if most is None else ["--max-running", str(most)]
        self.cli(step, "limits", [job_type, *change], {"job_type": job_type, "max_running": most})

    # -- composition (docs/composition.md) -------------------------------------------------------

    def chain(self, step: int, args: Mapping[str, Any]) -> None:
        """A `comp` run with its on_success / on_dead steps, enqueued and committed; the answer
        names the root run and, per tag, the tags of each outcome's steps (the checker finds
        each step's runs by the tag in their payload)."""
        process, tag = f"client-{step}", f"c{step}"
        specs: dict[str, dict[str, list[str]]] = {}
        follow = {
            outcome: [_step(s, f"{tag}.{outcome[3]}{i}", specs) for i, s in enumerate(steps)]
            for outcome, steps in (("on_success", args["on_success"]), ("on_dead", args["on_dead"]))
        }
        specs[tag] = {o: [s["payload"]["n"] for s in follow[o]] for o in follow}
        payload = {"b": args["root"]["b"], "s": args["root"]["s"], "n": tag}
        self.history.write(INVOKE, "chain", {"tag": tag, "api": args["api"]}, process=process)
        try:
            with connect(self.dsn, "torture-client") as conn:
                if args["api"] == "python":
                    run_id = pgtick.enqueue(conn, COMP, payload, **_nonempty(follow))
                else:
                    row = conn.execute(
                        "SELECT pgtick.enqueue(%s, %s, on_success => %s, on_dead => %s)",
                        [COMP, Jsonb(payload), *(_json(follow[o]) for o in OUTCOMES)],
                    ).fetchone()
                    assert row is not None
                    run_id = int(row[0])
                conn.commit()
        except (psycopg.Error, pgtick.DatabaseError) as exc:
            self.history.write(
                FAIL, "chain", {"tag": tag, "error": str(exc)[:200]}, process=process
            )
            return
        self.history.write(
            OK, "chain", {"tag": tag, "root": run_id, "specs": specs}, process=process
        )

    def batch(self, step: int, args: Mapping[str, Any]) -> None:
        """A batch of `comp` runs with a callback: opened with its first members in one
        transaction, more added in a second one, closed at once or some seconds later
        (`pgtick batch close`)."""
        process, tag = f"client-{step}", f"b{step}"
        callback = {"job_type": COMP, "payload": {"b": "ok", "s": 0.1, "n": f"{tag}.cb"}}
        self.history.write(INVOKE, "batch-open", {"tag": tag}, process=process)
        try:
            with connect(self.dsn, "torture-client") as conn:
                batch_id = pgtick.open_batch(conn, callback=callback)
                members = [
                    pgtick.enqueue(conn, COMP, {**m, "n": f"{tag}.m{i}"}, batch=batch_id)
                    for i, m in enumerate(args["members"])
                ]
                conn.commit()
        except (psycopg.Error, pgtick.DatabaseError) as exc:
            self.history.write(
                FAIL, "batch-open", {"tag": tag, "error": str(exc)[:200]}, process=process
            )
            return
        self.history.write(
            OK,
            "batch-open",
            {"tag": tag, "batch": batch_id, "members": members, "callbacks": 1},
            process=process,
        )
        if args["later"]:
            self.history.write(INVOKE, "batch-add", {"batch": batch_id}, process=process)
            try:
                with connect(self.dsn, "torture-client") as conn:
                    more = [
                        pgtick.enqueue(conn, COMP, {**m, "n": f"{tag}.l{i}"}, batch=batch_id)
                        for i, m in enumerate(args["later"])
                    ]
                    conn.commit()
                self.history.write(
                    OK, "batch-add", {"batch": batch_id, "members": more}, process=process
                )
            except (psycopg.Error, pgtick.DatabaseError) as exc:
                self.history.write(
                    FAIL, "batch-add", {"batch": batch_id, "error": str(exc)[:200]}, process=process
                )
        time.sleep(args["close_after"])
        self.cli(step, "batch", ["close", str(batch_id)], {"close": batch_id})

    def prune(self, step: int, args: Mapping[str, Any]) -> None:
        older = ["--older-than", args["older_than"]] if args["older_than"] else []
        self.cli(step, "prune", older, {"older_than": args["older_than"]})
