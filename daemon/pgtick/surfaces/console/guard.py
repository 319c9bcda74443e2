"""Who may do what on the console: the login session, the CSRF token of its forms, the throttle
of wrong tokens, the Host check against DNS rebinding and the check that a POST came from the
console's own pages.

A session is a cookie ``<expiry>.<nonce>.<role>.<name>.<signature>``: the role is ``operator``
(logged in with the token of ``web.token_file``: pages and actions) or ``viewer`` (the token of
``web.viewer_token_file``: pages only); the name is what the person gave at login (base64url),
for the header and the audit log; the signature is an HMAC-SHA256 under a key derived from both
tokens, so every daemon holding the same tokens accepts it, a new token ends every session, and
nothing is stored at login. A logout is stored in the
database (``console_logouts``), so that every daemon refuses the session from then on; the routes
ask it, and ``KnownSessions`` keeps what it said for a few seconds. The CSRF token of a form is
an HMAC of the session, so it cannot be reused with another one.

The token itself (the login form, a bearer header) is compared in constant time. A client that
gave a wrong one is refused, its token unchecked, for ``GUESS_INTERVAL_SECONDS`` after
(``Guessers``): one checked guess a second per client, while every other client's token is
checked as usual. Pure: no I/O beyond the clock; the routes apply it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

SESSION_COOKIE = "pgtick_session"
LOGIN_COOKIE = "pgtick_login"  # the login form's CSRF token, before there is a session
LOGIN_FORM_SECONDS = 600
CSRF_FIELD = "csrf"
MAX_COOKIE_CHARS = 400  # a real session cookie is about 100, with a long name some 250
OPERATOR, VIEWER = "operator", "viewer"
ROLES = (OPERATOR, VIEWER)
MAX_NAME_CHARS = 40  # a login's name, as the header and the audit log show it
# How long a client that gave a wrong token is refused without its token being checked.
GUESS_INTERVAL_SECONDS = 1.0
# Clients remembered after a wrong token (about 100 bytes each); when full, the one whose wait
# ends first is forgotten: memory stays bounded however many addresses a guesser has.
MAX_GUESSERS = 10_000
# Sessions whose logout state the console keeps (about 100 bytes each); the oldest forgotten.
MAX_KNOWN_SESSIONS = 10_000
IPV6_CLIENT_PREFIX = 64  # one host, or one customer's network, per /64
LOOPBACK_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class Session:
    """A session cookie these tokens signed, not expired: its nonce, its expiry (epoch s), the
    role it was logged in with and the name given then."""

    cookie: str
    nonce: str
    expiry: int
    role: str = OPERATOR
    name: str = ""

    @property
    def acts(self) -> bool:
        return self.role == OPERATOR

    @property
    def who(self) -> str:
        """``alice (operator)``: how the header and the audit log name the login."""
        return f"{self.name or 'unnamed'} ({self.role})"


def login_name(text: str) -> str | None:
    """A name typed at login, made one line of at most MAX_NAME_CHARS printable characters;
    None when nothing printable is left."""
    name = " ".join("".join(c for c in text if c.isprintable()).split())[:MAX_NAME_CHARS]
    return name or None


class Sessions:
    """Issues and checks session cookies, CSRF tokens and the tokens themselves: ``tokens``
    maps each role that can log in (OPERATOR, VIEWER) to its token (a bare string: the
    operators' only)."""

    def __init__(
        self,
        tokens: Mapping[str, str] | str,
        ttl_seconds: float,
        *,
        clock: Callable[[], float] = time.time,
        guessers: Guessers | None = None,
    ) -> None:
        by_role = {OPERATOR: tokens} if isinstance(tokens, str) else dict(tokens)
        material = "\n".join(f"{role}={token}" for role, token in sorted(by_role.items()))
        self._key = hmac.new(
            material.encode(), b"pgtick console session v2", hashlib.sha256
        ).digest()
        self._tokens = {
            role: hashlib.sha256(token.encode()).digest() for role, token in by_role.items()
        }
        self.roles = tuple(r for r in ROLES if r in by_role)
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self.guessers = guessers if guessers is not None else Guessers()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def token_role(self, given: str) -> str | None:
        """The role whose token ``given`` is (None: neither), in constant time: both sides
        hashed to one length, so not even a token's length shows, and every role's token
        compared whatever the first said."""
        digest = hashlib.sha256(given.encode()).digest()
        found = None
        for role, token in self._tokens.items():
            if hmac.compare_digest(digest, token):
                found = role
        return found

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is one of the tokens (``token_role``)."""
        return self.token_role(given) is not None

    def token_refusal(self, given: str, peer: str) -> str | None:
        """Why ``given``, from the client at ``peer``, is not accepted as a token, or None.
        A client that gave a wrong token is refused unchecked for GUESS_INTERVAL_SECONDS;
        any other client's token is checked."""
        return self.guessers.check(client_key(peer), lambda: self.token_matches(given))

    def issue(self, role: str = OPERATOR, name: str = "") -> str:
        """A new session cookie's value for ``role`` and the login's ``name``, valid for
        ``ttl_seconds``."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        encoded = base64.urlsafe_b64encode(name[:MAX_NAME_CHARS].encode()).decode().rstrip("=")
        expiry = int(self._clock() + self.ttl_seconds)
        body = f"{expiry}.{secrets.token_urlsafe(16)}.{role}.{encoded}"
        return f"{body}.{self._sign(body)}"

    def signed(self, cookie: str | None) -> Session | None:
        """The session of ``cookie`` if these tokens signed it and it has not expired;
        whether it was logged out is the database's to say (``KnownSessions``)."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS or cookie.count(".") != 4:
            return None
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        expiry_text, nonce, role, encoded = body.split(".")
        if not expiry_text.isascii() or not expiry_text.isdigit() or role not in self.roles:
            return None
        try:
            name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        expiry = int(expiry_text)
        if expiry <= self._clock():
            return None
        return Session(cookie, nonce, expiry, role, name)

    def valid(self, cookie: str | None) -> bool:
        """Whether ``cookie`` is a session this token signed, not expired (``signed``)."""
        return self.signed(cookie) is not None

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


def client_key(peer: str) -> str:
    """Whom a wrong token is held against: the peer's address; for IPv6 its /64, which one
    host or one customer's network usually has whole (an address of an IPv4 client on a
    dual-stack socket, ``::ffff:a.b.c.d``, as IPv4)."""
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])
    except ValueError:
        return peer[:100]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        network = ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False)
        return str(network)
    return str(address)


class Guessers:
    """The clients that gave a wrong token lately, each with the end of its wait (monotonic),
    in the order their waits end: a fixed-size table, the first entry forgotten when full."""

    def __init__(
        self,
        interval_seconds: float = GUESS_INTERVAL_SECONDS,
        max_clients: int = MAX_GUESSERS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_seconds = interval_seconds
        self.max_clients = max_clients
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._until)

    def check(self, client: str, matches: Callable[[], bool]) -> str | None:
        """Why ``client``'s token is refused, or None: unchecked while its wait lasts,
        else ``matches()`` decides and a wrong token starts a new wait. Atomic, so parallel
        requests of one client get one check between them; the check takes microseconds
        and nothing waits outside this lock."""
        with self._lock:
            now = self._clock()
            until = self._until.get(client)
            if until is not None and now < until:
                wait = until - now
                return f"a wrong token came from your address just now: try again in {wait:.1f} s"
            while self._until and next(iter(self._until.values())) <= now:
                self._until.popitem(last=False)  # waits over, oldest first
            if matches():
                self._until.pop(client, None)
                return None
            self._until.pop(client, None)
            self._until[client] = now + self.interval_seconds  # last: its wait ends last
            while len(self._until) > self.max_clients:
                self._until.popitem(last=False)
            return "wrong token"


class KnownSessions:
    """What the database said lately about sessions: nonce -> (when asked, logged out), for
    at most ``max_sessions``, the least recently asked about forgotten first. A logout is
    final, so it is kept for as long as the entry is; "not logged out" only for the age
    the caller accepts."""

    def __init__(
        self, max_sessions: int = MAX_KNOWN_SESSIONS, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_sessions = max_sessions
        self._clock = clock
        self._known: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._known)

    def get(self, nonce: str, max_age_seconds: float) -> bool | None:
        """Whether the session was logged out, if known within ``max_age_seconds`` (a logout
        at any age); None: ask the database."""
        with self._lock:
            known = self._known.get(nonce)
            if known is None:
                return None
            asked_at, logged_out = known
            if logged_out or self._clock() - asked_at < max_age_seconds:
                self._known.move_to_end(nonce)
                return logged_out
            return None

    def put(self, nonce: str, logged_out: bool) -> None:
        with self._lock:
            self._known.pop(nonce, None)
            self._known[nonce] = (self._clock(), logged_out)
            while len(self._known) > self.max_sessions:
                self._known.popitem(last=False)


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
