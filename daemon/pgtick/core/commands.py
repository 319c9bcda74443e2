"""Runs a command handler as a child process that leads its own process group.

The payload goes in on stdin, bounded tails of stdout and stderr come back (and every read
goes to an optional sink, the job output capture), and on timeout or
cancellation the whole group gets SIGTERM, then SIGKILL after a grace period, so grandchildren
that ignore SIGTERM do not outlive their run. Processes the child leaves in its group when it
exits normally get the same treatment (after up to PIPE_DRAIN_SECONDS if they hold its pipes):
a run is over only when its group is gone, so no attempt overlaps the leftovers of the last.
A single loop multiplexes the pipes with a selector, which lets us stop reading whenever we
choose (a process that escaped the group can not hang the worker by holding a pipe) and
notices cancellation within one poll interval.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

STDERR_TAIL_BYTES = 4096
STDOUT_TAIL_BYTES = 4096
DEFAULT_KILL_GRACE_SECONDS = 5.0
# Upper bound on how late a cancellation or timeout is noticed.
POLL_INTERVAL_SECONDS = 0.05
READ_CHUNK_BYTES = 1 << 20
# Larger pipes for stdout and stderr (Linux F_SETPIPE_SZ): a command printing a flood is read
# in 1 MiB reads instead of 64 KiB ones, 16 times fewer wake-ups of the daemon for the same bytes.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031
# A command's output is read at most this fast: a command flooding its stdout waits on its
# full pipe (as it would on a slow terminal) instead of taking a core of the daemon's host
# from the runs the daemon starts meanwhile. Far above what a job prints for people to read.
OUTPUT_BYTES_PER_SECOND = 64 << 20
RATE_WINDOW_SECONDS = 0.05
# After the child exits, how long processes it left behind may keep its pipes open.
PIPE_DRAIN_SECONDS = 1.0
# How long SIGKILLed processes may take to disappear before we stop waiting for them.
REAP_TIMEOUT_SECONDS = 5.0
# Reads after the run is over, for output already in the pipes (bounded: a writer that
# escaped the group could keep them busy forever).
FINAL_DRAIN_ROUNDS = 16
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# systemd hands these to pgtick alone; a child inheriting them could speak for the daemon; and
# with worker.processes above 1, a command using prometheus_client would write its series into
# the daemon's /metrics (metrics.py).
PRIVATE_ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PROMETHEUS_MULTIPROC_DIR")
# A run's trace context is its own (the caller's env), never the daemon's inherited one.
TRACE_ENV_VARS = ("TRACEPARENT", "TRACESTATE")

log = structlog.get_logger("pgtick.commands")

# Called with ("stdout" | "stderr", bytes) for every read from the child's pipes.
OutputSink = Callable[[str, bytes], None]


@dataclass(frozen=True)
class CommandResult:
    """What a finished (or killed) command left behind, ready for the attempt row."""

    returncode: int | None  # None if killed by us
    stderr_tail: str
    stdout_tail: str
    killed: str | None  # None, "timeout" or "cancelled"
    duration_seconds: float


class _Tail:
    """Keeps the last ``limit`` bytes of a stream whatever its length."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()

    def append(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) > 2 * self._limit:  # trim in batches, not on every chunk
            del self._buffer[: -self._limit]

    def text(self) -> str:
        return bytes(self._buffer[-self._limit :]).decode("utf-8", errors="replace")


def _group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in the group (zombies may wait on a lazy init)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member changed its user (setuid): it exists, maybe only as a zombie
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no procfs: trust killpg
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    """Signal every process in the group; one we may not signal is no reason to stop."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        log.warning("command_signal_refused", pid=pgid, signal=signum.name, error=str(exc))


def _spawn_failure(argv: Sequence[str], exc: OSError, started: float) -> CommandResult:
    """Map exec errors to the shell's exit codes so callers handle one kind of result."""
    if isinstance(exc, FileNotFoundError):
        returncode, message = EXIT_NOT_FOUND, f"command not found: {argv[0]}"
    elif isinstance(exc, PermissionError):
        returncode, message = EXIT_NOT_EXECUTABLE, f"permission denied: {argv[0]}"
    else:
        returncode, message = EXIT_NOT_EXECUTABLE, f"cannot execute: {argv[0]}: {exc}"
    return CommandResult(
        returncode=returncode,
        stderr_tail=message,
        stdout_tail="",
        killed=None,
        duration_seconds=time.monotonic() - started,
    )


class _Run:
    """State of one child between spawn and reap; see run_command for the contract."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        payload: bytes,
        cancelled: threading.Event,
        deadline: float | None,
        kill_grace_seconds: float,
        on_output: OutputSink | None = None,
    ) -> None:
        self.proc = proc
        self.on_output = on_output
        self.pgid = proc.pid  # start_new_session: the child leads a group named after it
        self.cancelled = cancelled
        self.deadline = deadline
        self.kill_grace_seconds = kill_grace_seconds
        self.stdout = _Tail(STDOUT_TAIL_BYTES)
        self.stderr = _Tail(STDERR_TAIL_BYTES)
        self.killed: str | None = None
        self._payload = memoryview(payload)
        self._sigkill_at: float | None = None
        self._give_up_at: float | None = None
        self._stop_reading_at: float | None = None
        self._selector = selectors.DefaultSelector()
        self._window_start = time.monotonic()
        self._window_bytes = 0
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        for pipe in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        self._selector.register(proc.stdout.fileno(), selectors.EVENT_READ, ("stdout", self.stdout))
        self._selector.register(proc.stderr.fileno(), selectors.EVENT_READ, ("stderr", self.stderr))
        if payload:
            os.set_blocking(proc.stdin.fileno(), False)
            self._selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()

    def _close_fd(self, fd: int) -> None:
        self._selector.unregister(fd)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed and stream.fileno() == fd:
                stream.close()

    def _over_rate(self, timeout: float) -> bool:
        """True (after waiting out the rest of the window, at most ``timeout``) when this
        window's share of OUTPUT_BYTES_PER_SECOND is read already."""
        now = time.monotonic()
        if now - self._window_start >= RATE_WINDOW_SECONDS:
            self._window_start, self._window_bytes = now, 0
            return False
        if self._window_bytes < OUTPUT_BYTES_PER_SECOND * RATE_WINDOW_SECONDS:
            return False
        time.sleep(min(timeout, self._window_start + RATE_WINDOW_SECONDS - now))
        return True

    def _pump(self, timeout: float) -> None:
        """Move bytes between us and the child, waiting at most ``timeout`` seconds."""
        if self._over_rate(timeout):
            return
        # With nothing registered the selector just sleeps: a poll interval, not a busy loop.
        for key, _ in self._selector.select(timeout):
            fd = int(key.fd)
            if key.data is not None:
                stream, tail = key.data
                chunk = os.read(fd, READ_CHUNK_BYTES)
                if chunk:
                    self._window_bytes += len(chunk)
                    tail.append(chunk)
                    if self.on_output is not None:
                        self.on_output(stream, chunk)
                else:
                    self._close_fd(fd)
                continue
            try:
                written = os.write(fd, self._payload)
            except BlockingIOError:
                continue
            except BrokenPipeError:  # the child does not read its stdin; that is its choice
                written = len(self._payload)
            self._payload = self._payload[written:]
            if not self._payload:
                self._close_fd(fd)

    def _terminate(self, now: float) -> None:
        """SIGTERM the group now, SIGKILL it once the grace period is over."""
        self._sigkill_at = now + self.kill_grace_seconds
        _signal_group(self.pgid, signal.SIGTERM)

    def _escalate(self, now: float) -> None:
        """Start or escalate killing: cancellation, timeout, end of the grace period."""
        if self.killed is None and self.proc.returncode is None:  # not once the child is done
            if self.cancelled.is_set():
                self.killed = "cancelled"
            elif self.deadline is not None and now >= self.deadline:
                self.killed = "timeout"
            if self.killed is not None:
                self._terminate(now)
        if self._sigkill_at is not None and self._give_up_at is None and now >= self._sigkill_at:
            log.warning("command_sigkill", pid=self.pgid, reason=self.killed)
            self._give_up_at = now + REAP_TIMEOUT_SECONDS
            _signal_group(self.pgid, signal.SIGKILL)

    def _finished(self, now: float) -> bool:
        """Decide, once per poll, whether the run is over."""
        self._escalate(now)
        if self._give_up_at is not None and now >= self._give_up_at:
            log.error("command_unkillable", pid=self.pgid)  # stuck in the kernel (state D)
            return True
        if self.proc.poll() is None:
            return False
        if self._stop_reading_at is None:
            self._stop_reading_at = now + PIPE_DRAIN_SECONDS
        if self._selector.get_map() and now < self._stop_reading_at:
            return False  # let the last output arrive
        if not _group_alive(self.pgid):
            return True
        if self._sigkill_at is None:
            # The child exited but left processes in its group: they go the same way.
            log.info("command_left_processes", pid=self.pgid)
            self._terminate(now)
        return False

    def wait(self) -> int | None:
        """Pump pipes and watch the clock until the run is over and its group is gone."""
        while not self._finished(time.monotonic()):
            self._pump(POLL_INTERVAL_SECONDS)
        for _ in range(FINAL_DRAIN_ROUNDS):  # what dead writers left in the pipe buffers
            if not self._selector.get_map():
                break
            self._pump(0)
        self.close()
        if self.killed == "cancelled" and self.proc.returncode == 0:
            return 0  # it ignored the SIGTERM and exited 0 on its own: it succeeded
        return None if self.killed is not None else self.proc.returncode

    def close(self) -> None:
        for key in list(self._selector.get_map().values()):
            self._close_fd(key.fd)
        self._selector.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def abort(self) -> None:
        """Leave nothing behind when the caller's thread is interrupted mid-run."""
        _signal_group(self.pgid, signal.SIGKILL)
        self.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(REAP_TIMEOUT_SECONDS)


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    inherited = dict(os.environ)
    for name in TRACE_ENV_VARS:
        inherited.pop(name, None)
    merged = {**inherited, **env}
    for name in PRIVATE_ENV_VARS:
        merged.pop(name, None)
    return merged


def run_command(
    argv: Sequence[str],
    *,
    payload_json: str,
    env: Mapping[str, str],
    cancelled: threading.Event,
    timeout_seconds: float | None,
    kill_grace_seconds: float = DEFAULT_KILL_GRACE_SECONDS,
    on_output: OutputSink | None = None,
) -> CommandResult:
    """Run ``argv`` (no shell) to completion, timeout or cancellation; never raises for it.

    The caller passes PGTICK_PAYLOAD, PGTICK_RUN_ID, PGTICK_ATTEMPT and
    PGTICK_IDEMPOTENCY_KEY in ``env``; they are laid over this process's environment. A
    missing or non-executable program comes back as exit code 127 or 126 with the reason in
    ``stderr_tail``. ``returncode`` is None when we killed the child. ``on_output`` sees
    every read from stdout and stderr as it arrives (the job output capture).
    """
    if not argv:
        raise ValueError("a command handler needs at least the program to run")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            env=_child_env(env),
        )
    except OSError as exc:
        return _spawn_failure(argv, exc, started)

    deadline = None if timeout_seconds is None else started + timeout_seconds
    run = _Run(
        proc, payload_json.encode("utf-8"), cancelled, deadline, kill_grace_seconds, on_output
    )
    try:
        returncode = run.wait()
    except BaseException:
        run.abort()
        raise
    return CommandResult(
        returncode=returncode,
        stderr_tail=run.stderr.text(),
        stdout_tail=run.stdout.text(),
        killed=run.killed,
        duration_seconds=time.monotonic() - started,
    )
