"""sd_notify against a real datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgtick.observability.systemd import SEND_TIMEOUT_SECONDS, Notifier

RECEIVE_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket at a filesystem path, as systemd creates it."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(RECEIVE_TIMEOUT_SECONDS)
    yield sock, str(path)
    sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in the abstract namespace (``@name``)."""
    name = f"pgtick-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(RECEIVE_TIMEOUT_SECONDS)
    yield sock, "@" + name
    sock.close()


def assert_nothing_received(sock: socket.socket) -> None:
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)


def test_path_socket_receives_ready_with_status(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    notifier.ready("ticking, 4 threads")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ticking, 4 threads"
    notifier.close()


def test_abstract_socket(abstract_receiver: tuple[socket.socket, str]) -> None:
    sock, address = abstract_receiver
    notifier = Notifier({"NOTIFY_SOCKET": address})
    notifier.ready()
    assert sock.recv(4096) == b"READY=1"
    notifier.close()


def test_each_message(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"})
    notifier.status("line one\nline two\r\n")
    notifier.watchdog()
    notifier.stopping("draining 3 runs")
    notifier.stopping()
    notifier.notify("EXTEND_TIMEOUT_USEC=5000000", "STATUS=migrating")
    assert sock.recv(4096) == b"STATUS=line one line two"
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 3 runs"
    assert sock.recv(4096) == b"STOPPING=1"
    assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=5000000\nSTATUS=migrating"
    notifier.close()


def test_watchdog_interval_is_half_of_watchdog_usec(receiver: tuple[socket.socket, str]) -> None:
    _, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"})
    assert notifier.watchdog_interval_seconds == pytest.approx(15.0)
    own_pid = Notifier(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert own_pid.watchdog_interval_seconds == pytest.approx(15.0)


@pytest.mark.parametrize("usec", ["", "abc", "0", "-5", "1.5"])
def test_invalid_watchdog_usec_disables_watchdog(
    receiver: tuple[socket.socket, str], usec: str
) -> None:
    sock, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": usec})
    assert notifier.watchdog_interval_seconds is None
    notifier.watchdog()
    assert_nothing_received(sock)
    notifier.close()


# "another" is resolved in the test: a pid in a test id would differ between pytest-xdist's
# workers, which then refuse to run (each must collect the same tests).
@pytest.mark.parametrize("pid", ["another", "not-a-pid"])
def test_watchdog_pid_of_another_process_disables_watchdog(
    receiver: tuple[socket.socket, str], pid: str
) -> None:
    sock, path = receiver
    pid = str(os.getpid() + 1) if pid == "another" else pid
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": pid})
    assert notifier.watchdog_interval_seconds is None
    notifier.watchdog()
    assert_nothing_received(sock)
    notifier.ready()  # notifications other than the watchdog still go out
    sock.setblocking(True)
    assert sock.recv(4096) == b"READY=1"
    notifier.close()


@pytest.mark.parametrize("value", [None, "", "relative/path", "@", "vsock:2:1234"])
def test_without_usable_notify_socket_everything_is_a_no_op(value: str | None) -> None:
    env = {"WATCHDOG_USEC": "10000000"}
    if value is not None:
        env["NOTIFY_SOCKET"] = value
    notifier = Notifier(env)
    assert not notifier.enabled
    assert notifier.watchdog_interval_seconds is None
    notifier.ready("x")
    notifier.status("x")
    notifier.watchdog()
    notifier.stopping()
    notifier.close()


def test_reads_os_environ_by_default(
    receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    notifier = Notifier()
    notifier.ready()
    assert sock.recv(4096) == b"READY=1"
    notifier.close()


def test_socket_removed_mid_way_does_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000000"})
    notifier.ready()
    assert sock.recv(4096) == b"READY=1"
    sock.close()
    path.unlink()
    notifier.watchdog()
    notifier.status("still alive")
    notifier.stopping()
    notifier.close()


def test_closed_socket_without_unlink_does_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    notifier = Notifier({"NOTIFY_SOCKET": str(path)})
    sock.close()  # the path stays, nobody listens: ECONNREFUSED
    notifier.ready()
    notifier.close()


def test_reader_that_never_reads_does_not_block_forever(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    notifier = Notifier({"NOTIFY_SOCKET": str(path)})
    # The receive queue holds max_dgram_qlen + 1 datagrams; the next sendto would block.
    queue_limit = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    started = time.monotonic()
    for _ in range(queue_limit + 2):
        notifier.status("x" * 1000)
    elapsed = time.monotonic() - started
    notifier.close()
    sock.close()
    assert elapsed < 2 * SEND_TIMEOUT_SECONDS + 1.0


def test_close_is_final_and_idempotent(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.close()
    notifier.close()
    notifier.ready()
    assert not notifier.enabled
    assert_nothing_received(sock)
