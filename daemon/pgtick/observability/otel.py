"""The OpenTelemetry side of tracing.py, the one module of pgtick that imports OpenTelemetry:
loaded only by a daemon with tracing on (``tracing.start``), and by ``pgtick check`` then.

Configured the standard way, by the environment, as every OpenTelemetry SDK reads it:
``OTEL_TRACES_EXPORTER`` (``otlp``, the default, over HTTP/protobuf; ``console``; ``none``),
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``..._HEADERS``,
``..._TIMEOUT``, ``..._COMPRESSION``, the batch processor's ``OTEL_BSP_*``, the sampler's
``OTEL_TRACES_SAMPLER`` (parent-based, always on, by default), ``OTEL_SERVICE_NAME`` (default
``pgtick``) and ``OTEL_RESOURCE_ATTRIBUTES``. A handler module that sets a tracer provider of
its own when it is imported (``worker.imports``) keeps it: pgtick's spans go there too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from datetime import datetime

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pgtick.errors import ConfigError
from pgtick.observability import tracecontext
from pgtick.observability.tracecontext import TraceIds
from pgtick.observability.tracing import Tracing

DEFAULT_SERVICE_NAME = "pgtick"
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
EXPORTERS = ("otlp", "console", "none")
# The protocols of the exporter the extra ships (OTLP over HTTP); gRPC would need another.
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
HTTP_PROTOCOLS = ("http/protobuf",)
INSTRUMENTATION_NAME = "pgtick"
# Outcomes of an attempt that are no error of the span's (tracing.Attempt.end).
OK_OUTCOMES = frozenset({"succeeded"})

_PROPAGATOR = TraceContextTextMapPropagator()


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (comma-separated), ``otlp`` by default."""
    raw = environ.get(TRACES_EXPORTER_ENV, "").strip() or "otlp"
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def check_environment(key: str, environ: Mapping[str, str]) -> None:
    """Refuse, naming ``key``, an exporter or protocol this daemon does not have."""
    for name in exporter_names(environ):
        if name not in EXPORTERS:
            raise ConfigError(
                f"{key}: {TRACES_EXPORTER_ENV}={name!r}: pgtick exports spans with "
                f"{', '.join(EXPORTERS)}"
            )
    for env in PROTOCOL_ENVS:
        protocol = environ.get(env, "").strip()
        if protocol:
            if protocol not in HTTP_PROTOCOLS:
                raise ConfigError(
                    f"{key}: {env}={protocol!r}: the otel extra exports OTLP over HTTP; "
                    f"set {'/'.join(HTTP_PROTOCOLS)} (and the collector's HTTP port, 4318)"
                )
            break


def _exporter(name: str) -> SpanExporter | None:
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # its OTEL_EXPORTER_OTLP_* settings from the environment
    if name == "console":
        return ConsoleSpanExporter()
    return None


def provider_from_environment(version: str, environ: Mapping[str, str]) -> TracerProvider:
    """A tracer provider as the ``OTEL_*`` environment describes it (the module docstring)."""
    check_environment(TRACES_EXPORTER_ENV, environ)
    resource = Resource.create({"service.version": version})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for name in exporter_names(environ):
        exporter = _exporter(name)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _nanoseconds(at: datetime) -> int:
    """``at`` in the nanoseconds spans count in, never after now (the database's clock may
    be ahead of this host's: a span must not end before it starts)."""
    return min(int(at.timestamp() * 1e9), time.time_ns())


class AttemptSpan:
    """One attempt's span: started when the claim took the run, ended when the attempt's
    outcome is known; the current span of the handler's thread while the handler runs."""

    __slots__ = ("_span", "log_ids", "traceparent")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        context = span.get_span_context()
        self.traceparent = tracecontext.format_traceparent(
            context.trace_id, context.span_id, int(context.trace_flags)
        )
        self.log_ids = TraceIds(f"{context.trace_id:032x}", f"{context.span_id:016x}")

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        self._span.add_event("handler_started")
        token = otel_context.attach(trace.set_span_in_context(self._span))
        try:
            yield
        finally:
            otel_context.detach(token)

    def end(self, outcome: str, error: str = "", error_type: str = "", detail: str = "") -> None:
        span = self._span
        span.set_attribute("pgtick.outcome", outcome)
        if outcome not in OK_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, error or outcome))
            span.set_attribute("error.type", error_type or outcome)
            if error or detail:
                span.add_event(
                    "exception",
                    {
                        "exception.type": error_type or outcome,
                        "exception.message": error,
                        "exception.stacktrace": detail,
                    },
                )
        span.end()


class OtelTracing(Tracing):
    """Tracing on: a span per attempt, through ``provider``."""

    enabled = True

    def __init__(self, provider: trace.TracerProvider, version: str, *, owned: bool) -> None:
        self._provider = provider
        self._owned = owned  # built here: ours to flush and shut down
        self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, version)

    @classmethod
    def from_environment(cls, version: str, environ: Mapping[str, str]) -> OtelTracing:
        """The global tracer provider if a handler module set one, else one built from the
        environment and made global (so a handler's own spans go where pgtick's go)."""
        current = trace.get_tracer_provider()
        if not isinstance(current, trace.ProxyTracerProvider):
            return cls(current, version, owned=False)
        provider = provider_from_environment(version, environ)
        trace.set_tracer_provider(provider)
        return cls(provider, version, owned=True)

    def attempt(
        self,
        job_type: str,
        run_id: int,
        attempt: int,
        max_attempts: int,
        traceparent: str | None,
        claimed_at: datetime,
    ) -> AttemptSpan:
        parent = (
            _PROPAGATOR.extract({"traceparent": traceparent})
            if traceparent is not None
            else otel_context.Context()  # a root span, whatever this thread's context holds
        )
        span = self._tracer.start_span(
            f"run {job_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=_nanoseconds(claimed_at),
            attributes={
                "pgtick.job_type": job_type,
                "pgtick.run_id": run_id,
                "pgtick.attempt": attempt,
                "pgtick.max_attempts": max_attempts,
            },
        )
        return AttemptSpan(span)

    def shutdown(self) -> None:
        if self._owned and isinstance(self._provider, TracerProvider):
            self._provider.shutdown()
