"""Limits changed at runtime (issue 45, Must show 2): four daemons drain a backlog of a job
type whose config says max_running = 5; `pgtick limits work --max-running 1` holds from every
daemon's next claim on (sampled from the database every 10 ms: a run started after the change
only ever runs alone), and `--reset` gives the config's 5 back. `status` shows each limit with
its source."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster
from tests.acceptance.test_pause import sampling
from tests.dbhelp import Connection

pytestmark = pytest.mark.serial

DAEMONS = 4
CONFIG_LIMIT = 5
RUN_SECONDS = 0.2
# Per sample: the time, the runs running, those of them started after the change, the limit.
# The change's time is its transaction's now(), taken before the function ran and committed: a
# claim whose statement began in between counted under the old limit. Runs started 50 ms after
# it are the next claims'.
SAMPLE = """
SELECT clock_timestamp(), count(*),
       count(*) FILTER (WHERE r.started_at > c.limits_at + interval '50 milliseconds'),
       c.max_running
FROM job_type_controls c
RIGHT JOIN (SELECT 1) one ON true
LEFT JOIN runs r ON r.job_type = 'work' AND r.status = 'running'
GROUP BY c.limits_at, c.max_running
"""


def test_max_running_lowered_from_5_to_1_under_load_holds_from_the_next_claim_and_comes_back(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    config = cluster.config(
        f'[job_types.work]\nhandler = "flow_jobs:work"\nmax_running = {CONFIG_LIMIT}\n',
        threads=8,
        prefetch=0,
        poll_interval="1s",
    )
    for _ in range(DAEMONS):
        cluster.start(config)
    conn.execute(
        "SELECT enqueue('work', %s::jsonb) FROM generate_series(1, 400)",
        [f'{{"sleep": {RUN_SECONDS}}}'],
    )
    running = "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'running'"
    with sampling(dsn, running) as before:
        time.sleep(3.0)
    assert max(n for (n,) in before) == CONFIG_LIMIT, max(n for (n,) in before)

    with sampling(dsn, SAMPLE) as lowered:
        done = pgtick(dsn, "limits", "work", "--max-running", "1")
        assert done.code == 0, done.err
        assert done.text == "work: max_running 1 (runtime)", done.text
        time.sleep(3.0)
    after = [(at, n, new) for at, n, new, limit in lowered if limit == 1]
    assert len(after) > 150, len(after)  # sampled about every 10 ms
    # A run claimed after the change runs alone: never beside another, old or new.
    crowded = [(at, n, new) for at, n, new in after if new >= 1 and n > 1]
    assert not crowded, crowded[:5]
    # The runs claimed before it finish (0.2 s), and from then on one runs at a time.
    settled = [n for at, n, _ in after if at > after[0][0] + timedelta(seconds=1)]
    assert settled and max(settled) == 1, settled[:20]
    assert _limit_source(pgtick(dsn, "status", "--json").text) == ("1", "runtime")

    done = pgtick(dsn, "limits", "work", "--reset", "--config", str(config))
    assert done.code == 0, done.err
    assert done.text == f"work: max_running {CONFIG_LIMIT} (config)", done.text
    with sampling(dsn, running) as back:
        time.sleep(3.0)
    assert max(n for (n,) in back) == CONFIG_LIMIT, max(n for (n,) in back)


def _limit_source(text: str) -> tuple[str, str]:
    doc = json.loads(text)
    [work] = [t for t in doc["job_types"] if t["job_type"] == "work"]
    found = work["limit_sources"]["max_running"]
    return found["value"], found["source"]
