"""A 20-second database outage in a daemon's log (issue 44, item 10): the log got some 48
warnings, every loop one per failed retry. Now the first failure of each kind is logged, then
one line per backoff step with the count and the next retry ("still down"), and one line when
the database is back: a handful of lines, whatever the outage's length."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.correctness import enqueue
from tests.acceptance.tcp_proxy import TcpProxy, proxy_for

OUTAGE_SECONDS = 20.0
MAX_OUTAGE_LINES = 15


@pytest.fixture
def proxy(dsn: str) -> Iterator[TcpProxy]:
    with proxy_for(dsn) as p:
        yield p


def _problems(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("level") in ("warning", "error")]


@pytest.mark.timeout(120)
def test_a_20s_outage_is_a_handful_of_log_lines(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str, proxy: TcpProxy
) -> None:
    config = cluster.config(heartbeat="1s", lease="60s", reaper="1s", poll_interval="1s")
    daemon = cluster.start(config, env={"PGTICK_DSN": proxy.dsn(dsn)})
    [first] = enqueue(conn, [("record", {})])
    wait_for(lambda: first in cluster.executions(), 10, what="a run before the outage")
    before = len(daemon.events())
    proxy.cut()
    time.sleep(OUTAGE_SECONDS)
    proxy.restore()
    [after] = enqueue(conn, [("record", {})])
    wait_for(lambda: after in cluster.executions(), 30, what="a run after the outage")
    wait_for(
        lambda: any(e.get("event") == "database_back" for e in daemon.events()[before:]),
        60,
        what="the database_back line (every loop through again)",
    )
    events = daemon.events()[before:]
    problems = _problems(events)
    kinds = Counter(e["event"] for e in problems)
    print(f"{len(problems)} lines at warning level: {dict(kinds)}")
    assert daemon.proc.poll() is None
    assert len(problems) <= MAX_OUTAGE_LINES, kinds
    # What an operator needs from them: that it went down, that it is still down (a count and
    # the next retry), and when it came back.
    assert any(e.get("event") == "database_unreachable" for e in problems), kinds
    still = [e for e in problems if e.get("event") == "database_still_down"]
    assert still and all({"failures", "retry_in"} <= e.keys() for e in still), still
    back = [e for e in events if e.get("event") == "database_back"]
    assert back and back[0]["down_seconds"] >= OUTAGE_SECONDS - 1, back
