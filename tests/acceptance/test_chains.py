"""Chains (issue 48, docs/composition.md): a run names what to enqueue when it ends, and the
statement that records the outcome enqueues it, in its transaction. Shown here with real
daemons under SIGKILL, SIGTERM and restarts (each next run enqueued exactly once, results
passed along), on_dead fired by the reaper, and the chain given at enqueue time by SQL, the
CLI and Python, with its refusals."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgtick
from tests.dbhelp import Connection

from .cli import pgtick as cli
from .conftest import Cluster, wait_for

CHAIN_TYPES = """
[job_types.a]
handler = "compose_jobs:step"
on_success = {{ job_type = "b", payload = {{ sleep = {sleep} }} }}

[job_types.b]
handler = "compose_jobs:step"
on_success = {{ job_type = "c", payload = {{ sleep = {sleep} }} }}

[job_types.c]
handler = "compose_jobs:step"

[job_types.hang]
handler = "compose_jobs:step"
max_attempts = 1
on_dead = "cb"

[job_types.cb]
handler = "compose_jobs:callback"

[job_types.give]
handler = "compose_jobs:give"
"""

FAST = {"lease": "3s", "heartbeat": "1s", "reaper": "1s", "grace": "2s", "threads": 4}


def _runs(conn: Connection, job_type: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT id, status, payload FROM runs WHERE job_type = %s ORDER BY id", (job_type,)
    ).fetchall()
    return [{"id": i, "status": s, "payload": p} for i, s, p in rows]


def _done(conn: Connection, job_type: str, n: int) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE job_type = %s AND status = 'succeeded'", (job_type,)
    ).fetchone()
    return bool(row[0] >= n)


@pytest.mark.timeout(300)
def test_three_step_chains_under_kills_each_next_run_once(
    cluster: Cluster, conn: Connection
) -> None:
    chains = 200
    config = cluster.config(CHAIN_TYPES.format(sleep=0.3), **FAST)
    # Started first: a job type's chain is its runs' when they are enqueued, as its daemons'
    # config declared it then (job_type_settings, like its default priority).
    daemons = [cluster.start(config), cluster.start(config)]
    a_ids = [pgtick.enqueue(conn, "a", {"sleep": 0.3, "n": n}) for n in range(chains)]
    # Faults until every chain has ended: SIGKILL, SIGTERM (each then restarted), SIGSTOP
    # past the lease.
    deadline = time.monotonic() + 200
    turn = 0
    while not _done(conn, "c", chains):
        assert time.monotonic() < deadline, Counter(r["status"] for r in _runs(conn, "c"))
        time.sleep(1.5)
        victim = daemons[turn % 2]
        if turn % 3 == 2:
            # Frozen past its lease: the other daemon's reaper takes its runs; thawed, its
            # late results are refused by the claim guard.
            victim.signal(signal.SIGSTOP)
            time.sleep(5)
            victim.signal(signal.SIGCONT)
        else:
            victim.signal(signal.SIGKILL if turn % 3 == 0 else signal.SIGTERM)
            victim.wait(timeout=30)
            daemons[turn % 2] = cluster.start(config)
        turn += 1
    assert turn >= 3  # the chains crossed kills, drains and a freeze

    a_runs, b_runs, c_runs = (_runs(conn, t) for t in ("a", "b", "c"))
    assert [r["status"] for r in a_runs + b_runs + c_runs] == ["succeeded"] * (3 * chains)
    # Each next run enqueued exactly once, by the run before it.
    b_by_a = Counter(r["payload"]["previous"]["run_id"] for r in b_runs)
    assert b_by_a == Counter(a_ids)
    c_by_b = Counter(r["payload"]["previous"]["run_id"] for r in c_runs)
    assert c_by_b == Counter(r["id"] for r in b_runs)
    # Results passed along: c got b's result, which carries a's.
    for c in c_runs:
        previous = c["payload"]["previous"]
        assert previous["outcome"] == "succeeded"
        assert previous["job_type"] == "b"
        assert previous["result"]["path"] == ["a", "b"]
        assert previous["depth"] == 2
        assert pgtick.result(conn, c["id"])["path"] == ["a", "b", "c"]


@pytest.mark.timeout(120)
def test_on_dead_fired_once_by_the_reaper(cluster: Cluster, conn: Connection) -> None:
    config = cluster.config(CHAIN_TYPES.format(sleep=0), **FAST)
    first = cluster.start(config)
    hang = pgtick.enqueue(conn, "hang", {"sleep": 60})
    wait_for(
        lambda: (
            conn.execute("SELECT status FROM runs WHERE id = %s", (hang,)).fetchone()[0]
            == "running"
        ),
        20,
    )
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    cluster.start(config)
    wait_for(lambda: _done(conn, "cb", 1), 60, what="the on_dead step to run")
    time.sleep(2)  # a second reaper pass, had the first not settled it
    status, error_type = conn.execute(
        "SELECT status, error_type FROM runs WHERE id = %s", (hang,)
    ).fetchone()
    assert (status, error_type) == ("dead", "lease_expired")
    [cb] = _runs(conn, "cb")
    assert cb["payload"]["previous"] == {
        "run_id": hang,
        "job_type": "hang",
        "outcome": "dead",
        "result": None,
        "depth": 1,
    }
    # An operator's retry of the dead run, dead again (the reaper once more): its on_dead
    # step was enqueued once and is not enqueued again (its key pgtick.chain.<id>.dead.1).
    assert cli(cluster.dsn, "retry", str(hang)).code == 0
    wait_for(lambda: _status(conn, hang) == "running", 20)
    cluster.daemons[-1].signal(signal.SIGKILL)
    cluster.daemons[-1].wait(timeout=10)
    cluster.start(config)
    wait_for(lambda: _status(conn, hang) == "dead", 30)
    time.sleep(2)
    assert len(_runs(conn, "cb")) == 1


def _status(conn: Connection, run_id: int) -> str:
    return str(conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()[0])


@pytest.mark.timeout(120)
def test_chain_given_at_enqueue_by_sql_cli_and_python(
    cluster: Cluster, conn: Connection, dsn: str, tmp_path: Path
) -> None:
    cluster.start(cluster.config(CHAIN_TYPES.format(sleep=0), **FAST))
    nested = {"job_type": "give", "payload": {"give": 2}, "on_success": {"job_type": "cb"}}
    by_sql = conn.execute(
        "SELECT pgtick.enqueue('give', '{\"give\": 1}', on_success => %s)", (json.dumps(nested),)
    ).fetchone()[0]
    by_cli = cli(dsn, "enqueue", "give", "--payload", '{"give": 3}', "--on-success", "cb")
    assert by_cli.code == 0, by_cli.err
    by_python = pgtick.enqueue(conn, "give", {"give": 4}, on_success=["cb", "cb"])
    wait_for(lambda: _done(conn, "cb", 4), 60, what="4 callbacks")
    cbs = _runs(conn, "cb")
    got = sorted(r["payload"]["previous"]["result"] for r in cbs)
    assert got == [2, 3, 4, 4]  # the nested step's result, the CLI's, Python's two steps
    assert {r["payload"]["previous"]["run_id"] for r in cbs} >= {by_python}
    gives = {r["id"]: r["payload"] for r in _runs(conn, "give")}
    [second] = [i for i, p in gives.items() if p.get("previous", {}).get("run_id") == by_sql]
    assert gives[second]["previous"]["result"] == 1

    # Refusals: one clear line each, nothing enqueued.
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"on_success\[0\]: unknown key"):
        conn.execute("SELECT pgtick.enqueue('give', on_success => '{\"job\": \"x\"}')")
    bad = cli(dsn, "enqueue", "give", "--on-dead", '{"job_type": ""}')
    assert bad.code == 2
    assert "on_dead[0].job_type: expected a job type name of 1 to 200 characters" in bad.error
    deep: dict[str, Any] = {"job_type": "cb"}
    for _ in range(20):
        deep = {"job_type": "cb", "on_success": deep}
    with pytest.raises(ValueError, match="nested deeper than 16"):
        pgtick.enqueue(conn, "give", on_success=deep)
    cycle = tmp_path / "cycle.toml"
    cycle.write_text(
        '[job_types.x]\ncommand = ["true"]\non_success = "y"\n'
        '[job_types.y]\ncommand = ["true"]\non_success = { job_type = "x" }\n'
    )
    checked = cli(dsn, "check", "--config", str(cycle))
    assert checked.code == 2
    assert "the chain is a cycle (x -> y -> x); a chain must end" in checked.error
