"""Passwords out of what is logged or printed: a DSN's, and any a database error quotes."""

from __future__ import annotations

import re

_URL_SCHEME = re.compile(r"^(postgres(?:ql)?://)", re.IGNORECASE)
_URL_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced by ``***``, in URL and key=value form, for logs."""
    scheme = _URL_SCHEME.match(dsn)
    if scheme is None:
        return _KV_PASSWORD.sub(r"\1***", dsn)
    rest = dsn[scheme.end() :]
    slash = rest.find("/")
    authority_end = len(rest) if slash < 0 else slash
    at = rest.rfind("@", 0, authority_end)  # the last "@": an unescaped one in a password
    if at >= 0 and ":" in rest[:at]:
        user = rest[: rest.index(":")]
        rest = f"{user}:***{rest[at:]}"
    return scheme.group(1) + _URL_QUERY_PASSWORD.sub(r"\1***", rest)


_URL_IN_TEXT = re.compile(r"postgres(?:ql)?://[^\s\"']*", re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` with the password of every DSN in it replaced by ``***``: libpq's errors
    about a DSN it cannot parse quote the DSN whole."""
    return _KV_PASSWORD.sub(r"\1***", _URL_IN_TEXT.sub(lambda m: redact_dsn(m.group(0)), text))
