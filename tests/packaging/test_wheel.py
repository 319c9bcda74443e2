"""The wheel `make dist` builds carries the SQL, the console's files and the deployment files."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pgtick

ROOT = Path(__file__).resolve().parents[2]

DEPLOY_FILES = {
    "pgtick.service": ROOT / "systemd" / "pgtick.service",
    "config.example.toml": ROOT / "config.example.toml",
    "dashboard.json": ROOT / "grafana" / "dashboard.json",
    "alerts.yml": ROOT / "grafana" / "alerts.yml",
}


def test_wheel_carries_package_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        check=True,
        timeout=180,
    )
    wheel = tmp_path / f"pgtick-{pgtick.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name, source in DEPLOY_FILES.items():
            # the wheel holds the canonical file's content, not a dangling link
            assert zf.read(f"pgtick/deploy_files/{name}") == source.read_bytes(), name
    assert "pgtick/storage/sql/queries.sql" in names
    assert "pgtick/surfaces/operations/charts.sql" in names  # the console's queue depth
    assert any(n.startswith("pgtick/storage/sql/migrations/0001_") for n in names)
    assert "pgtick/surfaces/console/templates/base.html" in names
    assert "pgtick/surfaces/console/static/console.css" in names
    # The license the metadata names, as a file: at the root and in the wheel and the sdist.
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    dist_info = f"pgtick-{pgtick.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(f"{dist_info}/licenses/LICENSE").decode() == license_text
        assert "License-Expression: MIT" in zf.read(f"{dist_info}/METADATA").decode()


def test_sdist_carries_the_license(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        check=True,
        timeout=180,
    )
    (sdist,) = tmp_path.glob("pgtick-*.tar.gz")
    with tarfile.open(sdist) as tf:
        member = tf.extractfile(f"pgtick-{pgtick.__version__}/LICENSE")
        assert member is not None
        assert member.read() == (ROOT / "LICENSE").read_bytes()
