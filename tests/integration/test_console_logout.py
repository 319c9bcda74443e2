"""A console logout ends the session on every daemon (finding 11): logged out on daemon A, the
same cookie and CSRF token still cancelled a run through daemon B's console, because each
daemon remembered its own logouts in memory. Two consoles here, each on a pool of its own over
one database, as two daemons are."""

from __future__ import annotations

import http.client
import re
import time
import uuid
from collections.abc import Iterator
from typing import cast

import pytest
from psycopg import sql

from pgtick.storage import db, migrate
from pgtick.storage.store import Pool, RunStore
from pgtick.surfaces.console import gate
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import ConsoleServer
from tests.conftest import SCHEMA

TOKEN = "logout-token-0123456789"


def call(
    port: int, method: str, path: str, body: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = {
            "Host": f"127.0.0.1:{port}",
            "Content-Type": "application/x-www-form-urlencoded",
            **(headers or {}),
        }
        conn.request(method, path, body=body.encode(), headers=sent)
        response = conn.getresponse()
        data = response.read().decode()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:500]
    return found.group(1)


def serve(store: RunStore) -> ConsoleServer:
    server = ConsoleServer(
        "web.listen",
        "127.0.0.1",
        0,
        Console(store, TOKEN, heartbeat_seconds=20).routes(),
        SECURITY_HEADERS,
    )
    server.start()
    return server


@pytest.fixture
def consoles(store: RunStore, dsn: str) -> Iterator[tuple[int, int, int]]:
    """The ports of three consoles over one database, each with a pool of its own."""
    pools = [db.make_pool(dsn, SCHEMA, size=2, name=f"pgtick-web-{n}") for n in (2, 3)]
    servers = [serve(store), *(serve(RunStore(pool)) for pool in pools)]
    try:
        yield servers[0].port, servers[1].port, servers[2].port
    finally:
        for server in servers:
            server.stop()
        for pool in pools:
            pool.close()


def login(port: int) -> dict[str, str]:
    """The session cookie, as the header a browser would send, from the login form."""
    _, headers, page = call(port, "GET", "/login")
    form_cookie = headers["set-cookie"].split(";")[0]
    status, headers, _ = call(
        port,
        "POST",
        "/login",
        f"csrf={csrf_of(page)}&token={TOKEN}&name=tester",
        {"Cookie": form_cookie},
    )
    assert status == 303, status
    return {"Cookie": headers["set-cookie"].split(";")[0]}


def status_of(conn: db.Connection, run_id: int) -> str:
    row = conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return str(row[0])


def test_a_logout_on_one_daemon_ends_the_session_on_every_daemon(
    consoles: tuple[int, int, int], conn: db.Connection
) -> None:
    a, b, c = consoles
    first, second = (
        int(conn.execute("SELECT pgtick.enqueue('t')").fetchone()[0])  # type: ignore[index]
        for _ in range(2)
    )
    cookie = login(a)
    csrf = csrf_of(call(a, "GET", f"/runs/{first}", headers=cookie)[2])
    # the session is every daemon's: B acts on it, C shows its forms
    status, headers, _ = call(b, "POST", "/actions/cancel", f"run_id={first}&csrf={csrf}", cookie)
    assert (status, status_of(conn, first)) == (303, "cancelled"), headers
    status, _, page = call(c, "GET", f"/runs/{second}", headers=cookie)
    assert status == 200 and 'id="logout"' in page and csrf_of(page) == csrf

    status, headers, _ = call(a, "POST", "/logout", f"csrf={csrf}", cookie)
    assert (status, headers["location"]) == (303, "/login")
    assert "Max-Age=0" in headers["set-cookie"]

    # the same cookie and CSRF token, through B and C (which showed the forms just now):
    # refused, nothing done; an action asks the database every time
    for port in (b, c):
        status, _, page = call(
            port, "POST", "/actions/cancel", f"run_id={second}&csrf={csrf}", cookie
        )
        assert status == 403 and "logged out" in page, page[:300]
        status, _, _ = call(port, "POST", "/actions/trigger", f"schedule=x&csrf={csrf}", cookie)
        assert status == 403
    assert status_of(conn, second) == "queued"
    # a new login is a new session, taken everywhere
    fresh = login(b)
    page = call(c, "GET", f"/runs/{second}", headers=fresh)[2]
    form = f"run_id={second}&csrf={csrf_of(page)}"
    assert call(a, "POST", "/actions/cancel", form, fresh)[0] == 303
    assert status_of(conn, second) == "cancelled"


def test_a_page_sees_a_logout_elsewhere_within_the_check_interval(
    consoles: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages take an answer about a session up to SESSION_CHECK_SECONDS old (5 s; half a
    second here): one query per session that often, not one per page."""
    monkeypatch.setattr(gate, "SESSION_CHECK_SECONDS", 0.5)  # changed by issue 46: in gate
    a, b, _ = consoles
    cookie = login(a)
    page = call(b, "GET", "/schedules", headers=cookie)[2]
    assert 'id="logout"' in page  # B asked the database, and keeps the answer a while
    csrf = csrf_of(page)
    assert call(a, "POST", "/logout", f"csrf={csrf}", cookie)[0] == 303
    time.sleep(0.6)
    page = call(b, "GET", "/schedules", headers=cookie)[2]
    assert 'id="logout"' not in page and 'name="csrf"' not in page


def test_a_logout_is_kept_until_a_day_past_its_expiry(store: RunStore, conn: db.Connection) -> None:
    conn.execute(
        "INSERT INTO console_logouts (nonce, expires_at) VALUES"
        " ('long-gone', now() - interval '25 hours'), ('just-expired', now() - interval '1 hour')"
    )
    store.console_logout("new", 2_000_000_000)
    store.console_logout("new", 2_000_000_000)  # twice: changes nothing
    rows = conn.execute(
        "SELECT nonce, extract(epoch FROM expires_at)::bigint FROM console_logouts ORDER BY 1"
    ).fetchall()
    assert rows == [("just-expired", rows[0][1]), ("new", 2_000_000_000)]
    assert store.console_logged_out("new") and not store.console_logged_out("other")


def test_the_daemons_role_may_record_logouts_granted_before_or_after_the_migration(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role granted what the daemon needs before migration 0016 may record and read
    logouts once it is applied (a rolling deploy need not run `pgtick grants` first); a role
    granted after gets the same from `pgtick grants`."""
    shipped = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [m for m in shipped if m.version < "0016"])
    migrate.migrate(empty_dsn, SCHEMA)
    roles = [f"pgtick_app_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with db.connect_raw(empty_dsn) as conn:
        conn.autocommit = True
        try:
            for role in roles:
                conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
            # What the previous version's `pgtick grants` printed: today's lines less those of
            # the tables later migrations create (console_logouts and after).
            later = (
                "console_logouts",
                "job_type_controls",
                "audit_log",
                "batches",
                "batches_id_seq",
                "rollup_minutes",
                "rollup_hours",
            )
            earlier = [
                line
                for line in migrate.grants_sql(roles[0], SCHEMA).splitlines()
                if not any(f".{table}" in line for table in later)
            ]
            conn.execute("\n".join(earlier).encode())
            monkeypatch.setattr(migrate, "available", lambda: shipped)
            assert migrate.migrate(empty_dsn, SCHEMA)[0] == "0016_create_console_logouts"
            conn.execute(migrate.grants_sql(roles[1], SCHEMA).encode())
            for role in roles:  # the store's own statements, as the role
                with db.connect(empty_dsn, SCHEMA) as as_role:
                    as_role.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
                    store = RunStore(cast(Pool, None), as_role)
                    store.console_logout(role, 2_000_000_000)
                    assert store.console_logged_out(role)
        finally:
            for role in roles:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
