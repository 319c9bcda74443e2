"""`pgtick check` refuses everything `pgtick run` would refuse at start (issue 44, item 1):
`check --db` said "config OK" for a config with `web.listen` set while the console extra was
not installed, and `pgtick run` then exited 2, which the unit's RestartPreventExitStatus=2
keeps down. Both now run the same start-up checks (operations.startup_checks and
database_checks); each case here is refused by both, with the same line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK_TIMEOUT_SECONDS = 60
RUN_TIMEOUT_SECONDS = 60


def _pgtick(dsn: str, config: Path, *argv: str, pythonpath: str = "") -> tuple[int, str]:
    env = {**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick", *argv, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stderr


def _refused_line(stderr: str) -> str:
    """The one `pgtick: ...` line of a refusal (run logs JSON lines before it)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("pgtick: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def _no_console_extra(tmp_path: Path) -> str:
    """A path on which `import waitress` fails, as where the extra is not installed."""
    fake = tmp_path / "no-extra" / "waitress"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('waitress is not installed')\n")
    return str(fake.parent)


CASES = {
    "console extra missing": ('[web]\nlisten = "127.0.0.1:0"\n', "extra", "pgtick[console]"),
    "token file unreadable": (
        '[web]\nlisten = "127.0.0.1:0"\ntoken_file = "/nonexistent/pgtick-token"\n',
        "",
        "web.token_file",
    ),
    "more connections than the server has": (
        "[database]\npool_size = 100000\n",
        "",
        "database.pool_size",
    ),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_what_run_refuses(dsn: str, tmp_path: Path, case: str) -> None:
    text, extra, named = CASES[case]
    config = tmp_path / "config.toml"
    config.write_text(text)
    path = _no_console_extra(tmp_path) if extra else ""
    run_code, run_err = _pgtick(dsn, config, "run", pythonpath=path)
    check_code, check_err = _pgtick(dsn, config, "check", "--db", pythonpath=path)
    assert run_code == 2, run_err
    assert check_code == 2, check_err
    assert named in _refused_line(run_err)
    assert _refused_line(check_err) == _refused_line(run_err)
