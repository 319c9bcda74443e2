"""A span per attempt, in-process: the real worker (claim, handler threads, completer) on a real
database, its spans caught by the OpenTelemetry SDK's in-memory exporter. The daemon as a
process, exporting over OTLP/HTTP, is tests/acceptance/test_tracing.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pgtick
from pgtick.config import JobTypeConfig, WorkerConfig
from pgtick.core import handlers
from pgtick.core.worker import Worker
from pgtick.observability import tracecontext
from pgtick.observability.metrics import Metrics
from pgtick.observability.otel import OtelTracing
from pgtick.observability.tracing import Tracing
from pgtick.storage.store import NewRun, RunStore

WAIT_SECONDS = 30.0


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A provider of the test's own (never the process's global one) and what it exported."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _run_all(store: RunStore, job_types: dict[str, handlers.JobType], tracing: Tracing) -> None:
    """Start a worker, wait until no run of these types is queued or running, stop it."""
    worker = Worker(
        store,
        "w-trace",
        WorkerConfig(threads=2, poll_interval_seconds=0.1),
        job_types,
        Metrics(job_types, "test", 2),
        tracing=tracing,
    )
    worker.start()
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            with store.connection("test") as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pgtick.runs WHERE status IN ('queued', 'running')"
                ).fetchone()
            if row == (0,):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("runs did not finish")
    finally:
        worker.stop_claiming(5.0)
        worker.close()
        assert worker.wait_written(10.0) == []


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_each_attempt_is_a_child_of_the_enqueuer_s_span_and_the_handler_s_spans_of_it(
    dsn: str,
    store: RunStore,
    provider: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path,
) -> None:
    tracer_provider, exporter = provider
    tracer = tracer_provider.get_tracer("test")
    seen: dict[str, Any] = {}

    def py_ok(ctx: handlers.JobContext, payload: Any) -> None:
        seen["traceparent"] = ctx.traceparent
        with tracer.start_as_current_span("nested"):
            pass

    def py_fail(ctx: handlers.JobContext, payload: Any) -> None:
        raise ValueError("boom")

    env_file = tmp_path / "traceparent"
    job_types = {
        "py_ok": handlers.JobType(JobTypeConfig("py_ok"), 60.0, fn=py_ok),
        "py_fail": handlers.JobType(JobTypeConfig("py_fail", max_attempts=1), 60.0, fn=py_fail),
        "cmd": handlers.JobType(
            JobTypeConfig("cmd"),
            60.0,
            command=("/bin/sh", "-c", f'printf %s "$TRACEPARENT" > {env_file}'),
        ),
    }
    with psycopg.connect(dsn) as app, tracer.start_as_current_span("request") as request:
        ids = {name: pgtick.enqueue(app, name) for name in job_types}
        app.commit()
    _run_all(store, job_types, OtelTracing(tracer_provider, "test", owned=False))

    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"request", "run py_ok", "run py_fail", "run cmd", "nested"}
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in spans.values()} == {trace_id}  # one trace
    for name in job_types:
        attempt = spans[f"run {name}"]
        assert attempt.parent is not None
        assert attempt.parent.span_id == request.get_span_context().span_id
        assert attempt.kind is SpanKind.CONSUMER
        assert attempt.attributes is not None
        assert dict(attempt.attributes) == {
            "pgtick.job_type": name,
            "pgtick.run_id": ids[name],
            "pgtick.attempt": 1,
            "pgtick.max_attempts": 1 if name == "py_fail" else 10,
            "pgtick.outcome": "dead" if name == "py_fail" else "succeeded",
            **({"error.type": "ValueError"} if name == "py_fail" else {}),
        }
        assert attempt.events[0].name == "handler_started"
    nested = spans["nested"]
    assert nested.parent is not None
    assert nested.parent.span_id == spans["run py_ok"].context.span_id
    # The handler and the command were each given their attempt's span.
    for name, given in (("py_ok", seen["traceparent"]), ("cmd", env_file.read_text())):
        c = spans[f"run {name}"].context
        assert given == tracecontext.format_traceparent(c.trace_id, c.span_id, c.trace_flags)

    failed = spans["run py_fail"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: boom"
    [exception] = [e for e in failed.events if e.name == "exception"]
    assert exception.attributes is not None
    assert exception.attributes["exception.type"] == "ValueError"
    assert "raise ValueError" in str(exception.attributes["exception.stacktrace"])
    for name in ("py_ok", "cmd"):
        assert spans[f"run {name}"].status.status_code is StatusCode.UNSET


def test_a_run_enqueued_outside_any_trace_starts_one_of_its_own(
    store: RunStore, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = provider

    def noop(ctx: handlers.JobContext, payload: Any) -> None:
        return None

    job_types = {"noop": handlers.JobType(JobTypeConfig("noop"), 60.0, fn=noop)}
    store.enqueue_many([NewRun("noop") for _ in range(2)])
    _run_all(store, job_types, OtelTracing(tracer_provider, "test", owned=False))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["run noop", "run noop"]
    assert all(s.parent is None for s in spans)
    assert len({s.context.trace_id for s in spans}) == 2


def test_with_tracing_off_handlers_and_commands_get_the_enqueuer_s_context(
    dsn: str, store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off, no span is made, but the context a run was enqueued with is handed on as it is:
    what the handler or command does still joins the enqueuing trace."""
    seen: list[str | None] = []
    env_file = tmp_path / "traceparent"
    job_types = {
        "py": handlers.JobType(
            JobTypeConfig("py"), 60.0, fn=lambda ctx, payload: seen.append(ctx.traceparent)
        ),
        "cmd": handlers.JobType(
            JobTypeConfig("cmd"),
            60.0,
            command=("/bin/sh", "-c", f'printf %s "${{TRACEPARENT-unset}}" > {env_file}'),
        ),
    }
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    monkeypatch.setenv("TRACEPARENT", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    with psycopg.connect(dsn) as app:
        pgtick.enqueue(app, "py", traceparent=tp)
        pgtick.enqueue(app, "cmd")  # none: the daemon's own TRACEPARENT is not inherited
        app.commit()
    _run_all(store, job_types, Tracing())
    assert seen == [tp]
    assert env_file.read_text() == "unset"
