"""The command of the tracing test's ``traced_cmd`` job type: a child process that reads its
run's context from TRACEPARENT, prints it (the job's output) and sends a span of its own,
that context's child, to the OTLP endpoint it inherited from the daemon."""

from __future__ import annotations

import os
import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

sys.stdin.read()  # the payload
traceparent = os.environ["TRACEPARENT"]
print(traceparent, flush=True)
provider = TracerProvider(resource=Resource.create({"service.name": "traced-child"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
with provider.get_tracer("traced_child").start_as_current_span("child", context=parent):
    pass
provider.shutdown()
