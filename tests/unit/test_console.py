"""The console without a browser or a database: escaping, the pages' HTML, the action guard
(token, cross-site refusal) and the HTTP pieces it adds (forms, ``/*`` routes, headers)."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any, cast

import pytest

from pgtick.storage.store import (
    Attempt,
    Batch,
    JobTypeStats,
    RollupBucket,
    Run,
    RunStore,
    RunSummary,
    ScheduleListing,
    WorkerRow,
)
from pgtick.surfaces import operations
from pgtick.surfaces.console import fragments, routes
from pgtick.surfaces.console import views as pages
from pgtick.surfaces.console.fragments import Page
from pgtick.surfaces.console.routes import Console
from pgtick.surfaces.http import HttpServer, Request, find_route

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'


class Tags(HTMLParser):
    """Every start tag and attribute a browser would see, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def names(self) -> set[str]:
        return {t for t, _ in self.tags}

    def joined(self) -> str:
        return "".join(self.text)


def run(**changes: Any) -> Run:
    values: dict[str, Any] = {
        "id": 7,
        "schedule_id": None,
        "scheduled_for": None,
        "job_type": "send_email",
        "payload": {"to": "a@example.com"},
        "idempotency_key": None,
        "status": "dead",
        "run_at": NOW,
        "attempts": 2,
        "max_attempts": 2,
        "locked_by": None,
        "locked_until": None,
        "last_error": "boom",
        "error_type": "ValueError",
        "started_at": NOW,
        "finished_at": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }
    values.update(changes)
    return Run(**values)


def attempt(n: int, error: str | None) -> Attempt:
    return Attempt(7, n, f"host:1:{n}", NOW, NOW + timedelta(seconds=1.5), "failed", error, "E")


def detail(r: Run, attempts: list[Attempt]) -> operations.RunDetail:
    return operations.RunDetail(r, attempts, None, [], NOW)


def listing(name: str, paused: bool = False) -> ScheduleListing:
    return ScheduleListing(
        1,
        name,
        "t",
        "0 3 * * *",
        "Europe/Amsterdam",
        paused,
        "operator" if paused else None,
        None,
        "skip",
        "latest",
        NOW,
        "succeeded",
        NOW,
        NOW,
        NOW,
    )


def test_every_template_autoescapes_and_names_must_exist() -> None:
    import jinja2
    from markupsafe import Markup

    env = fragments._environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    page = pages.error_page(400, SCRIPT, Page(False, NOW)).body.decode()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    attribute = env.from_string('<a title="{{ t }}">{{ t }}</a>').render(t=IMG)
    assert attribute == (
        '<a title="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;">'
        "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;</a>"
    )
    assert env.from_string("{{ m }}").render(m=Markup("<b>ok</b>")) == "<b>ok</b>"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ nowhere }}").render()


def test_run_page_shows_hostile_payload_and_errors_as_text() -> None:
    r = run(payload={"note": SCRIPT, IMG: [IMG]}, last_error=IMG, job_type=SCRIPT)
    page = pages.run_page(detail(r, [attempt(1, SCRIPT), attempt(2, IMG)]), Page(True, NOW))
    parsed = Tags(page)
    assert "script" not in parsed.names() and "img" not in parsed.names()
    assert all("onerror" not in attrs for _, attrs in parsed.tags)
    text = parsed.joined()
    assert SCRIPT in text and IMG in text  # the reader sees the data as it is
    assert text.count(SCRIPT) >= 3 and text.count(IMG) >= 3  # payload, error, attempts


def test_run_page_lists_every_attempt_and_its_error() -> None:
    page = pages.run_page(
        detail(run(), [attempt(1, "Traceback (most recent call last): one"), attempt(2, "two")]),
        Page(False, NOW),
    )
    assert page.count('class="attempt"') == 2
    assert "Traceback (most recent call last): one" in page and "host:1:2" in page
    assert '"to": "a@example.com"' in Tags(page).joined()  # pretty JSON


def test_actions_only_with_a_token() -> None:
    d = detail(run(status="dead"), [])
    logged_in = Page(True, NOW, csrf="c5rf", login=fragments.LOGIN_IN)
    with_token = Tags(pages.run_page(d, logged_in))
    forms = [attrs for name, attrs in with_token.tags if name == "form"]
    assert [f["action"] for f in forms] == ["/logout", "/actions/retry"]
    assert all(f["method"] == "post" for f in forms)
    # every form carries the session's CSRF token; the token itself is never in the page
    csrf = [a for n, a in with_token.tags if n == "input" and a.get("name") == "csrf"]
    assert len(csrf) == 2 and all(a["value"] == "c5rf" for a in csrf)
    assert not [a for n, a in with_token.tags if n == "input" and a.get("name") == "token"]
    read_only = Tags(pages.run_page(d, Page(False, NOW)))
    assert "form" not in read_only.names() and "button" not in read_only.names()
    logged_out = Tags(pages.run_page(d, Page(False, NOW, login=fragments.LOGIN_OUT)))
    assert "form" not in logged_out.names()
    assert ("a", {"href": "/login", "id": "login-link"}) in logged_out.tags
    queued = Tags(pages.run_page(detail(run(status="queued"), []), logged_in))
    assert [a["action"] for n, a in queued.tags if n == "form"] == ["/logout", "/actions/cancel"]


def test_schedules_page_next_times_in_utc_and_local_and_actions() -> None:
    views = [
        operations.ScheduleView(
            listing("nightly"), [datetime(2026, 11, 24, 2, tzinfo=UTC)], "Europe/Amsterdam", None
        ),
        operations.ScheduleView(listing("held", paused=True), [], "Europe/Amsterdam", None),
    ]
    page = pages.schedules_page(views, Page(True, NOW))
    assert "2026-11-24 02:00:00" in page and "2026-11-24 03:00:00 CET (+01:00)" in page
    assert "paused (operator)" in page
    actions = [a["action"] for n, a in Tags(page).tags if n == "form"]
    assert actions == ["/actions/trigger", "/actions/pause", "/actions/trigger", "/actions/resume"]
    assert "form" not in Tags(pages.schedules_page(views, Page(False, NOW))).names()


def test_overview_counts_chart_and_refresh() -> None:
    stats = JobTypeStats("send_email", 3, 75.0, 1, 2, 1, 4, 5)
    worker = WorkerRow("h:1:ab", "h", 1, "0.1.0", 8, ["send_email"], NOW, 2.0, 2)
    ov = operations.Overview(
        NOW,
        [operations.JobTypeStatus(stats, 1)],
        [operations.WorkerStatus(worker, False)],
        [operations.ScheduleView(listing("nightly"), [NOW], "UTC", None)],
        [0] * 58 + [6, 3],
        day_totals={"send_email": RollupBucket(NOW, 40, 2, 1, 1, 0, 0, 80.0)},
    )
    page = pages.overview_page(ov, Page(False, NOW))
    row = re.search(r'<tr data-job-type="send_email">.*?</tr>', page)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
    assert [re.sub(r"<[^>]+>", "", c) for c in cells] == [
        "send_email",
        "3",
        "1m 15s",
        "1",
        "2",
        "1",
        "4",
        "5",
        "1",
        "-",
        "-",
        "40",  # succeeded in the last 24 hours, from the rollups
        "3",  # attempts failed (2) or lost (1)
    ]
    assert '<meta http-equiv="refresh" content="5">' in page
    assert page.count('<rect class="bar"') == 60 and "9 succeeded in the last hour" in page
    assert "2s ago" in page and "nightly" in page
    unavailable = pages.overview_page(operations.Overview(NOW, [], [], [], None), Page(False, NOW))
    assert "Not available" in unavailable and "No live daemons." in unavailable


def test_runs_page_filters_and_keyset_links() -> None:
    rows = [
        RunSummary(i, "t", "dead", 1, 1, NOW, None, NOW, SCRIPT, "nightly", NOW) for i in (9, 8)
    ]
    filters = pages.RunFilters(["dead", "failed"], "t", None, 10)
    page = pages.runs_page(operations.RunPage(rows, 8), filters, Page(False, NOW))
    assert 'href="/runs?status=dead&amp;status=failed&amp;type=t&amp;before=8"' in page
    assert 'id="newest"' in page
    assert 'value="dead" checked' in page and 'value="queued">' in page
    assert "script" not in Tags(page).names()
    last = pages.runs_page(operations.RunPage(rows, None), filters, Page(False, NOW))
    assert 'id="older"' not in last


def test_flash_is_escaped() -> None:
    page = pages.error_page(400, "x", Page(False, None, IMG)).body.decode()
    assert "img" not in Tags(page).names() and IMG in Tags(page).joined()


# -- the action guard and the HTTP pieces ---------------------------------------------------


def post(form: str, headers: dict[str, str] | None = None) -> Request:
    return Request(
        "POST",
        "/actions/retry",
        {},
        {
            "content-type": "application/x-www-form-urlencoded",
            "host": "127.0.0.1:1",
            **(headers or {}),
        },
        form.encode(),
    )


class Logouts:
    """The store as the action guard sees it: which sessions were logged out (on any daemon)."""

    def __init__(self) -> None:
        self.logged_out: set[str] = set()
        self.asked = 0

    def console_logged_out(self, nonce: str) -> bool:
        self.asked += 1
        return nonce in self.logged_out


def test_refusals() -> None:
    read_only = Console(cast(RunStore, None), None, heartbeat_seconds=20)
    assert read_only._refusal(post("token=x&run_id=1")) == (
        "read-only console: actions need web.token_file"
    )
    logouts = Logouts()
    guarded = Console(cast(RunStore, logouts), "s3cret", heartbeat_seconds=20)
    assert guarded.sessions is not None
    cookie = guarded.sessions.issue()
    csrf = guarded.sessions.csrf(cookie)
    session = {"cookie": f"pgtick_session={cookie}"}
    not_logged_in = "not logged in (or the session expired): log in at /login"
    # the token as a form field is no credential any more: the session is
    assert guarded._refusal(post("token=s3cret&run_id=1")) == not_logged_in
    assert guarded._refusal(post(f"csrf={csrf}&run_id=1", session)) is None
    wrong_csrf = "missing or wrong CSRF token: reload the page and try again"
    assert guarded._refusal(post("run_id=1", session)) == wrong_csrf
    flipped = csrf[:-1] + ("1" if csrf[-1] == "0" else "0")
    assert guarded._refusal(post(f"csrf={flipped}&run_id=1", session)) == wrong_csrf
    other = guarded.sessions.issue()  # another session's CSRF token does not fit this one
    assert guarded._refusal(post(f"csrf={guarded.sessions.csrf(other)}", session)) == wrong_csrf
    with_csrf = f"csrf={csrf}"
    assert guarded._refusal(post(with_csrf, {**session, "sec-fetch-site": "cross-site"})) == (
        "cross-site request refused"
    )
    assert guarded._refusal(post(with_csrf, {**session, "origin": "https://evil.example"})) == (
        "request from another origin refused"
    )
    assert guarded._refusal(post(with_csrf, {**session, "sec-fetch-site": "same-site"})) == (
        "same-site request refused"
    )
    # finding 4: an opaque origin (sandboxed frame, data: URL) is refused, session or not
    assert guarded._refusal(post(with_csrf, {**session, "origin": "null"})) == (
        "request from an opaque origin (Origin: null) refused"
    )
    assert guarded._refusal(post(with_csrf, {**session, "origin": "http://127.0.0.1:1"})) is None
    assert guarded._refusal(post("", {"authorization": "Bearer s3cret"})) is None
    assert guarded._refusal(post("", {"authorization": "Bearer s3cre"})) == "wrong token"
    # a session logged out (on this daemon or another) is refused; an action always asks
    asked = logouts.asked
    assert guarded._refusal(post(with_csrf, session)) is None
    assert guarded._refusal(post(with_csrf, session)) is None
    assert logouts.asked == asked + 2
    logouts.logged_out.add(cookie.split(".")[1])
    assert guarded._refusal(post(with_csrf, session)) == (
        "this session was logged out: log in at /login"
    )


def test_form_parsing_and_wildcard_routes() -> None:
    req = post("a=1&a=2&b=%3Cx%3E&c=")
    assert req.form() == {"a": ["1", "2"], "b": ["<x>"], "c": [""]}
    assert Request("POST", "/", {}, {"content-type": "text/plain"}, b"a=1").form() == {}
    routes = {("GET", "/runs"): print, ("GET", "/runs/*"): len}
    assert find_route(routes, "GET", "/runs") is print
    assert find_route(routes, "GET", "/runs/42") is len
    assert find_route(routes, "GET", "/runs/") is None
    assert find_route(routes, "GET", "/runs/4/2") is None


@pytest.fixture
def read_only_server() -> Iterator[HttpServer]:
    server = HttpServer(
        "web.listen",
        "127.0.0.1",
        0,
        Console(cast(RunStore, None), None, heartbeat_seconds=20).routes(),
        routes.SECURITY_HEADERS,
    )
    server.start()
    yield server
    server.stop()


def call(server: HttpServer, method: str, path: str, body: str = "") -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        conn.request(method, path, body=body.encode(), headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@pytest.mark.parametrize("action", ["retry", "cancel", "trigger", "pause", "resume"])
def test_read_only_console_refuses_posts_and_gets_to_actions(
    read_only_server: HttpServer, action: str
) -> None:
    status, headers = call(read_only_server, "POST", f"/actions/{action}", "run_id=1&token=x")
    assert status == 403
    assert headers["content-security-policy"].startswith("default-src 'self'")
    status, headers = call(read_only_server, "GET", f"/actions/{action}")
    assert (status, headers["allow"]) == (405, "POST")


def test_security_headers_and_static_files(read_only_server: HttpServer) -> None:
    status, headers = call(read_only_server, "GET", "/static/console.css")
    assert status == 200 and headers["content-type"].startswith("text/css")
    for name, value in routes.SECURITY_HEADERS.items():
        if name != "Cache-Control":
            assert headers[name.lower()] == value
    assert "script-src 'none'" in headers["content-security-policy"]
    assert call(read_only_server, "GET", "/static/../console/__init__.py")[0] == 404
    assert call(read_only_server, "GET", "/static/nope.css")[0] == 404
    status, headers = call(read_only_server, "GET", "/nowhere")
    assert status == 404 and headers["x-frame-options"] == "DENY"


def test_attempts_on_a_time_line() -> None:
    t0 = NOW - timedelta(minutes=10)
    attempts = [
        Attempt(7, 1, "h:1:a", t0, t0 + timedelta(seconds=30), "failed", "x", "E"),
        Attempt(
            7, 2, "h:1:b", t0 + timedelta(minutes=2), t0 + timedelta(minutes=3), "lost", None, None
        ),
        Attempt(7, 3, "h:1:c", t0 + timedelta(minutes=8), None, None, None, None),  # running
    ]
    page = pages.run_page(operations.RunDetail(run(), attempts, None, [], NOW), Page(False, NOW))
    spans = [a for n, a in Tags(page).tags if n == "rect" and "span" in (a.get("class") or "")]
    assert [s["data-attempt"] for s in spans] == ["1", "2", "3"]
    assert [s["class"] for s in spans] == [
        "span outcome-failed",
        "span outcome-lost",
        "span outcome-running",
    ]
    xs = [float(s["x"] or 0) for s in spans]
    widths = [float(s["width"] or 0) for s in spans]
    assert xs[0] == fragments.TIMELINE_LABEL_WIDTH and xs[0] < xs[1] < xs[2]
    # the time axis is 10 minutes: attempt 2 starts at 1/5 of it, the running one ends at now
    usable = fragments.TIMELINE_WIDTH - fragments.TIMELINE_LABEL_WIDTH - 4
    assert abs(xs[1] - (fragments.TIMELINE_LABEL_WIDTH + usable / 5)) < 0.1
    assert abs(xs[2] + widths[2] - (fragments.TIMELINE_LABEL_WIDTH + usable)) < 0.2
    assert "attempt 2: lost after 60.000s" in page
    assert fragments.timeline([], NOW) is None
    assert 'id="timeline"' not in pages.run_page(detail(run(), []), Page(False, NOW))


def test_overview_small_charts_per_job_type() -> None:
    ok = [0] * 59 + [3]
    dead = [0] * 58 + [2, 1]
    ov = operations.Overview(
        NOW, [], [], [], [0] * 60, {"zeta": (ok, dead), SCRIPT: (ok, [0] * 60)}, {}
    )
    page = pages.overview_page(ov, Page(False, NOW))
    tags = Tags(page)
    figures = [a["data-job-type"] for n, a in tags.tags if n == "figure"]
    assert figures == [SCRIPT, "zeta"] and "script" not in tags.names()
    zeta = page[page.index('data-job-type="zeta"') :]
    zeta = zeta[: zeta.index("</figure>")]
    assert zeta.count('<rect class="bar"') == 1 and zeta.count('<rect class="failures"') == 2
    assert "3 succeeded, 0 dead" not in zeta and "3</span> succeeded" in zeta
    assert "3</span> dead" in zeta and "peak 4/min" in zeta  # 3 + 1 this minute, stacked
    # the dead bar of this minute sits on the succeeded one
    rects = re.findall(
        r'<rect class="(bar|failures)" x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"',
        zeta,
    )
    now_x = max(float(r[1]) for r in rects)
    this_minute = {kind: (float(y), float(h)) for kind, x, y, h in rects if float(x) == now_x}
    (y_ok, _), (y_dead, h_dead) = this_minute["bar"], this_minute["failures"]
    assert abs(y_dead + h_dead - y_ok) < 0.11
    assert "depth" not in tags.names() and 'class="chart small depth"' in zeta
    assert '<rect class="depth"' not in zeta and "0</span> waiting now" in zeta
    empty = pages.overview_page(
        operations.Overview(NOW, [], [], [], [0] * 60, {}, {}), Page(False, NOW)
    )
    assert "No run waited or finished in the last hour." in empty
    assert "not available" not in empty
    late = pages.overview_page(
        operations.Overview(NOW, [], [], [], [0] * 60, None), Page(False, NOW)
    )
    assert late.count("Not available: the query ran out of time.") == 1


def test_overview_queue_depth_per_job_type() -> None:
    """A third small chart per job type: the runs due and waiting per minute, one bar per
    minute with a queue, its height the depth against the hour's peak; a type with a backlog
    and nothing finished gets its charts too."""
    depth = [0] * 50 + [1, 2, 4, 4, 3, 0, 0, 0, 0, 2]
    ov = operations.Overview(
        NOW, [], [], [], [0] * 60, {"mail": ([0] * 59 + [1], [0] * 60)}, {SCRIPT: depth}
    )
    page = pages.overview_page(ov, Page(False, NOW))
    tags = Tags(page)
    assert [a["data-job-type"] for n, a in tags.tags if n == "figure"] == [SCRIPT, "mail"]
    assert "script" not in tags.names()
    backlog = page[page.index("data-job-type=") : page.index("</figure>")]
    assert backlog.count('<rect class="depth"') == 6 and '<rect class="bar"' not in backlog
    assert "waiting, peak 4" in backlog and "2</span> waiting now" in backlog
    assert "0</span> succeeded" in backlog  # its finished chart, empty
    assert "<title>4 due and waiting, 7 min ago</title>" in backlog
    heights = [float(h) for h in re.findall(r'<rect class="depth"[^>]* height="([\d.]+)"', backlog)]
    usable = fragments.SMALL_HEIGHT - fragments.SMALL_TOP_PADDING - 2
    assert heights == [pytest.approx(usable * n / 4) for n in (1, 2, 4, 4, 3, 2)]
    mail = page[page.index('data-job-type="mail"') :]
    mail = mail[: mail.index("</figure>")]
    assert '<rect class="depth"' not in mail and "0</span> waiting now" in mail
    # one read out of time: its message once, the other charts still drawn
    late = operations.Overview(NOW, [], [], [], [0] * 60, {"mail": ([1] * 60, [0] * 60)}, None)
    page = pages.overview_page(late, Page(False, NOW))
    assert page.count("Queue depth: not available: the query ran out of time.") == 1
    assert 'class="chart small depth"' not in page and page.count('<rect class="bar"') == 120
    assert "Succeeded and dead per minute: not available" not in page
    late = operations.Overview(NOW, [], [], [], [0] * 60, None, {"mail": depth})
    page = pages.overview_page(late, Page(False, NOW))
    assert page.count("Succeeded and dead per minute: not available: the query ran out") == 1
    assert 'class="chart small finished"' not in page and page.count('<rect class="depth"') == 6
    assert "Queue depth: not available" not in page


def test_run_page_shows_the_result_escaped_and_a_batch_page_its_counts() -> None:
    """Issue 48: the run page shows the succeeded attempt's result as `pgtick show` does; the
    batch page its state, counts and callback run (docs/composition.md)."""
    ok = Attempt(7, 1, "h:1:c", NOW, NOW, "succeeded", None, None, {"html": SCRIPT, "n": 3})
    page = pages.run_page(detail(run(status="succeeded"), [ok]), Page(False, NOW))
    parsed = Tags(page)
    assert "script" not in parsed.names()
    assert '"html": "<script>' in parsed.joined() or SCRIPT in parsed.joined()
    assert '"n": 3' in parsed.joined()
    assert "Result" not in Tags(pages.run_page(detail(run(), []), Page(False, NOW))).joined()
    batch = Batch(9, "done", [{"job_type": "summary"}], 5, 3, 1, 1, 0, 42, NOW, NOW, NOW, {})
    text = Tags(pages.batch_page(batch, Page(False, NOW))).joined()
    assert "5 of 5 members ended" in text
    assert "summary" in text and "run 42" in text
