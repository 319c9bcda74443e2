"""W3C trace context as pgtick carries it: a ``traceparent`` string, read and checked without
OpenTelemetry, and the caller's current span read only from an OpenTelemetry the caller has
imported already (so that enqueueing never imports it).

A traceparent is ``VERSION-TRACE_ID-PARENT_ID-FLAGS`` (https://www.w3.org/TR/trace-context/),
e.g. ``00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01``. What is stored with a run is
its version-00 part, or nothing: the W3C rule for a receiver is that a malformed value starts a
new trace instead of failing the request, and the SQL function ``valid_traceparent``
(migration 0018) applies the same rule as ``valid`` here.
"""

from __future__ import annotations

import re
import sys
from typing import NamedTuple

# The version-00 layout, which later versions keep as their prefix.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
TRACEPARENT_CHARS = 55
INVALID_VERSION = "ff"
ZERO_TRACE_ID = "0" * 32
ZERO_SPAN_ID = "0" * 16
# Environment variable names a command handler reads its context from (the convention
# OpenTelemetry's environment-variable carriers follow).
TRACEPARENT_ENV = "TRACEPARENT"
TRACESTATE_ENV = "TRACESTATE"


class TraceIds(NamedTuple):
    """The ids a log line of a run carries: hex, as OpenTelemetry's log records write them."""

    trace_id: str
    span_id: str


def valid(value: str | None) -> str | None:
    """``value`` as stored with a run: its version-00 part if it is a valid traceparent,
    else None."""
    if value is None:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == INVALID_VERSION or (version == "00" and rest is not None):
        return None
    if trace_id == ZERO_TRACE_ID or span_id == ZERO_SPAN_ID:
        return None
    return value[:TRACEPARENT_CHARS]


def ids(traceparent: str | None) -> TraceIds | None:
    """The trace and span ids of a valid traceparent (None: none, or not valid)."""
    checked = valid(traceparent)
    if checked is None:
        return None
    return TraceIds(checked[3:35], checked[36:52])


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """A version-00 traceparent from OpenTelemetry's integer ids."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def current() -> str | None:
    """The traceparent of the caller's current OpenTelemetry span, if the caller has imported
    OpenTelemetry and is inside a valid span; None otherwise. Never imports OpenTelemetry:
    a process that has not imported it has no span to be inside of."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format_traceparent(context.trace_id, context.span_id, int(context.trace_flags))
