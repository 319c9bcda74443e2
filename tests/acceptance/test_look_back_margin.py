"""A run skipped by a claim because another transaction held it locked, due between the claim's
bound (latest run_at claimed - 1 s) and the idle probe's (latest run_at claimed, while
notifications arrive), is claimed by an idle daemon once that transaction lets go. It was
not, for up to 10 minutes: the probe did not see it (below the probe's bound), the look back
did not look there (not below the claim's bound), and with nothing passed since the last
look the next look was the full one, 600 s later; nothing announces a rollback. The look now
reads the margin too, and a run it finds there makes the probe start at the claim's bound."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg

from tests.dbhelp import NewRun, Runs

from .conftest import Cluster, wait_for

LOOK_SECONDS = 5.0


def _ran(cluster: Cluster, run_id: int) -> bool:
    return any(r["run_id"] == run_id for r in cluster.records())


def test_a_run_held_across_a_look_back_then_let_go_is_claimed_by_an_idle_daemon(
    cluster: Cluster, store: Runs, dsn: str
) -> None:
    cluster.start()
    first = store.enqueue_many([NewRun("record") for _ in range(3)])
    wait_for(lambda: all(_ran(cluster, i) for i in first), 10, what="the first runs")
    now = store.now()
    held = store.enqueue(NewRun("record", {"held": True}, run_at=now + timedelta(seconds=2)))
    with psycopg.connect(dsn) as other:
        other.execute("SELECT id FROM pgtick.runs WHERE id = %s FOR UPDATE", [held])
        # Due half a second after the held run: the claim that takes it skips the held one
        # and puts its bound 1 s below its own run_at, below the held run.
        after = store.enqueue(NewRun("record", run_at=now + timedelta(seconds=2.5)))
        wait_for(lambda: _ran(cluster, after), 10, what="the run due after the held one")
        time.sleep(LOOK_SECONDS + 2.0)  # a look back passes while the run is still held
        other.rollback()
        released = time.time()
    waited = 15.0
    deadline = time.monotonic() + waited
    while time.monotonic() < deadline and not _ran(cluster, held):
        time.sleep(0.1)
    assert _ran(cluster, held), (
        f"run {held}, due and free since {time.time() - released:.1f} s, not claimed by the "
        f"idle daemon (run {after}, due 0.5 s after it, ran long ago)"
    )
