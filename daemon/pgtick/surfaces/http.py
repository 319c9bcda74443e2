"""One small HTTP server with a route table: the metrics listener (``metrics.listen``).

A server binds the address given under a config key and serves a fixed ``{(method, path):
handler}`` table; a handler takes a ``Request`` and returns a ``Response``. A path ending in
``/*`` matches one more segment (``/runs/*`` serves ``/runs/42``); every response carries the
server's fixed headers. The web console serves the same kind of table through waitress
(``pgtick.surfaces.console.server``); this one stays on the standard library so that the
daemon's core keeps its six runtime packages. A scrape or a health check is a few small
requests a minute, so the server is bounded rather than fast: at most ``MAX_CONNECTIONS``
connections, one thread each; a connection that is not inside a handler is closed
``REQUEST_DEADLINE_SECONDS`` after it connected or after its last response (the whole time a
request may take to arrive, and a keep-alive's idle limit); when all are taken, a new one
evicts the connection that has waited longest, or is refused if every one is inside a handler.
A slow-loris client therefore holds a socket for seconds, never a thread for good, and a real
scrape gets through. Access lines go to the debug log, never to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from pgtick.errors import ConfigError
from pgtick.observability.database import Readiness
from pgtick.observability.metrics import Metrics

MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_SECONDS = 10.0  # a client that stops sending does not hold a thread forever
# Bounds against slow or idle clients (finding 2 of issue 22): see the module docstring.
MAX_CONNECTIONS = 64
REQUEST_DEADLINE_SECONDS = 10.0
POLL_INTERVAL_SECONDS = 0.2  # how often the deadline is checked
STOP_TIMEOUT_SECONDS = 2.0
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
FORM = "application/x-www-form-urlencoded"
MAX_FORM_FIELDS = 100

log = structlog.get_logger("pgtick.http")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # names lower-cased
    body: bytes = b""
    # The address the connection came from, as the server saw it (the console's throttle of
    # wrong tokens keys on it); behind a reverse proxy, the proxy's. "" when not known.
    peer: str = ""

    def form(self) -> dict[str, list[str]]:
        """The fields of a url-encoded form body (empty for any other content type)."""
        content_type = self.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != FORM:
            return {}
        try:
            return urllib.parse.parse_qs(
                self.body.decode("utf-8"),
                keep_blank_values=True,
                strict_parsing=False,
                max_num_fields=MAX_FORM_FIELDS,
            )
        except (UnicodeDecodeError, ValueError):
            return {}

    def first(self, name: str, *, form: bool = False) -> str | None:
        """One query (or form) field's first value, None when absent."""
        values = (self.form() if form else self.query).get(name)
        return values[0] if values else None


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]
Routes = Mapping[tuple[str, str], Handler]


def text(status: int, body: str) -> Response:
    """A plain-text response, one line."""
    return Response(status, TEXT, (body.rstrip("\n") + "\n").encode("utf-8"))


def html(status: int, body: str) -> Response:
    """An HTML page (the caller has escaped what it interpolated)."""
    return Response(status, HTML, body.encode("utf-8"))


def see_other(location: str, headers: Mapping[str, str] | None = None) -> Response:
    """303: after a POST, the browser GETs ``location`` (a reload does not repeat the POST)."""
    return Response(HTTPStatus.SEE_OTHER, TEXT, b"", {"Location": location, **(headers or {})})


def find_route(routes: Routes, method: str, path: str) -> Handler | None:
    """The handler for ``path`` exactly, or for its parent with ``/*`` (one trailing segment)."""
    handler = routes.get((method, path))
    if handler is None and "/" in path.rstrip("/"):
        parent, _, last = path.rpartition("/")
        if last:
            handler = routes.get((method, parent + "/*"))
    return handler


def answer(routes: Routes, request: Request) -> Response:
    """The table's response to one request: HEAD is GET without the body (the caller drops
    it), 404 or 405 when no route matches, a 500 (logged, the path cut) when the handler
    fails."""
    lookup = "GET" if request.method == "HEAD" else request.method
    handler = find_route(routes, lookup, request.path)
    if handler is None:
        allowed = sorted({m for m, _ in routes if find_route(routes, m, request.path)})
        if not allowed:
            return text(HTTPStatus.NOT_FOUND, "not found")
        allow = ", ".join(allowed + (["HEAD"] if "GET" in allowed else []))
        response = text(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed")
        return Response(response.status, TEXT, response.body, {"Allow": allow})
    try:
        return handler(dataclasses.replace(request, method=lookup))
    except Exception:
        log.exception("http_handler_failed", method=request.method, path=request.path[:200])
        return text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")


class _Connection:
    """One open connection: since when it has waited for a request, whether a handler runs."""

    __slots__ = ("busy", "sock", "waiting_since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.waiting_since = time.monotonic()
        self.busy = False

    def drop(self) -> None:
        """Wake the connection's thread out of its read: it sees the end and finishes."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Another process on the port is an error to report, not a port to share.
    allow_reuse_address = False
    # The kernel's queue of connections not yet accepted (socketserver's 5 drops a burst's SYNs,
    # and each dropped one waits a second to retry).
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        headers: Mapping[str, str],
        max_connections: int,
        deadline_seconds: float,
    ) -> None:
        self.routes = dict(routes)
        self.headers = dict(headers)
        self.max_connections = max_connections
        self.deadline_seconds = deadline_seconds
        self.connections: dict[int, _Connection] = {}  # by id of the socket
        self.connections_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the new connection, within ``max_connections``: evict the one that has
        waited longest for a request, or refuse this one when every connection is busy."""
        victim = None
        with self.connections_lock:
            full = len(self.connections) >= self.max_connections
            waiting = [c for c in self.connections.values() if not c.busy] if full else []
            if waiting:
                victim = min(waiting, key=lambda c: c.waiting_since)
                del self.connections[id(victim.sock)]
            if not full or victim is not None:
                self.connections[id(request)] = _Connection(request)
        if full and victim is None:
            log.warning("http_connection_refused", reason="every connection is busy")
            self.shutdown_request(request)
            return
        if victim is not None:
            victim.drop()
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.pop(id(request), None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Between accepts (every POLL_INTERVAL_SECONDS): close connections past the deadline."""
        cutoff = time.monotonic() - self.deadline_seconds
        with self.connections_lock:
            late = [c for c in self.connections.values() if not c.busy and c.waiting_since < cutoff]
            for connection in late:
                del self.connections[id(connection.sock)]
        for connection in late:
            connection.drop()

    def connection(self, sock: socket.socket) -> _Connection | None:
        with self.connections_lock:
            return self.connections.get(id(sock))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or sent garbage: a debug line, not a traceback on stderr."""
        log.debug("http_connection_failed", client=str(client_address), exc_info=True)


class _Input:
    """A connection's input that notes when the client hung up: a header block cut short by the
    end of the stream reads like a complete one to the standard library, and is not a request
    (1 500 slow clients closing at once would otherwise each run a scrape)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.ended = False

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self.raw.readline(size)
        if not line:
            self.ended = True
        return line

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.raw.read(size)
        return data

    def close(self) -> None:
        self.raw.close()


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    server_version = "pgtick"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    rfile: Any

    def setup(self) -> None:
        super().setup()
        self.rfile = _Input(self.rfile)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        connection = self.server.connection(self.connection)
        if connection is None or self.rfile.ended:  # evicted, past the deadline, or hung up
            self.close_connection = True
            return
        url = urllib.parse.urlsplit(self.path)
        length_text = self.headers.get("Content-Length") or "0"
        if not (length_text.isascii() and length_text.isdigit()):  # "²".isdigit() too
            self.close_connection = True
            self._send(method, text(HTTPStatus.BAD_REQUEST, "bad Content-Length"))
            return
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(method, text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large"))
            return
        request = Request(
            method=method,
            path=url.path,
            query=urllib.parse.parse_qs(url.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length > 0 else b"",
        )
        connection.busy = True
        try:
            self._send(method, answer(self.server.routes, request))
        finally:
            connection.waiting_since = time.monotonic()
            connection.busy = False

    def _send(self, method: str, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in {**self.server.headers, **response.headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http_request", client=self.client_address[0], line=format % args)


class HttpServer:
    """A route table served on ``host:port``; ``key`` names the config key in errors;
    ``headers`` go on every response (the console's security headers)."""

    def __init__(
        self,
        key: str,
        host: str,
        port: int,
        routes: Routes,
        headers: Mapping[str, str] | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        deadline_seconds: float = REQUEST_DEADLINE_SECONDS,
    ) -> None:
        self.key = key
        self._address = (host, port)
        self._routes = routes
        self._headers = dict(headers or {})
        self._bounds = (max_connections, deadline_seconds)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind and serve on a daemon thread; a refused address is a ConfigError naming the key."""
        host, port = self._address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self._server = _Server(self._address, self._routes, self._headers, *self._bounds)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason = "address already in use"
            raise ConfigError(f"{self.key}: cannot listen on {shown}: {reason}") from None
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_SECONDS},
            name=f"pgtick-http-{self.key}",
            daemon=True,
        )
        self._thread.start()
        log.info("http_listening", key=self.key, address=shown, port=self.port)

    def stop(self) -> None:
        """Stop accepting, close the socket; requests in flight finish on their own threads."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_SECONDS)
        self._server = None


def observability_routes(metrics: Metrics, readiness: Readiness) -> dict[tuple[str, str], Handler]:
    """``/metrics``, ``/healthz`` (the process answers) and ``/readyz``."""

    def scrape(request: Request) -> Response:
        body, content_type = metrics.exposition(request.headers.get("accept", ""))
        return Response(HTTPStatus.OK, content_type, body)

    def healthz(_request: Request) -> Response:
        return text(HTTPStatus.OK, "ok")

    def readyz(_request: Request) -> Response:
        reason = readiness.reason_not_ready()
        if reason is None:
            return text(HTTPStatus.OK, "ready")
        return text(HTTPStatus.SERVICE_UNAVAILABLE, reason.splitlines()[0])

    return {("GET", "/metrics"): scrape, ("GET", "/healthz"): healthz, ("GET", "/readyz"): readyz}
