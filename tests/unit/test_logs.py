"""One JSON shape for structlog and stdlib records, context on both, one line per event."""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from pgtick.config import JobTypeConfig
from pgtick.core.handlers import JobContext, JobType, execute
from pgtick.observability.logs import configure_logging, protect_dsn

# psycopg sets its own logger to WARNING on import; a library without that quirk shows INFO.
LIBRARY_LOGGER = "some.library"
RUN_CONTEXT = {"run_id": 42, "job_type": "send_invoice_emails", "attempt": 2}
LEADING_KEYS = ["timestamp", "level", "event", "logger"]
ISO_UTC_MICROSECONDS = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"


class FakeTTY(io.StringIO):
    """A stream that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Leave the root logger and structlog as this test found them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_structlog_and_stdlib_lines_have_the_same_shape() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    structlog.get_logger("pgtick.worker").warning("lease_lost")
    logging.getLogger("psycopg").warning("connection %s lost", "pg1")

    ours, theirs = json_lines(stream)
    assert list(ours) == LEADING_KEYS
    assert list(theirs) == LEADING_KEYS
    assert ours["event"] == "lease_lost"
    assert ours["logger"] == "pgtick.worker"
    assert ours["level"] == theirs["level"] == "warning"
    assert theirs["event"] == "connection pg1 lost"
    assert theirs["logger"] == "psycopg"
    for line in (ours, theirs):
        assert re.match(ISO_UTC_MICROSECONDS, line["timestamp"])


def test_bound_contextvars_appear_on_structlog_and_stdlib_lines() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    log = structlog.get_logger("pgtick.handlers")
    with structlog.contextvars.bound_contextvars(**RUN_CONTEXT):
        log.info("handler_started", extra_field="x")
        logging.getLogger("psycopg.pool").warning("pool is busy")
    log.info("after_run")

    ours, theirs, after = json_lines(stream)
    assert ours.items() >= {**RUN_CONTEXT, "extra_field": "x"}.items()
    assert theirs.items() >= {**RUN_CONTEXT, "level": "warning"}.items()
    assert set(ours) - {"extra_field"} == set(theirs)
    assert "run_id" not in after


def test_stdlib_extra_fields_are_kept() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    logging.getLogger(LIBRARY_LOGGER).info("notice", extra={"sqlstate": "01000", "level": "x"})
    (line,) = json_lines(stream)
    assert line["sqlstate"] == "01000"
    assert line["level"] == "info"  # an extra never overrides a standard key
    assert "message" not in line  # set on the record by other formatters (pytest's, here)


@pytest.mark.parametrize("source", ["structlog", "stdlib"])
def test_exception_is_one_json_line_with_the_traceback_in_a_field(source: str) -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    try:
        raise ValueError("bad\npayload")
    except ValueError:
        if source == "structlog":
            structlog.get_logger("pgtick.worker").exception("handler_failed")
        else:
            logging.getLogger("psycopg").exception("handler_failed")

    text = stream.getvalue()
    assert text.count("\n") == 1
    (line,) = json_lines(stream)
    assert line["level"] == "error"
    assert line["event"] == "handler_failed"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert "ValueError: bad\npayload" in line["exception"]


def test_level_filtering_applies_to_both() -> None:
    stream = io.StringIO()
    configure_logging("json", "warning", stream)
    log = structlog.get_logger("pgtick.ticker")
    log.info("tick_done")
    log.debug("tick_details")
    logging.getLogger(LIBRARY_LOGGER).info("chatty")
    log.warning("tick_late")
    logging.getLogger("psycopg").error("connection failed")
    assert [line["event"] for line in json_lines(stream)] == ["tick_late", "connection failed"]


def test_debug_level_lets_everything_through() -> None:
    stream = io.StringIO()
    configure_logging("json", "DEBUG", stream)
    structlog.get_logger("pgtick.ticker").debug("tick_details")
    logging.getLogger(LIBRARY_LOGGER).debug("sending query")
    assert [line["level"] for line in json_lines(stream)] == ["debug", "debug"]


def test_console_format_is_not_json() -> None:
    stream = io.StringIO()
    configure_logging("console", "info", stream)
    structlog.get_logger("pgtick.worker").info("run_claimed", run_id=7)
    logging.getLogger(LIBRARY_LOGGER).info("connected")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "run_claimed" in lines[0]
    assert "run_id=7" in lines[0]
    assert "connected" in lines[1]
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    assert "\x1b[" not in stream.getvalue()  # no colors off a terminal


def test_auto_is_json_off_a_tty_and_console_with_colors_on_one() -> None:
    piped = io.StringIO()
    configure_logging("auto", "info", piped)
    structlog.get_logger("pgtick").info("started")
    assert json_lines(piped)[0]["event"] == "started"

    terminal = FakeTTY()
    configure_logging("auto", "info", terminal)
    structlog.get_logger("pgtick").info("started")
    assert "\x1b[" in terminal.getvalue()
    with pytest.raises(json.JSONDecodeError):
        json.loads(terminal.getvalue())


def test_json_forced_on_a_tty() -> None:
    terminal = FakeTTY()
    configure_logging("json", "info", terminal)
    structlog.get_logger("pgtick").info("started")
    assert json_lines(terminal)[0]["event"] == "started"


def test_calling_twice_does_not_duplicate_handlers() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", "info", first)
    configure_logging("json", "info", second)
    structlog.get_logger("pgtick").info("once")
    logging.getLogger(LIBRARY_LOGGER).info("once too")
    assert first.getvalue() == ""
    assert [line["event"] for line in json_lines(second)] == ["once", "once too"]


def test_unknown_format_or_level_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        configure_logging("xml", "info", io.StringIO())
    with pytest.raises(ValueError, match="level"):
        configure_logging("json", "verbose", io.StringIO())


def test_non_json_values_are_rendered_not_raised() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    structlog.get_logger("pgtick").info("odd_values", when=datetime.date(2026, 1, 2))
    structlog.get_logger("pgtick").info("odd_values", thing=object())
    first, second = json_lines(stream)
    assert first["when"] == "2026-01-02"
    assert second["thing"].startswith("<object object")


def test_journald_makes_stdout_line_buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", fake_stdout)
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert not fake_stdout.line_buffering
    configure_logging("json", "info", io.StringIO())
    assert fake_stdout.line_buffering


def test_without_journald_stdout_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", fake_stdout)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    configure_logging("json", "info", io.StringIO())
    assert not fake_stdout.line_buffering


def test_default_stream_is_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", fake_stdout)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    configure_logging()
    structlog.get_logger("pgtick").info("to_stdout")
    assert json_lines(fake_stdout)[0]["event"] == "to_stdout"


PASSWORD = 'Sup3r"S3cret\\pw'


def test_a_protected_password_never_reaches_the_stream_in_any_form() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    protect_dsn(f"host=db.internal user=app password='{PASSWORD.replace(chr(92), chr(92) * 2)}'")
    log = structlog.get_logger("pgtick.db")
    log.warning("connect_failed", error=f"could not connect with {PASSWORD}")
    logging.getLogger("psycopg.pool").warning("error connecting: %r", PASSWORD)
    try:
        raise RuntimeError(f"bad password {PASSWORD}")
    except RuntimeError:
        log.exception("boom")
    text = stream.getvalue()
    lines = json_lines(stream)  # still valid JSON after redaction
    assert len(lines) == 3
    assert "S3cret" not in text
    assert [line["level"] for line in lines] == ["warning", "warning", "error"]
    assert lines[0]["error"] == "could not connect with ***"
    assert "***" in lines[2]["exception"]


@pytest.mark.parametrize(
    ("logged", "shown"),
    [
        ("postgresql://app:hunter2hunter@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("host=db password=hunter2hunter user=app", "host=db password=*** user=app"),
        ("host=db password = 'a b c' user=app", "host=db password = *** user=app"),
        (
            "postgresql://db/x?sslpassword=k3y&password=pw",
            "postgresql://db/x?sslpassword=***&password=***",
        ),
    ],
)
def test_dsn_passwords_are_redacted_even_when_not_registered(logged: str, shown: str) -> None:
    stream = io.StringIO()
    configure_logging("console", "info", stream)
    logging.getLogger("psycopg").warning("%s", logged)
    structlog.get_logger("pgtick").warning("dsn", dsn=logged)
    text = stream.getvalue()
    assert "hunter2" not in text and "a b c" not in text and "k3y" not in text
    assert text.count(shown) == 2


def test_a_password_from_the_environment_is_protected_from_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGTICK_DSN", "host=db user=app password=fromtheenv")
    monkeypatch.setenv("PGPASSWORD", "alsosecret")
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    structlog.get_logger("pgtick").info("x", a="fromtheenv alsosecret")
    assert json_lines(stream)[0]["a"] == "*** ***"


def test_short_passwords_are_left_to_the_dsn_patterns() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    protect_dsn("host=db password=abc")
    structlog.get_logger("pgtick").info("abc is a word", dsn="host=db password=abc")
    [line] = json_lines(stream)
    assert (line["event"], line["dsn"]) == ("abc is a word", "host=db password=***")


def test_a_running_handler_s_lines_carry_its_run() -> None:
    """handlers.execute sets logs.RUN around the handler: structlog and stdlib lines logged
    meanwhile name the run, a key the event sets itself wins, and nothing outlives the run."""
    stream = io.StringIO()
    configure_logging("json", "info", stream)

    def handler(ctx: JobContext, payload: Any) -> None:
        structlog.get_logger("app.jobs").info("sending", to=payload["to"])
        logging.getLogger("app.mailer").warning("slow smtp")
        structlog.get_logger("app.jobs").info("override", attempt=99)

    jt = JobType(JobTypeConfig("send_invoice_emails"), lease_seconds=60.0, fn=handler)
    ctx = JobContext(
        run_id=42,
        job_type="send_invoice_emails",
        attempt=2,
        max_attempts=3,
        scheduled_for=None,
        idempotency_key=None,
        _store=None,  # type: ignore[arg-type]  # never touched: the handler does no I/O
        _worker_id="w",
        _guard=None,  # type: ignore[arg-type]
    )
    outcome = execute(ctx, jt, {"to": "a@example.com"})
    structlog.get_logger("app.jobs").info("after")

    assert outcome.kind == "succeeded"
    ours, theirs, override, after = json_lines(stream)
    assert ours.items() >= {**RUN_CONTEXT, "to": "a@example.com"}.items()
    assert theirs.items() >= {**RUN_CONTEXT, "level": "warning"}.items()
    assert override["attempt"] == 99 and override["run_id"] == 42
    assert not {"run_id", "job_type", "attempt"} & set(after)
