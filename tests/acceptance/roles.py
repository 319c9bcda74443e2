"""A login role with a password that the test server really checks (the embedded server
trusts local connections: one pg_hba line per role makes it ask for the password)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

PASSWORD_CHECK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Role:
    name: str
    password: str
    dsn: str  # the test database as this role, with its password

    def dsn_with(self, password: str) -> str:
        return make_conninfo(self.dsn, password=password)


def _password_required(dsn: str) -> bool:
    try:
        psycopg.connect(make_conninfo(dsn, password="not-" + uuid.uuid4().hex)).close()
    except psycopg.OperationalError:
        return True
    return False


@contextmanager
def login_role(admin_dsn: str, database_dsn: str) -> Iterator[Role]:
    """A fresh LOGIN role with a password (and no privileges), dropped afterwards."""
    name = f"pgtick_app_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        row = admin.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(row[0])
        rules = "".join(
            f"{kind} all {name} {addr} scram-sha-256\n"
            for kind, addr in (("local", ""), ("host", "127.0.0.1/32"), ("host", "::1/128"))
        )
        hba.write_text(rules + hba.read_text())
        admin.execute("SELECT pg_reload_conf()")
    role = Role(name, password, make_conninfo(database_dsn, user=name, password=password))
    deadline = time.monotonic() + PASSWORD_CHECK_TIMEOUT_SECONDS
    while not _password_required(role.dsn):  # the reload is asynchronous
        assert time.monotonic() < deadline, "the server does not check the role's password"
        time.sleep(0.05)
    try:
        yield role
    finally:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
