"""The console's guard (sessions, CSRF, Host, origin) and the run id rule it shares with the CLI:
pure functions, no server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgtick.errors import UsageError
from pgtick.surfaces import operations
from pgtick.surfaces.console import guard

HUGE = "9" * 5000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_expires_after_its_ttl() -> None:
    clock = Clock()
    sessions = guard.Sessions("s3cret", 60, clock=clock)
    cookie = sessions.issue()
    assert sessions.valid(cookie)
    clock.now += 59
    assert sessions.valid(cookie)
    clock.now += 2
    assert not sessions.valid(cookie)


def test_a_tampered_or_foreign_cookie_is_refused() -> None:
    sessions = guard.Sessions("s3cret", 60)
    cookie = sessions.issue(guard.OPERATOR, "alice")
    expiry, nonce, role, name, signature = cookie.split(".")
    assert not sessions.valid(f"{int(expiry) + 3600}.{nonce}.{role}.{name}.{signature}")
    assert not sessions.valid(f"{expiry}.{nonce}x.{role}.{name}.{signature}")
    assert not sessions.valid(f"{expiry}.{nonce}.{role}.Ym9i.{signature}")  # another name
    flipped = "1" if signature[-1] == "0" else "0"
    assert not sessions.valid(f"{expiry}.{nonce}.{role}.{name}.{signature[:-1]}{flipped}")
    assert not sessions.valid(guard.Sessions("other", 60).issue())  # another token's
    for junk in (None, "", "a.b", "a.b.c.d", "x" * 500, f"-1.{nonce}.{role}.{name}.{signature}"):
        assert not sessions.valid(junk)


def test_a_viewer_session_cannot_be_made_an_operator_one() -> None:
    sessions = guard.Sessions({guard.OPERATOR: "op-token", guard.VIEWER: "view-token"}, 60)
    assert sessions.token_role("op-token") == guard.OPERATOR
    assert sessions.token_role("view-token") == guard.VIEWER
    assert sessions.token_role("view-token ") is None and sessions.token_role("") is None
    cookie = sessions.issue(guard.VIEWER, "Bob Viewer")
    session = sessions.signed(cookie)
    assert session is not None and session.role == guard.VIEWER and not session.acts
    assert session.name == "Bob Viewer" and session.who == "Bob Viewer (viewer)"
    expiry, nonce, _, name, signature = cookie.split(".")
    assert not sessions.valid(f"{expiry}.{nonce}.operator.{name}.{signature}")
    # a console with the operators' token alone takes no viewer session, even one signed
    assert guard.Sessions({guard.OPERATOR: "op-token"}, 60).signed(cookie) is None


def test_a_login_name_is_one_short_printable_line() -> None:
    assert guard.login_name("  Alice \n\x1b[31m  Smith ") == "Alice [31m Smith"
    assert guard.login_name("\x00\n ") is None
    assert guard.login_name("x" * 100) == "x" * guard.MAX_NAME_CHARS


def test_a_signed_session_names_its_nonce_and_expiry_and_a_new_token_ends_it() -> None:
    clock = Clock()
    sessions = guard.Sessions("s3cret", 60, clock=clock)
    cookie = sessions.issue()
    expiry, nonce, *_ = cookie.split(".")
    assert sessions.signed(cookie) == guard.Session(cookie, nonce, int(expiry), "operator", "")
    assert int(expiry) == int(clock.now) + 60
    assert guard.Sessions("rotated", 60).signed(cookie) is None


def test_known_sessions_keep_a_logout_and_a_not_logged_out_only_briefly() -> None:
    """What the database said about a session's logout (it stores them: every daemon asks)."""
    clock = Clock()
    known = guard.KnownSessions(3, clock=clock)
    assert known.get("a", 5) is None  # never asked: ask the database
    known.put("a", False)
    known.put("b", True)
    clock.now += 4
    assert known.get("a", 5) is False and known.get("a", 0) is None  # actions ask every time
    clock.now += 2
    assert known.get("a", 5) is None  # too old for a page too
    assert known.get("b", 0) is True  # a logout is final, however old
    for nonce in "cdef":
        known.put(nonce, False)
    assert len(known) == 3 and known.get("b", 5) is None  # bounded, oldest forgotten


def test_a_wrong_token_holds_back_its_client_only_and_for_a_second() -> None:
    clock = Clock()
    guessers = guard.Guessers(1.0, 100, clock=clock)
    checked: list[str] = []

    def token(client: str, right: bool) -> str | None:
        def matches() -> bool:
            checked.append(client)
            return right

        return guessers.check(client, matches)

    assert token("10.0.0.9", False) == "wrong token"
    clock.now += 0.5
    refused = token("10.0.0.9", True)  # its own right token: refused, not looked at
    assert refused is not None and "try again in 0.5 s" in refused
    assert token("10.0.0.1", True) is None  # the owner elsewhere: checked, taken
    assert checked == ["10.0.0.9", "10.0.0.1"]
    clock.now += 0.5
    assert token("10.0.0.9", True) is None  # a second on: checked again
    assert len(guessers) == 0


def test_the_guessers_table_is_bounded_however_many_addresses_guess() -> None:
    clock = Clock()
    guessers = guard.Guessers(1.0, 50, clock=clock)
    for n in range(1000):
        assert guessers.check(f"10.0.{n // 256}.{n % 256}", lambda: False) == "wrong token"
        assert len(guessers) <= 50
    assert guessers.check("10.0.3.231", lambda: True) is not None  # among the last 50
    assert guessers.check("10.0.0.0", lambda: True) is None  # forgotten: the oldest
    clock.now += 1.0
    guessers.check("10.9.9.9", lambda: False)  # the waits that ended go first
    assert len(guessers) == 1


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),  # IPv4 on a dual-stack socket
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::2", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("fe80::1%eth0", "fe80::/64"),
        ("", ""),
    ],
)
def test_a_client_is_its_address_or_its_ipv6_64(peer: str, client: str) -> None:
    assert guard.client_key(peer) == client


def test_csrf_belongs_to_its_session() -> None:
    sessions = guard.Sessions("s3cret", 60)
    one, two = sessions.issue(), sessions.issue()
    assert sessions.csrf_matches(one, sessions.csrf(one))
    assert not sessions.csrf_matches(one, sessions.csrf(two))
    assert not sessions.csrf_matches(one, None)
    assert not sessions.csrf_matches(None, sessions.csrf(one))


def test_the_cookie_is_httponly_samesite_strict_and_expires() -> None:
    sessions = guard.Sessions("s3cret", 3600)
    header = sessions.set_cookie(sessions.issue())
    assert header.startswith("pgtick_session=")
    assert "; HttpOnly" in header and "; SameSite=Strict" in header and "Max-Age=3600" in header
    assert "Max-Age=0" in guard.clear_cookie()
    assert guard.session_cookie({"cookie": "a=1; pgtick_session=v.x.y; b=2"}) == "v.x.y"
    assert guard.session_cookie({"cookie": "a=1"}) is None


@pytest.mark.parametrize(
    ("host", "listen", "names", "allowed"),
    [
        ("127.0.0.1:8089", "127.0.0.1", (), True),
        ("localhost:8089", "127.0.0.1", (), True),  # an SSH tunnel's local end
        ("localhost:9999", "127.0.0.1", (), True),
        ("[::1]:8089", "::1", (), True),
        ("rebound.evil.example:8089", "127.0.0.1", (), False),  # DNS rebinding
        ("rebound.evil.example", "0.0.0.0", (), False),
        ("10.1.2.3:8089", "0.0.0.0", (), True),  # an address of the machine
        ("10.1.2.3:8089", "10.1.2.3", (), True),
        ("10.1.2.4:8089", "10.1.2.3", (), False),
        ("PGTICK.internal:443", "10.1.2.3", ("pgtick.internal",), True),
        ("other.internal", "10.1.2.3", ("pgtick.internal",), False),
        ("", "127.0.0.1", (), False),
        (None, "127.0.0.1", (), False),
    ],
)
def test_host_must_name_the_console(
    host: str | None, listen: str, names: tuple[str, ...], allowed: bool
) -> None:
    assert guard.host_allowed(host, listen, names) is allowed


def test_cross_site_posts_and_origin_null_are_refused() -> None:
    own = {"host": "127.0.0.1:8089"}
    assert guard.cross_site(own) is None
    assert guard.cross_site({**own, "origin": "http://127.0.0.1:8089"}) is None
    assert guard.cross_site({**own, "origin": "null"}) is not None
    assert guard.cross_site({**own, "origin": "http://evil.example"}) is not None
    assert guard.cross_site({**own, "sec-fetch-site": "cross-site"}) is not None


@pytest.mark.parametrize("text", ["1", "42", "0042", str(2**63 - 1)])
def test_run_ids_in_range_parse(text: str) -> None:
    assert operations.parse_run_id(text) == int(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0", "ids start at 1"),
        (str(2**63), "larger than any bigint"),
        (str(2**64), "larger than any bigint"),
        (HUGE, "larger than any bigint"),
        ("-1", None),
        ("1e3", None),
        ("", None),
        ("١٢", None),  # Arabic-Indic digits: isdigit() but not an id
    ],
)
def test_anything_else_is_not_a_run_id(text: str, why: str | None) -> None:
    with pytest.raises(UsageError) as caught:
        operations.parse_run_id(text)
    message = str(caught.value)
    assert message.startswith("not a run id: ")
    assert len(message) < 100  # a 5 000-digit id is cut, not echoed
    if why:
        assert message.endswith(f"({why})")


def test_the_cli_uses_the_same_rule() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgtick", "show", HUGE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "not a run id: " in out.stderr and "(larger than any bigint)" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr) < 300
