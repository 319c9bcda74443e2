"""A NUL byte in the runs page's filters (``/runs?type=%00``) is the client's mistake: a 400
naming the field. The console answered 503 "the database did not answer in time" and logged a
database failure: psycopg refuses the parameter before anything is sent, and its DataError
was treated like an outage."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from pgtick.storage.store import RunStore
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import ConsoleServer


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def console(store: RunStore) -> Iterator[ConsoleServer]:
    server = ConsoleServer(
        "web.listen",
        "127.0.0.1",
        0,
        Console(store, None, heartbeat_seconds=20).routes(),
        SECURITY_HEADERS,
    )
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("query", ["type=%00", "schedule=%00", "type=mail%00x"])
def test_a_nul_byte_in_a_filter_is_a_bad_request_not_a_database_outage(
    console: ConsoleServer, query: str
) -> None:
    assert get(console.port, "/runs?type=mail")[0] == 200
    status, page = get(console.port, f"/runs?{query}")
    assert "did not answer in time" not in page, page[page.find("error-text") :][:200]
    assert status == 400, status
