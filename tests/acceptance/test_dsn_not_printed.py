"""A DSN is never printed with its password: libpq's errors about a DSN it cannot parse quote
it whole, and `pgtick run` (stderr: the journal under systemd) and every verb printed the
password with them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.cli import pgtick

SECRET = "hunter2secret"
BAD_DSNS = {
    "unclosed IPv6 bracket": f"postgresql://pgtick:{SECRET}@[db.internal/app",
}


@pytest.mark.parametrize("name", list(BAD_DSNS))
def test_a_malformed_dsn_is_refused_without_showing_its_password(name: str, dsn: str) -> None:
    result = pgtick(dsn, "status", "--dsn", BAD_DSNS[name])
    assert result.code in (2, 3), result
    assert SECRET not in "\n".join(result.out + result.err), result.err


def test_run_does_not_print_the_password_of_a_malformed_dsn(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[metrics]\nlisten = ""\n[logging]\nformat = "json"\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgtick",
            "run",
            "--config",
            str(path),
            "--dsn",
            BAD_DSNS["unclosed IPv6 bracket"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert SECRET not in proc.stdout + proc.stderr, proc.stderr
