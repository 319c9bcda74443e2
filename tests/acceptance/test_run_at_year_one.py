"""A run due at 0001-01-01 00:00:00+00 (accepted by enqueue(); also what the claim's result
clamps -infinity and BC run_ats to) killed the dispatcher when it was the latest priority-0
run of its claim: the claim's lower bound, 1 s below it, overflows Python's datetime. The
daemon exited 1 with the run left 'running'."""

from __future__ import annotations

import time

from tests import dbhelp
from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster


def test_a_run_due_in_year_one_does_not_stop_claiming(
    dsn: str, conn: dbhelp.Connection, cluster: Cluster
) -> None:
    daemon = cluster.start()
    [(first,)] = conn.execute("SELECT enqueue('record', '{}', '0001-01-01 00:00:00+00')").fetchall()
    time.sleep(3.0)
    alive = daemon.proc.poll() is None
    later = pgtick(dsn, "enqueue", "record")
    assert later.code == 0, later
    later_id = int(later.out[-1])
    time.sleep(3.0)
    ran = cluster.executions()
    assert alive and daemon.proc.poll() is None and first in ran and later_id in ran, (
        f"daemon alive after 3 s: {alive}; executions: {dict(ran)}; log tail:\n"
        + daemon.log()[-1500:]
    )
