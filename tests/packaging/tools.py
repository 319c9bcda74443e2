"""Repository files and the real tools the packaging tests check them with."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
SYSTEMD = ROOT / "systemd"
README = ROOT / "README.md"


def tool(name: str, debian_package: str) -> str:
    """Path of a required tool; a missing one fails the test (CI must have it), never skips."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install the Debian package '{debian_package}'"
            f" (apt-get install {debian_package}; .ci/run does)",
            pytrace=False,
        )
    return path


def run(*args: str, cwd: Path | None = None, stdin: str | None = None) -> tuple[int, str]:
    """Exit code and combined output of a tool."""
    proc = subprocess.run(
        args,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of grafana/alerts.yml."""
    groups = load_yaml(GRAFANA / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def readme_anchors() -> set[str]:
    return {
        github_anchor(m.group(1))
        for m in re.finditer(r"^#{1,6} (.+)$", README.read_text(), flags=re.MULTILINE)
    }
