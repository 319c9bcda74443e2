"""The bad-input corpus: config files, command-line arguments and SQL calls that must be
refused. Each refused command exits with its documented code (2 usage/config, 3 database,
4 not found) and prints exactly one line on stderr naming the problem, never a traceback, and
leaves the database byte for byte as it was (row counts and a digest of every table)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.dbhelp import Connection

from .cli import Result, insert_run, pgtick
from .roles import Role, login_role

LONG_TYPE = "t" * 10_000
TEN_MB_PAYLOAD = json.dumps({"blob": "x" * (10 * 1024 * 1024)})

GOOD_JOB = '[job_types.noop]\ncommand = ["/bin/true"]\n'


@dataclass(frozen=True)
class Case:
    """One refused command: ``{config}`` in argv is the case's config file (``config``)."""

    argv: tuple[str, ...]
    code: int
    names: str  # must appear in the stderr line
    config: bytes | None = None
    stdin: str = ""
    unreadable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    # -- config files (pgtick check, and any command reading the file) --
    "config non-UTF-8 bytes": Case(
        ("check", "--config", "{config}"), 2, "not valid UTF-8", b'[worker]\nthreads = "\xff\xfe"\n'
    ),
    "config TOML syntax": Case(
        ("check", "--config", "{config}"), 2, "not valid TOML", b"[worker\n"
    ),
    "config unknown key": Case(
        ("check", "--config", "{config}"), 2, "worker.thread", b"[worker]\nthread = 4\n"
    ),
    "config unknown section": Case(
        ("check", "--config", "{config}"), 2, "unknown section", b"[wroker]\nthreads = 4\n"
    ),
    "config bad cron": Case(
        ("check", "--config", "{config}"),
        2,
        "schedules.nightly.cron",
        (GOOD_JOB + '[schedules.nightly]\njob_type = "noop"\ncron = "61 * * * *"\n').encode(),
    ),
    "config time zone typo": Case(
        ("check", "--config", "{config}"),
        2,
        "schedules.nightly.timezone",
        (
            GOOD_JOB
            + '[schedules.nightly]\njob_type = "noop"\ncron = "0 3 * * *"\n'
            + 'timezone = "Europe/Amsterdm"\n'
        ).encode(),
    ),
    "config lease 0s": Case(
        ("check", "--config", "{config}"), 2, "worker.lease", b'[worker]\nlease = "0s"\n'
    ),
    "config negative threads": Case(
        ("check", "--config", "{config}"), 2, "worker.threads", b"[worker]\nthreads = -1\n"
    ),
    "config duration not a duration": Case(
        ("check", "--config", "{config}"), 2, "ticker.interval", b'[ticker]\ninterval = "soon"\n'
    ),
    "config handler import fails": Case(
        ("check", "--config", "{config}"),
        2,
        "no_such_module_xyz",
        b'[job_types.x]\nhandler = "no_such_module_xyz:run"\n',
    ),
    "config missing file": Case(
        ("status", "--config", "/nonexistent/pgtick.toml"), 2, "/nonexistent/pgtick.toml"
    ),
    "config is a directory": Case(("status", "--config", "/tmp"), 2, "/tmp"),
    "config unreadable": Case(
        ("check", "--config", "{config}"),
        2,
        "cannot read config file",
        GOOD_JOB.encode(),
        unreadable=True,
    ),
    # -- command-line arguments --
    "unknown command": Case(("frobnicate",), 2, "frobnicate"),
    "show negative run id": Case(("show", "-1"), 2, "'-1'"),
    "show non-numeric run id": Case(("show", "abc"), 2, "'abc'"),
    "show run id beyond bigint": Case(("show", "99999999999999999999"), 2, "99999999999999999999"),
    "show unknown run id": Case(("show", "424242"), 4, "run 424242 not found"),
    "retry non-numeric run id": Case(("retry", "1", "x"), 2, "'x'"),
    "retry unknown run id": Case(("retry", "424242"), 4, "424242"),
    "retry a queued run": Case(("retry", "{queued}"), 2, "it is queued"),
    "cancel a succeeded run": Case(("cancel", "{succeeded}"), 2, "it is succeeded"),
    "retry ids and bulk flags": Case(("retry", "1", "--status", "dead"), 2, "not both"),
    "retry bulk without --type": Case(("retry", "--status", "dead"), 2, "--type"),
    "cancel bulk terminal status": Case(
        ("cancel", "--status", "succeeded", "--type", "x"), 2, "'succeeded'"
    ),
    "runs unknown status": Case(("runs", "--status", "runing"), 2, "'runing'"),
    "runs --limit 0": Case(("runs", "--limit", "0"), 2, "--limit"),
    "runs --limit -1": Case(("runs", "--limit", "-1"), 2, "--limit"),
    "runs --limit too large": Case(("runs", "--limit", "10001"), 2, "--limit"),
    "runs --before abc": Case(("runs", "--before", "abc"), 2, "--before"),
    "runs --since abc": Case(("runs", "--since", "abc"), 2, "--since"),
    "prune --older-than 0s": Case(("prune", "--older-than", "0s"), 2, "--older-than"),
    "prune --older-than in the future": Case(
        ("prune", "--older-than", "2999-01-01T00:00:00Z"), 2, "--older-than"
    ),
    "prune non-terminal status": Case(("prune", "--status", "queued"), 2, "'queued'"),
    "enqueue 10 000-character job type": Case(("enqueue", LONG_TYPE), 2, "job type"),
    "enqueue empty job type": Case(("enqueue", ""), 2, "job type"),
    "enqueue job type with spaces": Case(("enqueue", "send mail"), 2, "job type"),
    "enqueue payload not JSON": Case(("enqueue", "x", "--payload", "{days: 3}"), 2, "--payload"),
    "enqueue payload not an object": Case(("enqueue", "x", "--payload", "[1, 2]"), 2, "object"),
    "enqueue payload NaN": Case(("enqueue", "x", "--payload", '{"a": NaN}'), 2, "NaN"),
    "enqueue payload NUL character": Case(
        ("enqueue", "x", "--payload", '{"a": "\\u0000"}'), 2, "--payload"
    ),
    "enqueue 10 MB payload": Case(
        ("enqueue", "x", "--payload", "-"), 2, "1 MiB", stdin=TEN_MB_PAYLOAD
    ),
    "enqueue --run-at abc": Case(("enqueue", "x", "--run-at", "abc"), 2, "--run-at"),
    "enqueue payload from stdin not JSON": Case(
        ("enqueue", "x", "--payload", "-"), 2, "--payload: invalid JSON", stdin="{"
    ),
    "enqueue --in not a duration": Case(("enqueue", "x", "--in", "5 parsecs"), 2, "--in"),
    "status --horizon-threshold not a duration": Case(
        ("status", "--horizon-threshold", "soon"), 2, "--horizon-threshold"
    ),
    "enqueue of an undeclared type with refuse_undeclared_job_types": Case(
        ("enqueue", "typo_type", "--config", "{config}"),
        2,
        "worker.refuse_undeclared_job_types",
        config=b"[worker]\nrefuse_undeclared_job_types = true\n" + GOOD_JOB.encode(),
    ),
    "enqueue --max-attempts 0": Case(("enqueue", "x", "--max-attempts", "0"), 2, "--max-attempts"),
    "enqueue --key too long": Case(("enqueue", "x", "--key", "k" * 10_000), 2, "--key"),
    "schedules next --count 0": Case(
        ("schedules", "next", "nightly", "--count", "0"), 2, "--count"
    ),
    "schedules backfill --from abc": Case(
        ("schedules", "backfill", "nightly", "--from", "abc", "--to", "1h"), 2, "--from"
    ),
    "schedules pause unknown": Case(("schedules", "pause", "nope"), 4, "'nope'"),
    "grants empty role": Case(("grants", ""), 2, "ROLE"),
    "dsn not a DSN": Case(("status", "--dsn", "host=/nonexistent port=notaport"), 3, "connect"),
    "dsn wrong password": Case(("status", "--dsn", "{wrong_password}"), 3, "password"),
}


def digest(conn: Connection) -> list[tuple[Any, ...]]:
    """Row count and md5 of every table of the pgtick schema."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'pgtick'"
            " ORDER BY 1"
        )
    ]
    out = []
    for table in tables:
        row = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM pgtick.{table} t"
        ).fetchone()
        out.append((table, row))
    return out


@pytest.fixture
def seeded(conn: Connection) -> dict[str, str]:
    """A database with something in every table a refused command could touch."""
    queued = insert_run(conn, job_type="x")
    succeeded = insert_run(conn, job_type="x", status="succeeded", finished_at="now()")
    insert_run(conn, job_type="x", status="dead", finished_at="2020-01-01")
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron) VALUES ('nightly', 'x', '0 3 * * *')"
    )
    conn.execute("INSERT INTO effects (key, run_id) VALUES ('mail:1', %s)", (succeeded,))
    return {"queued": str(queued), "succeeded": str(succeeded)}


@pytest.fixture
def role(pg_admin_dsn: str, dsn: str) -> Iterator[Role]:
    with login_role(pg_admin_dsn, dsn) as r:
        yield r


def _run(case: Case, dsn: str, tmp_path: Path, values: dict[str, str]) -> Result:
    tmp_path.mkdir()
    path = tmp_path / "config.toml"
    if case.config is not None:
        path.write_bytes(case.config)
    if case.unreadable:
        path.chmod(0)
        if os.geteuid() == 0:
            # root reads any file whatever its mode; this one opens but fails to read (EIO).
            path = Path("/proc/self/mem")
    fill = {"{config}": str(path), **{"{" + k + "}": v for k, v in values.items()}}
    argv = [fill.get(a, a) for a in case.argv]
    return pgtick(dsn, *argv, stdin=case.stdin)


@pytest.mark.timeout(300)
def test_the_bad_input_corpus_is_refused_cleanly(
    dsn: str,
    conn: Connection,
    seeded: dict[str, str],
    role: Role,
    tmp_path: Path,
) -> None:
    assert len(CASES) >= 30
    values = {**seeded, "wrong_password": role.dsn_with("wrong")}
    before = digest(conn)
    failures = []
    for name, case in CASES.items():
        result = _run(case, dsn, tmp_path / name.replace(" ", "_"), values)
        problems = []
        if result.code != case.code:
            problems.append(f"exit {result.code}, want {case.code}")
        if len(result.err) != 1:
            problems.append(f"{len(result.err)} stderr lines")
        elif not result.err[0].startswith("pgtick: ") or case.names not in result.err[0]:
            problems.append("line does not name the problem")
        if "Traceback" in "\n".join(result.out + result.err):
            problems.append("traceback")
        if role.password in "\n".join(result.out + result.err):
            problems.append("password shown")
        if digest(conn) != before:
            problems.append("database changed")
            before = digest(conn)
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}: {result.err[:3]}")
    assert not failures, "\n".join(failures)


# SQL calls any application makes: each refused with a message naming the argument.
SQL_CASES: dict[str, tuple[str, str]] = {
    "enqueue NULL job type": ("SELECT enqueue(NULL)", "job_type"),
    "enqueue empty job type": ("SELECT enqueue('')", "job_type must be 1 to 200"),
    "enqueue 10 000-character job type": (
        "SELECT enqueue(repeat('t', 10000))",
        "job_type must be 1 to 200 characters, got 10000",
    ),
    "enqueue array payload": ("SELECT enqueue('x', '[1, 2]')", "payload must be a JSON object"),
    "enqueue string payload": ("SELECT enqueue('x', '\"s\"')", "got a JSON string"),
    "enqueue payload not JSON": ("SELECT enqueue('x', '{days: 3}')", "json"),
    "enqueue payload NUL": ("SELECT enqueue('x', '{\"a\": \"\\u0000\"}')", "\\u0000"),
    "enqueue run_at not a time": ("SELECT enqueue('x', '{}', 'abc')", "timestamp"),
    "enqueue max_attempts 0": (
        "SELECT enqueue('x', '{}', NULL, NULL, 0)",
        "max_attempts must be at least 1",
    ),
    "enqueue priority out of range": (
        "SELECT enqueue('x', '{}', NULL, NULL, NULL, 2000000)",
        "priority must be between -1000000 and 1000000, got 2000000",
    ),
    "enqueue 10 MB idempotency key": (
        "SELECT enqueue('x', '{}', NULL, repeat(md5(random()::text), 320000))",
        "index row",
    ),
    # runs is partitioned by status: no partition takes an unknown one.
    "run with an unknown status": (
        "UPDATE runs SET status = 'bogus'",
        'no partition of relation "runs" found for row',
    ),
}


@pytest.mark.timeout(120)
def test_bad_sql_calls_are_refused_and_change_nothing(
    conn: Connection, seeded: dict[str, str]
) -> None:
    before = digest(conn)
    failures = []
    for name, (statement, names) in SQL_CASES.items():
        try:
            conn.execute(statement.encode())
        except psycopg.Error as exc:
            if names not in str(exc):
                failures.append(f"{name}: {str(exc).splitlines()[0]}")
        else:
            failures.append(f"{name}: accepted")
        if digest(conn) != before:
            failures.append(f"{name}: database changed")
            before = digest(conn)
    assert not failures, "\n".join(failures)
