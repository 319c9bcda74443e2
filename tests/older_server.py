"""The integration tests again, on the oldest PostgreSQL installed from the distribution
(``make test`` runs this after the main pass, whose embedded server is PostgreSQL 18).

pgtick supports PostgreSQL 13 and newer, and servers differ in ways that only show when a
statement runs on them: before 18, a plan node the planner hints disable adds 1e10 to the
plan's cost, and a server built with LLVM then JIT-compiled every claim (seconds each on
PostgreSQL 15, where 18 took milliseconds). The embedded server has no JIT; Debian's
packages have it. This starts a throwaway cluster from ``/usr/lib/postgresql/N/bin`` (the
lowest N from 13 to 17; ``.ci/run`` installs ``postgresql-15``), runs ``pytest
tests/integration`` against it with ``PGTICK_TEST_DSN``, stops it and returns pytest's
status. Extra arguments go to pytest.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "postgresql-15"
# No TCP (listen_addresses is empty): the port only names the socket file, in a directory
# of this run's own, so the default will do.
PORT = 5432
ROOT = Path("/usr/lib/postgresql")
VERSIONS = range(13, 18)
SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "listen_addresses": "",
}


def bin_dir() -> Path | None:
    """The bin directory of the oldest supported server before 18 that is installed."""
    found = []
    for entry in ROOT.glob("*/bin/postgres") if ROOT.is_dir() else []:
        version = entry.parent.parent.name
        if re.fullmatch(r"\d+", version) and int(version) in VERSIONS:
            found.append((int(version), entry.parent))
    return min(found)[1] if found else None


def as_owner(owner: str | None, command: list[str]) -> list[str]:
    """``command`` as ``owner`` (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", owner, "--", *command] if owner else command


def main(args: list[str]) -> int:
    binaries = bin_dir()
    if binaries is None:
        print(
            f"tests/older_server.py: no PostgreSQL {VERSIONS[0]}-{VERSIONS[-1]} under {ROOT}:"
            f" apt-get install {PACKAGE}",
            file=sys.stderr,
        )
        return 1
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres").pw_name
        except KeyError:
            print(
                f"tests/older_server.py: no 'postgres' user (it comes with {PACKAGE})",
                file=sys.stderr,
            )
            return 1
    work = Path(tempfile.mkdtemp(prefix="pgtick-older-pg-"))
    data, sockets = work / "data", work / "sockets"
    sockets.mkdir()
    if owner:
        shutil.chown(work, owner)
        shutil.chown(sockets, owner)
    options = " ".join(f"-c {k}={v}" for k, v in SETTINGS.items())
    pg_ctl = [str(binaries / "pg_ctl"), "-w", "-D", str(data)]
    try:
        subprocess.run(
            as_owner(
                owner, [str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            as_owner(
                owner,
                [
                    *pg_ctl,
                    "-l",
                    str(work / "log"),
                    "-o",
                    f"-p {PORT} -k {sockets} {options}",
                    "start",
                ],
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        version = subprocess.run(
            [str(binaries / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        print(f"tests/older_server.py: tests/integration on {version}", flush=True)
        env = {
            **os.environ,
            "PGTICK_TEST_DSN": f"host={sockets} port={PORT} user=postgres dbname=postgres",
        }
        tests = Path(__file__).resolve().parent / "integration"
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", str(tests), *args], env=env, check=False
        ).returncode
    finally:
        subprocess.run(
            as_owner(owner, [*pg_ctl, "-m", "immediate", "stop"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
