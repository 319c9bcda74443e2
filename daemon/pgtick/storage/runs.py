"""Runs and their attempts on the daemon's hot path: enqueue, claim (with flow control's
limits), heartbeat, finish, release, and the effects guard. The operator's reads and actions
on runs are in ``run_admin.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from pgtick.errors import DatabaseError
from pgtick.storage import db, sqlfile
from pgtick.storage.base import SKIPPING_TRIES, StoreBase, by_index, set_statement_timeout
from pgtick.storage.run_values import (
    TIMED_OUT_RUNNING,
    Beat,
    Claim,
    ClaimedRun,
    ClaimType,
    FailResult,
    Failure,
    FlowState,
    Lease,
    NewRun,
)

T = TypeVar("T")


def enqueue_on(
    conn: psycopg.Connection[Any],
    schema: str,
    run: NewRun,
) -> int:
    """Enqueue through ``<schema>.enqueue()`` on the caller's connection and transaction.
    A serialization failure (a REPEATABLE READ or SERIALIZABLE transaction whose snapshot
    cannot see the run another transaction committed with the same key) is raised as
    psycopg's own ``SerializationFailure``: the caller's transaction is aborted, and retrying
    the whole of it is the caller's part, as for any other statement of it."""
    try:
        with db.wrap_errors("enqueue"):
            row = conn.execute(
                sqlfile.with_schema(_enqueue_query("enqueue_qualified", run), schema),
                _enqueue_params(run),
            ).fetchone()
    except DatabaseError as exc:
        if isinstance(exc.__cause__, psycopg.errors.SerializationFailure):
            raise exc.__cause__ from None
        raise
    assert row is not None
    return int(row[0])


def _enqueue_query(name: str, run: NewRun) -> str:
    """The enqueue block for ``run``: with the trace context argument only when it has one, so
    that the others still enqueue through a schema before migration 0018; a member of a batch
    or a run with a chain through the functions of 0025 and 0026."""
    if run.batch_id is not None:
        return "enqueue_member"
    if run.follow is not None:
        return "enqueue_composed"
    return name if run.traceparent is None else f"{name}_traced"


def _enqueue_params(run: NewRun) -> dict[str, Any]:
    return {
        "job_type": run.job_type,
        "payload": Jsonb(dict(run.payload) if run.payload is not None else {}),
        "run_at": run.run_at,
        "idempotency_key": run.idempotency_key,
        "max_attempts": run.max_attempts,
        "priority": run.priority,
        "concurrency_key": run.concurrency_key,
        "traceparent": run.traceparent,
        "on_success": _steps(run.follow, "on_success"),
        "on_dead": _steps(run.follow, "on_dead"),
        "batch_id": run.batch_id,
    }


def _steps(follow: Mapping[str, Any] | None, outcome: str) -> Jsonb | None:
    steps = (follow or {}).get(outcome)
    return None if steps is None else Jsonb(steps)


def _pg_path(path: Sequence[str] | None) -> str | None:
    """A payload field's path as a PostgreSQL text[] literal (``#>>``'s right side)."""
    if path is None:
        return None
    return (
        "{" + ",".join('"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in path) + "}"
    )


def _limit_params(types: Sequence[ClaimType]) -> dict[str, Any]:
    """The flow-control limits of ``types``, one array per limit (claim_limited, flow_state)."""
    return {
        "max_running": [t.max_running for t in types],
        "key_paths": [_pg_path(t.key_path) for t in types],
        "per_key": [t.max_running_per_key for t in types],
        "rates": [t.rate[0] if t.rate else None for t in types],
        "rate_windows": [t.rate[1] if t.rate else None for t in types],
        "key_rates": [t.rate_per_key[0] if t.rate_per_key else None for t in types],
        "key_windows": [t.rate_per_key[1] if t.rate_per_key else None for t in types],
    }


def by_id(items: Iterable[T], run_id: Callable[[T], int]) -> list[T]:
    """Items in the order of their run ids: the statements that read lists of ids find each
    row's position in them by binary search (``width_bucket``, queries.sql's header), which
    needs the list sorted."""
    return sorted(items, key=run_id)


def _claims(worker_id: str, claims: Sequence[Claim]) -> dict[str, Any]:
    ordered = by_id(claims, lambda claim: claim[0])
    return {
        "worker_id": worker_id,
        "ids": db.Ints(run_id for run_id, _ in ordered),
        "attempts": db.Ints(attempt for _, attempt in ordered),
    }


def wake(conn: db.Connection, job_types: Iterable[str]) -> None:
    """NOTIFY each of these job types once: idle daemons that handle one claim now."""
    for job_type in sorted(set(job_types)):
        conn.execute(sqlfile.query("notify", conn.schema), {"job_type": job_type})


def announce(
    conn: db.Connection,
    runs: Sequence[tuple[str, datetime | None]],
    also: Iterable[str] = (),
) -> None:
    """Runs were made claimable ((job type, run_at); None: now): each type's earliest due
    second first (``!due``, for claimers whose lower bound is past it, keyset.py), then the
    wake-ups, of their types and of those ``also`` names; delivered in this order, the claim
    a wake-up starts begins low enough."""
    if runs:
        conn.execute(
            sqlfile.query("notify_due", conn.schema),
            {"job_types": [jt for jt, _ in runs], "run_ats": [at for _, at in runs]},
        )
    wake(conn, [*(jt for jt, _ in runs), *also])


class RunQueries(StoreBase):
    """The runs aggregate (``runs``, ``attempts``, ``effects``)."""

    def enqueue(self, run: NewRun) -> int:
        """Add one run (or return the existing one for its idempotency key). In a transaction
        of its own, READ COMMITTED (db.py): enqueue() looks a key up after waiting for it,
        which a REPEATABLE READ default would turn into a serialization failure."""
        with self._conn("enqueue") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query(_enqueue_query("enqueue", run), conn.schema), _enqueue_params(run)
            ).fetchall()
        return int(rows[0][0])

    def enqueue_many(self, runs: Sequence[NewRun]) -> list[int]:
        """Add many runs in one statement; ids in input order, existing ids for taken keys.
        The keys are taken first (take_idempotency_keys, migration 0015), in the same
        transaction: a key another transaction took waits for it, and the run it committed
        is returned, not a second one."""
        if not runs:
            return []
        keys = sorted({r.idempotency_key for r in runs if r.idempotency_key is not None})
        # The same key twice in one batch is one run: inserted once, at its first place.
        new: list[NewRun] = []
        given: list[int | None] = []
        placed: set[str] = set()
        with self._conn("enqueue") as conn, conn.transaction():
            taken: dict[str, tuple[int, bool]] = {}
            if keys:
                rows = conn.execute(
                    sqlfile.query("take_idempotency_keys", conn.schema), {"keys": keys}
                ).fetchall()
                taken = {str(k): (int(run_id), bool(fresh)) for k, run_id, fresh in rows}
            for run in runs:
                key = run.idempotency_key
                if key is None:
                    new.append(run)
                    given.append(None)
                elif taken[key][1] and key not in placed:
                    placed.add(key)
                    new.append(run)
                    given.append(taken[key][0])
            drawn: list[int] = []
            if new:
                params = {
                    "ids": given,
                    "job_types": [r.job_type for r in new],
                    "payloads": [
                        Jsonb(dict(r.payload) if r.payload is not None else {}) for r in new
                    ],
                    "run_ats": [r.run_at for r in new],
                    "keys": [r.idempotency_key for r in new],
                    "max_attempts": [r.max_attempts for r in new],
                    "priorities": [r.priority for r in new],
                    "concurrency_keys": [r.concurrency_key for r in new],
                    "traceparents": [r.traceparent for r in new],
                    "follows": [None if r.follow is None else Jsonb(dict(r.follow)) for r in new],
                    "batch_ids": [r.batch_id for r in new],
                }
                rows = conn.execute(sqlfile.query("enqueue_many", conn.schema), params).fetchall()
                drawn = [int(row[0]) for row in rows]
                # Members counted in their batches, refused unless each batch is open (0026).
                batches = collections.Counter(r.batch_id for r in new if r.batch_id is not None)
                for batch_id, n in sorted(batches.items()):
                    conn.execute(
                        sqlfile.query("batch_members_added", conn.schema),
                        {"batch_id": batch_id, "n": n},
                    )
                announce(conn, [(r.job_type, r.run_at) for r in new])
        ids: list[int] = []
        unkeyed = iter(drawn[i] for i, g in enumerate(given) if g is None)
        for run in runs:
            key = run.idempotency_key
            ids.append(next(unkeyed) if key is None else taken[key][0])
        return ids

    def claim(
        self,
        worker_id: str,
        types: Sequence[ClaimType],
        limit: int,
        lows: Mapping[str, datetime] | None = None,
    ) -> list[ClaimedRun]:
        """Claim up to ``limit`` due runs of the given types in one statement; a type's runs
        due before its entry in ``lows`` are not looked at (the keyset claim)."""
        return self.claim_looking(worker_id, types, limit, lows)[0]

    def claim_looking(
        self,
        worker_id: str,
        types: Sequence[ClaimType],
        limit: int,
        lows: Mapping[str, datetime] | None = None,
        looks: Mapping[str, datetime | None] | None = None,
    ) -> tuple[list[ClaimedRun], dict[str, datetime]]:
        """``claim``, and per type of ``looks`` with a bound in ``lows``: the earliest due run
        of priority 0 at or after its entry in ``looks`` (None: from the start) and behind the
        bound (keyset.py's look back). When some of the types have limits, the claim takes
        their advisory locks first and counts what runs and started, in one short transaction
        (``claim_limited``)."""
        if limit <= 0 or not types:
            return [], {}
        lows = lows or {}
        looks = looks or {}
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "job_types": [t.job_type for t in types],
            "leases": [t.lease_seconds for t in types],
            "max_attempts": [t.max_attempts for t in types],
            "lows": [lows.get(t.job_type) for t in types],
            "looks": [t.job_type in looks for t in types],
            "look_froms": [looks.get(t.job_type) for t in types],
            "limit": limit,
        }
        limited = [t.job_type for t in types if t.limited]
        if limited:
            params |= _limit_params(types)

        def claim(conn: db.Connection) -> list[tuple[Any, ...]]:
            if not limited:
                return by_index(conn, "claim", params)
            with conn.transaction():
                conn.execute(
                    sqlfile.query("claim_limit_lock", conn.schema),
                    {"job_types": limited, "lock_prefix": f"pgtick.limit.{conn.schema}."},
                )
                return by_index(conn, "claim_limited", params)

        # Again when a run another daemon claimed and finished after this claim's snapshot
        # was moved out of runs_live before the scan reached it (base.SKIPPING_TRIES).
        rows = self._moving("claim", claim, SKIPPING_TRIES)
        runs = [ClaimedRun(*row) for row in rows if row[0] is not None]
        behind = {str(row[1]): row[7] for row in rows if row[0] is None}
        return runs, behind

    def flow_state(
        self,
        types: Sequence[ClaimType],
        run_id: int | None = None,
        *,
        statement_timeout_seconds: float | None = None,
    ) -> list[FlowState]:
        """What the limits of these job types hold back now (one run's reason with
        ``run_id``); types without limits are left out."""
        limited = [t for t in types if t.limited]
        if not limited:
            return []
        params = {"job_types": [t.job_type for t in limited], "run_id": run_id}
        params |= _limit_params(limited)
        with self._conn("flow_state") as conn, conn.transaction():
            if statement_timeout_seconds is not None:
                set_statement_timeout(conn, statement_timeout_seconds)
            rows = conn.execute(sqlfile.query("flow_state", conn.schema), params).fetchall()
        return [FlowState(*row) for row in rows]

    def rate_free_in(self, types: Sequence[ClaimType]) -> float | None:
        """Seconds until a saturated rate of these types allows a start again (None: none
        is saturated)."""
        rated = [t for t in types if t.rate is not None]
        if not rated:
            return None
        params = {
            "job_types": [t.job_type for t in rated],
            "rates": [t.rate[0] for t in rated if t.rate],
            "rate_windows": [t.rate[1] for t in rated if t.rate],
        }
        rows = self._all("claim", "rate_free_in", params)
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def sync_job_type_settings(
        self,
        priorities: Mapping[str, int],
        follows: Mapping[str, Mapping[str, Any] | None] | None = None,
    ) -> None:
        """Record each job type's default priority and chain (its config's on_success and
        on_dead), for enqueue() to give runs without their own."""
        if priorities:
            chains = follows or {}
            params = {
                "job_types": list(priorities),
                "priorities": list(priorities.values()),
                "follows": [
                    None if chains.get(t) is None else Jsonb(dict(chains[t] or {}))
                    for t in priorities
                ],
            }
            with self._conn("sync_job_types") as conn:
                conn.execute(sqlfile.query("sync_job_type_settings", conn.schema), params)

    def notify(self, job_types: Iterable[str], due: Sequence[tuple[str, datetime]] = ()) -> None:
        """Wake the daemons that handle these types (a limited type's slot came free); first,
        for each type in ``due`` ((job type, run_at) of runs that freed a key's slot), its
        earliest due second (``!due``): claimers whose bound passed that key's next runs
        start below them (keyset.py)."""
        with self._conn("notify") as conn:
            announce(conn, due, also=job_types)

    def next_due_in(
        self, job_types: Sequence[str], lows: Mapping[str, datetime] | None = None
    ) -> float | None:
        """Seconds until the earliest runnable run of these types is due (None: none), from
        each type's lower bound as ``claim``."""
        lows = lows or {}
        params = {"job_types": list(job_types), "lows": [lows.get(t) for t in job_types]}
        rows = self._by_index("next_due", "next_due", params)
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def heartbeat(self, worker_id: str, leases: Sequence[Lease]) -> Beat:
        """Extend the given leases; says which are still held, which are busy (ours, but
        row-locked by another transaction: skipped, not renewed), the others being gone; which
        of the gone ones an operator cancelled, and whether this worker's row still exists."""
        leases = by_id(leases, lambda lease: lease.run_id)
        params = {
            "worker_id": worker_id,
            "ids": db.Ints(lease.run_id for lease in leases),
            "attempts": db.Ints(lease.attempt for lease in leases),
            "leases": [lease.seconds for lease in leases],
        }
        # Again when our result writer finished and moved a run after this beat's snapshot
        # (base.SKIPPING_TRIES): a lease the beats fail to renew expires.
        [(held, registered, cancelled, busy)] = self._moving(
            "heartbeat", lambda conn: by_index(conn, "heartbeat", params), SKIPPING_TRIES
        )
        return Beat(set(held), bool(registered), set(cancelled), set(busy))

    def succeed(
        self, worker_id: str, claims: Sequence[Claim], results: Mapping[int, str] | None = None
    ) -> set[int]:
        """Mark runs succeeded if this worker still holds these claims; returns those it did.
        ``results``: run id -> its handler's result as JSON text (migration 0024)."""
        return self._moving(
            "succeed",
            lambda conn: self.succeed_on(conn, worker_id, claims, hinted=True, results=results),
        )

    @staticmethod
    def succeed_on(
        conn: db.Connection,
        worker_id: str,
        claims: Sequence[Claim],
        *,
        hinted: bool = False,
        lock_wait_ms: int | None = None,
        results: Mapping[int, str] | None = None,
    ) -> set[int]:
        """``succeed`` on a given connection: inside a handler's transaction, or ``hinted``
        (``by_index``) on pgtick's own, where the planner hints cannot outlast pgtick's
        statements."""
        params = _claims(worker_id, claims)
        # No results (most batches): a NULL array, nothing to dump per run.
        params["results"] = [results.get(i) for i in params["ids"]] if results else None
        with db.wrap_errors("succeed"):
            if hinted:
                rows = by_index(conn, "succeed", params, lock_wait_ms=lock_wait_ms)
            else:
                rows = conn.execute(sqlfile.query("succeed", conn.schema), params).fetchall()
        # Rows with a NULL id are the chains' and batches' (0025, 0026).
        return {row[0] for row in rows if row[0] is not None}

    def fail(self, worker_id: str, failures: Sequence[Failure]) -> list[FailResult]:
        """Record failed attempts: ``failed`` with a retry time, or ``dead``."""
        if not failures:
            return []
        return self._moving("fail", lambda conn: self._fail_on(conn, worker_id, failures))

    def finish(
        self,
        worker_id: str,
        succeeded: Sequence[Claim],
        failures: Sequence[Failure],
        *,
        lock_wait_ms: int | None = None,
        results: Mapping[int, str] | None = None,
    ) -> tuple[set[int], list[FailResult]]:
        """Write a batch of results all or nothing, so a failure part-way leaves nothing
        written and the batch can be retried as it is: one statement when the batch holds
        one kind (atomic by itself, no BEGIN/COMMIT round trips), else one transaction.
        Returns what the lease guard let through: the succeeded ids and the failures.
        ``lock_wait_ms``: give up (``db.lock_not_available``) rather than wait longer for a
        run's row lock."""
        wait = lock_wait_ms

        def write(conn: db.Connection) -> tuple[set[int], list[FailResult]]:
            if succeeded and failures:
                with conn.transaction():
                    done = self.succeed_on(
                        conn, worker_id, succeeded, hinted=True, lock_wait_ms=wait, results=results
                    )
                    return done, self._fail_on(conn, worker_id, failures, lock_wait_ms=wait)
            if failures:
                return set(), self._fail_on(conn, worker_id, failures, lock_wait_ms=wait)
            done = self.succeed_on(
                conn, worker_id, succeeded, hinted=True, lock_wait_ms=wait, results=results
            )
            return done, []

        return self._moving("complete", write)

    @staticmethod
    def _fail_on(
        conn: db.Connection,
        worker_id: str,
        failures: Sequence[Failure],
        *,
        lock_wait_ms: int | None = None,
    ) -> list[FailResult]:
        failures = by_id(failures, lambda f: f.run_id)
        params = {
            "worker_id": worker_id,
            "ids": db.Ints(f.run_id for f in failures),
            "attempts": db.Ints(f.attempt for f in failures),
            "errors": [f.error for f in failures],
            "error_types": [f.error_type for f in failures],
            "details": [f.detail for f in failures],
            "delays": [f.retry_in_seconds for f in failures],
        }
        with db.wrap_errors("fail"):
            rows = by_index(conn, "fail", params, lock_wait_ms=lock_wait_ms)
            # Rows with a NULL id are the chains' and batches' (0025, 0026).
            return [FailResult(*row) for row in rows if row[0] is not None]

    def mark_timed_out(self, worker_id: str, marks: Sequence[tuple[Claim, str]]) -> set[int]:
        """Note on held runs past their timeout (``marks``: each claim and its error) that
        their handlers run on: the runs stay running and held; returns those noted."""
        if not marks:
            return set()
        marks = by_id(marks, lambda mark: mark[0][0])
        params = {
            **_claims(worker_id, [claim for claim, _ in marks]),
            "errors": [error + TIMED_OUT_RUNNING for _, error in marks],
        }
        rows = self._moving("mark_timed_out", lambda conn: by_index(conn, "mark_timed_out", params))
        return {row[0] for row in rows}

    def release(
        self,
        worker_id: str,
        claims: Sequence[Claim],
        hold_seconds: float = 0.0,
        *,
        lock_wait_ms: int | None = None,
    ) -> set[int]:
        """Give held runs back (queued, attempt not counted), due no sooner than
        ``hold_seconds`` from now; returns those released. ``lock_wait_ms`` bounds the wait
        for a row another session holds locked (then nothing is released: the error is
        ``db.lock_not_available``)."""
        if not claims:
            return set()

        def write(conn: db.Connection) -> list[tuple[Any, ...]]:
            with conn.transaction():
                params = _claims(worker_id, claims) | {"hold": hold_seconds}
                rows = by_index(conn, "release", params, lock_wait_ms=lock_wait_ms)
                # Given back with their old run_at, behind every claimer's lower bound:
                # announce each type's earliest (claimers lower their bounds to it, no scan
                # from the start), and wake idle daemons that handle them.
                announce(conn, [(job_type, run_at) for _, job_type, run_at in rows])
            return rows

        return {row[0] for row in self._moving("release", write)}

    def acknowledge_cancel(
        self, worker_id: str, claims: Sequence[Claim], *, lock_wait_ms: int | None = None
    ) -> set[int]:
        """Let go of held runs an operator cancelled, now that their handlers have stopped;
        returns those that were cancelled and held by these claims. ``lock_wait_ms``: as
        ``release``'s."""
        if not claims:
            return set()
        params = _claims(worker_id, claims)
        rows = self._moving(
            "acknowledge_cancel",
            lambda conn: by_index(conn, "acknowledge_cancel", params, lock_wait_ms=lock_wait_ms),
        )
        return {row[0] for row in rows}

    @staticmethod
    def effect_once_on(conn: db.Connection, key: str, run_id: int | None) -> bool:
        """True only the first time ``key`` is recorded (on the given connection)."""
        with db.wrap_errors("effect_once"):
            row = conn.execute(
                sqlfile.query("effect_once", conn.schema), {"key": key, "run_id": run_id}
            ).fetchone()
        return row is not None

    def effect_once(self, key: str, run_id: int | None) -> bool:
        with self._conn("effect_once") as conn:
            return self.effect_once_on(conn, key, run_id)
