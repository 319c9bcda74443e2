"""Who may do what on the console: the login session, the CSRF token of its forms, the Host
check against DNS rebinding and the check that a POST came from the console's own pages.

A session is a cookie ``<expiry>.<nonce>.<signature>``: the signature is an HMAC-SHA256 under a
key derived from the token of ``web.token_file``, so every daemon holding the same token accepts
it, a new token ends every session, and nothing is stored server side except the nonces of
sessions logged out before they expired. The CSRF token of a form is an HMAC of the session, so
it cannot be reused with another one. Pure: no I/O beyond the clock; the routes apply it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

SESSION_COOKIE = "pgtick_session"
LOGIN_COOKIE = "pgtick_login"  # the login form's CSRF token, before there is a session
LOGIN_FORM_SECONDS = 600
CSRF_FIELD = "csrf"
MAX_COOKIE_CHARS = 200  # a real session cookie is about 80
MAX_REVOKED_SESSIONS = 10_000  # logouts remembered until their cookie would expire anyway
LOOPBACK_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Sessions:
    """Issues and checks session cookies and CSRF tokens for one console token."""

    def __init__(
        self, token: str, ttl_seconds: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = hmac.new(token.encode(), b"pgtick console session v1", hashlib.sha256).digest()
        self._token = token.encode()
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._revoked: dict[str, float] = {}  # nonce -> expiry
        self._lock = threading.Lock()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def issue(self) -> str:
        """A new session cookie's value, valid for ``ttl_seconds``."""
        body = f"{int(self._clock() + self.ttl_seconds)}.{secrets.token_urlsafe(16)}"
        return f"{body}.{self._sign(body)}"

    def valid(self, cookie: str | None) -> bool:
        """Whether ``cookie`` is a session this token signed, not expired, not logged out."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS or cookie.count(".") != 2:
            return False
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return False
        expiry_text, _, nonce = body.partition(".")
        if not expiry_text.isascii() or not expiry_text.isdigit():
            return False
        with self._lock:
            revoked = nonce in self._revoked
        return not revoked and int(expiry_text) > self._clock()

    def revoke(self, cookie: str | None) -> None:
        """Log a session out: its cookie is refused from now on (until it would expire)."""
        if not self.valid(cookie):
            return
        assert cookie is not None
        expiry_text, nonce, _ = cookie.split(".")
        now = self._clock()
        with self._lock:
            for old in [n for n, until in self._revoked.items() if until <= now]:
                del self._revoked[old]
            if len(self._revoked) < MAX_REVOKED_SESSIONS:
                self._revoked[nonce] = float(expiry_text)

    def csrf(self, cookie: str) -> str:
        """The CSRF token the forms of this session carry."""
        return self._sign(f"csrf|{cookie}")

    def csrf_matches(self, cookie: str | None, given: str | None) -> bool:
        if not cookie or not given or len(given) > MAX_COOKIE_CHARS:
            return False
        return hmac.compare_digest(given.encode(), self.csrf(cookie).encode())

    def set_cookie(self, value: str) -> str:
        """The ``Set-Cookie`` value that starts a session."""
        return (
            f"{SESSION_COOKIE}={value}; Max-Age={int(self.ttl_seconds)}; Path=/; HttpOnly; "
            "SameSite=Strict"
        )


def clear_cookie() -> str:
    """The ``Set-Cookie`` value that ends a session in the browser."""
    return f"{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"


def session_cookie(headers: Mapping[str, str], cookie: str = SESSION_COOKIE) -> str | None:
    """A cookie's value (the session's by default) in a request's ``Cookie`` header, if any."""
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == cookie and value:
            return value
    return None


def login_form_cookie(value: str) -> str:
    """The ``Set-Cookie`` value that pairs the login form with this browser (double submit):
    the form's hidden field must equal it, which a page elsewhere cannot arrange."""
    return (
        f"{LOGIN_COOKIE}={value}; Max-Age={LOGIN_FORM_SECONDS}; Path=/login; HttpOnly; "
        "SameSite=Strict"
    )


def login_form_matches(headers: Mapping[str, str], given: str | None) -> bool:
    expected = session_cookie(headers, LOGIN_COOKIE)
    if not expected or not given or len(given) > MAX_COOKIE_CHARS:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without the port and IPv6 brackets, lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(host_header: str | None, listen_host: str, names: Sequence[str]) -> bool:
    """Whether a request's ``Host`` names this console: its listen address (any address of the
    machine when it listens on all of them), ``localhost`` when it listens on loopback (an SSH
    tunnel), or one of ``web.hosts``. A DNS rebinding page sends its own name: refused."""
    if not host_header:
        return False
    name = host_name(host_header)
    if name in names:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name in LOOPBACK_NAMES and (is_loopback(listen_host) or listen_host in WILDCARDS)
    if listen_host in WILDCARDS:
        return True
    if is_loopback(listen_host):
        return address.is_loopback
    return name == listen_host.lower()


def cross_site(headers: Mapping[str, str]) -> str | None:
    """Why a POST did not come from the console's own pages, or None. Browsers say where a
    request comes from; the pages set ``Referrer-Policy: same-origin``, so their forms carry
    their real ``Origin``, and ``Origin: null`` (a sandboxed frame, a data: URL) is refused."""
    fetch_site = headers.get("sec-fetch-site", "same-origin").lower()
    if fetch_site not in ("same-origin", "none"):
        return f"{fetch_site} request refused"
    origin = headers.get("origin")
    if origin is None:
        return None
    if origin == "null":
        return "request from an opaque origin (Origin: null) refused"
    host = headers.get("host", "")
    if not host or urllib.parse.urlsplit(origin).netloc.lower() != host.lower():
        return "request from another origin refused"
    return None
