"""W3C traceparent values as pgtick stores them (observability/tracecontext.py), and the switch
that decides whether a daemon traces (observability/tracing.py). No database."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from pgtick.errors import ConfigError
from pgtick.observability import tracecontext, tracing

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# (value, what is stored): shared with the SQL function's test (test_trace_context.py).
CASES: list[tuple[str, str | None]] = [
    (TP, TP),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", TP[:-2] + "00"),
    # a later version keeps version 00's layout as its prefix, and may append fields
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "01" + TP[2:]),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
    (" " + TP, None),
    ("", None),
    ("not a traceparent", None),
]


@pytest.mark.parametrize(("value", "stored"), CASES)
def test_a_traceparent_is_stored_only_when_valid(value: str, stored: str | None) -> None:
    assert tracecontext.valid(value) == stored


def test_ids_are_those_log_lines_carry() -> None:
    assert tracecontext.ids(TP) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert tracecontext.ids("garbage") is None and tracecontext.ids(None) is None


def test_format_round_trips_through_ids() -> None:
    made = tracecontext.format_traceparent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 1)
    assert made == TP


def test_tracing_off_hands_on_the_enqueuer_s_context_and_makes_no_span() -> None:
    off = tracing.Tracing()
    attempt = off.attempt("t", 1, 1, 3, TP, datetime.now(UTC))
    assert attempt.traceparent == TP
    assert attempt.log_ids == tracecontext.ids(TP)
    assert off.attempt("t", 1, 1, 3, None, datetime.now(UTC)) is tracing.NOT_TRACED
    assert tracing.NOT_TRACED.traceparent is None and tracing.NOT_TRACED.log_ids is None


@pytest.mark.parametrize(
    ("enabled", "env", "wanted"),
    [
        (False, {}, False),
        (True, {}, True),
        (True, {"OTEL_SDK_DISABLED": "true"}, False),
        (True, {"OTEL_SDK_DISABLED": "TRUE"}, False),
        (True, {"OTEL_SDK_DISABLED": "false"}, True),
        (False, {"OTEL_SDK_DISABLED": "false"}, False),
    ],
)
def test_the_config_turns_tracing_on_and_otel_sdk_disabled_wins(
    enabled: bool, env: dict[str, str], wanted: bool
) -> None:
    assert tracing.wanted(enabled, env) is wanted
    if not wanted:  # (on, start would set this process's global tracer provider)
        assert tracing.start(enabled, "test", env).enabled is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "exports OTLP over HTTP"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "exports OTLP over HTTP"),
    ],
)
def test_an_exporter_setting_the_daemon_cannot_honour_is_refused_naming_the_key(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^tracing\.enabled: ") as info:
        tracing.require_extra("tracing.enabled", env)
    assert message in str(info.value)


def test_the_standard_exporter_settings_are_accepted() -> None:
    for env in (
        {},
        {"OTEL_TRACES_EXPORTER": "otlp,console"},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
    ):
        tracing.require_extra("tracing.enabled", env)


# Run in a fresh interpreter: a module this process imported earlier would hide the import.
_BLOCK_OTEL = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )


def test_without_the_extra_tracing_enabled_is_refused_with_the_install_line() -> None:
    done = _python(
        _BLOCK_OTEL
        + "from pgtick.observability import tracing\n"
        + "try:\n    tracing.require_extra('tracing.enabled', {})\n"
        + "except Exception as exc:\n    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == tracing.OTEL_EXTRA_MISSING.format(key="tracing.enabled")


def test_current_reads_the_caller_s_span_only_from_an_opentelemetry_already_imported() -> None:
    done = _python(
        "import sys\nfrom pgtick.observability import tracecontext\n"
        "print(tracecontext.current(), 'opentelemetry' in sys.modules)\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "with TracerProvider().get_tracer('t').start_as_current_span('s') as span:\n"
        "    c = span.get_span_context()\n"
        "    print(tracecontext.current() == tracecontext.format_traceparent(c.trace_id,"
        " c.span_id, int(c.trace_flags)))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False", "True"]
