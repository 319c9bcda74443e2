"""What a new user runs into: `enqueue` of a job type the config does not declare warns on
stderr (and still enqueues), `check` without any config file says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dbhelp import Connection

from .cli import pgtick

DEFAULT_CONFIG_PATH = "/etc/pgtick/config.toml"  # README: Configuration

CONFIG = """
[job_types.noop]
command = ["/bin/true"]
"""


def test_enqueue_of_an_undeclared_job_type_warns_and_enqueues(
    conn: Connection, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    declared = pgtick(dsn, "enqueue", "noop", "--config", str(config))
    assert (declared.code, declared.err) == (0, [])

    typo = pgtick(dsn, "enqueue", "nosuchtype", "--config", str(config))
    assert typo.code == 0
    assert typo.error.startswith(
        f"pgtick: warning: job type 'nosuchtype' is not declared in {config}; enqueued anyway"
    )
    row = conn.execute("SELECT job_type, status FROM runs WHERE id = %s", (int(typo.out[0]),))
    assert row.fetchone() == ("nosuchtype", "queued")

    bare = pgtick(dsn, "enqueue", "noop")  # no config file at all
    assert bare.code == 0
    assert "is not declared in no config file" in bare.error
    assert DEFAULT_CONFIG_PATH in bare.error


def test_check_without_a_config_file_says_which_file_it_looked_for(
    dsn: str, tmp_path: Path
) -> None:
    if Path(DEFAULT_CONFIG_PATH).exists():
        pytest.fail(f"this test needs {DEFAULT_CONFIG_PATH} to be absent")
    result = pgtick(dsn, "check")
    assert result.code == 0, result.err
    assert result.out[0] == (
        f"config: no config file ({DEFAULT_CONFIG_PATH} does not exist; --config and"
        " $PGTICK_CONFIG not given); checking the defaults"
    )
    assert result.out[-1] == "defaults OK (no config file): 0 job types, 0 schedules"
    assert not any(line.startswith("config OK") for line in result.out)

    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    named = pgtick(dsn, "check", "--config", str(config))
    assert named.code == 0, named.err
    assert named.out[0] == f"config: {config}"
    assert named.out[-1] == "config OK: 1 job types, 0 schedules"


EVERY_MISTAKE = """
[worker]
threads = 0
thread = 3

[wroker]
x = 1

[job_types.a]
command = ["/bin/true"]
backoff = "quadratic"

[schedules.s1]
job_type = "a"
cron = "61 * * * *"
timezone = "Europe/Amsterdm"

[schedules.s2]
cron = "0 3 * * *"
"""


def test_check_reports_every_config_error_at_once(
    conn: Connection, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(EVERY_MISTAKE)
    result = pgtick(dsn, "check", "--config", str(config))
    assert result.code == 2
    assert result.out == []
    assert result.err == [
        f"pgtick: {config}: {line}"
        for line in (
            "wroker: unknown section (did you mean worker?)",
            "worker.threads: expected a positive integer, got 0",
            "worker.thread: unknown key (did you mean worker.threads?)",
            'job_types.a.backoff: must be one of exponential, linear, fixed (got "quadratic")',
            "schedules.s1.cron: minute field '61': out of range",
            "schedules.s1.timezone: unknown time zone 'Europe/Amsterdm'",
            "schedules.s2.job_type: missing (every schedule needs one)",
            "7 config errors",
        )
    ]
    # The daemon (and every other command) stops at the first.
    run = pgtick(dsn, "status", "--config", str(config))
    assert (run.code, run.error) == (
        2,
        f"pgtick: {config}: wroker: unknown section (did you mean worker?)",
    )


def test_handler_import_error_names_the_config_file(dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[job_types.a]\nhandler = "no_such_module_xyz:run"\n')
    for argv in (("check",), ("run",)):
        result = pgtick(dsn, *argv, "--config", str(config))
        assert result.code == 2
        assert result.error.startswith(
            f"pgtick: {config}: job_types.a.handler: cannot import module 'no_such_module_xyz'"
        ), result.error
