"""`pgtick grants` covers every function the granted role's paths reach, in a database whose
default privileges do not give EXECUTE to PUBLIC (issue 42, finding 6: a keyed enqueue failed
there with "permission denied for function key_lock"). The walk: every function of the schema
is executable by the role, and a keyed enqueue works from SQL and from the CLI as that role."""

from __future__ import annotations

import psycopg
import pytest

from tests.dbhelp import migrate

from .cli import pgtick
from .roles import login_role


@pytest.mark.timeout(120)
def test_grants_cover_every_function_under_revoked_defaults(
    pg_admin_dsn: str, empty_dsn: str
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        owner.execute("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
        owner.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
    migrate(empty_dsn)
    with login_role(pg_admin_dsn, empty_dsn) as role:
        printed = pgtick(empty_dsn, "grants", role.name)
        assert printed.code == 0, printed.err
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            owner.execute(printed.text.encode())
            functions = owner.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgtick'"
            ).fetchall()
            assert len(functions) >= 3
            refused = owner.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'pgtick' AND NOT has_function_privilege(%s, p.oid, 'EXECUTE')",
                (role.name,),
            ).fetchall()
            assert refused == []

        with psycopg.connect(role.dsn, autocommit=True) as app:
            first = app.execute("SELECT pgtick.enqueue('mail', '{}', NULL, 'order-1')").fetchone()
            again = app.execute("SELECT pgtick.enqueue('mail', '{}', NULL, 'order-1')").fetchone()
            assert first is not None and first == again
        by_cli = pgtick(role.dsn, "enqueue", "mail", "--key", "order-1")
        assert by_cli.code == 0, by_cli.err
        assert by_cli.text.strip() == str(first[0])
        other = pgtick(role.dsn, "enqueue", "mail", "--key", "order-2")
        assert other.code == 0, other.err
        assert other.text.strip() != str(first[0])
