"""What a new user runs into: a daemon without job types says so; `pgtick demo` runs the
demo's schedules and `pgtick status` against it (PGTICK_DSN from its first line) shows them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pgtick.config.values import cpus_available

from .cli import pgtick
from .conftest import Cluster, wait_for

NOTHING_TO_RUN = """
[worker]
shutdown_grace = "1s"

[metrics]
listen = ""

[logging]
format = "json"
"""


def parent_pid(pid: int) -> int:
    """The parent of a live process (/proc/PID/stat's fourth field, after the command's
    parenthesis, which may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def test_daemon_with_zero_job_types_warns_that_it_only_ticks_schedules(cluster: Cluster) -> None:
    config = cluster.tmp_path / "empty.toml"
    config.write_text(NOTHING_TO_RUN)
    bare = cluster.start(config)
    equipped = cluster.start()  # the acceptance config: job types from worker.imports
    for daemon in (bare, equipped):
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0, daemon.log()
    [warning] = [e for e in bare.events() if e["event"] == "no_job_types"]
    assert warning["level"] == "warning"
    assert "only ticks schedules" in warning["message"]
    assert warning["config"] == str(config)
    assert not [e for e in equipped.events() if e["event"] == "no_job_types"]


DEMO_RUN_WITHIN_SECONDS = 90.0


@pytest.mark.timeout(240)
def test_demo_runs_its_schedule_and_status_shows_it(repo_root: Path, tmp_path: Path) -> None:
    """`pgtick demo` as `make demo` starts it (config.example.toml; only the metrics port is
    made free-for-all, as other tests may hold 9464): its first line is PGTICK_DSN=..., a run
    of the every-minute schedule succeeds within 90 s, and `pgtick status --json` against that
    DSN shows the demo's schedules, job types and daemon."""
    example = (repo_root / "config.example.toml").read_text()
    listen = 'listen = "127.0.0.1:9464"'
    assert listen in example
    config = tmp_path / "config.toml"
    config.write_text(example.replace(listen, 'listen = "127.0.0.1:0"'))
    # Not under pytest's basetemp (mode 0700): the server may run as an unprivileged user.
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-demo-"))
    out = tmp_path / "demo.out"
    argv = ["demo", "--config", str(config), "--data-dir", str(data_dir)]
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "pgtick", *argv],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PGTICK_CONFIG": "", "PGTICK_DSN": ""},
        )
    started = time.monotonic()
    try:
        first = wait_for(lambda: out.read_text().partition("\n")[1] and out.read_text(), 60)
        line = first.splitlines()[0]
        assert line.startswith("PGTICK_DSN=postgresql://"), first
        dsn = line.removeprefix("PGTICK_DSN=")

        def succeeded() -> list[dict[str, object]]:
            result = pgtick(dsn, "runs", "--status", "succeeded", "--json")
            return json.loads(result.text)["runs"] if result.code == 0 else []

        def unscheduled() -> list[dict[str, object]]:
            return [r for r in succeeded() if r["schedule"] is None]

        # The run the demo enqueues at start, within seconds (the every-minute schedule's run
        # may come first when the demo starts just before a minute boundary); the schedule's
        # run within 90 s (a minute boundary and a tick).
        [first] = wait_for(unscheduled, 30, interval=0.5, what="the demo's first run")
        assert first["job_type"] == "hello"

        def scheduled() -> list[dict[str, object]]:
            return [r for r in succeeded() if r["schedule"] == "every_minute"]

        wait_for(scheduled, DEMO_RUN_WITHIN_SECONDS, interval=1.0, what="a scheduled run")
        assert time.monotonic() - started < DEMO_RUN_WITHIN_SECONDS
        # The README's promise: the daemon's log shows a hello line with the payload.
        events = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
        greetings = [e.get("greeting") for e in events if e["event"] == "hello"]
        assert greetings[:2] == ["hello from pgtick demo", "hello from the ticker"], events[-5:]
        hello = next(e for e in events if e["event"] == "hello")
        assert {"run_id", "job_type", "attempt"} <= hello.keys()

        status = pgtick(dsn, "status", "--json")
        assert status.code == 0, (status.out, status.err)
        doc = json.loads(status.text)
        assert [s["name"] for s in doc["schedules"]] == ["every_minute", "nightly_cleanup"]
        # worker.processes is "auto" by default: one worker process per CPU under the demo's
        # supervisor (the demo itself when that is one).
        workers = doc["workers"]
        assert len(workers) == cpus_available(), workers
        parents = {w["pid"] if len(workers) == 1 else parent_pid(w["pid"]) for w in workers}
        assert parents == {demo.pid}, workers
        assert all(sorted(w["job_types"]) == ["cleanup", "hello", "sleep"] for w in workers)

        demo.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
        assert demo.wait(60) == 0, out.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)
