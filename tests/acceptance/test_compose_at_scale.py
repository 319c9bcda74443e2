"""Issue 48, Must show 1 and 2 at their sizes: 1 000 three-step chains and a batch of 10 000
members, at once, on two daemons, under SIGKILL, SIGTERM, a daemon frozen past its lease and
PostgreSQL restarted under them (a server of the test's own; `fast` restarts: the throwaway
server's settings lose acknowledged commits in a crash). Every chain runs once end to end, each
next run enqueued exactly once by the run before it with the result passed along, and the
batch's callback runs once with the database's counts. Then a batch of 10 000 members whose
finished members retention prunes (kept 1 s) while the batch is open, under the same faults:
the callback comes, once, with counts that add up to every member. (Chains and batches under
every fault with a history checker: the guarantees harness, docs/guarantees.md.)"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgtick
from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import Connection, connect, migrate

from .cli import pgtick as cli
from .conftest import Cluster, Daemon
from .test_batches import TYPES, _cb_ran, callback_once_with_the_counts
from .test_chains import _done, _runs

CHAINS = 1000
MEMBERS = 10_000
CONFIG = """
[job_types.a]
handler = "compose_jobs:step"
on_success = { job_type = "b", payload = { sleep = 0.01 } }

[job_types.b]
handler = "compose_jobs:step"
on_success = { job_type = "c", payload = { sleep = 0.01 } }

[job_types.c]
handler = "compose_jobs:step"
""" + TYPES.format(retention="7d")  # the members and the callback, as test_batches.py's
FAST = {"lease": "3s", "heartbeat": "1s", "reaper": "1s", "grace": "2s", "threads": 8}


@pytest.mark.serial
@pytest.mark.timeout(900)
def test_1000_chains_and_a_10000_member_batch_under_every_fault(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = _database(own_server, "compose")
    cluster = Cluster(dsn, tmp_path)
    try:
        config = cluster.config(CONFIG, **FAST)
        daemons = [cluster.start(config), cluster.start(config)]
        plan = _plan()
        batch_id = _create_batch(dsn, tmp_path, plan)
        with psycopg.connect(dsn, autocommit=False) as app:
            a_ids = [pgtick.enqueue(app, "a", {"sleep": 0.01, "n": n}) for n in range(CHAINS)]
            app.commit()
        _under_every_fault(own_server, cluster, config, daemons, lambda: _all_ended(dsn))
        time.sleep(3)  # a second callback or next run would be enqueued by now
        with connect(dsn) as conn:
            _chains_ran_once(conn, a_ids)
            callback_once_with_the_counts(conn, dsn, batch_id, plan)
    finally:
        cluster.stop_all()


@pytest.mark.serial
@pytest.mark.timeout(900)
def test_a_10000_member_batch_pruned_while_open_under_every_fault(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Retention keeps finished runs 1 s, so the daemons prune every 10 s (reaper.py), and an
    operator prunes between faults: the members that ended go while the batch waits for the
    rest. Their rows gone, the counts
    are the batch's own (migration 0026), and the callback is enqueued once and runs. The
    callback's own row may be pruned too: what it was given is in the jobs' log."""
    dsn = _database(own_server, "pruned")
    cluster = Cluster(dsn, tmp_path)
    try:
        config = cluster.config(TYPES.format(retention="1s"), **FAST)
        daemons = [cluster.start(config), cluster.start(config)]
        plan = _plan()
        # Each member sleeps 50 ms: the batch stays open for a minute or so, long enough for
        # the daemons' retention and the operator's prune to pass many times.
        batch_id = _create_batch(dsn, tmp_path, plan, sleep=0.05)
        kept_while_open: list[int] = []

        def called_back() -> bool:
            pruned = cli(dsn, "prune", "--older-than", "1s")  # the operator's, too
            assert pruned.code in (0, 3), pruned.err  # 3: the server was away (restarting)
            with connect(dsn) as conn:
                [(kept,)] = conn.execute(
                    "SELECT count(*) FROM runs WHERE batch_id = %s", (batch_id,)
                ).fetchall()
            if cluster.executions("callback"):
                return True
            kept_while_open.append(int(kept))
            return False

        _under_every_fault(own_server, cluster, config, daemons, called_back)
        time.sleep(3)  # a second callback would be enqueued, and would have run, by now
        assert min(kept_while_open) < MEMBERS // 2, kept_while_open  # pruned while open
        callbacks = [r for r in cluster.records() if r["event"] == "callback"]
        assert len({r["run_id"] for r in callbacks}) == 1, callbacks  # one callback run
        counts = callbacks[0]["payload"]["batch"]
        assert counts["id"] == batch_id and counts["members"] == MEMBERS
        assert (counts["cancelled"], counts["skipped"]) == (0, 0)
        assert counts["succeeded"] + counts["dead"] == MEMBERS
        # Planned dead members are dead; one planned to succeed at once is not (a kill can
        # cost a member retried first its last attempt: test_batches.py).
        assert plan.count(0) <= counts["dead"] <= MEMBERS - plan.count(1)
        ran = {r["run_id"] for r in cluster.records() if r["event"] == "run"}
        assert len(ran) == MEMBERS  # every member ran (pruned only once ended)
    finally:
        cluster.stop_all()


def _database(own_server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = make_conninfo(own_server.dsn, dbname=name)
    migrate(dsn)
    return dsn


def _plan() -> list[int]:
    """Each member's plan: 1 = succeeds at once; 2, 3 = retried first; 0 = dead after 3
    attempts."""
    rng = random.Random(4848)
    return [rng.choice([1, 1, 1, 2, 3, 0]) for _ in range(MEMBERS)]


def _create_batch(dsn: str, tmp_path: Path, plan: list[int], **extra: object) -> int:
    """The batch of ``plan``'s members (``extra`` in each payload), created (and closed) by
    the CLI from a JSON lines file, with the callback `cb`."""
    lines = tmp_path / "members.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"job_type": "member", "payload": {"n": n, "succeed_at": s, **extra}}) + "\n"
            for n, s in enumerate(plan)
        )
    )
    created = cli(dsn, "batch", "create", str(lines), "--callback", "cb")
    assert created.code == 0, created.err
    return int(created.text)


def _under_every_fault(
    own_server: EmbeddedPostgres,
    cluster: Cluster,
    config: Path,
    daemons: list[Daemon],
    done: Callable[[], bool],
) -> None:
    """Faults every 2 s until ``done()``: SIGKILL, PostgreSQL restarted, SIGTERM, a daemon
    frozen past its lease (the other daemon's reaper steps in), four on one daemon and then
    four on the other; each kind at least once."""
    faults = Counter[str]()
    deadline = time.monotonic() + 780
    turn = 0
    while not done():
        assert time.monotonic() < deadline, faults
        time.sleep(2)
        slot = (turn // 4) % 2
        kind = ("kill", "restart-db", "term", "freeze")[turn % 4]
        if kind == "restart-db":
            own_server.stop("fast")  # every connection cut, then back
            time.sleep(1.5)
            own_server.start()
        elif kind == "freeze":
            daemons[slot].signal(signal.SIGSTOP)
            time.sleep(5)
            daemons[slot].signal(signal.SIGCONT)
        else:
            victim = daemons[slot]
            victim.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            victim.wait(timeout=30)
            daemons[slot] = cluster.start(config)
        faults[kind] += 1
        turn += 1
    assert all(faults[k] >= 1 for k in ("kill", "restart-db", "term", "freeze")), faults


def _all_ended(dsn: str) -> bool:
    """Every chain's last run succeeded and the callback ran (a connection of its own: the
    server restarts under the test)."""
    with connect(dsn) as conn:
        return _done(conn, "c", CHAINS) and _cb_ran(conn)


def _chains_ran_once(conn: Connection, a_ids: list[int]) -> None:
    a_runs, b_runs, c_runs = (_runs(conn, t) for t in ("a", "b", "c"))
    assert [r["status"] for r in a_runs + b_runs + c_runs] == ["succeeded"] * (3 * CHAINS)
    assert Counter(r["payload"]["previous"]["run_id"] for r in b_runs) == Counter(a_ids)
    assert Counter(r["payload"]["previous"]["run_id"] for r in c_runs) == Counter(
        r["id"] for r in b_runs
    )
    for c in c_runs:
        previous = c["payload"]["previous"]
        assert (previous["job_type"], previous["depth"]) == ("b", 2)
        assert previous["result"]["path"] == ["a", "b"]
