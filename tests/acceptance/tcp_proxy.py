"""A TCP proxy on 127.0.0.1 in front of the test server's Unix socket, that a test can cut and
restore: a network outage between one daemon and PostgreSQL, while other daemons and the test
itself still reach the server directly."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from psycopg.conninfo import conninfo_to_dict, make_conninfo

BUFFER_BYTES = 65536
POLL_SECONDS = 0.05


def socket_path(dsn: str) -> str:
    """The Unix socket file the embedded server listens on, from its DSN."""
    if dsn.startswith("postgresql://"):
        host = parse_qs(urlparse(dsn).query).get("host", [""])[0]
        port = urlparse(dsn).port or 5432
    else:
        params = conninfo_to_dict(dsn)
        host, port = str(params.get("host", "")), int(params.get("port") or 5432)
    if not host.startswith("/"):
        raise ValueError(f"not a Unix-socket DSN: {dsn!r}")
    return str(Path(host) / f".s.PGSQL.{port}")


class TcpProxy:
    """Forwards each accepted connection to the server's socket; ``cut()`` drops every open
    connection and refuses new ones (they are accepted and closed at once) until
    ``restore()``."""

    def __init__(self, target_socket: str) -> None:
        self._target = target_socket
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def dsn(self, dsn: str) -> str:
        """``dsn`` pointed at this proxy instead of the socket."""
        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            victims, self._open = self._open, []
        for sock in victims:
            _close(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)
        self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        self._listener.settimeout(POLL_SECONDS)
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refuse = self._cut
            if refuse:
                _close(client)
                continue
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self._target)
            except OSError:
                _close(client)
                _close(server)
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """Copy bytes both ways until either side closes (or the proxy cuts them)."""
        sel = selectors.DefaultSelector()
        try:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while True:
                for key, _ in sel.select(POLL_SECONDS):
                    src = key.fileobj
                    assert isinstance(src, socket.socket)
                    data = src.recv(BUFFER_BYTES)
                    if not data:
                        return
                    key.data.sendall(data)
                if a.fileno() < 0 or b.fileno() < 0:
                    return
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            _close(a)
            _close(b)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def proxy_for(dsn: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(socket_path(dsn))
    try:
        yield proxy
    finally:
        proxy.close()
