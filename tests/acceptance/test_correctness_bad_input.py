"""Item 8: settings and arguments that passed `pgtick check` and then hurt at run time are
refused up front, exit 2, with one line that names the key or option and says why. Each case
was accepted before the fix (the pool exhausted the server's connections, the ticker built a
year of runs in one tick, the enqueue failed with a database error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import dbhelp
from tests.acceptance.cli import pgtick

JOB = '[job_types.noop]\ncommand = ["/bin/true"]\n'

CONFIG_CASES = {
    "pool beyond any server": (
        "[database]\npool_size = 100000\n",
        "database.pool_size: must be at most 1000",
        "max_connections",
    ),
    "a year of lookahead": (
        '[ticker]\nlookahead = "365d"\n',
        "ticker.lookahead: must be at most 1h",
        "created in advance",
    ),
    "a 3 ms lease": ('[worker]\nlease = "3ms"\n', "worker.lease: must be at least 1s", "lease"),
    "a job type's lease barely above the heartbeat": (
        '[worker]\nheartbeat = "20s"\n' + JOB + 'lease = "21s"\n',
        "job_types.noop.lease: must be at least twice worker.heartbeat (40s)",
        "late heartbeat",
    ),
    "a 3 ms job type lease": (
        '[worker]\nheartbeat = "1s"\n' + JOB + 'lease = "3ms"\n',
        "job_types.noop.lease: must be at least 1s",
        "lease",
    ),
}


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_check_refuses_settings_that_hurt_at_run_time(name: str, dsn: str, tmp_path: Path) -> None:
    text, names, why = CONFIG_CASES[name]
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = pgtick(dsn, "check", "--config", str(path))
    assert result.code == 2, result
    assert result.error.startswith(f"pgtick: {path}: {names}"), result.error
    assert why in result.error, result.error


@pytest.mark.parametrize("value", ["2147483648", "99999999999999999999"])
def test_enqueue_refuses_max_attempts_beyond_an_integer_column(
    value: str, dsn: str, conn: dbhelp.Connection
) -> None:
    result = pgtick(dsn, "enqueue", "noop", "--max-attempts", value)
    assert result.code == 2, result
    assert "--max-attempts" in result.error and "2147483647" in result.error, result.error
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_run_refuses_a_pool_the_server_cannot_serve(dsn: str, tmp_path: Path) -> None:
    """Within the bound, but more than the server's max_connections: `pgtick run` stops at
    start with the reason (it used to open connections until the server refused them, log
    thousands of "too many clients" lines, and exit 3 with a pool timeout naming no cause)."""
    with dbhelp.connect(dsn, "pgtick") as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
    assert row is not None
    path = tmp_path / "config.toml"
    path.write_text(f'[database]\npool_size = {row[0] + 1}\n[metrics]\nlisten = ""\n')
    result = pgtick(dsn, "run", "--config", str(path))
    assert result.code == 2, result
    line = result.error
    assert line.startswith(f"pgtick: {path}: database.pool_size:"), line
    assert f"max_connections = {row[0]}" in line, line
    assert "too many clients" not in "\n".join(result.out), "it tried anyway"


def test_check_and_run_name_the_processes_when_one_per_cpu_passes_the_servers_limit(
    dsn: str, tmp_path: Path
) -> None:
    """One process would fit, this many do not (the default's one per CPU on a big VM): the
    key to change is worker.processes, for `pgtick check --db` as for `pgtick run`."""
    with dbhelp.connect(dsn, "pgtick") as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
    assert row is not None
    processes = row[0] // 14 + 1  # a worker process's 13 pooled connections and its beat
    path = tmp_path / "config.toml"
    path.write_text(f'[worker]\nprocesses = {processes}\n[metrics]\nlisten = ""\n')
    for verb in (("check", "--db"), ("run",)):
        result = pgtick(dsn, *verb, "--config", str(path))
        assert result.code == 2, result
        line = result.error
        assert line.startswith(f"pgtick: {path}: worker.processes:"), line
        assert f"{processes} worker process(es)" in line, line
        assert f"max_connections = {row[0]}" in line, line
