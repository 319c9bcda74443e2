"""Lifecycle bugs 3 and 4 against a real PostgreSQL, in-process: decorator options go
through the config file's validator; a batch of results is written all or nothing. And what
the result writer and a give-up announce when runs of limited types stop holding slots."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgtick.config import WorkerConfig, config_from_mapping
from pgtick.core import handlers
from pgtick.core.completer import Completer
from pgtick.core.handlers import JobContext
from pgtick.core.lifecycle import Held, Lifecycle
from pgtick.core.outcome import Outcome
from pgtick.core.worker import Worker, claim_type
from pgtick.errors import ConfigError, DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import ClaimType, Lease, NewRun, RunStore


def _noop(ctx: JobContext, payload: Any) -> None:
    return None


@pytest.fixture
def registry() -> Iterator[list[str]]:
    """Names registered with @pgtick.job by a test, forgotten afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        handlers._DECORATED.pop(name, None)


def _register(registry: list[str], name: str, **options: Any) -> None:
    registry.append(name)
    handlers.job(name, **options)(_noop)


def test_decorator_options_are_checked_like_the_config_file(
    registry: list[str], store: RunStore
) -> None:
    """Bug 3: `lease=40` (an int, as the README shows for timeout) made every claim and
    heartbeat fail; `max_attempts=0` violated a CHECK on every claim; `backoff="expo"` raised
    out of execute() and killed the worker thread."""
    _register(registry, "dec_int_lease", lease=40, timeout="5m", max_attempts=4)
    config = config_from_mapping({"job_types": {"plain": {"command": ["/bin/true"]}}})
    job_types = handlers.resolve(config)
    jt = job_types["dec_int_lease"]
    assert jt.lease_seconds == 40.0 and isinstance(jt.lease_seconds, float)
    assert (jt.config.timeout_seconds, jt.config.max_attempts) == (300.0, 4)
    # Both types in one claim, as the dispatcher does: the leases are one float8[].
    store.enqueue_many([NewRun("dec_int_lease"), NewRun("plain")])
    types = [ClaimType(t.name, t.lease_seconds, t.config.max_attempts) for t in job_types.values()]
    claimed = store.claim("w", types, 10)
    assert sorted((c.job_type, c.max_attempts) for c in claimed) == [
        ("dec_int_lease", 4),
        ("plain", 10),
    ]
    leases = [Lease(c.id, c.attempt, 30.0) for c in claimed]
    assert store.heartbeat("w", leases).held == {c.id for c in claimed}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff": "expo"}, "backoff"),
        ({"lease": "soon"}, "lease"),
        ({"jitter": 3}, "jitter"),
        ({"lease": 5}, "twice worker.heartbeat"),
    ],
)
def test_bad_decorator_options_are_config_errors_naming_the_decorator(
    registry: list[str], options: dict[str, Any], words: str
) -> None:
    _register(registry, "dec_bad", **options)
    with pytest.raises(ConfigError) as err:
        handlers.resolve(config_from_mapping({}))
    message = str(err.value)
    assert "@pgtick.job('dec_bad')" in message and words in message, message
    assert "\n" not in message


FAULT_ONCE = """
CREATE SEQUENCE public.fault_seq;
CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.outcome = 'failed' AND nextval('public.fault_seq') = 1 THEN
        RAISE EXCEPTION 'injected fault while recording a failure';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_once BEFORE INSERT ON attempts_history
    FOR EACH ROW EXECUTE FUNCTION public.fail_once();
"""


def _write_all(completer: Completer) -> None:
    """Run the completer's writer until what was submitted is written, then stop it."""
    thread = threading.Thread(target=completer.run)
    thread.start()
    try:
        assert completer.wait_empty(15)
    finally:
        completer.close()
        thread.join(10)


def _attempts(metrics: Metrics, outcome: str, job_type: str = "noop") -> float:
    labels = {"job_type": job_type, "outcome": outcome}
    return metrics.registry.get_sample_value("pgtick_run_attempts_total", labels) or 0.0


def test_a_batch_of_results_is_written_all_or_nothing(store: RunStore, conn: db.Connection) -> None:
    """Bug 4: the completer wrote successes and failures in separate statements; when the
    second failed, the first had committed, and on the retry the runs that had succeeded were
    reported as lost. Now a batch is one transaction, retried as a whole."""
    conn.execute(FAULT_ONCE)
    jt = handlers.JobType(handlers.JobTypeConfig("noop"), 60.0, fn=_noop)
    metrics = Metrics({"noop": jt}, "test", 2)
    life = Lifecycle(metrics)
    store.enqueue_many([NewRun("noop"), NewRun("noop")])
    good, bad = store.claim("w", [ClaimType("noop", 60.0, 5)], 2)
    batch = []
    for run, outcome in (
        (good, Outcome(good.id, "succeeded")),
        (bad, Outcome(bad.id, "failed", "E: x", "E", "tb", 30.0)),
    ):
        held = Held(run, handlers.claimed_context(run, store, "w", life), jt)
        assert life.accept([held]) == [] and life.start(held)
        assert life.finish(held, outcome, 0.01) == outcome
        batch.append((held, outcome))
    completer = Completer(store, "w", life, metrics)
    for held, outcome in batch:
        completer.submit(held, outcome, 0.01)
    _write_all(completer)
    statuses = dict(conn.execute("SELECT id, status FROM runs").fetchall())
    assert statuses == {good.id: "succeeded", bad.id: "failed"}

    assert [_attempts(metrics, o) for o in ("succeeded", "failed", "lost")] == [1, 1, 0]
    errors = metrics.registry.get_sample_value("pgtick_db_errors_total", {"operation": "complete"})
    assert errors == 1  # the injected fault happened, and was retried
    assert life.held_count() == 0


class _NotifyFailsOnce(RunStore):
    """A store whose first wake-up for a freed slot fails, as a dropped connection would (the
    completer pins a copy of it: what failed is counted on the class)."""

    failures = 0
    sent = 0

    def notify(self, job_types: Any, due: Any = ()) -> None:
        if not _NotifyFailsOnce.failures:
            _NotifyFailsOnce.failures += 1
            raise DatabaseError("connection lost")
        super().notify(job_types, due)
        _NotifyFailsOnce.sent += 1


def test_a_failed_wake_up_after_a_written_batch_reports_no_run_as_lost(
    store: RunStore, conn: db.Connection
) -> None:
    """The wake-up for the slots a limited type's batch freed came after the batch's
    transaction but before the batch was recorded as written: when it failed, the whole batch
    was retried, the guard refused the runs already finished, and they were reported lost. Now
    only the wake-up is sent again."""
    limited = handlers.JobTypeConfig("noop", max_running=5)
    jt = handlers.JobType(limited, 60.0, fn=_noop)
    metrics = Metrics({"noop": jt}, "test", 2)
    life = Lifecycle(metrics)
    _NotifyFailsOnce.failures = _NotifyFailsOnce.sent = 0
    failing = _NotifyFailsOnce(store.pool)
    store.enqueue(NewRun("noop"))
    [run] = store.claim("w", [ClaimType("noop", 60.0, 5, max_running=5)], 1)
    held = Held(run, handlers.claimed_context(run, store, "w", life), jt)
    outcome = Outcome(run.id, "succeeded")
    assert life.accept([held]) == [] and life.start(held)
    assert life.finish(held, outcome, 0.01) == outcome
    completer = Completer(failing, "w", life, metrics, frozenset({"noop"}))
    completer.submit(held, outcome, 0.01)
    _write_all(completer)
    assert (_NotifyFailsOnce.failures, _NotifyFailsOnce.sent) == (1, 1)  # sent on the retry
    assert conn.execute("SELECT status FROM runs").fetchall() == [("succeeded",)]

    assert [_attempts(metrics, o) for o in ("succeeded", "lost")] == [1, 0]
    assert life.held_count() == 0


def test_a_run_cancelled_while_running_announces_its_freed_key_slot_when_let_go(
    store: RunStore, dsn: str
) -> None:
    """A run of a type limited per key holds its key's slot until its daemon lets go of it,
    and an operator's cancel frees the slot at that moment, as a finished run's result does:
    the writer announces it the same way (the run's due second, then the type), so every
    daemon's claim comes back below the key's next runs. Only finished runs were announced,
    and a cancelled one's key waited for a claim's look back (every 5 s)."""
    keyed = handlers.JobTypeConfig("sync", concurrency_key=("tenant",), max_running_per_key=1)
    jt = handlers.JobType(keyed, 60.0, fn=_noop)
    metrics = Metrics({"sync": jt}, "test", 2)
    life = Lifecycle(metrics)
    store.enqueue(NewRun("sync", {"tenant": "a"}))
    limit = ClaimType("sync", 60.0, 5, key_path=("tenant",), max_running_per_key=1)
    [run] = store.claim("w", [limit], 1)
    held = Held(run, handlers.claimed_context(run, store, "w", life), jt)
    outcome = Outcome(run.id, "succeeded")  # the handler did not stop for the cancel
    assert life.accept([held]) == [] and life.start(held)
    assert life.finish(held, outcome, 0.01) == outcome
    assert store.cancel([run.id]) == [run.id]
    completer = Completer(store, "w", life, metrics, frozenset({"sync"}), frozenset({"sync"}))
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgtick")
        completer.submit(held, outcome, 0.01)
        _write_all(completer)
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    assert payloads == [f"!due {int(run.run_at.timestamp())} sync", "sync"]
    assert [_attempts(metrics, o, "sync") for o in ("succeeded", "cancelled")] == [0, 1]
    assert life.held_count() == 0


def test_a_claimed_run_cancelled_before_it_started_announces_its_slot_when_given_up(
    store: RunStore, dsn: str
) -> None:
    """The same for a run no thread had started when the daemon gave its claims up (a
    shutdown, or runs that waited too long for a thread): an operator had cancelled it, so it
    is let go of, not given back, and its slot is announced like a finished run's."""
    keyed = handlers.JobTypeConfig("sync", concurrency_key=("tenant",), max_running_per_key=1)
    jt = handlers.JobType(keyed, 60.0, fn=_noop)
    metrics = Metrics({"sync": jt}, "test", 1)
    worker = Worker(store, "w", WorkerConfig(threads=1), {"sync": jt}, metrics)
    store.enqueue(NewRun("sync", {"tenant": "a"}))
    [run] = store.claim("w", [claim_type(keyed, 60.0)], 1)
    held = Held(run, handlers.claimed_context(run, store, "w", worker.life), jt)
    assert worker.life.accept([held]) == []
    assert store.cancel([run.id]) == [run.id]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgtick")
        assert worker.release_unstarted() == 0  # let go of, not given back
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    assert payloads == [f"!due {int(run.run_at.timestamp())} sync", "sync"]
    assert worker.life.held_count() == 0
