"""The HTTP server and the metrics endpoints without a database: routing, errors, a busy port,
and the database collector's sharing, caching and time bound (its fetch is a plain function)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from pgtick.errors import ConfigError
from pgtick.observability.database import DatabaseCollector, DatabaseSnapshot, Readiness
from pgtick.observability.metrics import Metrics
from pgtick.surfaces.http import (
    MAX_CONNECTIONS,
    HttpServer,
    Request,
    Response,
    observability_routes,
    text,
)


@pytest.fixture
def serve() -> Iterator[Callable[..., HttpServer]]:
    started: list[HttpServer] = []

    def start(
        routes: dict[tuple[str, str], Callable[[Request], Response]], key: str = "metrics.listen"
    ) -> HttpServer:
        server = HttpServer(key, "127.0.0.1", 0, routes)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def call(
    server: HttpServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_routes_get_the_request_and_shape_the_response(serve: Callable[..., HttpServer]) -> None:
    seen: list[Request] = []

    def echo(request: Request) -> Response:
        seen.append(request)
        return Response(201, "application/json", b'{"ok": true}', {"X-Extra": "1"})

    server = serve({("POST", "/runs"): echo})
    status, headers, body = call(
        server, "POST", "/runs?state=dead&state=failed", b"payload", {"X-Token": "t"}
    )
    assert (status, body) == (201, b'{"ok": true}')
    assert headers["content-type"] == "application/json"
    assert headers["x-extra"] == "1"
    assert headers["content-length"] == "12"
    [request] = seen
    assert (request.method, request.path, request.body) == ("POST", "/runs", b"payload")
    assert request.query == {"state": ["dead", "failed"]}
    assert request.headers["x-token"] == "t"


def test_unknown_path_is_404_and_wrong_method_405(serve: Callable[..., HttpServer]) -> None:
    server = serve({("GET", "/healthz"): lambda _r: text(200, "ok")})
    assert call(server, "GET", "/nope")[0] == 404
    status, headers, _ = call(server, "POST", "/healthz", b"")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    status, headers, body = call(server, "HEAD", "/healthz")
    assert (status, body, headers["content-length"]) == (200, b"", "3")


def test_a_failing_handler_is_a_500_and_the_server_goes_on(
    serve: Callable[..., HttpServer],
) -> None:
    def broken(_request: Request) -> Response:
        raise RuntimeError("bug")

    server = serve({("GET", "/broken"): broken, ("GET", "/ok"): lambda _r: text(200, "ok")})
    assert call(server, "GET", "/broken")[0] == 500
    assert call(server, "GET", "/ok")[2] == b"ok\n"


def test_a_port_in_use_is_a_config_error_naming_the_key(serve: Callable[..., HttpServer]) -> None:
    first = serve({})
    second = HttpServer("web.listen", "127.0.0.1", first.port, {})
    with pytest.raises(ConfigError) as refused:
        second.start()
    assert str(refused.value) == (
        f"web.listen: cannot listen on 127.0.0.1:{first.port}: address already in use"
    )


def test_bad_requests_get_an_answer_not_a_traceback(
    serve: Callable[..., HttpServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = serve({("POST", "/x"): lambda _r: text(200, "x")})
    assert call(server, "POST", "/x", None, {"Content-Length": "abc"})[0] == 400
    assert call(server, "POST", "/x", None, {"Content-Length": str(2 << 20)})[0] == 413
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n")  # hangs up mid-request
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"\x16\x03\x01 not http\r\n\r\n")
        assert b"400" in sock.recv(4096)
    assert call(server, "POST", "/x", b"")[2] == b"x\n"
    assert "Traceback" not in capfd.readouterr().err


def test_a_header_cut_short_by_a_hang_up_is_not_a_request(
    serve: Callable[..., HttpServer],
) -> None:
    seen: list[Request] = []

    def record(request: Request) -> Response:
        seen.append(request)
        return text(200, "x")

    server = serve({("GET", "/x"): record})
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET /x HTTP/1.1\r\nX-Slow: a")
    time.sleep(0.3)
    assert seen == []
    assert call(server, "GET", "/x")[0] == 200 and len(seen) == 1


def test_two_servers_serve_their_own_routes(serve: Callable[..., HttpServer]) -> None:
    a = serve({("GET", "/a"): lambda _r: text(200, "a")})
    b = serve({("GET", "/b"): lambda _r: text(200, "b")}, key="web.listen")
    assert (call(a, "GET", "/a")[2], call(a, "GET", "/b")[0]) == (b"a\n", 404)
    assert (call(b, "GET", "/b")[2], call(b, "GET", "/a")[0]) == (b"b\n", 404)


def test_stop_releases_the_port() -> None:
    server = HttpServer("metrics.listen", "127.0.0.1", 0, {})
    server.start()
    port = server.port
    server.stop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# -- the database collector ----------------------------------------------------------------


class Fetch:
    """Counts calls; each call waits for ``release`` (set by default) and may fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.error: Exception | None = None
        self.depth = 3

    def __call__(self) -> DatabaseSnapshot:
        self.calls += 1
        self.started.set()
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        return DatabaseSnapshot(runs={("a", "queued"): self.depth}, queue_depth={"a": self.depth})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Timers:
    """Stands for ``threading.Timer``: notes the reads planned ahead; the test fires them."""

    def __init__(self) -> None:
        self.planned: list[tuple[float, Callable[[], None], threading.Event]] = []

    def __call__(self, delay: float, action: Callable[[], None]) -> Callable[[], None]:
        cancelled = threading.Event()
        self.planned.append((delay, action, cancelled))
        return cancelled.set

    def pending(self) -> list[float]:
        """The delays of the timers neither fired nor cancelled."""
        return [delay for delay, _, cancelled in self.planned if not cancelled.is_set()]

    def fire(self) -> None:
        (_, action, cancelled) = next(p for p in self.planned if not p[2].is_set())
        cancelled.set()
        action()


def endpoint(
    fetch: Fetch,
    clock: Clock,
    *,
    last_tick: float | None = 1000.0,
    wait: float = 0.8,
    before: Collector | None = None,
    timers: Timers | None = None,
) -> tuple[Metrics, Readiness, dict[tuple[str, str], Callable[[Request], Response]]]:
    """As ``Endpoints.start_http`` wires them; ``before`` is registered ahead of the
    database collector (where the worker processes' merged files are); reads planned ahead
    go to ``timers`` (by default to one that never fires)."""
    metrics = Metrics(["a", "b"], "1.2.3", 4)
    if before is not None:
        metrics.registry.register(before)
    collector = DatabaseCollector(
        fetch,
        metrics.job_types,
        ["nightly"],
        on_error=lambda: metrics.db_error("metrics"),
        cache_seconds=5.0,
        wait_seconds=wait,
        clock=clock,
        timer=Timers() if timers is None else timers,
    )
    metrics.registry.register(collector)
    metrics.before_collect(collector.prefetch)
    readiness = Readiness(collector, lambda: last_tick, 60.0, clock=clock)
    return metrics, readiness, observability_routes(metrics, readiness)


def samples(
    routes: dict[tuple[str, str], Callable[[Request], Response]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = routes[("GET", "/metrics")](Request("GET", "/metrics", {}, {}))
    assert response.status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(response.body.decode())
        for s in f.samples
    }


def test_concurrent_scrapes_share_one_read_per_cache_period() -> None:
    fetch, clock = Fetch(), Clock()
    fetch.release.clear()
    _, _, routes = endpoint(fetch, clock)
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(samples, routes) for _ in range(20)]
        deadline = time.monotonic() + 5
        while fetch.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        fetch.release.set()
        results = [f.result() for f in futures]
    assert fetch.calls == 1
    assert all(r[("pgtick_queue_depth", (("job_type", "a"),))] == 3 for r in results)
    clock.now += 4.9
    fetch.depth = 7
    assert samples(routes)[("pgtick_queue_depth", (("job_type", "a"),))] == 3
    assert fetch.calls == 1
    clock.now += 0.2
    assert samples(routes)[("pgtick_queue_depth", (("job_type", "a"),))] == 7
    assert fetch.calls == 2


class Merge(Collector):
    """Stands for the merge of the worker processes' files: notes whether the database read
    had started when it was collected (waiting for it a while, not failing at once)."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.read_started: list[bool] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.read_started.append(self.fetch.started.wait(5))
        return iter(())


def test_a_scrape_starts_the_database_read_before_it_collects_the_other_series() -> None:
    """The query overlaps the merge and the rendering instead of following them; the one
    read started first is the one the database series show (one read, not two)."""
    fetch, clock = Fetch(), Clock()
    merge = Merge(fetch)
    _, _, routes = endpoint(fetch, clock, before=merge)
    s = samples(routes)
    assert merge.read_started == [True]
    assert fetch.calls == 1
    assert s[("pgtick_queue_depth", (("job_type", "a"),))] == 3


def test_labels_are_pre_initialised_for_configured_types_and_schedules() -> None:
    _, _, routes = endpoint(Fetch(), Clock())
    s = samples(routes)
    for job_type in ("a", "b"):
        for status in ("queued", "running", "succeeded", "failed", "dead", "cancelled", "skipped"):
            assert ("pgtick_runs", (("job_type", job_type), ("status", status))) in s
        assert ("pgtick_runs_stuck", (("job_type", job_type),)) in s
    assert s[("pgtick_runs", (("job_type", "b"), ("status", "queued")))] == 0
    assert s[("pgtick_schedule_last_success_timestamp_seconds", (("schedule", "nightly"),))] == 0
    assert s[("pgtick_db_collect_success", ())] == 1


def test_a_hanging_database_does_not_hang_the_scrape() -> None:
    fetch, clock = Fetch(), Clock()
    fetch.release.clear()
    _, readiness, routes = endpoint(fetch, clock, wait=0.2)
    started = time.monotonic()
    s = samples(routes)
    assert time.monotonic() - started < 1.0
    assert s[("pgtick_db_collect_success", ())] == 0
    assert ("pgtick_queue_depth", (("job_type", "a"),)) not in s
    assert s[("pgtick_worker_threads", ())] == 4  # the process series are all there
    assert readiness.reason_not_ready() == "database: database read still running after 0.2s"
    assert fetch.calls == 1  # the second caller did not start another read
    fetch.release.set()


def test_a_failed_read_is_counted_cached_and_gives_the_readiness_reason() -> None:
    fetch, clock = Fetch(), Clock()
    fetch.error = RuntimeError("metrics: OperationalError: connection refused")
    _, _, routes = endpoint(fetch, clock)
    assert samples(routes)[("pgtick_db_collect_success", ())] == 0
    # The error counter is exposed before the read it counts: the next scrape shows it.
    s = samples(routes)
    assert s[("pgtick_db_collect_success", ())] == 0
    assert s[("pgtick_db_errors_total", (("operation", "metrics"),))] == 1
    readyz = routes[("GET", "/readyz")](Request("GET", "/readyz", {}, {}))
    assert (readyz.status, readyz.body) == (
        503,
        b"database: metrics: OperationalError: connection refused\n",
    )
    assert fetch.calls == 1  # cached: a down database is not asked again within the period
    fetch.error = None
    clock.now += 6
    assert samples(routes)[("pgtick_db_collect_success", ())] == 1


def depth_a(routes: dict[tuple[str, str], Callable[[Request], Response]]) -> float:
    return samples(routes)[("pgtick_queue_depth", (("job_type", "a"),))]


def wait_for_calls(fetch: Fetch, n: int) -> None:
    deadline = time.monotonic() + 5
    while fetch.calls < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fetch.calls == n


def test_scrapes_at_a_steady_pace_find_the_values_read_just_before_them() -> None:
    """From the third scrape of a steady pace on, the aggregate runs shortly before each
    scrape, not during it: the scrape only renders, however long the query takes. Scrapes
    within a cache period of a round's first (a second scraper) and /readyz do not count as
    rounds; the reads stay one per round."""
    fetch, clock, timers = Fetch(), Clock(), Timers()
    _, _, routes = endpoint(fetch, clock, timers=timers)
    assert depth_a(routes) == 3
    clock.now += 0.1
    depth_a(routes)  # the same round: served from the cache
    clock.now += 7
    readyz = routes[("GET", "/readyz")](Request("GET", "/readyz", {}, {}))
    assert (readyz.status, fetch.calls, timers.pending()) == (200, 2, [])
    clock.now += 7.9  # the second round, 15 s after the first
    depth_a(routes)
    assert fetch.calls == 3
    (delay,) = timers.pending()
    assert 14.5 <= delay <= 14.75  # a quarter of a second (or 3 reads) before the next round
    clock.now += delay
    fetch.depth = 7
    timers.fire()
    wait_for_calls(fetch, 4)
    clock.now += 15 - delay
    assert depth_a(routes) == 7  # fresh, and this scrape ran no query
    assert fetch.calls == 4
    assert len(timers.pending()) == 1  # the next one is planned in its turn


def test_a_read_ahead_waits_for_the_end_of_the_cache_period() -> None:
    """Rounds barely over a cache period apart: the planned read comes while the last one
    is still fresh, so it waits for the moment it is not; never two reads in one period."""
    fetch, clock, timers = Fetch(), Clock(), Timers()
    _, _, routes = endpoint(fetch, clock, timers=timers)
    depth_a(routes)
    clock.now += 5.1
    depth_a(routes)
    assert fetch.calls == 2
    (delay,) = timers.pending()
    clock.now += delay  # 4.85 s after the last read, which is fresh for 5
    timers.fire()
    (wait,) = timers.pending()
    assert fetch.calls == 2 and 0.1 < wait < 0.2
    clock.now += wait
    timers.fire()
    wait_for_calls(fetch, 3)
    assert timers.pending() == []


def test_when_scrapes_stop_at_most_one_read_follows_and_close_cancels_it() -> None:
    fetch, clock, timers = Fetch(), Clock(), Timers()
    collector = DatabaseCollector(fetch, ["a"], [], clock=clock, timer=timers)

    def scrape() -> None:
        collector.prefetch()
        assert collector.latest().snapshot is not None

    scrape()
    clock.now += 15
    scrape()
    clock.now += 14.75
    timers.fire()
    wait_for_calls(fetch, 3)
    assert timers.pending() == []  # no scrape came: nothing more is planned
    clock.now += 0.25
    scrape()
    assert len(timers.pending()) == 1
    collector.close()
    assert timers.pending() == []
    clock.now += 15
    timers.planned[-1][1]()  # a timer that fired as the daemon stopped reads nothing
    time.sleep(0.05)
    assert fetch.calls == 3


def test_readiness_follows_the_ticker() -> None:
    clock = Clock()
    _, readiness, routes = endpoint(Fetch(), clock, last_tick=1000.0)
    assert readiness.reason_not_ready() is None
    assert routes[("GET", "/readyz")](Request("GET", "/readyz", {}, {})).status == 200
    clock.now = 1000.0 + 120.5
    assert readiness.reason_not_ready() == "ticker: last tick 120s ago (limit 120s)"
    _, never, _ = endpoint(Fetch(), clock, last_tick=None)
    assert never.reason_not_ready() == "ticker: no tick yet"
    healthz = routes[("GET", "/healthz")](Request("GET", "/healthz", {}, {}))
    assert (healthz.status, healthz.body) == (200, b"ok\n")


# -- bounds against slow and idle clients (issue 22, finding 2) ------------------------------


def timed_get(port: int, path: str = "/metrics") -> tuple[int, float]:
    """(status, seconds) of one GET on a new connection."""
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (a read sees the end) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_idle_keep_alive_connections_do_not_stop_a_scrape() -> None:
    server = HttpServer(
        "metrics.listen", "127.0.0.1", 0, {("GET", "/metrics"): lambda _r: text(200, "m")}
    )
    server.start()
    threads_before = threading.active_count()
    idle: list[http.client.HTTPConnection] = []
    try:
        for _ in range(200):  # each asks once, then keeps its connection open
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            idle.append(conn)
        worst = max(timed_get(server.port)[1] for _ in range(5))
        assert worst < 0.1, f"a scrape took {worst:.3f}s behind 200 idle connections"
        assert threading.active_count() <= threads_before + MAX_CONNECTIONS + 2
    finally:
        for conn in idle:
            conn.close()
        server.stop()


def test_slowloris_is_bounded_by_connections_and_a_whole_request_deadline() -> None:
    server = HttpServer(
        "metrics.listen",
        "127.0.0.1",
        0,
        {("GET", "/metrics"): lambda _r: text(200, "m")},
        max_connections=16,
        deadline_seconds=1.0,
    )
    server.start()
    threads_before = threading.active_count()
    slow: list[socket.socket] = []
    try:
        for _ in range(300):  # each sends part of a header, then a byte now and then
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            slow.append(sock)
        assert threading.active_count() <= threads_before + 16 + 4
        time.sleep(0.2)  # the evicted connections' threads finish (they share this process)
        scrapes = sorted(timed_get(server.port) for _ in range(5))
        assert {status for status, _ in scrapes} == {200}
        assert scrapes[2][1] < 0.1, f"median scrape {scrapes[2][1]:.3f}s behind 300 slow clients"
        # a client that keeps trickling is still cut off at the deadline (not per read)
        trickler = socket.create_connection(("127.0.0.1", server.port))
        trickler.sendall(b"GET /metrics HTTP/1.1\r\n")
        began = time.monotonic()
        cut = False
        while time.monotonic() - began < 3 and not cut:
            with contextlib.suppress(OSError):
                trickler.sendall(b"X")
            cut = closed_by_server(trickler, 0.3)
        assert cut and time.monotonic() - began < 2.5
        trickler.close()
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_extra_connections_are_refused_when_every_one_is_busy() -> None:
    release = threading.Event()

    def hold(_request: Request) -> Response:
        release.wait(10)
        return text(200, "done")

    server = HttpServer(
        "metrics.listen", "127.0.0.1", 0, {("GET", "/hold"): hold}, max_connections=2
    )
    server.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = [pool.submit(timed_get, server.port, "/hold") for _ in range(2)]
            time.sleep(0.3)
            extra = socket.create_connection(("127.0.0.1", server.port))
            extra.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_server(extra, 2.0), "a third connection was served, not refused"
            extra.close()
            release.set()
            assert [f.result()[0] for f in held] == [200, 200]
    finally:
        release.set()
        server.stop()
