"""Guessing the console's token, against a real store and the real waitress server. A wrong
token sent as ``Authorization: Bearer`` was not slowed down at all (the login form's was), so
the token could be guessed at full speed through the actions; and the slow-down of a wrong
login slept inside one of the console's four request threads, so a handful of concurrent wrong
logins from anyone who can reach /login kept every page from answering for seconds. Now a
wrong token, through either, shuts every token out for a second, unchecked, and nothing
waits."""

from __future__ import annotations

import concurrent.futures
import http.client
import re
import time
from collections.abc import Iterator

import pytest

from pgtick.storage.store import RunStore
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import WEB_THREADS, ConsoleServer

TOKEN = "review-token-0123456789"


def call(
    port: int, method: str, path: str, body: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
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


def wrong_login(port: int) -> int:
    _, headers, page = call(port, "GET", "/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', page.decode()).group(1)  # type: ignore[union-attr]
    cookie = headers["set-cookie"].split(";")[0]
    status, _, _ = call(port, "POST", "/login", f"csrf={nonce}&token=guess", {"Cookie": cookie})
    return status


def test_a_wrong_bearer_token_shuts_tokens_out_like_a_wrong_login(
    console: ConsoleServer,
) -> None:
    def pause(token: str) -> tuple[int, bytes]:
        status, _, body = call(
            console.port,
            "POST",
            "/actions/pause",
            "schedule=nightly",
            {"Authorization": f"Bearer {token}"},
        )
        return status, body

    for wrong in (lambda: pause("guess"), lambda: (wrong_login(console.port), b"wrong token")):
        started = time.monotonic()
        status, body = wrong()
        assert status == 403 and b"wrong token" in body
        # the right token, right after: refused without being looked at
        status, body = pause(TOKEN)
        assert status == 403 and b"try again in" in body, body
        time.sleep(max(0.0, started + 1.1 - time.monotonic()))
        status, body = pause(TOKEN)
        assert status != 403, body  # the schedule is not found, but the token is taken


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
