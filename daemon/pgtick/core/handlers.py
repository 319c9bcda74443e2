"""Job types and their handlers: Python callables and commands, and JobContext.

A job type maps to exactly one handler: ``handler = "module:function"`` or ``command = [...]``
in ``[job_types.NAME]``, or an ``@pgtick.job("NAME")`` decorator in a module listed in
``worker.imports``. ``execute`` runs one claimed run and turns whatever happened into an
``Outcome``; it never raises, so a handler can never kill a worker thread: whatever a handler
raises, ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` included, fails its run.
None of them is the daemon's own business: its shutdown comes by signals to the main thread,
never by an exception in a worker thread.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, Unpack

import structlog

from pgtick import config as config_mod
from pgtick.config import Config, JobOptions, JobTypeConfig
from pgtick.core import commands, joblog
from pgtick.core.backoff import Backoff
from pgtick.core.outcome import MAX_RETRY_DELAY_SECONDS, Outcome, bounded, short, storable
from pgtick.core.output import Capture, Flusher
from pgtick.errors import ConfigError, Fail, Retry
from pgtick.observability import logs, tracecontext, tracing
from pgtick.observability.tracecontext import TraceIds
from pgtick.observability.tracing import Attempt
from pgtick.storage import results
from pgtick.storage.store import ClaimedRun, RunStore

COMMAND_KILL_GRACE_SECONDS = 3.0  # SIGTERM to the process group, then SIGKILL after this
# How long a stopped command can take to be gone: the kill grace, the wait for SIGKILLed
# processes to disappear, and a poll. The drain waits this long before releasing.
COMMAND_STOP_TIMEOUT_SECONDS = (
    COMMAND_KILL_GRACE_SECONDS + commands.REAP_TIMEOUT_SECONDS + 2 * commands.POLL_INTERVAL_SECONDS
)

Handler = Callable[["JobContext", Any], Any]

log = structlog.get_logger("pgtick.handlers")

# The decorator's registry. Filled at import time of the modules in ``worker.imports``;
# read once by ``resolve`` at start-up.
_DECORATED: dict[str, tuple[Handler, dict[str, Any]]] = {}
_CANCELLED_LOCK = threading.Lock()


def job(name: str, **options: Unpack[JobOptions]) -> Callable[[Handler], Handler]:
    """Register ``fn(ctx, payload)`` as the handler of job type ``name``.

    Options are the keys of ``[job_types.NAME]`` but ``handler`` and ``command`` (the schema's
    ``JOB_OPTION_KEYS``; ``JobOptions`` types them), with the same values (seconds as numbers,
    or durations such as ``"5m"``; None: not set), checked by the file's code when the daemon
    starts. They apply when the config file has no ``[job_types.NAME]`` table (if it has one,
    the file's settings win).
    """

    def register(fn: Handler) -> Handler:
        existing = _DECORATED.get(name)
        if existing is not None and existing[0] is not fn:
            raise ConfigError(
                f"job type {name!r} is registered twice: {_describe(existing[0])} "
                f"and {_describe(fn)}"
            )
        _DECORATED[name] = (fn, {k: v for k, v in options.items() if v is not None})
        return fn

    return register


def _where(name: str, fn: Handler) -> str:
    """A decorated job type's settings, as its errors name them."""
    return f"@pgtick.job({name!r}) in {getattr(fn, '__module__', '?')}"


def _describe(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(frozen=True)
class JobType:
    """A job type this daemon can run: its settings and its one handler."""

    config: JobTypeConfig
    lease_seconds: float
    fn: Handler | None = None
    command: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def backoff(self) -> Backoff:
        c = self.config
        return Backoff(c.backoff, c.backoff_base_seconds, c.backoff_max_seconds, c.jitter)


def import_handler(spec: str, key: str) -> Handler:
    """Import ``module:function``; a failure is a ConfigError naming the key."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"{key}: cannot import module {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ConfigError(f"{key}: {spec!r} is not callable")
    return target  # type: ignore[no-any-return]


def import_modules(modules: tuple[str, ...]) -> None:
    """Import ``worker.imports`` so their ``@pgtick.job`` decorators register."""
    for i, module_name in enumerate(modules):
        try:
            importlib.import_module(module_name)
        except Exception as exc:
            raise ConfigError(
                f"worker.imports[{i}]: cannot import module {module_name!r}: {exc}"
            ) from exc


def resolve(config: Config) -> dict[str, JobType]:
    """Every job type this daemon can run, from the config file and the decorators; an error
    (a handler that does not import, ...) names the config file that led to it."""
    try:
        return _resolve(config)
    except ConfigError as exc:
        if config.path is None:
            raise
        raise ConfigError(f"{config.path}: {exc}") from exc


def _resolve(config: Config) -> dict[str, JobType]:
    import_modules(config.worker.imports)
    default_lease = config.worker.lease_seconds
    resolved: dict[str, JobType] = {}
    for name, jt in config.job_types.items():
        key = f"job_types.{name}"
        decorated = _DECORATED.get(name)
        lease = jt.lease_seconds or default_lease
        if jt.handler and decorated:
            raise ConfigError(
                f"{key}.handler: job type {name!r} also has an @pgtick.job handler "
                f"({_describe(decorated[0])}); a job type has exactly one handler"
            )
        if jt.command and decorated:
            raise ConfigError(
                f"{key}.command: job type {name!r} also has an @pgtick.job handler "
                f"({_describe(decorated[0])}); a job type has exactly one handler"
            )
        if jt.handler:
            resolved[name] = JobType(jt, lease, fn=import_handler(jt.handler, f"{key}.handler"))
        elif jt.command:
            resolved[name] = JobType(jt, lease, command=jt.command)
        elif decorated:
            resolved[name] = JobType(jt, lease, fn=decorated[0])
        else:
            raise ConfigError(
                f'{key}: no handler: set handler = "module:function" or command = [...], '
                "or register one with @pgtick.job in a module listed in worker.imports"
            )
    for name, (fn, options) in _DECORATED.items():
        if name not in resolved:
            # The file's validator, so a decorator cannot set what the file may not.
            jt = config_mod.job_type_config(
                name, options, config.worker, prefix=_where(name, fn), decorator=True
            )
            resolved[name] = JobType(jt, jt.lease_seconds or default_lease, fn=fn)
    _check_decorated(config, resolved)
    return resolved


def _check_decorated(config: Config, resolved: Mapping[str, JobType]) -> None:
    """What the file's loading checked of its own job types, now that the decorators' are
    known: the schedules' job types and key fields, and chains that lead back (a cycle)."""
    for name, schedule in config.schedules.items():
        if schedule.job_type not in resolved:
            raise ConfigError(
                f"schedules.{name}.job_type: unknown job type {schedule.job_type!r} "
                f"(no [job_types.{schedule.job_type}] handler and no @pgtick.job)"
            )
        if schedule.job_type not in config.job_types:  # decorated (the file's: checked on loading)
            where = _where(schedule.job_type, _DECORATED[schedule.job_type][0])
            config_mod.check_key_field(schedule, resolved[schedule.job_type].config, where)
    if any(name not in config.job_types for name in resolved):
        # The file's own chains were checked on loading; a decorator's may close a cycle.
        config_mod.check_chain_cycles({name: jt.config for name, jt in resolved.items()})


# -- the context handed to handlers -----------------------------------------------------------


class CommitGuard(Protocol):
    """Who decides whether a handler's transaction may commit its run's success (the
    lifecycle): the run may meanwhile have timed out, been lost or been cancelled."""

    def begin_commit(self, run_id: int) -> bool: ...

    def end_commit(self, run_id: int, committed: bool) -> None: ...


class _Unguarded:
    """For contexts made outside a daemon (tests, scripts): the database guard alone."""

    def begin_commit(self, run_id: int) -> bool:
        return True

    def end_commit(self, run_id: int, committed: bool) -> None:
        return None


@dataclass
class JobContext:
    """What a handler knows about its run, and the tools to do its job safely."""

    run_id: int
    job_type: str
    attempt: int
    max_attempts: int
    scheduled_for: datetime | None
    idempotency_key: str | None
    _store: RunStore = field(repr=False)
    _worker_id: str = field(repr=False)
    # The W3C traceparent the run's work belongs to (docs/tracing.md): the attempt's span
    # while a daemon with tracing on runs it, else the span that enqueued it; None: none.
    # Commands get it as TRACEPARENT; a handler hands it on to what it calls.
    traceparent: str | None = None
    _guard: CommitGuard = field(default_factory=_Unguarded, repr=False)
    _tx: Any = field(default=None, repr=False)
    _log: Any = field(default=None, repr=False)
    # Where what the attempt prints is written (None: not kept, outside a daemon).
    _flusher: Flusher | None = field(default=None, repr=False)
    _started_at: datetime | None = field(default=None, repr=False)
    _committed: bool = field(default=False, repr=False)  # transaction() committed the success
    # Made on first use: most runs end without anyone asking, and an Event (a lock and a
    # condition) per run was a tenth of the dispatcher's time in a backlog of short runs.
    _cancelled: threading.Event | None = field(default=None, repr=False)
    _trace_ids: TraceIds | None = field(default=None, repr=False)
    _result: str | None = field(default=None, repr=False)  # set_result's, as JSON text

    def set_result(self, value: Any) -> None:
        """The run's result when its success is committed by ``transaction()`` (which
        commits before the handler returns, so its return value comes too late to store).
        Raises ``ValueError`` (storage.results.ResultError) past the 1 MiB bound."""
        self._result = results.encode(value)

    @property
    def trace_ids(self) -> TraceIds | None:
        """The trace and span ids the run's log lines carry (those of ``traceparent``)."""
        return self._trace_ids

    @property
    def cancelled(self) -> threading.Event:
        """Set when the run times out, its lease is lost, an operator cancels it or the
        daemon stops: a long handler waits on it instead of sleeping."""
        event = self._cancelled
        if event is None:
            with _CANCELLED_LOCK:  # the heartbeat may set it while the handler first asks
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                event = self._cancelled
        return event

    @property
    def log(self) -> Any:
        """A structlog logger bound to this run."""
        if self._log is None:
            self._log = structlog.get_logger("pgtick.job").bind(
                run_id=self.run_id, job_type=self.job_type, attempt=self.attempt
            )
        return self._log

    def effect_once(self, key: str) -> bool:
        """True only the first time ``key`` is seen: record before you act.

        Inside ``transaction()`` the key is recorded in that transaction, so it is kept only
        if the transaction commits.
        """
        if self._tx is not None:
            return RunStore.effect_once_on(self._tx, key, self.run_id)
        return self._store.effect_once(key, self.run_id)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection whose transaction also commits this run's success.

        The handler's writes and ``succeeded`` become visible together or not at all. If the
        run is no longer this worker's (lease lost, cancelled, timed out), the transaction is
        rolled back and ``LeaseLostError`` raised.
        """
        committing = False
        try:
            with self._store.connection("transaction") as conn, conn.transaction():
                self._tx = conn
                try:
                    yield conn
                    if not self._guard.begin_commit(self.run_id):
                        raise LeaseLostError(f"run {self.run_id}: no longer held, not committed")
                    committing = True
                    claim = (self.run_id, self.attempt)
                    stored = {self.run_id: self._result} if self._result is not None else None
                    if not RunStore.succeed_on(conn, self._worker_id, [claim], results=stored):
                        raise LeaseLostError(f"run {self.run_id}: lease lost before commit")
                finally:
                    self._tx = None
        except BaseException:
            if committing:
                self._guard.end_commit(self.run_id, committed=False)
            raise
        self._committed = True
        self._guard.end_commit(self.run_id, committed=True)


class LeaseLostError(Exception):
    """The run is no longer this worker's: its result must not be written."""


# -- running one run ---------------------------------------------------------------------------


def failed(
    ctx: JobContext,
    jt: JobType,
    message: str,
    error_type: str,
    detail: str,
    delay: float | None = None,
) -> Outcome:
    """A failed attempt: retried after ``delay`` (default: the job type's backoff), or dead
    when the run's attempts are used up."""
    message, detail = storable(message), storable(detail)
    if ctx.attempt >= ctx.max_attempts:
        return Outcome(ctx.run_id, "dead", message, error_type, detail, None)
    if delay is None:
        delay = jt.backoff.delay(ctx.attempt)
    return Outcome(
        ctx.run_id, "failed", message, error_type, detail, min(delay, MAX_RETRY_DELAY_SECONDS)
    )


def _failure(ctx: JobContext, jt: JobType, exc: BaseException) -> Outcome:
    """Map a handler's exception to failed (with backoff), or dead."""
    detail = bounded("".join(traceback.format_exception(exc)))
    error_type = type(exc).__name__
    message = short(f"{error_type}: {exc}" if str(exc) else error_type)
    if isinstance(exc, Fail):
        return Outcome(ctx.run_id, "dead", storable(message), "Fail", storable(detail), None)
    after = exc.after if isinstance(exc, Retry) else None
    return failed(ctx, jt, message, error_type, detail, None if after is None else max(0.0, after))


def command_env(ctx: JobContext, payload_json: str) -> dict[str, str]:
    """The environment variables a command handler receives (PGTICK_PAYLOAD, PGTICK_RUN_ID, ...,
    and TRACEPARENT when the run is in a trace)."""
    env = {
        "PGTICK_PAYLOAD": payload_json,
        "PGTICK_RUN_ID": str(ctx.run_id),
        "PGTICK_JOB_TYPE": ctx.job_type,
        "PGTICK_ATTEMPT": str(ctx.attempt),
        "PGTICK_MAX_ATTEMPTS": str(ctx.max_attempts),
        "PGTICK_IDEMPOTENCY_KEY": ctx.idempotency_key or "",
        "PGTICK_SCHEDULED_FOR": ctx.scheduled_for.isoformat() if ctx.scheduled_for else "",
    }
    if ctx.traceparent is not None:
        env[tracecontext.TRACEPARENT_ENV] = ctx.traceparent
    return env


def new_capture(ctx: JobContext, jt: JobType) -> Capture:
    """The capture of what this attempt prints, bounded by the job type's output_max_bytes."""
    capture = Capture(
        ctx.run_id, ctx.attempt, ctx.job_type, ctx._started_at, jt.config.output_max_bytes
    )
    capture.committed = lambda: ctx._committed
    capture.trace_ids = ctx._trace_ids
    return capture


def _run_command(ctx: JobContext, jt: JobType, payload: Any) -> Outcome:
    assert jt.command is not None
    capture = None
    if ctx._flusher is not None:
        capture = new_capture(ctx, jt)
        ctx._flusher.add(capture)
    payload_json = json.dumps(payload, separators=(",", ":"))
    try:
        result = commands.run_command(
            jt.command,
            payload_json=payload_json,
            env=command_env(ctx, payload_json),
            cancelled=ctx.cancelled,
            timeout_seconds=jt.config.timeout_seconds,
            kill_grace_seconds=COMMAND_KILL_GRACE_SECONDS,
            on_output=None if capture is None else capture.feed,
        )
    finally:
        if capture is not None and ctx._flusher is not None:
            ctx._flusher.finish(capture)  # before the outcome: the run is still held
    # Exit 0 is a success even after a cancel's SIGTERM (the command ignored it and finished):
    # a drain writes it, an operator's cancel or a lost lease refuses it by the claim guard.
    # Released instead, it ran again (torture seed 4318, run 2441).
    if result.killed == "cancelled" and result.returncode != 0:
        return Outcome(ctx.run_id, "interrupted")
    if result.returncode == 0 and result.killed in (None, "cancelled"):
        if not jt.config.result_from_stdout:
            return Outcome(ctx.run_id, "succeeded")
        try:
            stored = results.from_stdout(result.stdout_tail)
        except results.ResultError as exc:
            return failed(ctx, jt, short(str(exc)), "result", bounded(str(exc)))
        return Outcome(ctx.run_id, "succeeded", result=stored)
    stderr = result.stderr_tail.strip()
    last_line = stderr.splitlines()[-1] if stderr else ""
    if result.killed == "timeout":
        error_type = "timeout"
        message = f"timed out after {jt.config.timeout_seconds:g}s"
    else:
        error_type = "exit_status"
        message = f"exit status {result.returncode}"
    if last_line:
        message = f"{message}: {last_line}"
    return failed(ctx, jt, short(message), error_type, bounded(stderr or message))


def _run_python(ctx: JobContext, jt: JobType, payload: Any) -> Any:
    """Call the handler, its log records captured as the attempt's output; its return value."""
    assert jt.fn is not None
    flusher = ctx._flusher
    if flusher is None:
        return jt.fn(ctx, payload)
    capture = joblog.log_capture()
    capture.enter(ctx.run_id, ctx.attempt, joblog.slot(lambda: new_capture(ctx, jt), flusher))
    pid = os.getpid()
    try:
        return jt.fn(ctx, payload)
    finally:
        kept = capture.leave(ctx.run_id, ctx.attempt)
        if kept is not None and os.getpid() == pid:  # not from a process the handler forked
            flusher.finish(kept)


def unreadable_payload(ctx: JobContext, exc: Exception) -> Outcome:
    """A payload the database holds but Python cannot read (nested deeper than the
    interpreter's recursion limit): the run is dead, as every attempt would fail the same."""
    message = short(f"payload: cannot be read: {type(exc).__name__}: {exc}")
    return Outcome(ctx.run_id, "dead", storable(message), "payload", storable(message), None)


def execute(ctx: JobContext, jt: JobType, payload: Any, attempt: Attempt | None = None) -> Outcome:
    """Run one attempt and say what became of it. Never raises. ``attempt``: its place in its
    trace (tracing.py; None: the context ``ctx`` came with, handed on)."""
    if attempt is None:
        attempt = tracing.Untraced(ctx.traceparent) if ctx.traceparent else tracing.NOT_TRACED
    ctx.traceparent = attempt.traceparent
    ids = ctx._trace_ids = attempt.log_ids
    token = logs.RUN.set((ctx.run_id, ctx.job_type, ctx.attempt, ids))
    try:
        with attempt.current():
            return _attempt(ctx, jt, payload)
    finally:
        logs.RUN.reset(token)


def _leave_if_forked(pid: int, code: int) -> None:
    """In a process the handler forked, which came back here (it returned, raised, or called
    sys.exit()): exit it. Carrying on, it was a second copy of the daemon, starting the runs
    claimed ahead that the daemon starts too."""
    if os.getpid() == pid:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 1


def _attempt(ctx: JobContext, jt: JobType, payload: Any) -> Outcome:
    pid = os.getpid()
    try:
        if jt.command is not None:
            return _run_command(ctx, jt, payload)
        assert jt.fn is not None
        value = _run_python(ctx, jt, payload)
    except LeaseLostError:
        _leave_if_forked(pid, 1)
        return Outcome(ctx.run_id, "lost", "lease lost", "lease_lost")
    except Exception as exc:
        _leave_if_forked(pid, 1)
        return _failure(ctx, jt, exc)
    except BaseException as exc:
        _leave_if_forked(pid, _exit_code(exc))
        # sys.exit() or a library's KeyboardInterrupt/GeneratorExit: a failure of the
        # run like any other, but worth a line of its own (it meant to stop something).
        log.warning(
            "handler_raised_base_exception",
            run_id=ctx.run_id,
            error_type=type(exc).__name__,
            error=short(str(exc)),
        )
        return _failure(ctx, jt, exc)
    _leave_if_forked(pid, 0)
    if value is None or ctx._committed:  # transaction() stored ctx.set_result()'s, if any
        return Outcome(ctx.run_id, "succeeded")
    try:
        stored = results.encode(value)
    except results.ResultError as exc:
        return failed(ctx, jt, short(str(exc)), "result", bounded(str(exc)))
    return Outcome(ctx.run_id, "succeeded", result=stored)


def claimed_context(
    run: ClaimedRun,
    store: RunStore,
    worker_id: str,
    guard: CommitGuard,
    flusher: Flusher | None = None,
) -> JobContext:
    """A fresh JobContext for a run this worker just claimed."""
    return JobContext(
        run_id=run.id,
        job_type=run.job_type,
        attempt=run.attempt,
        max_attempts=run.max_attempts,
        scheduled_for=run.scheduled_for,
        idempotency_key=run.idempotency_key,
        traceparent=run.traceparent,
        _store=store,
        _worker_id=worker_id,
        _guard=guard,
        _flusher=flusher,
        _started_at=run.started_at,
    )


def handler_summary(job_types: Mapping[str, JobType]) -> dict[str, str]:
    """{job type: what handles it}, for ``pgtick check`` and the start-up log line."""
    out = {}
    for name, jt in sorted(job_types.items()):
        out[name] = "command " + " ".join(jt.command) if jt.command else _describe(jt.fn)  # type: ignore[arg-type]
    return out


def hostname() -> str:
    return os.uname().nodename
