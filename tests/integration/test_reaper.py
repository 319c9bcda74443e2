"""The reaper against a real PostgreSQL: a lost run waits for its job type's backoff, a lost
run with no attempts left is dead, and two reapers at once reap each run once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from pgtick.config import JobTypeConfig, RetentionConfig
from pgtick.core.backoff import Backoff
from pgtick.core.handlers import JobType
from pgtick.core.reaper import Reaper
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import ClaimType, NewRun, RunStore, WorkerInfo
from tests.integration.horizon import held_snapshot, statement_buffers
from tests.integration.leases import expire

# The job types the reaper knows: one with jitter, one without. "stranger" is a type no
# handler of this daemon knows (another fleet's): the default backoff applies.
JOB_TYPES = {
    "jittery": JobType(
        JobTypeConfig("jittery", backoff="exponential", backoff_base_seconds=10, jitter=0.2),
        lease_seconds=60.0,
    ),
    "hourly": JobType(
        JobTypeConfig("hourly", backoff="fixed", backoff_base_seconds=3600, jitter=0.0),
        lease_seconds=60.0,
    ),
}
CLAIM = [ClaimType(name, 60.0, 10) for name in ("jittery", "hourly", "stranger")]
# Float seconds through make_interval() come back in whole microseconds.
TOLERANCE_SECONDS = 1e-5


def make_reaper(store: RunStore) -> Reaper:
    metrics = Metrics(JOB_TYPES, "test", threads=1)
    return Reaper(store, JOB_TYPES, 1.0, 1.0, RetentionConfig(), metrics)


@pytest.fixture
def reaper(store: RunStore) -> Reaper:
    return make_reaper(store)


def lose_attempt(store: RunStore, conn: db.Connection, reaper: Reaper, run_id: int) -> None:
    """Claim the run (next attempt), let its lease expire, reap it; due again at once."""
    [claimed] = store.claim("crashy", CLAIM, 1)
    assert claimed.id == run_id
    expire(conn, [run_id])
    assert reaper.reap_once() == 1


def delay_of(conn: db.Connection, run_id: int) -> float:
    """run_at - updated_at: both are the reaping statement's now()."""
    row = conn.execute("SELECT run_at - updated_at FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    delta: timedelta = row[0]
    return delta.total_seconds()


def make_due(conn: db.Connection, run_id: int) -> None:
    conn.execute("UPDATE runs SET run_at = now() WHERE id = %s", [run_id])


def assert_within_jitter(delay: float, policy: Backoff, attempt: int) -> None:
    base = policy.base_delay(attempt)
    low, high = base * (1 - policy.jitter), min(policy.max_seconds, base * (1 + policy.jitter))
    assert low - TOLERANCE_SECONDS <= delay <= high + TOLERANCE_SECONDS, (delay, low, high)


def test_lost_attempts_wait_for_the_job_types_backoff(
    store: RunStore, conn: db.Connection, reaper: Reaper
) -> None:
    """After an isolated crash (attempt 1) the run keeps its place; after lost attempt n > 1
    it waits the job type's backoff for attempt n - 1, jitter included."""
    jittery = store.enqueue(NewRun("jittery"))
    run_at = store.get_run(jittery).run_at  # type: ignore[union-attr]
    lose_attempt(store, conn, reaper, jittery)
    run = store.get_run(jittery)
    assert run is not None
    assert (run.status, run.attempts, run.run_at, run.locked_by) == ("failed", 1, run_at, None)
    assert (run.error_type, run.last_error) == (
        "lease_expired",
        "lease expired while running on crashy",
    )

    policy = JOB_TYPES["jittery"].backoff
    lose_attempt(store, conn, reaper, jittery)
    assert_within_jitter(delay_of(conn, jittery), policy, 1)  # 10 s +- 20 %
    make_due(conn, jittery)
    lose_attempt(store, conn, reaper, jittery)
    assert_within_jitter(delay_of(conn, jittery), policy, 2)  # 20 s +- 20 %
    assert store.get_run(jittery).status == "failed"  # type: ignore[union-attr]
    attempts = store.get_attempts(jittery)
    assert [(a.attempt, a.worker_id, a.outcome, a.error_type) for a in attempts] == [
        (n, "crashy", "lost", "lease_expired") for n in (1, 2, 3)
    ]
    assert all(a.finished_at is not None for a in attempts)

    # Each job type its own policy: fixed one hour, no jitter.
    hourly = store.enqueue(NewRun("hourly"))
    lose_attempt(store, conn, reaper, hourly)
    lose_attempt(store, conn, reaper, hourly)
    assert delay_of(conn, hourly) == pytest.approx(3600.0, abs=TOLERANCE_SECONDS)

    # A type this daemon has no handler for: the default backoff (10 s exponential, 20 %).
    stranger = store.enqueue(NewRun("stranger"))
    lose_attempt(store, conn, reaper, stranger)
    lose_attempt(store, conn, reaper, stranger)
    assert_within_jitter(delay_of(conn, stranger), Backoff(), 1)

    # Not due until the backoff has passed: nothing to claim now.
    assert store.claim("other", CLAIM, 10) == []


def test_a_lost_run_with_no_attempts_left_is_dead(
    store: RunStore, conn: db.Connection, reaper: Reaper
) -> None:
    once = store.enqueue(NewRun("jittery", max_attempts=1))
    twice = store.enqueue(NewRun("jittery", max_attempts=2))
    lose_attempt(store, conn, reaper, once)
    lose_attempt(store, conn, reaper, twice)
    assert store.get_run(twice).status == "failed"  # type: ignore[union-attr]
    lose_attempt(store, conn, reaper, twice)
    for run_id, attempts in ((once, 1), (twice, 2)):
        run = store.get_run(run_id)
        assert run is not None
        assert (run.status, run.attempts, run.error_type, run.locked_by) == (
            "dead", attempts, "lease_expired", None)  # fmt: skip
        assert run.finished_at is not None
        outcomes = [(a.attempt, a.outcome) for a in store.get_attempts(run_id)]
        assert outcomes == [(n, "lost") for n in range(1, attempts + 1)]
    assert store.claim("other", CLAIM, 10) == []


RUNS = 1500  # three of the reaper's batches


@pytest.fixture
def second_store(dsn: str) -> Iterator[RunStore]:
    """Another daemon's pool on the same database."""
    pool = db.make_pool(dsn, "pgtick", size=2, name="pgtick-test-2")
    try:
        yield RunStore(pool)
    finally:
        pool.close()


def test_two_reapers_at_once_reap_each_run_once(
    store: RunStore, second_store: RunStore, conn: db.Connection
) -> None:
    ids = store.enqueue_many([NewRun("jittery") for _ in range(RUNS)])
    while store.claim("crashy", CLAIM, 500):
        pass
    expire(conn, ids)
    reapers = [make_reaper(store), make_reaper(second_store)]
    counts = [0, 0]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def reap(i: int) -> None:
        try:
            start.wait(10)
            while n := reapers[i].reap_once():
                counts[i] += n
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reap, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(counts) == RUNS, counts
    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM runs GROUP BY status, attempts"
    ).fetchall()
    assert rows == [("failed", 1, RUNS)]
    lost = conn.execute(
        "SELECT count(*), count(DISTINCT run_id) FROM attempts WHERE outcome = 'lost'"
    ).fetchone()
    assert lost == (RUNS, RUNS)
    assert reapers[0].reap_once() == reapers[1].reap_once() == 0


def test_a_pass_looks_at_leases_ended_since_the_last_and_a_first_pass_at_all(
    store: RunStore, conn: db.Connection
) -> None:
    """A lease that ended long before the previous pass but was not visible to it (a claim
    whose transaction outlasted its lease, its daemon then dead) is for the look at every
    lease, which a reaper makes first and then every FULL_REAP_SECONDS."""
    reaper = make_reaper(store)
    early, recent = store.enqueue_many([NewRun("hourly"), NewRun("hourly")])
    assert {r.id for r in store.claim("w", CLAIM, 2)} == {early, recent}
    assert reaper.reap_once() == 0 and reaper.full_passes == 1
    assert not store.reap_look().due  # no lease has ended: the pass locks nothing
    conn.execute("UPDATE runs SET locked_until = now() - interval '1 hour' WHERE id = %s", [early])
    expire(conn, [recent])
    look = store.reap_look()
    assert look.due and abs((look.now - store.now()).total_seconds()) < 5
    assert not store.reap_look(store.now()).due  # none ended since now
    assert reaper.reap_once() == 1 and reaper.full_passes == 1
    assert store.get_run(recent).status == "failed"  # type: ignore[union-attr]
    assert store.get_run(early).status == "running"  # type: ignore[union-attr]
    fresh = make_reaper(store)  # e.g. another daemon's
    assert fresh.reap_once() == 1 and fresh.full_passes == 1
    assert store.get_run(early).status == "failed"  # type: ignore[union-attr]


def test_under_a_held_snapshot_a_pass_reads_only_the_leases_ended_since(
    store: RunStore, dsn: str
) -> None:
    """Every finished run leaves an ended lease in runs_lease_idx that vacuum cannot remove
    while a snapshot is held; a pass from ``since`` does not visit them."""
    short = [ClaimType("hourly", 1.0, 10)]
    with held_snapshot(dsn):
        store.enqueue_many([NewRun("hourly") for _ in range(2000)])
        while claimed := store.claim("w", short, 500):
            store.succeed("w", [(r.id, r.attempt) for r in claimed])
        time.sleep(1.5)  # every one of their leases has ended
        since = store.now()
        for name in ("reap_look", "reap_select"):
            windowed, full = _reap_buffers(store, name, since), _reap_buffers(store, name, None)
            # reap_look probes the index twice: whether a lease awaits, and the earliest.
            assert windowed <= (4 if name == "reap_look" else 3), (name, windowed, full)
            assert full > windowed + 10, (name, windowed, full)


def _reap_buffers(store: RunStore, name: str, since: datetime | None) -> int:
    """Shared buffers the reaper's statement touched (reap_select's locks rolled back)."""
    with store.connection() as conn, conn.transaction(force_rollback=True):
        params = {"limit": 500, "since": since, "alive": 5.0, "slack": 0.5}
        return statement_buffers(conn, name, params)


def test_after_a_database_error_the_next_pass_looks_at_every_lease(
    store: RunStore, conn: db.Connection
) -> None:
    """An outage may be a failover to a server whose clock differs: a bound taken on the old
    clock could hide leases, so the pass after the error looks at all of them."""
    metrics = Metrics(JOB_TYPES, "test", threads=1)
    reaper = Reaper(store, JOB_TYPES, 0.1, 1.0, RetentionConfig(), metrics)
    thread = threading.Thread(target=reaper.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while reaper.full_passes < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reaper.full_passes == 1
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
            "pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'"
        )
        deadline = time.monotonic() + 10
        while reaper.full_passes < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reaper.full_passes == 2
    finally:
        reaper.stop_event.set()
        thread.join(10)


def _holder(store: RunStore, conn: db.Connection, worker: str, run_id: int, **ago: float) -> None:
    """Run ``run_id``, claimed by ``worker``: its lease ended ``lease`` seconds ago and its
    holder last beat ``beat`` seconds ago (no workers row without ``beat``)."""
    conn.execute(
        "UPDATE runs SET locked_by = %s, locked_until = now() - make_interval(secs => %s)"
        " WHERE id = %s",
        [worker, ago["lease"], run_id],
    )
    if "beat" in ago:
        store.register_worker(WorkerInfo(worker, "host", 1, "0.1.0", 1, ["hourly"]))
        conn.execute(
            "UPDATE workers SET heartbeat_at = now() - make_interval(secs => %s) WHERE id = %s",
            [ago["beat"], worker],
        )


def test_a_lease_that_ended_is_left_to_a_holder_that_beat_at_its_end_and_recently(
    store: RunStore, conn: db.Connection, reaper: Reaper
) -> None:
    """A holder skips (SKIP LOCKED) a run whose row another session holds locked, so its
    lease ends under a live daemon: the reaper leaves it while the holder's last beat is at
    most 5 s old and came at most 0.5 s before the lease's end. A holder stopped or dead
    beat last when it renewed the lease (a whole lease before its end), or long ago."""
    ids = store.enqueue_many([NewRun("hourly") for _ in range(6)])
    assert len(store.claim("w", CLAIM, 6)) == 6
    cases = {
        "beat after the end": {"lease": 2.0, "beat": 1.0},
        "beat just before the end": {"lease": 2.0, "beat": 2.3},
        "beat after the end, too long ago": {"lease": 7.0, "beat": 6.0},
        "beat at the renewal (stopped)": {"lease": 0.5, "beat": 1.5},
        "no workers row (exited)": {"lease": 2.0},
        "beat before the end, long ago": {"lease": 2.0, "beat": 62.0},
    }
    for (name, ago), run_id in zip(cases.items(), ids, strict=True):
        _holder(store, conn, name, run_id, **ago)
    kept = set(ids[:2])
    assert reaper.reap_once() == 4
    assert {r for r, s in conn.execute("SELECT id, status FROM runs") if s == "running"} == kept
    assert reaper.reap_once() == 0
    ended = "SELECT count(*) FROM attempts WHERE run_id = ANY(%s) AND outcome IS NOT NULL"
    assert conn.execute(ended, [list(kept)]).fetchone() == (0,)  # still open, not lost


def test_a_lease_a_pass_could_not_take_is_taken_by_the_next_pass_once_it_may(
    store: RunStore, conn: db.Connection, dsn: str, reaper: Reaper
) -> None:
    """A pass skips a run whose row another session holds locked, and leaves one whose
    holder is alive; the next passes look only at leases that ended since the last (5 s
    before it). Such a run's lease must stay in their range: once the lock goes, or the
    holder stops beating, the next pass takes it (before, the look at every lease did, up to
    10 minutes later), and meanwhile the passes do not lock anything for it."""
    locked, trusted = store.enqueue_many([NewRun("hourly"), NewRun("hourly")])
    assert len(store.claim("w", CLAIM, 2)) == 2
    _holder(store, conn, "dead", locked, lease=60.0)
    _holder(store, conn, "alive", trusted, lease=60.0, beat=1.0)
    with db.connect(dsn, "pgtick") as other, other.transaction():
        other.execute("SELECT 1 FROM pgtick.runs WHERE id = %s FOR UPDATE", [locked])
        assert reaper.reap_once() == 0 and reaper.full_passes == 1
        assert reaper.reap_once() == 0 and reaper.full_passes == 1  # a pass from `since`
    assert reaper.reap_once() == 1 and reaper.full_passes == 1
    assert store.get_run(locked).status == "failed"  # type: ignore[union-attr]
    assert store.reap_look().oldest is not None  # the live holder's, still kept
    conn.execute("UPDATE workers SET heartbeat_at = now() - interval '6 seconds'")
    assert reaper.reap_once() == 1 and reaper.full_passes == 1
    assert store.get_run(trusted).status == "failed"  # type: ignore[union-attr]
