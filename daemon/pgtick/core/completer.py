"""The completer: the one writer of the results the worker's threads hand over.

It writes up to ``COMPLETE_BATCH_MAX`` results per transaction, each guarded by its claim
(worker id and attempt), so a result of an earlier claim never lands on a later one; after a
database error it retries the same batch. A batch that meets a run's row held locked by
another session (an operator's open transaction) for ``FINISH_LOCK_WAIT_MS`` is written one
result at a time instead, and the results whose rows are still locked are set aside and tried
again every ``LOCKED_RETRY_SECONDS``: one locked row never holds up every result of the
daemon (the torture harness, seed 103: two runs' success written 12 s late behind a third's
lock; and every later result with them). Which result may be written, and when a run stops
being held, is the lifecycle's decision (lifecycle.py): the completer reports back what the
database accepted.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable

import structlog

from pgtick.core.lifecycle import Held, Lifecycle
from pgtick.core.outcome import Outcome
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.db import retry_delay
from pgtick.storage.store import Claim, ClaimedRun, FailResult, Failure, RunStore

COMPLETE_BATCH_MAX = 500
# Results (storage/results.py, up to 1 MiB each) in one finish statement at most about this
# much: 500 results of 1 MiB would be one 500 MiB statement.
COMPLETE_BATCH_RESULT_BYTES = 8 * 1024 * 1024
COMPLETE_BATCH_WINDOW_SECONDS = 0.002
# A finish waits this long for a row lock before the batch is written result by result (a
# result waits for the heartbeat's lock of its row, milliseconds, as a matter of course).
FINISH_LOCK_WAIT_MS = 1000
ONE_LOCK_WAIT_MS = 200  # each result's wait when written alone
LOCKED_RETRY_SECONDS = 1.0
RESULT_KINDS = ("succeeded", "failed", "dead")  # what finish writes

log = structlog.get_logger("pgtick.worker")

# What the completer writes: a run, what to record of it, and its handler's wall time (None:
# no handler ran).
Result = tuple[Held, Outcome, float | None]


def limited_among(
    helds: Iterable[Held], ids: set[int], limited: frozenset[str]
) -> list[ClaimedRun]:
    """The runs among ``helds`` whose id is in ``ids`` (no longer held) and whose job type
    has a limit: the ones whose freed slots are announced."""
    return [h.run for h in helds if h.id in ids and h.run.job_type in limited]


def announce_freed(store: RunStore, freed: list[ClaimedRun], keyed: frozenset[str]) -> None:
    """Tell every daemon that these runs of limited types no longer hold their slots: a
    wake-up per job type, after the due second of each type limited per key (its claims
    skip a busy key's runs and move their bound past them; keyset.py)."""
    store.notify(
        {run.job_type for run in freed},
        due=[(run.job_type, run.run_at) for run in freed if run.job_type in keyed],
    )


class Completer:
    """Writes outcomes in batches: one transaction per batch, each guarded by its claim."""

    def __init__(
        self,
        store: RunStore,
        worker_id: str,
        life: Lifecycle,
        metrics: Metrics,
        limited: frozenset[str] = frozenset(),
        keyed: frozenset[str] = frozenset(),
    ) -> None:
        self._limited = limited  # job types whose freed slots other daemons must hear of
        # Of those, the types with max_running_per_key: their claims skip the runs of keys at
        # their limit and move the keyset bound past them, so a freed slot also says where
        # that key's next runs are (the finished run's run_at, keyset.py).
        self._keyed = keyed
        self._store = store
        self._worker_id = worker_id
        self._life = life
        self._metrics = metrics
        self._items: collections.deque[Result] = collections.deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._writing: list[Result] = []  # the batch being written
        self._closing = False
        self._idle = False  # the writer waits for results (a submit must wake it)
        # Runs of limited types let go of and not announced yet (kept when the NOTIFY fails,
        # for the retry).
        self._unannounced: list[ClaimedRun] = []
        # Results whose runs' rows another session holds locked: (when to try again, result).
        self._parked: list[tuple[float, Result]] = []

    def limits_changed(self, limited: frozenset[str], keyed: frozenset[str]) -> None:
        """An operator changed limits at runtime (controls.py): announce these types' slots."""
        self._limited, self._keyed = limited, keyed

    def submit(self, held: Held, outcome: Outcome, duration: float | None) -> None:
        self.submit_many([(held, outcome, duration)])

    def submit_many(self, results: list[Result]) -> None:
        """Queue results for the writer. Every handler thread calls this once per run, so it
        takes the lock only to wake a writer that waits: the writer marks itself idle before
        it looks at the queue, and the queue's own operations are atomic."""
        self._items.extend(results)
        if self._idle:
            with self._cond:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def unwritten(self) -> list[int]:
        """Run ids whose results are still to be written."""
        with self._cond:
            parked = [result for _, result in self._parked]
            return [
                held.id
                for held, outcome, _ in (*self._writing, *self._items, *parked)
                if outcome.kind != "timed_out"  # a note, not a result
            ]

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._items or self._in_flight or self._parked:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def run(self) -> None:
        """Write outcomes until closed, on a pinned connection (re-pinned after errors)."""
        failures = 0
        while True:
            try:
                with self._store.pinned("complete") as store:
                    self._metrics.outage.succeeded("complete")  # a connection again
                    if self._loop(store):
                        return
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("complete")
                if not self._metrics.outage.failed("complete", exc, retry_delay(failures)):
                    log.warning("complete_failed", error=str(exc), retry_in=retry_delay(failures))
                with self._cond:
                    closing = self._closing
                if closing and failures > 3:
                    return
                time.sleep(retry_delay(failures))

    def _loop(self, store: RunStore) -> bool:
        """Write batches until closed (True) or until the database fails (raises)."""
        while True:
            with self._cond:
                self._idle = True
                while not self._unpark() and not self._unannounced and not self._closing:
                    self._cond.wait(self._park_wait())
                self._idle = False
                if not self._items and not self._unannounced and self._closing:
                    if self._parked:  # the drain waits for them (wait_empty), up to its bound
                        self._cond.wait(self._park_wait())
                        continue
                    return True
            # Let a batch gather for a moment when it is small.
            if len(self._items) < COMPLETE_BATCH_MAX:
                time.sleep(COMPLETE_BATCH_WINDOW_SECONDS)
            with self._cond:
                n = min(len(self._items), COMPLETE_BATCH_MAX)
                batch: list[Result] = []
                size = 0
                while len(batch) < n and (not batch or size < COMPLETE_BATCH_RESULT_BYTES):
                    item = self._items.popleft()
                    size += len(item[1].result or "")
                    batch.append(item)
                self._in_flight = len(batch)
                self._writing = batch
            try:
                self._write(store, batch)
            except DatabaseError:
                with self._cond:  # what was not written is retried as it is
                    self._items.extendleft(reversed(batch))
                    self._in_flight = 0
                    self._writing = []
                raise
            with self._cond:
                self._in_flight = 0
                self._writing = []
                self._cond.notify_all()
            self._metrics.flush()  # the start delays the threads queued meanwhile

    def _unpark(self) -> bool:
        """Under the lock: move the set-aside results due again to the queue; whether
        anything is queued."""
        now = time.monotonic()
        if self._parked:
            due = [result for at, result in self._parked if at <= now]
            self._parked = [(at, result) for at, result in self._parked if at > now]
            self._items.extend(due)
        return bool(self._items)

    def _park_wait(self) -> float | None:
        """Under the lock: how long to wait for a submit before a set-aside result is due."""
        if not self._parked:
            return None
        return max(0.0, min(at for at, _ in self._parked) - time.monotonic())

    def _finish(
        self, store: RunStore, batch: list[Result], succeed: list[Claim], failures: list[Failure]
    ) -> tuple[set[int], dict[int, FailResult]]:
        """The batch's results in one write; if a run's row stays locked by another session,
        each on its own, those still locked set aside (removed from ``batch``)."""
        # The handlers' results (storage/results.py), by run id: most batches have none.
        results = {h.id: o.result for h, o, _ in batch if o.result is not None}
        try:
            succeeded, failed = store.finish(
                self._worker_id,
                succeed,
                failures,
                lock_wait_ms=FINISH_LOCK_WAIT_MS,
                results=results,
            )
            return succeeded, {r.id: r for r in failed}
        except DatabaseError as exc:
            if not db.lock_not_available(exc):
                raise
        done: set[int] = set()
        failed_by_id: dict[int, FailResult] = {}
        locked: list[Result] = []
        for item in [item for item in batch if item[1].kind in RESULT_KINDS]:
            held = item[0]
            claim = (held.id, held.run.attempt)
            one = [f for f in failures if f.run_id == held.id]
            try:
                s, f = store.finish(
                    self._worker_id,
                    [claim] if claim in succeed else [],
                    one,
                    lock_wait_ms=ONE_LOCK_WAIT_MS,
                    results=results,
                )
            except DatabaseError as exc:
                if not db.lock_not_available(exc):
                    self._record(batch, done, failed_by_id)  # what was written stays so
                    raise
                locked.append(item)
                continue
            done |= s
            failed_by_id.update({r.id: r for r in f})
        if locked:
            log.warning(
                "results_held_up_by_row_locks",
                run_ids=sorted(h.id for h, _, _ in locked),
                retry_in=LOCKED_RETRY_SECONDS,
                reason="another session holds these runs' rows locked; the other results "
                "are written",
            )
            at = time.monotonic() + LOCKED_RETRY_SECONDS
            with self._cond:
                self._parked += [(at, item) for item in locked]
            ids = {h.id for h, _, _ in locked}
            batch[:] = [item for item in batch if item[0].id not in ids]
        return done, failed_by_id

    def _record(
        self, batch: list[Result], succeeded: set[int], failed_by_id: dict[int, FailResult]
    ) -> None:
        """The results written, reported to the lifecycle and removed from ``batch``."""
        written = succeeded | failed_by_id.keys()
        self._freed(batch, written)
        if written:
            self._life.written(
                [item for item in batch if item[0].id in written], succeeded, failed_by_id
            )
        batch[:] = [item for item in batch if item[0].id not in written]

    def _write(self, store: RunStore, batch: list[Result]) -> None:
        """Note on runs past their timeout that they timed out (they stay held until their
        handlers return: a note, no result); write the results (one statement, or one
        transaction), then let go of the runs an operator cancelled: those whose handlers
        stopped without a result, and those whose result the claim guard refused (the others
        were lost); then announce the slots of limited types this freed. ``batch`` is left
        holding what was not written yet, for a retry after a database error."""
        timed_out = [((h.id, h.run.attempt), o.error) for h, o, _ in batch if o.kind == "timed_out"]
        if timed_out:
            # Before the results: a failure in this same batch is written after its note.
            store.mark_timed_out(self._worker_id, timed_out)
            batch[:] = [item for item in batch if item[1].kind != "timed_out"]
        succeed = [(h.id, h.run.attempt) for h, o, _ in batch if o.kind == "succeeded"]
        failures = [
            Failure(h.id, h.run.attempt, o.error, o.error_type, o.detail, o.retry_in_seconds)
            for h, o, _ in batch
            if o.kind in RESULT_KINDS[1:]
        ]
        if succeed or failures:
            succeeded, failed_by_id = self._finish(store, batch, succeed, failures)
            self._record(batch, succeeded, failed_by_id)
        if batch:
            claims = [(h.id, h.run.attempt) for h, _, _ in batch]
            let_go = store.acknowledge_cancel(self._worker_id, claims)
            self._freed(batch, let_go)  # a cancelled run's slot frees when it is let go of
            self._life.written(batch, set(), {}, let_go)
            batch.clear()
        # After the batch is recorded as written: a failure here retries only the wake-up
        # (the writer comes back for it), where it retried the whole batch and reported its
        # written runs as lost.
        if self._unannounced:
            announce_freed(store, self._unannounced, self._keyed)
            self._unannounced = []

    def _freed(self, batch: list[Result], ids: set[int]) -> None:
        """Keep the runs of limited types among ``ids`` (no longer held) for the wake-up."""
        if self._limited:
            self._unannounced += limited_among((h for h, _, _ in batch), ids, self._limited)
