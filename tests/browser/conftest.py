"""A real `pgtick run` daemon serving the console, and headless Chromium driven by selenium.

One daemon and one browser per module (they take a few seconds to start); each module gets a
database of its own with prepared runs. Chromium comes from Debian (`chromium` and
`chromium-driver`, installed by .ci/run); when it is missing the tests fail, naming them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from tests import dbhelp

from ..acceptance.conftest import (
    Cluster,
    Daemon,
    cluster,  # noqa: F401 - the fixture, for config tests here
    wait_for,
)
from ..conftest import SCHEMA, drop_database, new_database

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "console-test-token-0123456789"
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
REPO = Path(__file__).resolve().parents[2]

WEB = """
[web]
listen = "127.0.0.1:0"
token_file = "{token_file}"

[schedules.nightly_report]
job_type = "record"
cron = "0 3 1 1 *"
timezone = "Europe/Amsterdam"

[schedules.hourly_sync]
job_type = "record"
cron = "15 * * * *"
"""

# Runs of a job type no daemon here handles, so they stay as prepared: 3 due (enqueued five
# minutes ago: a backlog on the queue-depth chart), 1 awaiting retry, 2 dead in the last day
# (one of them hostile), 5 succeeded a few minutes ago.
PREPARED = """
INSERT INTO runs (job_type, payload, status, run_at, created_at, attempts, max_attempts)
SELECT 'report', jsonb_build_object('n', i), 'queued', now() - interval '5 minutes',
       now() - interval '5 minutes', 0, 3
FROM generate_series(1, 3) i;
INSERT INTO runs (job_type, status, run_at, attempts, max_attempts, last_error, error_type)
VALUES ('report', 'failed', now() + interval '1 hour', 1, 3, 'timeout talking to smtp',
        'TimeoutError');
INSERT INTO runs (job_type, payload, status, attempts, max_attempts, last_error, error_type,
                  started_at, finished_at)
SELECT 'report', '{}', 'succeeded', 1, 3, NULL, NULL, now() - interval '3 minutes',
       now() - interval '2 minutes'
FROM generate_series(1, 5);
"""


@dataclass
class Console:
    """The daemon under test and how to reach its console."""

    daemon: Daemon
    url: str
    dsn: str
    dead_id: int
    hostile_id: int
    token: str | None
    metrics_url: str = ""

    def login_form(self) -> tuple[dict[str, str], str]:
        """What GET /login gives a browser: the form's cookie (as a request header) and the
        matching CSRF token of the form."""
        status, _, body, headers = _open(urllib.request.Request(self.url + "/login"))
        assert status == 200, status
        cookie = headers["set-cookie"].split(";")[0]
        found = re.search(r'name="csrf" value="([^"]+)"', body)
        assert cookie.startswith("pgtick_login=") and found is not None
        return {"Cookie": cookie}, found.group(1)

    def login(self, token: str | None = None, name: str = "tester") -> str:
        """A session cookie's value from the login form (the header a browser would keep), as
        ``name``;
        again after a second when a wrong token another test gave just before, from this
        same address (every test's), holds this client's tokens back for that long."""
        for _ in range(3):
            cookie, csrf = self.login_form()
            form = {"token": token or self.token or "", "csrf": csrf, "name": name}
            status, _, body, headers = self.post_full("/login", form, cookie)
            if status != 403 or "try again in" not in body:
                break
            time.sleep(1.1)
        assert status == 303, status
        cookie = headers["set-cookie"].split(";")[0]
        assert cookie.startswith("pgtick_session=")
        return cookie.removeprefix("pgtick_session=")

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        with dbhelp.connect(self.dsn, SCHEMA) as conn:
            return conn.execute(statement).fetchall()  # type: ignore[arg-type]

    def checksum(self) -> str:
        """What an action could change in runs and schedules (not the ticker's cursor)."""
        rows = self.sql(
            "SELECT (SELECT coalesce(string_agg(concat_ws('|', id, status, run_at, attempts,"
            " max_attempts, locked_by, finished_at, last_error), ',' ORDER BY id), '')"
            " FROM runs),"
            " (SELECT string_agg(concat_ws('|', id, name, paused, paused_reason), ','"
            " ORDER BY id) FROM schedules)"
        )
        return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()

    def post(
        self, path: str, form: dict[str, str], headers: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        """(status, Location, body) of a POST, redirects not followed."""
        return self.post_full(path, form, headers)[:3]

    def post_full(
        self, path: str, form: dict[str, str], headers: dict[str, str] | None = None
    ) -> tuple[int, str, str, dict[str, str]]:
        """(status, Location, body, headers lower-cased) of a POST, redirects not followed."""
        request = urllib.request.Request(
            self.url + path,
            data=urllib.parse.urlencode(form).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded", **(headers or {})},
            method="POST",
        )
        return _open(request)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """(status, body) of a GET, redirects not followed (a 303's body is empty)."""
        status, location, body, _ = _open(
            urllib.request.Request(self.url + path, headers=headers or {})
        )
        return status, body or location


def _open(request: urllib.request.Request) -> tuple[int, str, str, dict[str, str]]:
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            headers = {k.lower(): v for k, v in response.headers.items()}
            return response.status, headers.get("location", ""), response.read().decode(), headers
    except urllib.error.HTTPError as exc:
        headers = {k.lower(): v for k, v in exc.headers.items()}
        return exc.code, headers.get("location", ""), exc.read().decode(), headers


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _prepare(dsn: str) -> tuple[int, int]:
    with dbhelp.connect(dsn, SCHEMA) as conn:
        conn.execute(PREPARED)  # type: ignore[arg-type]
        dead = conn.execute(
            "INSERT INTO runs (job_type, status, attempts, max_attempts, last_error, error_type,"
            " started_at, finished_at) VALUES ('report', 'dead', 3, 3, 'smtp said no',"
            " 'SMTPError', now() - interval '1 hour', now() - interval '1 hour') RETURNING id"
        ).fetchone()
        hostile = conn.execute(
            "INSERT INTO runs (job_type, payload, status, attempts, max_attempts, last_error,"
            " error_type, started_at, finished_at) VALUES ('report', %s, 'dead', 2, 2, %s,"
            " 'ValueError', now() - interval '10 minutes', now() - interval '10 minutes')"
            " RETURNING id",
            (json.dumps({"comment": SCRIPT, "name": IMG}), f"bad input {SCRIPT} {IMG}"),
        ).fetchone()
        assert dead is not None and hostile is not None
        for n, error in ((1, f"Traceback (most recent call last):\n  {SCRIPT}"), (2, IMG)):
            conn.execute(
                "INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
                " outcome, error, error_type) VALUES (%s, %s, 'elsewhere:1:aa',"
                " now() - interval '11 minutes', now() - interval '10 minutes', 'failed', %s,"
                " 'ValueError')",
                (hostile[0], n, error),
            )
        # What attempt 2 printed: a head with hostile text and colour codes, then (after a
        # middle that was not kept) a tail; attempt 1 printed nothing.
        head = [[0, "stdout", f"hello {SCRIPT}"], [5, "stderr", f"\x1b[31mred {IMG}\x1b[0m"]]
        tail = [[900, "log", "INFO job: done"]]
        for seq, lines, omitted in ((0, head, 0), (-1, tail, 12345)):
            conn.execute(
                "INSERT INTO output_chunks (run_id, attempt, attempt_started_at, seq, lines,"
                " omitted_bytes) VALUES (%s, 2, now() - interval '11 minutes', %s, %s, %s)",
                (hostile[0], seq, json.dumps(lines), omitted),
            )
        return int(dead[0]), int(hostile[0])


def start_console(
    pg_admin_dsn: str,
    template_db: str,
    tmp: Path,
    *,
    token: str | None,
    web: str = WEB,
    metrics: bool = False,
    settings: dict[str, str] | None = None,
    viewer_token: str | None = None,
) -> Iterator[Console]:
    """A daemon serving the console (``web``, with ``{token_file}`` filled in) over prepared
    runs; ``metrics`` also starts its metrics listener on a free port; ``settings`` are the
    acceptance config's (``reaper="1h"``)."""
    name = new_database(pg_admin_dsn, template_db)
    dsn = make_conninfo(pg_admin_dsn, dbname=name)
    daemons = Cluster(dsn, tmp)
    try:
        dead_id, hostile_id = _prepare(dsn)
        files = {"token_file": "", "viewer_token_file": ""}
        for key, secret in (("token_file", token), ("viewer_token_file", viewer_token)):
            if secret is not None:
                path = tmp / f"web-{key}"
                path.write_text(secret + "\n")
                files[key] = str(path)
        config = daemons.config(web.format(**files), **(settings or {}))
        if metrics:
            text = config.read_text()
            config.write_text(
                text.replace('[metrics]\nlisten = ""', '[metrics]\nlisten = "127.0.0.1:0"')
            )
        daemon = daemons.start(config)
        ports = {
            key: listening(daemon, key) for key in ("web.listen", "metrics.listen")[: 1 + metrics]
        }
        yield Console(
            daemon,
            f"http://127.0.0.1:{ports['web.listen']}",
            dsn,
            dead_id,
            hostile_id,
            token,
            f"http://127.0.0.1:{ports['metrics.listen']}" if metrics else "",
        )
    finally:
        daemons.stop_all()
        drop_database(pg_admin_dsn, name)


def listening(daemon: Daemon, key: str) -> int:
    """The port the daemon's listener ``key`` bound."""
    event = wait_for(
        lambda: next(
            (
                e
                for e in daemon.events()
                if e.get("event") == "http_listening" and e.get("key") == key
            ),
            None,
        ),
        10,
        what=f"{key} to listen",
    )
    return int(event["port"])


@pytest.fixture(scope="module")
def chrome() -> Iterator[object]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: install the Debian packages chromium and "
            "chromium-driver (apt-get install chromium chromium-driver; .ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def keep_screenshot(shot: Path, name: str = "console.png") -> None:
    """With PGTICK_UPDATE_DOCS_SCREENSHOT=1, the docs' screenshot ``docs/name`` (the README's
    and docs/console.md's) is refreshed from ``shot``."""
    if os.environ.get("PGTICK_UPDATE_DOCS_SCREENSHOT") == "1":
        (REPO / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / name)
