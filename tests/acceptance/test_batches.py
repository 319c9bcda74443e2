"""Batches (issue 48, docs/composition.md): a set of runs whose callback is enqueued exactly
once when the batch is closed and every member has ended, with the counts by outcome. Shown
with real daemons under SIGKILL, SIGTERM and restarts (members retrying, some dead), with
retention pruning finished members while the batch is open, and with cancel and retry."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgtick
from tests.dbhelp import Connection

from .cli import pgtick as cli
from .conftest import Cluster, wait_for

TYPES = """
[job_types.member]
handler = "compose_jobs:member"
max_attempts = 3
backoff_base = "0s"

[job_types.cb]
handler = "compose_jobs:callback"

[retention]
succeeded = "{retention}"
dead = "{retention}"
cancelled = "{retention}"
skipped = "{retention}"
"""

FAST = {"lease": "3s", "heartbeat": "1s", "reaper": "1s", "grace": "2s", "threads": 8}


def _batch(dsn: str, batch_id: int) -> dict[str, Any]:
    shown = cli(dsn, "batch", str(batch_id), "--json")
    assert shown.code == 0, shown.err
    return dict(json.loads(shown.text))


def _callbacks(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT payload FROM runs WHERE job_type = 'cb' ORDER BY id").fetchall()
    return [row[0] for row in rows]


def _cb_ran(conn: Connection) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE job_type = 'cb' AND status = 'succeeded'"
    ).fetchone()
    return bool(row[0] >= 1)


def _as_planned(plan: int, status: str, history: list[list[str]]) -> bool:
    """Whether a member's attempts ([attempt, outcome, error_type], released ones left out) are
    what its plan (1 = succeeds at once; 2, 3 = retried first; 0 = dead after 3 attempts) and
    faults make: numbered 1, 2, ...; the handler's Retry only before the planned attempt, its
    success only from it on, and last; any other end (lost, failed by the daemon) a fault's;
    dead after 3 attempts."""
    if [int(a) for a, _, _ in history] != list(range(1, len(history) + 1)):
        return False
    for attempt, outcome, error_type in ((int(a), o, e) for a, o, e in history):
        planned_retry = plan == 0 or attempt < plan
        if outcome == "succeeded" and (planned_retry or attempt != len(history)):
            return False
        if (outcome, error_type) == ("failed", "Retry") and not planned_retry:
            return False
    if history and history[-1][1] == "succeeded":
        return status == "succeeded" and len(history) <= 3
    return status == "dead" and len(history) == 3


def callback_once_with_the_counts(
    conn: Connection, dsn: str, batch_id: int, plan: list[int]
) -> None:
    """The batch of ``plan``'s members (1 = succeeds at once; 2, 3 = retried first; 0 = dead
    after 3 attempts), done under faults: its one callback has the database's counts."""
    # A fault (SIGKILL, a frozen daemon, a drain that could not write its results) can cost a
    # member an attempt, recorded lost or failed by the daemon: so a member may end dead where
    # its plan says it succeeds, but only with such attempts. Each member's history is read
    # against its plan: an attempt the handler ended is the one its plan says.
    ended = dict(
        conn.execute(
            "SELECT (payload->>'n')::int, status FROM runs WHERE batch_id = %s", (batch_id,)
        ).fetchall()
    )
    assert len(ended) == len(plan) and set(ended.values()) <= {"succeeded", "dead"}
    assert all(ended[n] == "dead" for n, s in enumerate(plan) if s == 0)
    histories = {
        n: history
        for n, history in conn.execute(
            "SELECT (r.payload->>'n')::int, array_agg(array[a.attempt::text, a.outcome, "
            "coalesce(a.error_type, '')] ORDER BY a.attempt) "
            "FROM runs r JOIN attempts a ON a.run_id = r.id "
            "WHERE r.batch_id = %s AND a.outcome <> 'released' GROUP BY 1",
            (batch_id,),
        ).fetchall()
    }
    wrong = {
        n: (plan[n], ended[n], histories.get(n))
        for n in range(len(plan))
        if not _as_planned(plan[n], ended[n], histories.get(n, []))
    }
    assert not wrong, f"members whose history is not their plan (plan, status, attempts): {wrong}"
    expected = {
        "id": batch_id,
        "members": len(plan),
        "succeeded": sum(1 for status in ended.values() if status == "succeeded"),
        "dead": sum(1 for status in ended.values() if status == "dead"),
        "cancelled": 0,
        "skipped": 0,
    }
    [callback] = _callbacks(conn)
    assert callback["batch"] == expected
    shown = _batch(dsn, batch_id)
    assert shown["state"] == "done"
    assert {k: shown[k] for k in expected} == expected


@pytest.mark.timeout(400)
def test_batch_under_kills_callback_once_with_right_counts(
    cluster: Cluster, conn: Connection, dsn: str, tmp_path: Path
) -> None:
    rng = random.Random(48)
    # 1 = succeeds at once; 2, 3 = retried first; 0 = dead after 3 attempts.
    plan = [rng.choice([1, 1, 1, 2, 3, 0]) for _ in range(1000)]
    lines = tmp_path / "members.jsonl"
    first, later = plan[:600], plan[600:]
    lines.write_text(
        "\n".join(
            json.dumps({"job_type": "member", "payload": {"n": n, "succeed_at": s, "sleep": 0.02}})
            for n, s in enumerate(first)
        )
        + "\n"
    )
    config = cluster.config(TYPES.format(retention="7d"), **FAST)
    daemons = [cluster.start(config), cluster.start(config)]
    created = cli(dsn, "batch", "create", str(lines), "--callback", "cb", "--open")
    assert created.code == 0, created.err
    batch_id = int(created.text)
    # Members added later from the application, while the first ones run.
    with psycopg.connect(dsn, autocommit=False) as app:
        for n, s in enumerate(later, start=len(first)):
            payload = {"n": n, "succeed_at": s, "sleep": 0.02}
            pgtick.enqueue(app, "member", payload, batch=batch_id)
        app.commit()
    assert _batch(dsn, batch_id)["members"] == 1000
    closed = False
    deadline = time.monotonic() + 300
    turn = 0
    while not _cb_ran(conn):
        assert time.monotonic() < deadline, _batch(dsn, batch_id)
        time.sleep(1.5)
        victim = daemons[turn % 2]
        victim.signal(signal.SIGKILL if turn % 2 == 0 else signal.SIGTERM)
        victim.wait(timeout=30)
        daemons[turn % 2] = cluster.start(config)
        turn += 1
        if turn == 2:  # closed while members still run, between kills
            assert cli(dsn, "batch", "close", str(batch_id)).code == 0
            closed = True
    assert closed
    time.sleep(3)  # any second callback would be enqueued by now (reaper passes included)
    callback_once_with_the_counts(conn, dsn, batch_id, plan)
    text = cli(dsn, "batch", str(batch_id))
    assert text.out[0] == f"batch {batch_id}: done, 1000 of 1000 members ended"


@pytest.mark.timeout(200)
def test_members_pruned_while_open_neither_block_nor_repeat_the_callback(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    cluster.start(cluster.config(TYPES.format(retention="1s"), **FAST))
    batch_id = pgtick.open_batch(conn, callback={"job_type": "cb", "payload": {"report": 1}})
    early = [pgtick.enqueue(conn, "member", {"n": n}, batch=batch_id) for n in range(20)]
    dead = pgtick.enqueue(conn, "member", {"succeed_at": 0}, batch=batch_id)
    # By the batch's own counts: the daemon prunes (every 10 s with a retention of 1 s) the
    # members ended first while later ones still run, so their rows never all show at once
    # (CI counted the rows and waited for 21 forever).
    wait_for(
        lambda: (b := _batch(dsn, batch_id))["succeeded"] == 20 and b["dead"] == 1,
        60,
        interval=0.5,
        what="20 members succeeded and 1 dead",
    )
    # Retention prunes the finished members while the batch is open.
    wait_for(
        lambda: (
            cli(dsn, "prune", "--older-than", "1s").code == 0
            and not conn.execute(
                "SELECT 1 FROM runs WHERE id = ANY(%s)", ([*early, dead],)
            ).fetchone()
        ),
        60,
        interval=1.0,
        what="the finished members pruned",
    )
    assert _batch(dsn, batch_id)["members_kept"] == {}
    assert _batch(dsn, batch_id)["succeeded"] == 20
    # More members; one cancelled before it runs; then closed: the callback comes once.
    held = pgtick.enqueue(conn, "member", {"n": 99}, batch=batch_id, run_at=_in_an_hour(conn))
    more = [pgtick.enqueue(conn, "member", {"n": n}, batch=batch_id) for n in range(5)]
    assert cli(dsn, "cancel", str(held)).code == 0
    assert pgtick.close_batch(conn, batch_id) in ("closed", "done")
    wait_for(lambda: _cb_ran(conn), 60, what="the callback")
    # Members and the batch's own row may go with retention now; the callback ran once.
    time.sleep(3)
    [callback] = _callbacks(conn)
    assert callback == {
        "report": 1,
        "batch": {
            "id": batch_id,
            "members": 27,
            "succeeded": 25,
            "dead": 1,
            "cancelled": 1,
            "skipped": 0,
        },
    }
    assert len(more) == 5
    # A closed batch takes no more members: one clear error.
    with pytest.raises(pgtick.DatabaseError, match=r"is done: members are added only while"):
        pgtick.enqueue(conn, "member", {}, batch=batch_id)


def _in_an_hour(conn: Connection) -> Any:
    return conn.execute("SELECT now() + interval '1 hour'").fetchone()[0]


@pytest.mark.timeout(120)
def test_retried_member_counted_once(cluster: Cluster, conn: Connection, dsn: str) -> None:
    cluster.start(cluster.config(TYPES.format(retention="7d"), **FAST))
    batch_id = pgtick.open_batch(conn, callback="cb")
    dead = pgtick.enqueue(conn, "member", {"succeed_at": 0}, batch=batch_id)
    ok = pgtick.enqueue(conn, "member", {"succeed_at": 2}, batch=batch_id)  # retried once
    wait_for(lambda: _batch(dsn, batch_id)["succeeded"] + _batch(dsn, batch_id)["dead"] == 2, 60)
    assert (_batch(dsn, batch_id)["succeeded"], _batch(dsn, batch_id)["dead"]) == (1, 1)
    # The operator retries the dead member: its count is taken back until it ends again.
    conn.execute("UPDATE runs SET payload = '{\"succeed_at\": 1}' WHERE id = %s", (dead,))
    assert cli(dsn, "retry", str(dead)).code == 0
    wait_for(lambda: _batch(dsn, batch_id)["succeeded"] == 2, 60)
    assert _batch(dsn, batch_id)["dead"] == 0
    assert pgtick.close_batch(conn, batch_id) == "done"
    wait_for(lambda: _cb_ran(conn), 30)
    [callback] = _callbacks(conn)
    assert callback["batch"]["succeeded"] == 2
    assert callback["batch"]["dead"] == 0
    assert ok in {
        r[0] for r in conn.execute("SELECT id FROM runs WHERE batch_id = %s", (batch_id,))
    }
