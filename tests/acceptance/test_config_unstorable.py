"""Config files the loader crashed on, or that `pgtick check` passed and `pgtick run` then
failed on in the database: one line naming the key (or the file) and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.acceptance.cli import pgtick

JOB = '[job_types.noop]\ncommand = ["/bin/true"]\n'
NUL_SCHEDULE = JOB + (
    '[schedules.nightly]\njob_type = "noop"\ncron = "0 3 * * *"\npayload = { note = "a\\u0000b" }\n'
)


def test_check_refuses_a_schedule_payload_jsonb_cannot_store(dsn: str, tmp_path: Path) -> None:
    """`pgtick enqueue --payload` refuses a NUL character (jsonb refuses it); a schedule's
    payload with one passed `pgtick check` ("config OK")..."""
    path = tmp_path / "config.toml"
    path.write_text(NUL_SCHEDULE)
    result = pgtick(dsn, "check", "--config", str(path))
    assert result.code == 2, (result.code, result.out, result.err)
    assert "schedules.nightly.payload" in result.err[-1], result.err


def test_run_names_the_key_of_a_schedule_payload_jsonb_cannot_store(
    dsn: str, tmp_path: Path
) -> None:
    """...and then `pgtick run` exited 3 ("database unreachable") with
    `pgtick: sync_schedules: UntranslatableCharacter: unsupported Unicode escape sequence`."""
    path = tmp_path / "config.toml"
    path.write_text(NUL_SCHEDULE + '[metrics]\nlisten = ""\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick", "run", "--config", str(path), "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert "schedules.nightly.payload" in proc.stderr, proc.stderr[-500:]


def test_a_huge_toml_integer_is_a_config_error_not_an_internal_error(
    dsn: str, tmp_path: Path
) -> None:
    """tomllib raises ValueError (int() of more than 4300 digits), which load_config did not
    catch: `pgtick: internal error: Exceeds the limit (4300 digits) ...`, exit 1."""
    path = tmp_path / "config.toml"
    path.write_text("[worker]\nthreads = " + "9" * 5000 + "\n")
    result = pgtick(dsn, "check", "--config", str(path))
    assert result.code == 2, (result.code, result.err)
    assert str(path) in result.error and "internal error" not in result.error, result.err
