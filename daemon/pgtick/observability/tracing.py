"""Traces of runs (docs/tracing.md): with ``tracing.enabled`` and the ``otel`` extra, a span per
attempt, a child of the span that enqueued the run; off by default.

Off (the default, or ``OTEL_SDK_DISABLED=true``), nothing here imports OpenTelemetry and an
attempt costs nothing but the context it was enqueued with, handed on as it is: handlers get it
(``ctx.traceparent``), commands too (``TRACEPARENT``), and a run's log lines carry its ids. On,
``start`` loads ``otel.py``, the one module that imports OpenTelemetry, and each attempt's span
takes the enqueuer's place in all three.

Why a parent and not a link: a run is one message consumed once (OpenTelemetry's messaging
conventions allow either for that), and a parent puts the whole story, the request that
enqueued the run, each attempt, what the handler and its commands did, in the one trace its
user opens; a link would start a trace per attempt, to be found by following the link. The
price: a run retried hours later or enqueued for next week stretches its enqueuer's trace.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from pgtick.errors import ConfigError
from pgtick.observability import tracecontext
from pgtick.observability.tracecontext import TraceIds

# The standard switch that turns every OpenTelemetry SDK off, whatever the config says.
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
OTEL_EXTRA_MISSING = (
    "{key}: tracing needs the otel extra (the OpenTelemetry SDK and its OTLP/HTTP exporter): "
    "pip install 'pgtick[otel]'"
)
# What the extra brings: the SDK, and the exporter the default OTEL_TRACES_EXPORTER names.
EXTRA_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")


class Attempt(Protocol):
    """One attempt's place in its trace, from the moment a thread starts it."""

    @property
    def traceparent(self) -> str | None:
        """What the handler is given (``ctx.traceparent``, ``TRACEPARENT``)."""

    @property
    def log_ids(self) -> TraceIds | None:
        """The ids the run's log lines carry."""

    def current(self) -> contextlib.AbstractContextManager[None]:
        """While the handler runs: the attempt's span is the thread's current span."""

    def end(self, outcome: str, error: str = "", error_type: str = "", detail: str = "") -> None:
        """The attempt is over (``outcome`` as the lifecycle names it)."""


class Untraced:
    """An attempt of a daemon with tracing off: the enqueuer's context, handed on as it is."""

    __slots__ = ("log_ids", "traceparent")

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent
        self.log_ids = tracecontext.ids(traceparent)

    def current(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def end(self, outcome: str, error: str = "", error_type: str = "", detail: str = "") -> None:
        return None


NOT_TRACED = Untraced(None)  # a run enqueued outside any trace, tracing off: nearly all


class Tracing:
    """Tracing off: no span, the enqueuer's context handed on."""

    enabled = False

    def attempt(
        self,
        job_type: str,
        run_id: int,
        attempt: int,
        max_attempts: int,
        traceparent: str | None,
        claimed_at: datetime,
    ) -> Attempt:
        """The attempt a handler thread is about to start (claimed at ``claimed_at``)."""
        return NOT_TRACED if traceparent is None else Untraced(traceparent)

    def shutdown(self) -> None:
        """Send the spans not sent yet (at the daemon's stop)."""


def disabled_by_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """``OTEL_SDK_DISABLED=true``: the standard switch, which wins over the config."""
    return environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true"


def wanted(enabled: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this daemon traces: ``tracing.enabled``, unless the environment turns it off."""
    return enabled and not disabled_by_environment(environ)


def require_extra(key: str, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, naming ``key``, tracing without the otel extra, or with an exporter setting
    this daemon cannot honour (imports OpenTelemetry: only when tracing is on)."""
    try:
        missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    except ImportError:  # a parent package missing
        missing = list(EXTRA_MODULES)
    if missing:
        raise ConfigError(OTEL_EXTRA_MISSING.format(key=key))
    from pgtick.observability import otel

    otel.check_environment(key, environ)


def start(enabled: bool, version: str, environ: Mapping[str, str] = os.environ) -> Tracing:
    """This daemon's tracing: off, or spans exported the standard OpenTelemetry way
    (``OTEL_*`` environment variables); see the module docstring."""
    if not wanted(enabled, environ):
        return Tracing()
    from pgtick.observability import otel

    return otel.OtelTracing.from_environment(version, environ)
