"""The console served by waitress (``pgtick.surfaces.console.server``), without a database: the
route table over WSGI, the checks that answer before any database work (huge ids, Host), and
the bounds against idle and slow clients (issue 22, findings 2 and 3)."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest

from pgtick.errors import ConfigError
from pgtick.storage.store import RunStore
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import ConsoleServer
from pgtick.surfaces.http import Request, Response, text
from pgtick.surfaces.operations.setup import CONSOLE_EXTRA_MISSING

TOKEN = "s3cret-token"
HUGE = "9" * 5000


def call(
    port: int,
    method: str,
    path: str,
    body: str = "",
    headers: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, dict[str, str], bytes, float]:
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
        conn.request(method, path, body=body.encode(), headers=sent)
        response = conn.getresponse()
        data = response.read()
        found = {k.lower(): v for k, v in response.getheaders()}
        return response.status, found, data, time.monotonic() - began
    finally:
        conn.close()


@pytest.fixture
def console() -> Iterator[ConsoleServer]:
    # no store: every request here is answered before the database would be asked
    routes = Console(cast(RunStore, None), TOKEN, heartbeat_seconds=20).routes()
    server = ConsoleServer("web.listen", "127.0.0.1", 0, routes, SECURITY_HEADERS)
    server.start()
    yield server
    server.stop()


def test_the_route_table_over_wsgi() -> None:
    seen: list[Request] = []

    def echo(request: Request) -> Response:
        seen.append(request)
        return Response(201, "text/plain", b"made", {"X-Extra": "1"})

    server = ConsoleServer(
        "web.listen", "127.0.0.1", 0, {("POST", "/x/*"): echo, ("GET", "/g"): echo}, {"X-F": "f"}
    )
    server.start()
    try:
        spoofed = {"X-Forwarded-For": "203.0.113.9", "Remote-Addr": "203.0.113.9"}
        status, headers, body, _ = call(
            server.port, "POST", "/x/a%20b?q=1&q=2", "a=1&b=%3C", spoofed
        )
        assert (status, body, headers["x-extra"], headers["x-f"]) == (201, b"made", "1", "f")
        assert headers["server"] == "pgtick"
        request = seen[-1]
        assert (request.method, request.path) == ("POST", "/x/a%20b")
        assert request.query == {"q": ["1", "2"]}
        assert request.form() == {"a": ["1"], "b": ["<"]}
        assert request.peer == "127.0.0.1"  # the connection's, whatever a header says
        assert call(server.port, "HEAD", "/g")[:3] == (201, call(server.port, "HEAD", "/g")[1], b"")
        assert call(server.port, "GET", "/nope")[0] == 404
        status, headers, _, _ = call(server.port, "GET", "/x/1")
        assert (status, headers["allow"]) == (405, "POST")
    finally:
        server.stop()


def test_stop_frees_the_port_when_the_loop_cannot_be_woken() -> None:
    """CI once saw stop() raise EBADF: the event loop's wake-up pipe had been closed under it
    (by what, not found). The daemon stops its console last, after the drain; a stop that
    raises there turned a clean exit into a traceback."""
    server = ConsoleServer("web.listen", "127.0.0.1", 0, {("GET", "/g"): lambda r: text(200, "ok")})
    server.start()
    port = server.port
    assert call(port, "GET", "/g")[0] == 200
    wake = server._server.trigger  # the pipe the stale close hit
    os.close(wake.trigger)
    thread = server._thread
    server.stop()  # does not raise
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_huge_ids_are_answered_before_the_database(
    console: ConsoleServer, capfd: pytest.CaptureFixture[str]
) -> None:
    host = {"Host": "127.0.0.1"}
    status, _, body, _ = call(console.port, "GET", f"/runs/{HUGE}", headers=host)
    assert status == 404 and b"not a run id" in body and len(body) < 2000
    for before in (HUGE, str(2**64), str(2**63), "0", "-1", "x"):
        status, _, body, _ = call(console.port, "GET", f"/runs?before={before}", headers=host)
        assert status == 400 and b"before: not a run id" in body, before
    bearer = {**host, "Authorization": f"Bearer {TOKEN}"}
    for action in ("retry", "cancel"):
        status, _, body, _ = call(
            console.port, "POST", f"/actions/{action}", f"run_id={HUGE}", bearer
        )
        assert status == 400 and b"run_id: not a run id" in body
    err = capfd.readouterr()
    assert "Traceback" not in err.out + err.err and HUGE not in err.out + err.err


def test_host_must_name_the_console(console: ConsoleServer) -> None:
    assert call(console.port, "GET", "/login", headers={"Host": "127.0.0.1:8089"})[0] == 200
    assert call(console.port, "GET", "/login", headers={"Host": "localhost:1234"})[0] == 200
    status, headers, body, _ = call(
        console.port, "GET", "/", headers={"Host": "rebound.evil.example"}
    )
    assert status == 421 and b"not this console" in body
    assert headers["content-security-policy"].startswith("default-src 'self'")
    post = {"Host": "attacker.example", "Authorization": f"Bearer {TOKEN}"}
    assert call(console.port, "POST", "/actions/retry", "run_id=1", post)[0] == 421


def test_login_sets_the_session_cookie_and_a_wrong_token_is_slow(console: ConsoleServer) -> None:
    status, headers, body, _ = call(console.port, "GET", "/login", headers={"Host": "127.0.0.1"})
    form_cookie = headers["set-cookie"]
    assert status == 200 and form_cookie.startswith("pgtick_login=")
    assert "HttpOnly" in form_cookie and "SameSite=Strict" in form_cookie
    csrf = form_cookie.split(";")[0].removeprefix("pgtick_login=")
    assert f'name="csrf" value="{csrf}"'.encode() in body
    host = {"Host": "127.0.0.1", "Cookie": f"pgtick_login={csrf}"}
    status, headers, _, seconds = call(
        console.port, "POST", "/login", f"token={TOKEN}&csrf={csrf}&name=tester", host
    )
    cookie = headers["set-cookie"]
    assert (status, headers["location"]) == (303, "/") and seconds < 0.5
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=43200" in cookie
    status, headers, body, seconds = call(
        console.port, "POST", "/login", f"token=guess&csrf={csrf}&name=tester", host
    )
    assert status == 403 and "set-cookie" not in headers and b"wrong token" in body
    assert seconds < 0.5  # answered at once: no request thread waits
    # For a second after it this client's tokens are refused unchecked, the right one too;
    # another client's are checked.
    status, headers, body, _ = call(
        console.port, "POST", "/login", f"token={TOKEN}&csrf={csrf}&name=tester", host
    )
    assert status == 403 and "set-cookie" not in headers and b"try again in" in body
    elsewhere = call(
        console.port, "POST", "/login", f"token={TOKEN}&csrf={csrf}&name=tester", host, "127.0.0.2"
    )
    assert elsewhere[0] == 303 and elsewhere[1]["set-cookie"].startswith("pgtick_session=")
    time.sleep(1.1)
    opaque = {**host, "Origin": "null"}
    assert (
        call(console.port, "POST", "/login", f"token={TOKEN}&csrf={csrf}&name=tester", opaque)[0]
        == 403
    )
    no_form = {"Host": "127.0.0.1"}  # the token without the login form's CSRF pair
    status, headers, body, _ = call(console.port, "POST", "/login", f"token={TOKEN}", no_form)
    assert status == 403 and b"CSRF" in body and "set-cookie" not in headers


def test_idle_keep_alive_connections_do_not_stop_a_page(console: ConsoleServer) -> None:
    idle: list[http.client.HTTPConnection] = []
    try:
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=5)
            conn.request("GET", "/static/console.css")
            conn.getresponse().read()
            idle.append(conn)
        times = sorted(call(console.port, "GET", "/login")[3] for _ in range(5))
        assert times[2] < 0.1, f"median page {times[2]:.3f}s behind 200 idle connections"
    finally:
        for conn in idle:
            conn.close()


def test_slow_clients_are_evicted_and_cut_off_at_the_deadline() -> None:
    routes = {("GET", "/p"): lambda _r: text(200, "p")}
    server = ConsoleServer("web.listen", "127.0.0.1", 0, routes, deadline_seconds=1.0)
    server.start()
    threads_before = threading.active_count()
    slow: list[socket.socket] = []
    try:
        for _ in range(300):  # three times the connection limit, each part of a header
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /p HTTP/1.1\r\nX-Slow: ")
            slow.append(sock)
        assert threading.active_count() <= threads_before + 1  # no thread per connection
        time.sleep(0.2)
        times = sorted(call(server.port, "GET", "/p")[3] for _ in range(5))
        assert times[2] < 0.1, f"median page {times[2]:.3f}s behind 300 slow clients"
        trickler = socket.create_connection(("127.0.0.1", server.port))
        trickler.sendall(b"GET /p HTTP/1.1\r\n")
        trickler.settimeout(0.3)
        began, cut = time.monotonic(), False
        while time.monotonic() - began < 6 and not cut:
            try:
                trickler.sendall(b"X")
                cut = trickler.recv(4096) == b""
            except TimeoutError:
                pass
            except OSError:
                cut = True
        assert cut and time.monotonic() - began < 4.5, "a trickling client was never cut off"
        trickler.close()
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_without_the_console_extra_the_console_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "waitress", None)
    server = ConsoleServer("web.listen", "127.0.0.1", 0, {})
    with pytest.raises(ConfigError) as refused:
        server.start()
    assert str(refused.value) == CONSOLE_EXTRA_MISSING.format(key="web.listen")
    assert "pip install 'pgtick[console]'" in str(refused.value)


def test_stop_survives_a_wake_up_pipe_whose_descriptor_was_closed_and_reused() -> None:
    """Something else in the process closed the number of the event loop's wake-up pipe and
    opened another file that got it: waking the loop fails, and closing the pipe closes that
    number without an error. stop() still closes the listening socket and returns (a parallel
    test run once hit this in teardown)."""
    routes = Console(cast(RunStore, None), TOKEN, heartbeat_seconds=20).routes()
    server = ConsoleServer("web.listen", "127.0.0.1", 0, routes, SECURITY_HEADERS)
    server.start()
    port = server.port
    number = server._server.trigger.trigger  # type: ignore[union-attr]
    other = os.open(os.devnull, os.O_RDONLY)
    # The pipe's end closed and its number given to another file, in one step: a lower
    # number may be free in this process, so the next open() need not get this one.
    os.dup2(other, number)
    os.close(other)
    try:
        server.stop()
    finally:
        with contextlib.suppress(OSError):  # stop() closed it as the pipe's end
            os.close(number)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
