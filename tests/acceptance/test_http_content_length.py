"""The metrics listener of a live daemon answers a malformed Content-Length with 400. It
checked the header with ``str.isdigit()``, which is true for superscript digits such as "²"
(a latin-1 header byte 0xB2), then called ``int()`` on it, which raised: the request got no
response at all, and the traceback went to the debug log."""

from __future__ import annotations

import socket

from .conftest import Cluster


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def test_a_non_ascii_digit_content_length_gets_a_400(cluster: Cluster) -> None:
    path = cluster.config()
    path.write_text(path.read_text().replace('listen = ""', 'listen = "127.0.0.1:0"', 1))
    daemon = cluster.start(path)
    event = next(e for e in daemon.events() if e.get("event") == "http_listening")
    port = int(event["port"])
    good = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert good.startswith(b"HTTP/1.1 200"), good
    answer = raw(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\nConnection: close\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 400"), f"no answer, the connection dropped: {answer!r}"
