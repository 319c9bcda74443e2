"""A console listening beyond loopback (``0.0.0.0``) with a token and a short session, and the
daemon's metrics listener, against a real daemon (issue 22: Must show 3, findings 1-4).

Reads need a session there; the session is a signed, expiring cookie; every POST needs the
session's CSRF token; a tampered or expired cookie is nobody's; hostile text in every field
stays text; slow and idle clients do not keep ``/metrics`` from answering.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import statistics
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from .conftest import IMG, SCRIPT, TOKEN, Console, start_console

SESSION_TTL_SECONDS = 6
EXPOSED = f"""
[web]
listen = "0.0.0.0:0"
token_file = "{{token_file}}"
session_ttl = "{SESSION_TTL_SECONDS}s"

[schedules.nightly_report]
job_type = "record"
cron = "0 3 1 1 *"
"""
HUGE = "9" * 5000


def machine_address() -> str:
    """This machine's address on its network (what a colleague's browser would use), or
    loopback when it has none; the console listens on both."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    for exposed in start_console(
        pg_admin_dsn,
        template_db,
        tmp_path_factory.mktemp("exposed"),
        token=TOKEN,
        web=EXPOSED,
        metrics=True,
    ):
        port = urllib.parse.urlsplit(exposed.url).port
        exposed.url = f"http://{machine_address()}:{port}"
        yield exposed


def session(cookie: str) -> dict[str, str]:
    return {"Cookie": f"pgtick_session={cookie}"}


def csrf_of(console: Console, cookie: str, path: str) -> str:
    """The CSRF token in the forms of a page, as the logged-in browser sees it."""
    status, body = console.get(path, session(cookie))
    assert status == 200, (status, body[:200])
    marker = 'name="csrf" value="'
    start = body.index(marker) + len(marker)
    return body[start : body.index('"', start)]


def no_alert(driver: Any) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when there is none
    except NoAlertPresentException:
        return True
    return False


def test_reads_off_loopback_need_a_session(console: Console, chrome: Any) -> None:
    # finding 1: the pages that showed the hostile run's payload to anyone are refused
    for path in ("/", "/runs", f"/runs/{console.hostile_id}", "/schedules", "/runs?status=dead"):
        status, location = console.get(path)
        assert (status, location) == (303, "/login"), path
    chrome.get(f"{console.url}/runs/{console.hostile_id}")
    assert urllib.parse.urlsplit(chrome.current_url).path == "/login"
    assert SCRIPT not in chrome.page_source and "comment" not in chrome.page_source
    # the login page and the stylesheet stay reachable
    assert console.get("/login")[0] == 200 and console.get("/static/console.css")[0] == 200
    # with a session the same page shows the run
    cookie = console.login()
    status, body = console.get(f"/runs/{console.hostile_id}", session(cookie))
    assert status == 200 and "comment" in body


def test_post_without_a_valid_csrf_token_is_refused(console: Console) -> None:
    cookie = console.login()
    csrf = csrf_of(console, cookie, f"/runs/{console.dead_id}")
    before = console.checksum()
    target = {"run_id": str(console.dead_id)}
    other = console.login()  # another session's token does not fit this one
    for form in (target, {**target, "csrf": ""}, {**target, "csrf": csrf_of(console, other, "/")}):
        status, _, body = console.post("/actions/retry", form, session(cookie))
        assert status == 403 and "CSRF" in body
    # a page elsewhere posting with the browser's cookie: its Origin gives it away
    status, _, _ = console.post(
        "/actions/retry",
        {**target, "csrf": csrf},
        {**session(cookie), "Origin": "null"},
    )
    assert status == 403
    assert console.checksum() == before
    status, location, _ = console.post("/actions/retry", {**target, "csrf": csrf}, session(cookie))
    assert status == 303 and "retried" in location


def test_tampered_and_expired_cookies_are_refused(console: Console) -> None:
    cookie = console.login()
    csrf = csrf_of(console, cookie, "/")
    expiry, nonce, role, name, signature = cookie.split(".")
    flipped = signature[:-1] + ("1" if signature[-1] == "0" else "0")
    for forged in (
        f"{int(expiry) + 86400}.{nonce}.{role}.{name}.{signature}",  # a longer life
        f"{expiry}.{nonce}.{role}.{name}.{flipped}",
        f"{expiry}.{nonce}.viewer.{name}.{signature}",  # another role
        f"{expiry}.{nonce}",
        "1.2.3.4.5",
    ):
        assert console.get("/runs", session(forged)) == (303, "/login"), forged
        status, _, body = console.post(
            "/actions/pause", {"schedule": "nightly_report", "csrf": csrf}, session(forged)
        )
        assert status == 403 and "not logged in" in body
    assert console.get("/runs", session(cookie))[0] == 200
    time.sleep(SESSION_TTL_SECONDS + 1)
    assert console.get("/runs", session(cookie)) == (303, "/login")
    status, _, body = console.post(
        "/actions/pause", {"schedule": "nightly_report", "csrf": csrf}, session(cookie)
    )
    assert status == 403 and "expired" in body
    assert console.sql("SELECT paused FROM schedules WHERE name = 'nightly_report'") == [(False,)]


def test_logout_ends_the_session(console: Console) -> None:
    cookie = console.login()
    csrf = csrf_of(console, cookie, "/")
    status, location, _, headers = console.post_full("/logout", {"csrf": csrf}, session(cookie))
    assert (status, location) == (303, "/login") and "Max-Age=0" in headers["set-cookie"]
    assert console.get("/runs", session(cookie)) == (303, "/login")  # the old cookie is dead
    status, _, body = console.post(
        "/actions/pause", {"schedule": "nightly_report", "csrf": csrf}, session(cookie)
    )
    assert status == 403 and "logged out" in body


def test_a_wrong_token_is_slowed_down_and_the_login_form_has_a_csrf_token(
    console: Console,
) -> None:
    cookie, csrf = console.login_form()
    began = time.monotonic()
    status, _, body, headers = console.post_full(
        "/login", {"token": "guess", "csrf": csrf, "name": "tester"}, cookie
    )
    assert status == 403 and "wrong token" in body and "set-cookie" not in headers
    assert time.monotonic() - began < 0.5  # answered at once: no request thread waits
    # For a second after it this client's tokens are refused unchecked, the right one too:
    # one guess a second per client, through the form or a bearer header (another client's
    # token is checked: tests/integration/test_console_guessing.py).
    status, _, body, headers = console.post_full(
        "/login", {"token": TOKEN, "csrf": csrf, "name": "tester"}, cookie
    )
    assert status == 403 and "try again in" in body and "set-cookie" not in headers
    status, _, body = console.post(
        "/actions/pause", {"schedule": "nightly_report"}, {"Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 403 and "try again in" in body
    time.sleep(max(0.0, began + 1.1 - time.monotonic()))
    # the right token without the form's own CSRF token (a page elsewhere posting it) is refused
    for form, headers in (
        ({"token": TOKEN}, cookie),
        ({"token": TOKEN, "csrf": csrf, "name": "tester"}, {}),
        ({"token": TOKEN, "csrf": csrf + "x"}, cookie),
    ):
        status, _, body, answer = console.post_full("/login", form, headers)
        assert status == 403 and "CSRF" in body and "set-cookie" not in answer


def test_huge_run_ids_are_404_and_400_without_a_traceback(console: Console, chrome: Any) -> None:
    cookie = console.login()
    status, body = console.get(f"/runs/{HUGE}", session(cookie))
    assert status == 404 and "not a run id" in body
    for before in (HUGE, str(2**64)):
        status, body = console.get(f"/runs?before={before}", session(cookie))
        assert status == 400 and "not a run id" in body
    csrf = csrf_of(console, cookie, "/")
    for action in ("retry", "cancel"):
        status, _, body = console.post(
            f"/actions/{action}", {"run_id": HUGE, "csrf": csrf}, session(cookie)
        )
        assert status == 400 and "not a run id" in body
    chrome.get(f"{console.url}/login")
    chrome.add_cookie({"name": "pgtick_session", "value": cookie, "path": "/"})
    chrome.get(f"{console.url}/runs/{HUGE}")
    assert chrome.find_element(By.TAG_NAME, "h1").text == "404 Not Found"
    log = console.daemon.log()
    assert "Traceback" not in log and HUGE not in log
    chrome.delete_all_cookies()


def test_host_header_must_name_the_console(console: Console) -> None:
    cookie = console.login()
    status, body = console.get("/", {**session(cookie), "Host": "rebound.attacker.example"})
    assert status == 421 and "not this console" in body


def test_xss_payloads_in_every_field_stay_text(console: Console, chrome: Any) -> None:
    hostile = f"x{SCRIPT}{IMG}"
    with_attempt = console.sql(
        "INSERT INTO runs (job_type, payload, idempotency_key, status, attempts, max_attempts,"
        " last_error, error_type, started_at, finished_at) VALUES"
        f" ({_q(hostile)}, {_q(json.dumps({hostile: hostile}))}::jsonb, {_q(hostile)}, 'dead',"
        f" 1, 1, {_q(hostile)}, {_q(hostile)}, now(), now()) RETURNING id"
    )[0][0]
    console.sql(
        "INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
        f" outcome, error, error_type) VALUES ({with_attempt}, 1, {_q(hostile)}, now(), now(),"
        f" 'failed', {_q(hostile)}, {_q(hostile)}) RETURNING run_id"
    )
    cookie = console.login()
    chrome.get(f"{console.url}/login")
    chrome.add_cookie({"name": "pgtick_session", "value": cookie, "path": "/"})
    quoted = urllib.parse.quote(hostile)
    for path in (
        "/",
        f"/runs/{with_attempt}",
        f"/runs/{with_attempt}?flash={quoted}",
        f"/runs?type={quoted}&schedule={quoted}",
        "/runs?status=dead",
        f"/runs/{quoted}",
        "/schedules",
    ):
        chrome.get(console.url + path)
        assert no_alert(chrome), path
        # changed by issue 46: the console's own live.js is the one script (its CSP nonce)
        ours = 'script:not([src="/static/live.js"])'
        assert chrome.find_elements(By.CSS_SELECTOR, ours) == [], path
        assert chrome.find_elements(By.TAG_NAME, "img") == [], path
        count = chrome.execute_script("return document.querySelectorAll('[onerror]').length")
        assert count == 0, path
    chrome.get(f"{console.url}/runs/{with_attempt}")
    text = chrome.find_element(By.TAG_NAME, "main").text
    assert text.count(SCRIPT) >= 5  # job type, key, error type, last error, attempt, payload
    chrome.delete_all_cookies()


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _timed(url: str, path: str) -> float:
    parts = urllib.parse.urlsplit(url)
    began = time.monotonic()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, (path, response.status)
    finally:
        conn.close()
    return time.monotonic() - began


def test_idle_and_slow_clients_do_not_stop_metrics_answering(console: Console) -> None:
    # finding 2, as reproduced: 200 idle keep-alive connections, then 1 500 clients trickling
    # header bytes; /metrics and /healthz still answer within 100 ms and threads stay bounded
    parts = urllib.parse.urlsplit(console.metrics_url)
    address = (parts.hostname or "", parts.port or 0)
    _timed(console.metrics_url, "/metrics")  # the first scrape reads the database
    # A scrape's own work (the database-derived gauges) slows on a busy shared machine: the
    # bound is 100 ms, or twice what it costs here without any attack if that is more.
    quiet = statistics.median(_timed(console.metrics_url, "/metrics") for _ in range(3))
    bound = max(0.1, 2 * quiet)

    def answered(times: list[float]) -> bool:
        scrapes, checks = times[0::2], times[1::2]  # /metrics, /healthz alternately
        return statistics.median(scrapes) < bound and statistics.median(checks) < 0.1

    threads_before = _threads(console.daemon.pid)
    idle: list[http.client.HTTPConnection] = []
    slow: list[socket.socket] = []
    try:
        for _ in range(200):
            conn = http.client.HTTPConnection(*address, timeout=10)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            idle.append(conn)
        idle_times = [_timed(console.metrics_url, p) for p in ("/metrics", "/healthz") * 3]
        assert answered(idle_times), (bound, idle_times)
        for _ in range(1500):
            sock = socket.create_connection(address, timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(sock)
        slow_times = []
        for _ in range(3):
            for sock in slow:
                with contextlib.suppress(OSError):  # evicted or cut off: what should happen
                    sock.sendall(b"a")
            slow_times += [_timed(console.metrics_url, p) for p in ("/metrics", "/healthz")]
        assert answered(slow_times), (bound, slow_times)
        assert max(slow_times) < 2, slow_times
        assert _threads(console.daemon.pid) < threads_before + 100
    finally:
        for conn in idle:
            conn.close()
        for sock in slow:
            sock.close()
    # when they all hang up, none of their half-sent requests runs a scrape (the issue saw
    # the next real scrape take 63 s); the machine is shared, so it gets half a second
    time.sleep(0.5)
    after = [_timed(console.metrics_url, "/metrics") for _ in range(5)]
    assert statistics.median(after) < bound and max(after) < 2, (bound, after)
