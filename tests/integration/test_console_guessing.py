"""Guessing the console's token, against a real store and the real waitress server. A wrong
token sent as ``Authorization: Bearer`` was not slowed down at all (the login form's was), so
the token could be guessed at full speed through the actions; and the slow-down of a wrong
login slept inside one of the console's four request threads, so a handful of concurrent wrong
logins from anyone who can reach /login kept every page from answering for seconds. The next
fix shut every token out for a second after any wrong one, the right one too, unchecked: a
client posting a wrong bearer token three times a second locked every operator out (finding
10). Now a wrong token holds back its own client only (its address): that client's tokens are
refused unchecked for a second, everyone else's are checked, and nothing waits."""

from __future__ import annotations

import concurrent.futures
import http.client
import re
import threading
import time
from collections.abc import Iterator

import pytest

from pgtick.storage.store import RunStore
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import WEB_THREADS, ConsoleServer

TOKEN = "review-token-0123456789"
OWNER = "127.0.0.1"  # loopback addresses all reach the console: one client each
GUESSER = "127.0.0.2"


def call(
    port: int,
    method: str,
    path: str,
    body: str = "",
    headers: dict[str, str] | None = None,
    source: str = OWNER,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        sent = {
            "Host": f"127.0.0.1:{port}",
            "Content-Type": "application/x-www-form-urlencoded",
            **(headers or {}),
        }
        conn.request(method, path, body=body.encode(), headers=sent)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


@pytest.fixture
def console(store: RunStore) -> Iterator[ConsoleServer]:
    routes = Console(store, TOKEN, heartbeat_seconds=20).routes()
    server = ConsoleServer("web.listen", "127.0.0.1", 0, routes, SECURITY_HEADERS)
    server.start()
    yield server
    server.stop()


def login(port: int, token: str, source: str = OWNER) -> tuple[int, bytes]:
    """(status, body) of the login form posted with ``token`` from ``source``."""
    _, headers, page = call(port, "GET", "/login", source=source)
    nonce = re.search(r'name="csrf" value="([^"]+)"', page.decode()).group(1)  # type: ignore[union-attr]
    cookie = headers["set-cookie"].split(";")[0]
    status, _, body = call(
        port,
        "POST",
        "/login",
        f"csrf={nonce}&token={token}&name=tester",
        {"Cookie": cookie},
        source,
    )
    return status, body


def pause(port: int, token: str, source: str = OWNER) -> tuple[int, bytes]:
    """(status, body) of a bearer action (the schedule does not exist: 303 with a flash
    saying so once the token is taken)."""
    status, _, body = call(
        port,
        "POST",
        "/actions/pause",
        "schedule=nightly",
        {"Authorization": f"Bearer {token}"},
        source,
    )
    return status, body


def test_a_wrong_token_holds_back_its_own_client_for_a_second(console: ConsoleServer) -> None:
    port = console.port
    for wrong in (lambda: pause(port, "guess"), lambda: login(port, "guess")):
        started = time.monotonic()
        status, body = wrong()
        assert status == 403 and b"wrong token" in body
        # the same client's right token, right after: refused without being looked at
        status, body = pause(port, TOKEN)
        assert status == 403 and b"try again in" in body, body
        status, body = login(port, TOKEN)
        assert status == 403 and b"try again in" in body, body
        # another client's right token meanwhile: checked, and taken
        assert pause(port, TOKEN, GUESSER)[0] == 303
        assert login(port, TOKEN, GUESSER)[0] == 303
        time.sleep(max(0.0, started + 1.1 - time.monotonic()))
        status, body = pause(port, TOKEN)
        assert status == 303, body  # the schedule is not found, but the token is taken


def test_the_owner_is_never_refused_while_a_guesser_hammers(console: ConsoleServer) -> None:
    """Finding 10: a client posting a wrong bearer token three times a second let 1 of 8 of
    the operator's actions through, and refused the operator's login. The guesser, hammering
    from its own address, is checked about once a second; the owner is always checked."""
    port = console.port
    stop = threading.Event()
    answers: list[bytes] = []

    def guess() -> None:
        while not stop.is_set():
            status, body = pause(port, "wrong", GUESSER)
            assert status == 403
            answers.append(body)
            stop.wait(0.05)  # twenty a second

    guesser = threading.Thread(target=guess)
    guesser.start()
    began = time.monotonic()
    try:
        owner: list[tuple[int, bytes]] = []
        for _ in range(8):  # the operator's actions, spread over two seconds
            time.sleep(0.25)
            owner.append(pause(port, TOKEN))
        logins = [login(port, TOKEN) for _ in range(2)]
    finally:
        stop.set()
        guesser.join()
    seconds = time.monotonic() - began
    assert [status for status, _ in owner] == [303] * 8, [body[:200] for _, body in owner]
    assert [status for status, _ in logins] == [303, 303], [body[:200] for _, body in logins]
    refused = sum(b"try again in" in body for body in answers)  # unchecked
    checked = len(answers) - refused  # "wrong token"
    assert refused > checked
    assert 1 <= checked <= seconds + 1, (checked, seconds, len(answers))


def test_wrong_logins_do_not_block_the_pages(console: ConsoleServer) -> None:
    assert call(console.port, "GET", "/runs")[0] == 200
    attackers = WEB_THREADS * 2
    with concurrent.futures.ThreadPoolExecutor(attackers + 1) as pool:
        # Fetch the forms first, then fire every wrong login at once.
        forms = []
        for _ in range(attackers):
            _, headers, page = call(console.port, "GET", "/login")
            nonce = re.search(r'name="csrf" value="([^"]+)"', page.decode()).group(1)  # type: ignore[union-attr]
            forms.append((nonce, headers["set-cookie"].split(";")[0]))
        futures = [
            pool.submit(
                call,
                console.port,
                "POST",
                "/login",
                f"csrf={nonce}&token=guess",
                {"Cookie": cookie},
            )
            for nonce, cookie in forms
        ]
        time.sleep(0.3)  # the wrong logins are in
        started = time.monotonic()
        status, _, _ = call(console.port, "GET", "/runs")
        page_seconds = time.monotonic() - started
        for f in futures:
            assert f.result()[0] == 403
    assert status == 200
    assert page_seconds < 2.0, (
        f"the runs page took {page_seconds:.1f}s while {attackers} wrong logins were slowed down:"
        " the delay sleeps in the console's request threads"
    )
