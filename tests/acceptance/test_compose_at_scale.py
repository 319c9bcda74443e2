"""Issue 48, Must show 1 and 2 at their sizes: 1 000 three-step chains and a batch of 10 000
members, at once, on two daemons, under SIGKILL, SIGTERM, a daemon frozen past its lease and
PostgreSQL restarted under them (a server of the test's own; `fast` restarts: the throwaway
server's settings lose acknowledged commits in a crash). Every chain runs once end to end, each
next run enqueued exactly once by the run before it with the result passed along, and the
batch's callback runs once with the database's counts. (The same with members pruned while the
batch is open: test_batches.py; chains and batches under every fault with a history checker:
the guarantees harness, docs/guarantees.md.)"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgtick
from pgtick.embedded import EmbeddedPostgres
from tests.dbhelp import Connection, connect, migrate

from .cli import pgtick as cli
from .conftest import Cluster
from .test_batches import TYPES, _batch, _cb_ran, callback_once_with_the_counts
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
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE compose")
    dsn = make_conninfo(own_server.dsn, dbname="compose")
    migrate(dsn)
    cluster = Cluster(dsn, tmp_path)
    try:
        config = cluster.config(CONFIG, **FAST)
        daemons = [cluster.start(config), cluster.start(config)]
        rng = random.Random(4848)
        # 1 = succeeds at once; 2, 3 = retried first; 0 = dead after 3 attempts.
        plan = [rng.choice([1, 1, 1, 2, 3, 0]) for _ in range(MEMBERS)]
        lines = tmp_path / "members.jsonl"
        lines.write_text(
            "".join(
                json.dumps({"job_type": "member", "payload": {"n": n, "succeed_at": s}}) + "\n"
                for n, s in enumerate(plan)
            )
        )
        created = cli(dsn, "batch", "create", str(lines), "--callback", "cb")
        assert created.code == 0, created.err
        batch_id = int(created.text)
        with psycopg.connect(dsn, autocommit=False) as app:
            a_ids = [pgtick.enqueue(app, "a", {"sleep": 0.01, "n": n}) for n in range(CHAINS)]
            app.commit()

        faults = Counter[str]()
        deadline = time.monotonic() + 780
        turn = 0
        while not _all_ended(dsn):
            assert time.monotonic() < deadline, (_batch(dsn, batch_id), faults)
            time.sleep(2)
            slot = (turn // 4) % 2  # four faults on one daemon, then four on the other
            kind = ("kill", "restart-db", "term", "freeze")[turn % 4]
            if kind == "restart-db":
                own_server.stop("fast")  # every connection cut, then back
                time.sleep(1.5)
                own_server.start()
            elif kind == "freeze":  # past its lease: the other daemon's reaper steps in
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
        time.sleep(3)  # a second callback or next run would be enqueued by now
        assert all(faults[k] >= 1 for k in ("kill", "restart-db", "term", "freeze")), faults
        with connect(dsn) as conn:
            _chains_ran_once(conn, a_ids)
            callback_once_with_the_counts(conn, dsn, batch_id, plan)
    finally:
        cluster.stop_all()


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
