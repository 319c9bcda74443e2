"""The version has one source: pyproject.toml, read back from the installed metadata."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pgtick

ROOT = Path(__file__).resolve().parents[2]


def test_version_comes_from_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert pgtick.__version__ == declared


def test_cli_prints_the_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgtick", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"pgtick {pgtick.__version__}"
