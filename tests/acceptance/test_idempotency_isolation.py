"""One run per idempotency key whatever the enqueuing transaction's isolation level (issue 42,
finding 1). A second enqueue of a key that another transaction took waits for it; then at READ
COMMITTED it gets that transaction's run, and at REPEATABLE READ or SERIALIZABLE, whose
snapshot cannot see that run, it fails with a serialization failure (SQLSTATE 40001) that the
caller retries. Never a second run. From SQL, from the Python API and from the CLI (under a
database whose default isolation is REPEATABLE READ), and from many clients at once."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import psycopg.errors
import pytest
from psycopg import sql

import pgtick
from tests.dbhelp import Connection, connect

from .cli import pgtick as run_cli

LEVELS = ("read committed", "repeatable read", "serializable")
KEY = "invoice-42"


def _runs_with_key(conn: Connection, key: str) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM runs WHERE idempotency_key = %s", (key,))]


def _begin(dsn: str, level: str) -> Connection:
    """A connection inside a transaction at ``level`` whose snapshot is taken now."""
    other = connect(dsn)
    other.execute(f"BEGIN ISOLATION LEVEL {level.upper()}")
    other.execute("SELECT 1 FROM runs LIMIT 1")  # the snapshot, before the other enqueue
    return other


def _sql_enqueue(c: Connection, key: str) -> int:
    row = c.execute("SELECT enqueue('mail', '{}', NULL, %s)", (key,)).fetchone()
    assert row is not None
    return int(row[0])


def _python_enqueue(c: Connection, key: str) -> int:
    return pgtick.enqueue(c, "mail", {}, idempotency_key=key)


ENQUEUERS: dict[str, Callable[[Connection, str], int]] = {
    "sql": _sql_enqueue,
    "python": _python_enqueue,
}


@pytest.fixture
def first(dsn: str) -> Iterator[Connection]:
    """A READ COMMITTED transaction that has enqueued KEY and not committed yet."""
    c = connect(dsn)
    c.execute("BEGIN")
    _sql_enqueue(c, KEY)
    yield c
    c.close()


@pytest.mark.parametrize("how", sorted(ENQUEUERS))
@pytest.mark.parametrize("level", LEVELS)
def test_an_enqueue_waiting_for_the_key_gets_its_run_or_a_serialization_failure(
    dsn: str, conn: Connection, first: Connection, level: str, how: str
) -> None:
    second = _begin(dsn, level)
    with ThreadPoolExecutor(1) as pool:
        waiting: Future[int] = pool.submit(ENQUEUERS[how], second, KEY)
        with pytest.raises(TimeoutError):
            waiting.result(timeout=0.5)  # it waits for the first transaction
        first_id = _runs_with_key(first, KEY)[0]
        first.execute("COMMIT")
        if level == "read committed":
            assert waiting.result(timeout=10) == first_id
            second.execute("COMMIT")
        else:
            with pytest.raises(psycopg.errors.SerializationFailure):
                waiting.result(timeout=10)
            second.execute("ROLLBACK")
            # Retried, as the caller does: the run the first one committed.
            second.execute(f"BEGIN ISOLATION LEVEL {level.upper()}")
            assert ENQUEUERS[how](second, KEY) == first_id
            second.execute("COMMIT")
    second.close()
    assert _runs_with_key(conn, KEY) == [first_id]


@pytest.mark.parametrize("how", sorted(ENQUEUERS))
@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_a_snapshot_older_than_the_committed_key_does_not_add_a_second_run(
    dsn: str, conn: Connection, level: str, how: str
) -> None:
    """The review's case: the snapshot predates the other transaction's commit, and the enqueue
    comes after it (no wait at all)."""
    second = _begin(dsn, level)
    first_id = _sql_enqueue(conn, KEY)  # autocommit: committed now
    with pytest.raises(psycopg.errors.SerializationFailure):
        ENQUEUERS[how](second, KEY)
    second.execute("ROLLBACK")
    second.close()
    assert _runs_with_key(conn, KEY) == [first_id]


def test_the_cli_under_a_repeatable_read_default_returns_the_run_it_waited_for(
    dsn: str, conn: Connection, first: Connection
) -> None:
    dbname = conn.info.dbname
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'").format(
            sql.Identifier(dbname)
        )
    )
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(run_cli, dsn, "enqueue", "mail", "--key", KEY)
        with pytest.raises(TimeoutError):
            waiting.result(timeout=2)  # the CLI waits for the key
        first_id = _runs_with_key(first, KEY)[0]
        first.execute("COMMIT")
        printed = waiting.result(timeout=60)
    assert printed.code == 0, printed.err
    assert printed.text.strip() == str(first_id)
    assert _runs_with_key(conn, KEY) == [first_id]


def test_many_clients_at_every_level_make_one_run_per_key(dsn: str, conn: Connection) -> None:
    """Eight clients, each transaction at a random level, enqueue from a pool of three hot keys
    (sometimes rolling back), retrying serialization failures: one run per key, and every
    committed answer for a key is that run."""
    keys = ["hot-a", "hot-b", "hot-c"]
    answers: dict[str, set[int]] = {k: set() for k in keys}
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with connect(dsn) as c:
            for _ in range(40):
                key = rng.choice(keys)
                level = rng.choice(LEVELS)
                enqueuer = ENQUEUERS[rng.choice(sorted(ENQUEUERS))]
                while True:
                    c.execute(f"BEGIN ISOLATION LEVEL {level.upper()}")
                    try:
                        c.execute("SELECT count(*) FROM runs")  # an early snapshot
                        got = enqueuer(c, key)
                        if rng.random() < 0.2:
                            c.execute("ROLLBACK")
                            break
                        c.execute("COMMIT")
                    except psycopg.errors.SerializationFailure:
                        c.execute("ROLLBACK")
                        continue
                    with lock:
                        answers[key].add(got)
                    break

    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(client, seed) for seed in range(8)]:
            done.result(timeout=120)
    for key in keys:
        runs = _runs_with_key(conn, key)
        assert len(runs) <= 1, (key, runs)
        assert answers[key] <= set(runs), (key, answers[key], runs)


def test_enqueue_many_ids_stay_aligned_with_the_input(dsn: str, conn: Connection) -> None:
    """A key two runs share (written by hand, around the key table) and a key taken before:
    the batch's ids map to its input, one each, in order."""
    from pgtick.storage import db
    from pgtick.storage.store import NewRun, RunStore

    for _ in range(2):
        conn.execute("INSERT INTO runs (job_type, idempotency_key) VALUES ('mail', 'twice')")
    taken = _sql_enqueue(conn, "taken")
    pool = db.make_pool(dsn, "pgtick", size=1, name="pgtick-test")
    try:
        batch = [
            NewRun("a", None, None, None, None, None, None),
            NewRun("mail", None, None, "twice", None, None, None),
            NewRun("b", None, None, None, None, None, None),
            NewRun("mail", None, None, "taken", None, None, None),
            NewRun("mail", None, None, "fresh", None, None, None),
            NewRun("mail", None, None, "fresh", None, None, None),
            NewRun("c", None, None, None, None, None, None),
        ]
        ids = RunStore(pool).enqueue_many(batch)
    finally:
        pool.close()
    assert len(ids) == len(batch)
    types = dict(conn.execute("SELECT id, job_type FROM runs").fetchall())
    assert [types[i] for i in ids] == ["a", "mail", "b", "mail", "mail", "mail", "c"]
    assert ids[1] in _runs_with_key(conn, "twice")
    assert ids[3] == taken
    assert ids[4] == ids[5] == _runs_with_key(conn, "fresh")[0]
    assert len({ids[0], ids[2], ids[4], ids[6]}) == 4


def test_a_key_whose_run_is_gone_is_taken_again(conn: Connection) -> None:
    old = _sql_enqueue(conn, KEY)
    conn.execute("DELETE FROM runs WHERE id = %s", (old,))
    new = _sql_enqueue(conn, KEY)
    assert new != old
    assert _runs_with_key(conn, KEY) == [new]
    assert _sql_enqueue(conn, KEY) == new
