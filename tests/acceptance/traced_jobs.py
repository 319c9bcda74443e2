"""Handlers of the tracing tests (tests/acceptance/test_tracing.py), named by ``handler =``:
one opens a span of its own and, inside it, enqueues a command's run; one records which
OpenTelemetry modules its daemon has loaded."""

from __future__ import annotations

import sys
from typing import Any

import pgtick
from jobs import record  # the daemon imports the tests' handler modules by their own names
from pgtick import JobContext


def traced(ctx: JobContext, payload: Any) -> None:
    from opentelemetry import trace

    with trace.get_tracer("traced_jobs").start_as_current_span("nested"):
        ctx.log.info("nested_span_open")
        # In the handler's transaction: enqueued with the nested span as its trace context,
        # committed together with this run's success.
        with ctx.transaction() as conn:
            pgtick.enqueue(conn, "traced_cmd", {"from": ctx.run_id})


def modules(ctx: JobContext, payload: Any) -> None:
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
    record(ctx, "modules", opentelemetry=loaded, traceparent=ctx.traceparent)
