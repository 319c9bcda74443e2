"""Applies ``sql/migrations/NNNN_*.sql`` in order, each in its own transaction under a
transaction-level advisory lock, recording each file's sha256; an applied file that changed
is an error. The lock lives and dies with the transaction, so ``migrate`` works through a
transaction-mode pooler (PgBouncer): nothing is left on the server connection it ran on.

A file whose first line is ``-- pgtick: no-transaction`` runs statement by statement in
autocommit instead (``CREATE INDEX CONCURRENTLY`` cannot run in a transaction, and it is what
lets daemons of the previous version keep writing while an index builds). Its statements end
with ``;`` at the end of a line (outside ``$$`` bodies) and must each be safe to run again:
the file is recorded only when all succeeded. A statement under the line
``-- pgtick: gexec`` is a query whose rows are the statements to run (DDL for each partition
there is at the time). Such a file needs the connection's session (its
``search_path`` and a session advisory lock), so it runs so only on a direct connection.
Through a transaction-mode pooler the same statements run without ``CONCURRENTLY``, in one
locked transaction like any other file: the index is built while writes to its table wait
(instant on a fresh install; on a large table run ``migrate`` once with a direct DSN instead),
and ``migrate`` logs which file it built that way.

A file with the line ``-- pgtick: stop-daemons`` among its leading comments changes what the
daemons of earlier versions read and write (a storage cut-over, where no compatibility shim
can keep them right). ``migrate`` refuses to apply it while any daemon is alive (heartbeated in
the last ``ALIVE_WITHIN_SECONDS``), naming them, unless forced: those daemons would go on
claiming and finishing by the old rules against the new tables. Every other migration is
applied under running daemons (rolling deploys).

A transactional file may open with a prelude, the statements up to a line
``-- pgtick: end of prelude``: it commits in a transaction of its own (under the same lock)
before the rest, so that what the rest's locks hold up meets the prelude's effect once they are
granted (0010 replaces ``enqueue()`` so that the application's enqueues waiting for its
cut-over work against the new table). A prelude must leave the database right for the code
before the file as well, and be safe to run again.

A file revised after its release lists the sha256 of its earlier texts in ``EARLIER_TEXTS``:
a database that applied one of them is where the revised text leaves it (a revision may change
how a file is applied, never what it leaves).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

import psycopg
import structlog
from psycopg import sql

from pgtick.errors import MigrationError, SchemaNewerError, SchemaOutdatedError, UsageError
from pgtick.observability.progress import Progress
from pgtick.storage import db, sqlfile

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
NO_TRANSACTION_MARKER = "-- pgtick: no-transaction"
STOP_DAEMONS_MARKER = "-- pgtick: stop-daemons"
PRELUDE_END_MARKER = "-- pgtick: end of prelude"
GEXEC_MARKER = "-- pgtick: gexec"
# version -> the sha256 of the file's texts before its revision (module docstring).
EARLIER_TEXTS: dict[str, frozenset[str]] = {
    # 0010 gained its prelude (enqueues waiting for the cut-over, issue 42).
    "0010": frozenset({"62b56bd1817438f7aae0e0e23e9ddde6150427b384b7550de5564bdfd9051286"}),
}
PROGRESS_PREFIX = "pgtick progress: "
# The migration that added schema_migrations.stops_daemons and marked the stop-daemons files
# before it; migrate marks each later one as it records it.
STOPS_RECORDED_FROM = "0014"
# A registered daemon that heartbeated this recently counts as alive for a stop-daemons
# migration: longer than any heartbeat interval in use (lease / 3 by default), so a live
# daemon is never missed; a daemon killed within it blocks until then, or --force.
ALIVE_WITHIN_SECONDS = 600.0
_LISTED_DAEMONS = 5
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_CONCURRENTLY = re.compile(r"\s+CONCURRENTLY\b", re.IGNORECASE)
# How often a migrator waiting for another one's advisory lock tries again. It polls rather
# than blocks: a session blocked in pg_advisory_lock holds a snapshot, and CREATE INDEX
# CONCURRENTLY in the lock holder would wait for that snapshot (a deadlock).
LOCK_POLL_SECONDS = 0.1
log = structlog.get_logger("pgtick.migrate")


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str
    sha256: str

    @property
    def transactional(self) -> bool:
        """False for files that must run outside a transaction (concurrent index builds)."""
        return not self.sql.startswith(NO_TRANSACTION_MARKER)

    @property
    def stops_daemons(self) -> bool:
        """True for files that daemons of earlier versions cannot run across."""
        for line in self.sql.splitlines():
            if not line.startswith("--"):
                return False
            if line.strip() == STOP_DAEMONS_MARKER:
                return True
        return False

    def parts(self) -> tuple[str | None, str]:
        """(prelude or None, the rest): a transactional file's two transactions."""
        lines = self.sql.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.strip() == PRELUDE_END_MARKER:
                return "".join(lines[:i]), "".join(lines[i + 1 :])
        return None, self.sql

    def statements(self) -> list[str]:
        """The file's statements (no-transaction files): each ends at a ``;`` that ends a line
        outside a ``$$`` body; comment-only chunks are dropped."""
        out: list[str] = []
        current: list[str] = []
        in_body = False
        for line in self.sql.splitlines():
            current.append(line)
            in_body ^= line.count("$$") % 2 == 1
            if not in_body and _STATEMENT_END.search(line):
                code = [ln for ln in current if not ln.lstrip().startswith("--")]
                if "".join(code).strip():
                    out.append("\n".join(current).strip())
                current = []
        if "".join(ln for ln in current if not ln.lstrip().startswith("--")).strip():
            out.append("\n".join(current).strip())
        return out


def available() -> list[Migration]:
    """The migration files shipped with this code, in order."""
    folder = importlib.resources.files("pgtick.storage").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            text = entry.read_text("utf-8")
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            found.append(Migration(match.group(1), match.group(2), text, digest))
    return sorted(found, key=lambda m: m.version)


def applied(conn: db.Connection, schema: str) -> dict[str, tuple[str, str]]:
    """{version: (name, sha256)} of what the database has applied; empty if never migrated."""
    exists = conn.execute(
        sqlfile.query("migrations_table_exists", schema), {"table": f'"{schema}".schema_migrations'}
    ).fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(sqlfile.with_schema("applied_migrations", schema)).fetchall()
    return {version: (name, sha) for version, name, sha in rows}


def _verify(done: dict[str, tuple[str, str]], files: list[Migration]) -> list[Migration]:
    """Check applied files are unchanged; return the pending ones."""
    by_version = {m.version: m for m in files}
    for version, (_name, sha) in done.items():
        migration = by_version.get(version)
        earlier = EARLIER_TEXTS.get(version, frozenset())
        if migration is not None and migration.sha256 != sha and sha not in earlier:
            raise MigrationError(
                f"migration {version}_{migration.name}.sql was changed after it was applied "
                f"(database has sha256 {sha[:12]}, file has {migration.sha256[:12]}); "
                "applied migrations must never be edited: add a new one"
            )
    return [m for m in files if m.version not in done]


def pending(conn: db.Connection, schema: str) -> list[Migration]:
    """Migrations not yet applied (raises MigrationError if an applied one changed)."""
    return _verify(applied(conn, schema), available())


def check_current(conn: db.Connection, schema: str) -> None:
    """Refuse to run against a schema older than this code, or newer by a stop-daemons
    migration this code does not know. Newer by any other migration is fine: rolling deploys
    run old daemons against it."""
    files = available()
    todo = _verify(applied(conn, schema), files)
    if todo:
        names = ", ".join(f"{m.version}_{m.name}" for m in todo)
        raise SchemaOutdatedError(
            f"database schema {schema!r} is older than this pgtick (pending: {names}); "
            "run `pgtick migrate` (or start with `pgtick run --migrate`)"
        )
    known = {m.version for m in files}
    rows = conn.execute(sqlfile.with_schema("stop_daemons_migrations", schema)).fetchall()
    unknown = [f"{version}_{name}" for version, name in rows if version not in known]
    if unknown:
        raise SchemaNewerError(
            f"database schema {schema!r} has {', '.join(unknown)} applied, which changed the "
            "tables daemons of earlier versions read and write, and this pgtick predates it; "
            "install the pgtick that brought it on this host (docs/operations: Rolling deploy)"
        )


MAX_ROLE_NAME_CHARS = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are cut silently


def grants_sql(role: str, schema: str, *, monitor: bool = False) -> str:
    """The GRANT statements a daemon's (and the operator CLI's) role needs on ``schema``, one
    per line, ready for psql: everything but CREATE, which stays with the schema owner. With
    ``monitor``, also pg_monitor (who holds the MVCC horizon, whatever their role)."""
    if not role or len(role) > MAX_ROLE_NAME_CHARS:
        raise UsageError(
            f"ROLE: a role name of 1 to {MAX_ROLE_NAME_CHARS} characters, got {len(role)}"
        )
    names = ["grants", "grant_monitor"] if monitor else ["grants"]
    return "\n".join(
        sql.SQL(sqlfile.queries()[name])
        .format(schema=sql.Identifier(schema), role=sql.Identifier(role))
        .as_string(None)
        .strip()
        + ";"
        for name in names
    )


def _poll(take: Callable[[], bool]) -> None:
    """Call ``take`` until it gets the lock, every ``LOCK_POLL_SECONDS``."""
    waiting = threading.Event()
    while not take():
        waiting.wait(LOCK_POLL_SECONDS)


def _try(conn: db.Connection, schema: str, query: str) -> bool:
    row = conn.execute(sqlfile.query(query, schema), {"schema": schema}).fetchone()
    return row is not None and bool(row[0])


@contextlib.contextmanager
def _locked_transaction(conn: db.Connection, schema: str) -> Iterator[None]:
    """A transaction holding the migrators' transaction-level lock (polled, each try in a
    transaction of its own so that no waiting transaction holds a snapshot for long)."""
    waiting = threading.Event()
    while True:
        with conn.transaction():
            if _try(conn, schema, "migrations_try_xact_lock"):
                yield
                return
        waiting.wait(LOCK_POLL_SECONDS)


def _apply_transactional(conn: db.Connection, schema: str, migration: Migration) -> None:
    """Inside the caller's locked transaction (the file less its prelude, if it has one)."""
    conn.execute(sqlfile.with_schema("set_local_search_path", schema))
    conn.execute(migration.parts()[1].encode("utf-8"))
    _record(conn, schema, migration)


def _apply_prelude(conn: db.Connection, schema: str, prelude: str) -> None:
    """Inside the caller's locked transaction, which commits it before the rest of its file."""
    conn.execute(sqlfile.with_schema("set_local_search_path", schema))
    conn.execute(prelude.encode("utf-8"))


def _is_gexec(statement: str) -> bool:
    return any(line.strip() == GEXEC_MARKER for line in statement.splitlines())


def _run(conn: db.Connection, statement: str, *, pooled: bool) -> None:
    """One statement of a no-transaction file. A ``-- pgtick: gexec`` one is a query whose
    rows are statements, each run in turn (psql's \\gexec): DDL for every partition there is,
    which a file cannot name. A generated statement on a table or index that is gone when its
    turn comes (retention dropped the partition meanwhile) is passed over: nothing is left to
    do to it. Through a pooler (inside the migration's transaction) each runs under a
    savepoint, so that such a one does not abort the rest."""
    text = _CONCURRENTLY.sub("", statement) if pooled else statement
    if not _is_gexec(statement):
        conn.execute(text.encode("utf-8"))
        return
    for (generated,) in conn.execute(text.encode("utf-8")).fetchall():
        sql_text = _CONCURRENTLY.sub("", generated) if pooled else generated
        try:
            if pooled:
                with conn.transaction():
                    conn.execute(sql_text.encode("utf-8"))
            else:
                conn.execute(sql_text.encode("utf-8"))
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedObject) as exc:
            log.info("migration_statement_passed_over", statement=generated, reason=str(exc))


def _apply_without_concurrently(conn: db.Connection, schema: str, migration: Migration) -> None:
    """A no-transaction file through a pooler: its statements without CONCURRENTLY, inside the
    caller's locked transaction (writes to the indexed tables wait for each build)."""
    conn.execute(sqlfile.with_schema("set_local_search_path", schema))
    for statement in migration.statements():
        _run(conn, statement, pooled=True)
    _record(conn, schema, migration)


def _record(conn: db.Connection, schema: str, migration: Migration) -> None:
    """Record an applied file, and whether it stops daemons once the history can say so."""
    params = {"version": migration.version, "name": migration.name, "sha256": migration.sha256}
    conn.execute(sqlfile.with_schema("record_migration", schema), params)
    if migration.stops_daemons and migration.version > STOPS_RECORDED_FROM:
        conn.execute(sqlfile.with_schema("mark_stops_daemons", schema), params)


def _apply_outside_transaction(conn: db.Connection, schema: str, migration: Migration) -> bool:
    """A no-transaction file on a direct connection, under the session lock; False if another
    migrator applied it meanwhile."""
    _poll(lambda: _try(conn, schema, "migrations_try_lock"))
    try:
        if migration.version in applied(conn, schema):
            return False
        # Statements that cannot run in a transaction (CREATE INDEX CONCURRENTLY) need a
        # session search_path: this is why the file needs a direct connection.
        conn.execute(sqlfile.with_schema("migration_search_path", schema))
        for statement in migration.statements():
            _run(conn, statement, pooled=False)
        _record(conn, schema, migration)
        return True
    finally:
        conn.execute(sqlfile.query("migrations_unlock", schema), {"schema": schema})


def check_privileges(conn: db.Connection, schema: str) -> None:
    """Refuse, in one line, a role that cannot migrate: migrations create and alter tables,
    which only the schema's owner may do (the daemon's role has no such rights, by design)."""
    row = conn.execute(sqlfile.query("migrate_privileges", schema), {"schema": schema}).fetchone()
    assert row is not None
    exists, owner, acts_as_owner, create_db, user = row
    if exists and not acts_as_owner:
        raise MigrationError(
            f"migrate: role {user!r} is not the owner of schema {schema!r} (owner: {owner!r}); "
            "migrations run as the schema owner: run `pgtick migrate` with the owner's DSN "
            "(docs/operations: Database roles)"
        )
    if not exists and not create_db:
        raise MigrationError(
            f"migrate: schema {schema!r} does not exist and role {user!r} has no CREATE on "
            "this database; migrations run as the schema owner: run `pgtick migrate` as the "
            "role that should own it (docs/operations: Database roles)"
        )


def _check_daemons_stopped(conn: db.Connection, schema: str, name: str, *, force: bool) -> None:
    """Refuse the stop-daemons migration ``name`` while daemons are alive (see the module
    docstring); with ``force``, log them and go on."""
    rows = conn.execute(
        sqlfile.query("alive_workers", schema), {"within": ALIVE_WITHIN_SECONDS}
    ).fetchall()
    if not rows:
        return
    daemons = [
        f"{host}:{pid} (pgtick {version}, {age:.0f} s ago)" for host, pid, version, age in rows
    ]
    if force:
        log.warning("migration_forced", migration=name, alive=daemons)
        return
    listed = ", ".join(daemons[:_LISTED_DAEMONS])
    if len(daemons) > _LISTED_DAEMONS:
        listed += f" and {len(daemons) - _LISTED_DAEMONS} more"
    raise MigrationError(
        f"migrate: {name} changes the tables daemons of earlier versions read and write, and "
        f"{len(daemons)} daemon(s) heartbeated in the last {ALIVE_WITHIN_SECONDS:.0f} s: "
        f"{listed}; stop every pgtick daemon first, or pass --force if they are gone "
        "(docs/operations: Rolling deploy)"
    )


class _CopyProgress:
    """A long migration's NOTICEs ``PROGRESS_PREFIX TABLE DONE TOTAL`` as the progress of each
    table's copy: rows done, rate and time left in the log, and on ``stream`` when it is a
    terminal (as `pgtick prune` shows its own)."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._tables: dict[str, Progress] = {}

    def __call__(self, notice: psycopg.errors.Diagnostic) -> None:
        message = notice.message_primary or ""
        if not message.startswith(PROGRESS_PREFIX):
            return
        table, done, total = message.removeprefix(PROGRESS_PREFIX).split()
        progress = self._tables.get(table)
        if progress is None:
            progress = Progress(f"migrate {table}", int(total), stream=self._stream)
            self._tables[table] = progress
        progress.advance(int(done) - progress.done)
        if int(done) >= int(total):
            progress.finish()


def migrate(
    dsn: str, schema: str, *, force: bool = False, progress_stream: TextIO | None = None
) -> list[str]:
    """Apply pending migrations; idempotent and safe to run from many processes at once, on a
    direct connection or through a transaction-mode pooler (see the module docstring).
    ``force`` applies a stop-daemons migration even while daemons are alive. A migration that
    copies rows reports its progress (the log; ``progress_stream`` if it is a terminal)."""
    with db.connect_raw(dsn, application_name="pgtick-migrate") as conn, db.wrap_errors("migrate"):
        conn.add_notice_handler(_CopyProgress(progress_stream))
        check_privileges(conn, schema)
        pooled = db.behind_pooler(conn, schema)
        with _locked_transaction(conn, schema):
            conn.execute(sqlfile.with_schema("create_schema", schema))
            conn.execute(sqlfile.with_schema("create_migrations_table", schema))
        done: list[str] = []
        preluded: set[str] = set()  # files whose prelude committed in this call
        while True:
            with _locked_transaction(conn, schema):
                todo = pending(conn, schema)
                if not todo:
                    return done
                migration = todo[0]
                name = f"{migration.version}_{migration.name}"
                if migration.stops_daemons:
                    _check_daemons_stopped(conn, schema, name, force=force)
                prelude = migration.parts()[0] if migration.transactional else None
                if prelude is not None and migration.version not in preluded:
                    _apply_prelude(conn, schema, prelude)
                    preluded.add(migration.version)
                    log.info("migration_prelude_applied", version=migration.version)
                    continue  # committed: the rest in a transaction of its own
                if migration.transactional:
                    _apply_transactional(conn, schema, migration)
                elif pooled:
                    log.warning(
                        "migration_not_concurrent",
                        migration=name,
                        message="through a connection pooler: indexes built without "
                        "CONCURRENTLY, writes to their tables wait while each builds",
                    )
                    _apply_without_concurrently(conn, schema, migration)
            direct_only = not migration.transactional and not pooled
            if direct_only and not _apply_outside_transaction(conn, schema, migration):
                continue  # another migrator applied it meanwhile
            log.info("migration_applied", version=migration.version, name=migration.name)
            done.append(name)
