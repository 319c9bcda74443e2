"""Command handlers as real child processes: exit codes, pipes, environment, killing."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from pgtick.core.commands import (
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    STDERR_TAIL_BYTES,
    CommandResult,
    run_command,
)

SH = "/bin/sh"
PAYLOAD = json.dumps({"invoice_ids": [1, 2, 3], "note": "grüße"})
# How long a SIGKILLed process may take to leave the process table in a busy CI container.
GONE_WITHIN_SECONDS = 2.0


def run(
    argv: list[str],
    *,
    payload_json: str = PAYLOAD,
    env: dict[str, str] | None = None,
    cancelled: threading.Event | None = None,
    timeout_seconds: float | None = 10.0,
    kill_grace_seconds: float = 0.5,
) -> CommandResult:
    return run_command(
        argv,
        payload_json=payload_json,
        env=env or {},
        cancelled=cancelled or threading.Event(),
        timeout_seconds=timeout_seconds,
        kill_grace_seconds=kill_grace_seconds,
    )


def alive(pid: int) -> bool:
    """Running, as opposed to absent or a zombie nobody reaped yet (PID 1 may be lazy)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return False
    return fields[0] not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def wait_for_file(path: Path) -> str:
    deadline = time.monotonic() + GONE_WITHIN_SECONDS
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.01)
    return path.read_text().strip()


def test_exit_zero_is_success() -> None:
    result = run([SH, "-c", "echo done"])
    assert result.returncode == 0
    assert result.killed is None
    assert result.stdout_tail == "done\n"
    assert result.stderr_tail == ""
    assert 0 < result.duration_seconds < 5


def test_exit_code_is_reported() -> None:
    result = run([SH, "-c", "echo 'disk full' >&2; exit 3"])
    assert result.returncode == 3
    assert result.killed is None
    assert result.stderr_tail == "disk full\n"


def test_stderr_tail_is_bounded_and_is_the_tail() -> None:
    # 10 MB of "x" then a last line: the tail holds the end, not the beginning.
    script = (
        "import sys\n"
        "for _ in range(160): sys.stderr.write('x' * 65536)\n"
        "sys.stderr.write('\\nthe real error\\n')\n"
        "sys.stdout.write('o' * 1_000_000 + 'END')\n"
    )
    result = run([sys.executable, "-c", script])
    assert result.returncode == 0
    assert len(result.stderr_tail.encode()) == STDERR_TAIL_BYTES
    assert result.stderr_tail.endswith("x\nthe real error\n")
    assert result.stdout_tail.endswith("oEND")
    assert len(result.stdout_tail) <= STDERR_TAIL_BYTES


def test_tail_decodes_invalid_utf8_with_replacement() -> None:
    result = run([sys.executable, "-c", "import sys; sys.stderr.buffer.write(b'bad \\xff byte')"])
    assert result.stderr_tail == "bad \ufffd byte"


def test_payload_arrives_on_stdin(tmp_path: Path) -> None:
    received = tmp_path / "stdin.json"
    result = run([SH, "-c", f"cat > {received}"])
    assert result.returncode == 0
    assert json.loads(received.read_text(encoding="utf-8")) == json.loads(PAYLOAD)


def test_large_payload_while_child_writes_a_lot_does_not_deadlock() -> None:
    # The child fills its stdout pipe before reading stdin; writing the payload first and
    # reading afterwards would deadlock both sides.
    big_payload = json.dumps({"blob": "p" * 1_000_000})
    script = (
        "import sys\n"
        "sys.stdout.write('o' * 1_000_000); sys.stdout.flush()\n"
        "data = sys.stdin.read()\n"
        "print(len(data))\n"
    )
    result = run([sys.executable, "-c", script], payload_json=big_payload)
    assert result.returncode == 0
    assert result.stdout_tail.endswith(f"{len(big_payload)}\n")


def test_child_that_ignores_stdin_is_fine() -> None:
    big_payload = json.dumps({"blob": "p" * 1_000_000})  # larger than a pipe buffer
    result = run([SH, "-c", "exec 0<&-; echo ok"], payload_json=big_payload)
    assert result.returncode == 0
    assert result.stdout_tail == "ok\n"


def test_empty_payload_closes_stdin_at_once() -> None:
    result = run([SH, "-c", "cat; echo eof"], payload_json="")
    assert result.returncode == 0
    assert result.stdout_tail == "eof\n"


def test_environment_is_passed_over_our_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTICK_TEST_INHERITED", "from-daemon")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    env = {
        "PGTICK_PAYLOAD": PAYLOAD,
        "PGTICK_RUN_ID": "1234",
        "PGTICK_ATTEMPT": "2",
        "PGTICK_IDEMPOTENCY_KEY": "invoice-2026-11",
    }
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    result = run([sys.executable, "-c", script], env=env)
    child_env = json.loads(result.stdout_tail)
    assert child_env.items() >= env.items()
    assert child_env["PGTICK_TEST_INHERITED"] == "from-daemon"
    assert "NOTIFY_SOCKET" not in child_env  # only the daemon talks to systemd
    assert "WATCHDOG_USEC" not in child_env


def test_no_shell_is_involved(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = run(["/bin/echo", f"$(touch {marker})", ";", "exit", "9"])
    assert result.returncode == 0
    assert result.stdout_tail == f"$(touch {marker}) ; exit 9\n"
    assert not marker.exists()


def test_child_leads_its_own_process_group() -> None:
    result = run([sys.executable, "-c", "import os; print(os.getpgid(0) == os.getpid())"])
    assert result.stdout_tail == "True\n"


def test_timeout_kills_the_group_including_a_grandchild_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 1000 & echo $$ $! > {pids}; wait"
    started = time.monotonic()
    result = run([SH, "-c", script], timeout_seconds=0.5, kill_grace_seconds=0.5)
    elapsed = time.monotonic() - started

    assert result.killed == "timeout"
    assert result.returncode is None
    assert 0.9 <= elapsed < 4.0  # timeout + grace, then SIGKILL; not the child's 1000 s
    child_pid, grandchild_pid = (int(pid) for pid in pids.read_text().split())
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)  # reaped by run_command
    assert not alive(grandchild_pid)
    assert not group_alive(child_pid)


def test_sigterm_is_enough_for_a_well_behaved_child() -> None:
    started = time.monotonic()
    result = run([SH, "-c", "sleep 1000"], timeout_seconds=0.2, kill_grace_seconds=5.0)
    assert result.killed == "timeout"
    assert result.returncode is None
    assert time.monotonic() - started < 3.0  # did not sit out the 5 s grace period


def test_cancellation_kills_within_the_grace_period(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cancelled = threading.Event()
    script = f"trap '' TERM; sleep 1000 & echo $$ $! > {pids}; wait"
    outcome: list[CommandResult] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run([SH, "-c", script], cancelled=cancelled, timeout_seconds=None)
        )
    )
    worker.start()
    wait_for_file(pids)
    cancelled_at = time.monotonic()
    cancelled.set()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert time.monotonic() - cancelled_at < 0.5 + 1.5  # grace 0.5 s plus polling slack
    (result,) = outcome
    assert result.killed == "cancelled"
    assert result.returncode is None
    child_pid, grandchild_pid = (int(pid) for pid in pids.read_text().split())
    assert not alive(grandchild_pid)
    assert not group_alive(child_pid)


def test_already_cancelled_event_kills_at_once() -> None:
    cancelled = threading.Event()
    cancelled.set()
    started = time.monotonic()
    result = run([SH, "-c", "sleep 1000"], cancelled=cancelled, timeout_seconds=None)
    assert result.killed == "cancelled"
    assert time.monotonic() - started < 2.0


def test_background_grandchild_holding_the_pipes_does_not_hang_us(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 1000 & echo $! > {pids}; echo started; exit 0"
    started = time.monotonic()
    result = run([SH, "-c", script], timeout_seconds=None, kill_grace_seconds=0.5)
    assert time.monotonic() - started < 4.0
    assert result.returncode == 0
    assert result.killed is None
    assert result.stdout_tail == "started\n"
    assert not alive(int(pids.read_text()))


def test_background_grandchild_without_the_pipes_is_not_left_behind(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {pids}; exit 0"
    result = run([SH, "-c", script], timeout_seconds=None, kill_grace_seconds=0.5)
    assert result.returncode == 0
    assert result.killed is None
    assert not alive(int(pids.read_text()))


def test_missing_executable_is_exit_127(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "program")
    result = run([missing, "--days", "30"])
    assert result.returncode == EXIT_NOT_FOUND
    assert result.stderr_tail == f"command not found: {missing}"
    assert result.killed is None


def test_non_executable_file_is_exit_126(tmp_path: Path) -> None:
    script = tmp_path / "cleanup"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)  # no x bit: not even root may exec it
    result = run([str(script)])
    assert result.returncode == EXIT_NOT_EXECUTABLE
    assert result.stderr_tail == f"permission denied: {script}"


def test_file_without_interpreter_is_exit_126(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF-but-not-really")
    garbage.chmod(0o755)
    result = run([str(garbage)])
    assert result.returncode == EXIT_NOT_EXECUTABLE
    assert result.stderr_tail.startswith(f"cannot execute: {garbage}")


def test_empty_argv_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="program"):
        run([])
