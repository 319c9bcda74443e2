"""A ``@pgtick.job`` job type's flow-control options limit as the same keys of
``[job_types.NAME]`` do: with ``max_running=1`` two daemons of four threads never run two of
its runs at once, and its ``priority`` is what enqueue() gives its runs. The decorator refused
these options (``job() got an unexpected keyword argument 'max_running'``, exit 2)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.test_flow_control import _max_overlap, _sampling, _succeeded
from tests.dbhelp import Connection

RUNS = 40
CONFIG = """
[worker]
threads = 4
prefetch = 0
poll_interval = "1s"
imports = ["decorated_jobs"]

[metrics]
listen = ""

[logging]
format = "json"
"""


@pytest.mark.timeout(120)
def test_a_decorated_max_running_of_one_never_runs_two_at_once(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    config = cluster.tmp_path / "decorated.toml"
    config.write_text(CONFIG)
    for _ in range(2):
        cluster.start(config)
    with _sampling(
        dsn, "SELECT count(*) FROM runs WHERE job_type = 'one_at_a_time' AND status = 'running'"
    ) as running:
        conn.execute(
            "SELECT enqueue('one_at_a_time', '{\"sleep\": 0.05}') FROM generate_series(1, %s)",
            [RUNS],
        )
        wait_for(lambda: _succeeded(conn) == RUNS, 60, 0.1, "every run done")
        time.sleep(0.05)  # one more sample after the last finish
    assert max(running) == 1, Counter(running)
    records = cluster.records()
    assert _max_overlap(records) == 1
    starts = Counter(r["run_id"] for r in records if r["event"] == "start")
    assert len(starts) == RUNS and set(starts.values()) == {1}
    priorities = conn.execute("SELECT DISTINCT priority FROM runs").fetchall()
    assert priorities == [(3,)]
