"""The console's HTTP server: the route table of ``routes`` as a WSGI application, served by
waitress (the ``pgtick[console]`` extra).

waitress reads requests on one event loop and hands only complete ones to a fixed pool of
``WEB_THREADS`` threads, so a slow or idle client costs a socket, never a thread. On top of its
connection limit and idle timeout this module adds what issue 22 (finding 2) asks: a request
must arrive whole within ``REQUEST_DEADLINE_SECONDS`` (a client trickling a header byte every
few seconds is cut off, which waitress's per-activity timeout does not do), and when
``MAX_CONNECTIONS`` are open the connection that has waited longest for its request is closed
to make room, instead of new ones waiting in the kernel's queue behind an attacker's.
``/metrics`` and ``/healthz`` are on their own listener (``pgtick.surfaces.http``), so nothing
here can keep them from answering.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

import structlog

from pgtick.errors import ConfigError
from pgtick.surfaces.http import MAX_BODY_BYTES, Request, Routes, answer
from pgtick.surfaces.operations.setup import require_console_extra

WEB_THREADS = 4  # pages take milliseconds; the console's pool has as few connections
MAX_CONNECTIONS = 100
REQUEST_DEADLINE_SECONDS = 10.0  # from a request's first byte to its last
IDLE_SECONDS = 10  # a keep-alive connection with no request in flight
MAX_HEADER_BYTES = 64 * 1024
STOP_TIMEOUT_SECONDS = 2.0

log = structlog.get_logger("pgtick.console")


StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def wsgi_app(routes: Routes, headers: Mapping[str, str]) -> WsgiApp:
    """The route table as a WSGI application; ``headers`` go on every response."""
    fixed = dict(headers)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ["REQUEST_METHOD"])
        # PATH_INFO is percent-decoded as latin-1 text; the route table wants what was sent
        path = urllib.parse.quote(str(environ.get("PATH_INFO", "")).encode("latin-1"), safe="/")
        request_headers = {
            key[5:].replace("_", "-").lower(): str(value)
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(key):
                request_headers[key.replace("_", "-").lower()] = str(environ[key])
        length_text = request_headers.get("content-length", "0")
        length = int(length_text) if length_text.isascii() and length_text.isdigit() else 0
        body = environ["wsgi.input"].read(length) if 0 < length <= MAX_BODY_BYTES else b""
        request = Request(
            method=method,
            path=path,
            query=urllib.parse.parse_qs(str(environ.get("QUERY_STRING", ""))),
            headers=request_headers,
            body=body,
            peer=str(environ.get("REMOTE_ADDR", "")),  # the socket's peer: no header trusted
        )
        response = answer(routes, request)
        phrase = HTTPStatus(response.status).phrase
        out = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *{**fixed, **response.headers}.items(),
        ]
        start_response(f"{response.status} {phrase}", out)
        return [] if method == "HEAD" else [response.body]

    return app


def _bounded_server(app: WsgiApp, sock: socket.socket, deadline_seconds: float) -> Any:
    """A waitress server on ``sock`` with the deadline and the eviction of the docstring."""
    from waitress.adjustments import Adjustments
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer
    from waitress.task import ThreadedTaskDispatcher

    class Channel(HTTPChannel):  # type: ignore[misc]
        request_started = 0.0

        def received(self, data: bytes) -> bool:
            if data and self.request is None:  # the first bytes of a new request
                self.request_started = time.time()
            return bool(super().received(data))

        def waiting_since(self) -> float:
            return self.request_started if self.request is not None else self.last_activity

    class Server(TcpWSGIServer):  # type: ignore[misc]
        channel_class = Channel

        def maintenance(self, now: float) -> None:
            super().maintenance(now)  # idle keep-alive connections (channel_timeout)
            cutoff = now - deadline_seconds
            for channel in list(self.active_channels.values()):
                started = channel.request_started
                if not channel.requests and channel.request is not None and started < cutoff:
                    channel.will_close = True

        def readable(self) -> bool:
            if self.accepting and len(self._map) >= self.adj.connection_limit:
                waiting = [
                    c for c in self.active_channels.values() if not c.requests and not c.will_close
                ]
                if waiting:
                    min(waiting, key=lambda c: c.waiting_since()).will_close = True
            return bool(super().readable())

    adj = Adjustments(
        sockets=[sock],
        threads=WEB_THREADS,
        connection_limit=MAX_CONNECTIONS,
        channel_timeout=IDLE_SECONDS,
        cleanup_interval=1,
        max_request_header_size=MAX_HEADER_BYTES,
        max_request_body_size=MAX_BODY_BYTES,
        asyncore_use_poll=True,  # select() stops at 1 024 descriptors
        expose_tracebacks=False,
        ident="pgtick",
    )
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    sockinfo = (sock.family, sock.type, sock.proto, sock.getsockname())
    return Server(
        app,
        map={},
        _sock=sock,
        dispatcher=dispatcher,
        adj=adj,
        bind_socket=False,
        sockinfo=sockinfo,
    )


class ConsoleServer:
    """The console's route table served by waitress on ``host:port``; ``key`` names the config
    key in errors; ``headers`` go on every response (the console's security headers)."""

    def __init__(
        self,
        key: str,
        host: str,
        port: int,
        routes: Routes,
        headers: Mapping[str, str] | None = None,
        *,
        deadline_seconds: float = REQUEST_DEADLINE_SECONDS,
    ) -> None:
        self.key = key
        self._address = (host, port)
        self._app = wsgi_app(routes, headers or {})
        self._deadline_seconds = deadline_seconds
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._server is None:
            raise RuntimeError("server not started")
        return self._port

    def start(self) -> None:
        """Bind and serve on a daemon thread; a refused address, or waitress missing, is a
        ConfigError naming the key."""
        require_console_extra(self.key)  # said clearly at start-up, not at the first page
        host, port = self._address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.bind(self._address)
        except OSError as exc:
            sock.close()
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason = "address already in use"
            raise ConfigError(f"{self.key}: cannot listen on {shown}: {reason}") from None
        self._port = int(sock.getsockname()[1])
        self._server = _bounded_server(self._app, sock, self._deadline_seconds)
        self._thread = threading.Thread(
            target=self._server.run, name=f"pgtick-http-{self.key}", daemon=True
        )
        self._thread.start()
        log.info("http_listening", key=self.key, address=shown, port=self._port)

    def stop(self) -> None:
        """Close every connection and the socket on the event loop's own thread (the loop
        ends with nothing left to watch), then stop the threads."""
        if self._server is None:
            return
        from waitress import wasyncore

        server = self._server
        try:
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        except OSError as exc:
            # The loop's wake-up pipe is gone (its descriptor closed under it): close the
            # sockets from here instead; the loop, polling them, finds nothing left to watch.
            log.warning("http_stop_unwoken", key=self.key, error=str(exc))
            wasyncore.close_all(server._map, ignore_all=True)
            # The pipe's read end as the loop polled it (a copy the trigger owns), which the
            # trigger leaves open when closing its other end fails. Closed through its owner,
            # once: left to the garbage collector, it would close that descriptor number
            # whenever it ran, by then perhaps someone else's. None when close_all closed it
            # (its other end's number closed without an error: reused by then).
            if server.trigger.socket is not None:
                server.trigger.socket.close()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_SECONDS)
        server.task_dispatcher.shutdown(timeout=STOP_TIMEOUT_SECONDS)
        self._server = None
