"""What a new user runs into: `enqueue` of a job type the config does not declare warns on
stderr (and still enqueues), `check` without any config file says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtick import config as config_mod
from pgtick import db

from .cli import pgtick

CONFIG = """
[job_types.noop]
command = ["/bin/true"]
"""


def test_enqueue_of_an_undeclared_job_type_warns_and_enqueues(
    conn: db.Connection, dsn: str, tmp_path: Path
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
    assert config_mod.DEFAULT_CONFIG_PATH in bare.error


def test_check_without_a_config_file_says_which_file_it_looked_for(
    dsn: str, tmp_path: Path
) -> None:
    if Path(config_mod.DEFAULT_CONFIG_PATH).exists():
        pytest.fail(f"this test needs {config_mod.DEFAULT_CONFIG_PATH} to be absent")
    result = pgtick(dsn, "check")
    assert result.code == 0, result.err
    assert result.out[0] == (
        f"config: no config file ({config_mod.DEFAULT_CONFIG_PATH} does not exist; --config and"
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
