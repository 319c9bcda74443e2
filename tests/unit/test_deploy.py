"""`pgtick deploy-files DIR` writes the deployment files; overwrites only with --force."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtick.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


def test_deploy_files_writes_canonical_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert cli.main(["deploy-files", str(out)]) == 0
    assert (out / "pgtick.service").read_bytes() == (ROOT / "systemd/pgtick.service").read_bytes()
    assert (out / "alerts.yml").read_bytes() == (ROOT / "grafana/alerts.yml").read_bytes()
    assert (out / "dashboard.json").exists()
    assert (out / "config.example.toml").exists()
    capsys.readouterr()
    assert cli.main(["deploy-files", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--force" in err
    assert cli.main(["deploy-files", "--force", str(out)]) == 0
