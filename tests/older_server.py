"""The integration tests again, on the oldest PostgreSQL installed from the distribution
(``make test`` runs this after the main pass, whose embedded server is PostgreSQL 18).

pgtick supports PostgreSQL 13 and newer, and servers differ in ways that only show when a
statement runs on them: before 18, a plan node the planner hints disable adds 1e10 to the
plan's cost, and a server built with LLVM then JIT-compiled every claim (seconds each on
PostgreSQL 15, where 18 took milliseconds). The embedded server has no JIT; Debian's
packages have it. This starts a throwaway cluster from ``/usr/lib/postgresql/N/bin`` (the
lowest N from 13 to 17; ``.ci/run`` installs ``postgresql-15``; ``pgtick.embedded``'s
``InstalledPostgres``, which ``python -m bench PART --server 15`` starts too), runs ``pytest
tests/integration`` against it with ``PGTICK_TEST_DSN``, stops it and returns pytest's
status. Extra arguments go to pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pgtick.embedded import (
    INSTALLED_ROOT,
    THROWAWAY_SETTINGS,
    InstalledPostgres,
    installed_versions,
)
from pgtick.errors import ConfigError

PACKAGE = "postgresql-15"
VERSIONS = range(13, 18)
SETTINGS = {
    **THROWAWAY_SETTINGS,
    "max_connections": "300",
    "listen_addresses": "",
}


def bin_dir() -> Path | None:
    """The bin directory of the oldest supported server before 18 that is installed."""
    found = [path for version, path in installed_versions().items() if version in VERSIONS]
    return found[0] if found else None


def main(args: list[str]) -> int:
    binaries = bin_dir()
    if binaries is None:
        print(
            f"tests/older_server.py: no PostgreSQL {VERSIONS[0]}-{VERSIONS[-1]} under "
            f"{INSTALLED_ROOT}: apt-get install {PACKAGE}",
            file=sys.stderr,
        )
        return 1
    work = Path(tempfile.mkdtemp(prefix="pgtick-older-pg-"))
    server = None
    try:
        try:
            server = InstalledPostgres(binaries, work, SETTINGS)
        except ConfigError as exc:
            print(f"tests/older_server.py: {exc}", file=sys.stderr)
            return 1
        print(f"tests/older_server.py: tests/integration on {server.version()}", flush=True)
        env = {**os.environ, "PGTICK_TEST_DSN": server.dsn}
        tests = Path(__file__).resolve().parent / "integration"
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", str(tests), *args], env=env, check=False
        ).returncode
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
