"""Logging setup: structlog is the API, the standard library carries every line to stdout.

Both structlog events and plain ``logging`` records (psycopg, psycopg_pool) end in one
``structlog.stdlib.ProcessorFormatter``: the same processors add ``timestamp``, ``level``,
``logger``, the run a handler thread is running (``RUN``) and the context bound with
``structlog.contextvars.bound_contextvars`` to each, so every line has one shape whoever
logged it. In JSON mode python-json-logger's ``JsonFormatter`` serializes the finished event
dict (one line per event, exceptions in an ``exception`` field); in console mode structlog's
``ConsoleRenderer`` prints it for humans.

Database passwords never reach the stream: the formatter redacts every finished line, whoever
logged it (psycopg's own messages can quote parts of a connection string). It replaces the
passwords it was given (``protect_dsn``, and ``$PGTICK_DSN``/``$PGPASSWORD`` at set-up) and
anything written like a password in a DSN (``user:secret@``, ``password=secret``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from contextvars import ContextVar
from typing import TextIO

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict
from pythonjsonlogger.json import JsonFormatter
from structlog.typing import EventDict, Processor, WrappedLogger

from pgtick.observability.tracecontext import TraceIds

FORMATS = ("auto", "json", "console")
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Keys every JSON line starts with, in this order; context fields follow.
LEADING_KEYS = ("timestamp", "level", "event", "logger")
REDACTED = "***"
# Shorter known passwords are redacted only where they appear in DSN syntax: replacing every
# occurrence of two letters would garble the whole log.
MIN_SECRET_CHARS = 4
SECRET_ENV_VARS = ("PGTICK_DSN", "PGPASSWORD")

# A password in a URI's user info, and a ``password=`` pair (key/value DSNs, URI queries).
# Neither runs past a quote or backslash, so a redacted JSON line stays valid JSON.
_URI_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s\"'\\]*:)[^@\s\"'\\]+@", re.IGNORECASE)
_PAIR_PASSWORD = re.compile(
    r"(\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s&\"'\\,;]+)", re.IGNORECASE
)


# What every LogRecord carries, plus what other formatters may already have set on it.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", (), None).__dict__
) | {"message", "asctime"}


class _PgtickHandler(logging.StreamHandler[TextIO]):
    """Marks the handler configure_logging installed, so a second call replaces it."""


class _RedactingFormatter(structlog.stdlib.ProcessorFormatter):
    """The last line of defence: no finished line leaves with a password in it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.secrets: set[str] = set()

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.secrets)


def redact(line: str, secrets: set[str]) -> str:
    """``line`` with DSN-style passwords and the given secrets (also JSON-escaped) replaced."""
    line = _URI_PASSWORD.sub(rf"\1{REDACTED}@", line)
    line = _PAIR_PASSWORD.sub(rf"\1{REDACTED}", line)
    for secret in sorted(secrets, key=len, reverse=True):
        for form in _written_forms(secret):
            line = line.replace(form, REDACTED)
    return line


def _written_forms(secret: str) -> list[str]:
    """How a secret can look in a line: as is, in a repr, JSON-escaped, or both; longest
    first so that a longer form is not broken up by a shorter one."""
    quoted = repr(secret)[1:-1]
    forms = {secret, quoted, _json_escaped(secret), _json_escaped(quoted)}
    return sorted(forms, key=len, reverse=True)


def _json_escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


def dsn_password(dsn: str) -> str | None:
    """The password a connection string carries, if any (None when it does not parse)."""
    try:
        return conninfo_to_dict(dsn).get("password") or None  # type: ignore[return-value]
    except psycopg.Error:
        return None


def protect_dsn(dsn: str) -> None:
    """Redact this DSN's password from every line from now on."""
    password = dsn_password(dsn)
    if password is not None:
        add_secret(password)


def add_secret(secret: str) -> None:
    """Redact ``secret`` from every line the installed handler writes from now on."""
    if len(secret) < MIN_SECRET_CHARS:
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _PgtickHandler) and isinstance(
            handler.formatter, _RedactingFormatter
        ):
            handler.formatter.secrets.add(secret)


class _JsonLineRenderer:
    """Last processor in JSON mode: python-json-logger turns the event dict into one line."""

    def __init__(self) -> None:
        self._formatter = JsonFormatter()

    def __call__(self, _logger: WrappedLogger, _method: str, event_dict: EventDict) -> str:
        ordered = {key: event_dict.pop(key) for key in LEADING_KEYS if key in event_dict}
        ordered.update(event_dict)
        return self._formatter.serialize_log_record(ordered)


def _add_record_extras(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Keep ``extra={...}`` fields of stdlib records, never overriding the standard keys."""
    record = event_dict.get("_record")
    if record is not None:
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                event_dict.setdefault(key, value)
    return event_dict


# (run_id, job_type, attempt, trace ids) of the run this thread's handler is running, or None:
# every line logged meanwhile carries them, and trace_id and span_id when the run is in a
# trace (docs/tracing.md; a key the event sets itself is kept). One variable set
# and reset per run (handlers.execute), where binding the three keys with structlog's
# contextvars cost a drain of no-op runs a few percent of its throughput (docs/performance.md).
RUN: ContextVar[tuple[int, str, int, TraceIds | None] | None] = ContextVar(
    "pgtick_run", default=None
)


def _merge_run_context(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    run = RUN.get()
    if run is None:
        return event_dict
    ids = run[3]
    if ids is None:
        return {"run_id": run[0], "job_type": run[1], "attempt": run[2], **event_dict}
    return {
        "run_id": run[0],
        "job_type": run[1],
        "attempt": run[2],
        "trace_id": ids.trace_id,
        "span_id": ids.span_id,
        **event_dict,
    }


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or already closed
        return False


def _renderer_chain(use_json: bool, colors: bool) -> list[Processor]:
    """The processors that finish every record, structlog's or a foreign one."""
    if use_json:
        return [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _JsonLineRenderer(),
        ]
    return [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.dev.ConsoleRenderer(colors=colors),
    ]


def _unbuffer_stdout_under_journald() -> None:
    """journald timestamps lines on arrival, so stdout must not sit in a block buffer."""
    if not os.environ.get("JOURNAL_STREAM"):
        return
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


def configure_logging(
    format: str = "auto",
    level: str = "info",
    stream: TextIO | None = None,
) -> None:
    """Route structlog and stdlib logging to one stream in one shape; safe to call again.

    Call it before the first log line: structlog caches each logger on first use, so a logger
    already used keeps the level it was created with (its output still follows the new setup).
    """
    if format not in FORMATS:
        raise ValueError(f"logging format must be one of {', '.join(FORMATS)}, not {format!r}")
    level_number = LEVELS.get(level.lower())
    if level_number is None:
        raise ValueError(f"logging level must be one of {', '.join(LEVELS)}, not {level!r}")

    _unbuffer_stdout_under_journald()
    target = sys.stdout if stream is None else stream
    tty = _is_tty(target)
    use_json = format == "json" or (format == "auto" and not tty)

    shared: list[Processor] = [
        _merge_run_context,
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = _RedactingFormatter(
        foreign_pre_chain=[*shared, _add_record_extras],
        processors=_renderer_chain(use_json, colors=tty),
    )
    handler = _PgtickHandler(target)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _PgtickHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level_number)
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "")
        if value:
            add_secret(value if name == "PGPASSWORD" else dsn_password(value) or "")

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        context_class=dict,
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Below-level calls return before any processor runs.
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        cache_logger_on_first_use=True,
    )
