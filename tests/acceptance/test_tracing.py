"""Traces from a real `pgtick run` (issue 44, Must show 4): spans exported over OTLP/HTTP to a
receiver the test starts, one trace from the test's own span through enqueue, the claim, the
handler, a span the handler opens, to a command's child process reading TRACEPARENT; and
with tracing off, or the otel extra missing, nothing imports OpenTelemetry.

No statement is added to the hot path by tracing: the claim reads a run's traceparent in the
row it returns (tests/integration/test_trace_context.py), and the tracing modules cannot send
one (observability sits below storage; lint-imports holds that)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgtick
from pgtick.observability import tracing
from tests.acceptance.conftest import HERE, Cluster, wait_for
from tests.acceptance.otlp_receiver import SPAN_KIND_CONSUMER, OtlpReceiver
from tests.dbhelp import Connection

SPANS_TIMEOUT_SECONDS = 60.0

TRACED = f"""
[tracing]
enabled = true

[job_types.traced_py]
handler = "traced_jobs:traced"

[job_types.traced_cmd]
command = [{json.dumps(sys.executable)}, {json.dumps(str(HERE / "traced_child.py"))}]
"""

MODULES = """
[tracing]
enabled = {enabled}

[job_types.modules]
handler = "traced_jobs:modules"
"""

# Put in front of a process's imports: any OpenTelemetry module is "not installed".
BLOCK_OTEL = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _Block())
"""


def _otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    env = {k: "" for k in os.environ if k.startswith("OTEL_")}  # none of the caller's
    return {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # milliseconds: the batch goes out at once
    }


def test_one_trace_from_the_enqueuer_through_the_handler_s_span_to_a_command_s_child(
    cluster: Cluster, dsn: str, conn: Connection
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # the test's own, as an application enqueueing would have
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with OtlpReceiver() as receiver:
        daemon = cluster.start(cluster.config(TRACED), env=_otel_env(receiver))
        with (
            provider.get_tracer("test").start_as_current_span("request") as request,
            psycopg.connect(dsn) as app,
        ):
            run_id = pgtick.enqueue(app, "traced_py")
            app.commit()
        wanted = {"run traced_py", "nested", "run traced_cmd", "child"}
        spans = wait_for(
            lambda: (got := receiver.named()).keys() >= wanted and got,
            SPANS_TIMEOUT_SECONDS,
            what=f"spans {wanted}",
        )
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0

    trace_id = f"{request.get_span_context().trace_id:032x}"
    request_id = f"{request.get_span_context().span_id:016x}"
    assert {spans[name].trace_id for name in wanted} == {trace_id}  # one trace
    # enqueue (the test's span) -> the attempt (claimed, then handled) -> the handler's span
    # -> the command run it enqueued -> the command's child process.
    assert spans["run traced_py"].parent_span_id == request_id
    assert spans["nested"].parent_span_id == spans["run traced_py"].span_id
    assert spans["run traced_cmd"].parent_span_id == spans["nested"].span_id
    assert spans["child"].parent_span_id == spans["run traced_cmd"].span_id
    assert {spans[name].service for name in wanted} == {"pgtick", "traced-child"}
    attempt = spans["run traced_py"]
    assert attempt.kind == SPAN_KIND_CONSUMER
    assert attempt.attributes == {
        "pgtick.job_type": "traced_py",
        "pgtick.run_id": run_id,
        "pgtick.attempt": 1,
        "pgtick.max_attempts": 10,
        "pgtick.outcome": "succeeded",
    }
    row = conn.execute("SELECT traceparent FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row == (f"00-{trace_id}-{request_id}-{int(request.get_span_context().trace_flags):02x}",)

    # The run's log lines carry the trace and its attempt's span: the handler's own line,
    # and the command's output as the daemon logs it.
    events = daemon.events()
    [opened] = [e for e in events if e["event"] == "nested_span_open"]
    assert (opened["trace_id"], opened["span_id"]) == (trace_id, attempt.span_id)
    [printed] = [e for e in events if e["event"] == "job_output"]
    cmd = spans["run traced_cmd"]
    assert (printed["trace_id"], printed["span_id"]) == (trace_id, cmd.span_id)
    assert printed["line"] == f"00-{trace_id}-{cmd.span_id}-{printed['line'][-2:]}"


TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _without_otel(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes cannot import any OpenTelemetry module, as if
    the otel extra were not installed (a sitecustomize that refuses them)."""
    site = tmp_path / "no-otel"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_OTEL)
    path = [str(site), str(HERE), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, path))}


def _modules_run(cluster: Cluster, dsn: str, enabled: str, env: dict[str, str]) -> list[str]:
    """Run one `modules` job on a daemon (tracing.enabled = ``enabled``) and return the
    OpenTelemetry modules its process had loaded by then."""
    daemon = cluster.start(cluster.config(MODULES.format(enabled=enabled)), env=env)
    with psycopg.connect(dsn) as app:
        pgtick.enqueue(app, "modules", traceparent=TP)
        app.commit()
    [record] = wait_for(
        lambda: [r for r in cluster.records() if r["event"] == "modules"], 30, what="the run"
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert record["traceparent"] == TP  # handed on without OpenTelemetry
    return list(record["opentelemetry"])


def test_with_tracing_off_the_daemon_imports_no_opentelemetry(cluster: Cluster, dsn: str) -> None:
    """The extra installed (this venv has it), tracing off: not one module of it loaded."""
    assert _modules_run(cluster, dsn, "false", {}) == []


def test_with_otel_sdk_disabled_the_daemon_imports_no_opentelemetry(
    cluster: Cluster, dsn: str
) -> None:
    assert _modules_run(cluster, dsn, "true", {"OTEL_SDK_DISABLED": "true"}) == []


def test_without_the_extra_a_daemon_runs_and_tracing_on_is_refused_at_check(
    cluster: Cluster, dsn: str, tmp_path: Path
) -> None:
    env = _without_otel(tmp_path)
    assert _modules_run(cluster, dsn, "false", env) == []
    config = cluster.config(MODULES.format(enabled="true"))
    for verb in ("check", "run"):  # one set of start-up checks for both
        done = subprocess.run(
            [sys.executable, "-m", "pgtick", verb, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PGTICK_DSN": dsn, **env},
        )
        assert done.returncode == 2, (verb, done.stdout, done.stderr)
        assert tracing.OTEL_EXTRA_MISSING.format(key="tracing.enabled") in done.stderr, verb


def test_importing_pgtick_and_enqueueing_import_no_opentelemetry(dsn: str) -> None:
    code = (
        "import sys, psycopg, pgtick\n"
        f"with psycopg.connect({dsn!r}) as c:\n"
        "    pgtick.enqueue(c, 'x')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
