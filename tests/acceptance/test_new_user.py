"""What a new user runs into: a daemon without job types says so; `pgtick demo` runs the
demo's schedules and `pgtick status` against it (PGTICK_DSN from its first line) shows them."""

from __future__ import annotations

import signal

from .conftest import Cluster

NOTHING_TO_RUN = """
[worker]
shutdown_grace = "1s"

[metrics]
listen = ""

[logging]
format = "json"
"""


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
