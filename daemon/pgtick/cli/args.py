"""Argument text -> values: instants and durations (``--since``, ``--run-at``, ``--from``) and
the ``--payload`` JSON, each refused in one line that names the option.
"""

from __future__ import annotations

import json
import math
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from pgtick import config as config_mod
from pgtick.errors import ConfigError, UsageError
from pgtick.observability import tracecontext
from pgtick.surfaces import operations


def trace_context(option: str | None) -> str | None:
    """The trace a run is enqueued in: ``--traceparent`` (refused if not a W3C traceparent),
    else ``$TRACEPARENT`` (ignored, with a warning, if not one: W3C's rule for a receiver)."""
    if option is not None:
        value = tracecontext.valid(option)
        if value is None:
            raise UsageError(
                f"--traceparent: not a W3C traceparent: {option!r} "
                "(00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)"
            )
        return value
    env = os.environ.get(tracecontext.TRACEPARENT_ENV, "").strip()
    if not env:
        return None
    value = tracecontext.valid(env)
    if value is None:
        print(
            f"pgtick: warning: ${tracecontext.TRACEPARENT_ENV} is not a W3C traceparent "
            f"({env[:80]!r}); enqueued outside any trace",
            file=sys.stderr,
        )
    return value


def _instant(text: str) -> datetime | None:
    """An ISO 8601 instant, without an offset taken as UTC; None if the text is not one."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _readable(value: datetime, text: str, option: str) -> datetime:
    """``value`` if it lies within years 1 to 9999 in UTC: stored outside them, it could not
    be read back, and every read of its run would fail."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise UsageError(f"{option}: out of range: {text!r} (years 1 to 9999 in UTC)") from None
    return value


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 instant; without an offset it is taken as UTC."""
    value = _instant(text)
    if value is None:
        raise UsageError(
            f"{option}: not an ISO 8601 time: {text!r} (e.g. 2026-11-22T09:00:00+01:00)"
        )
    return _readable(value, text, option)


def parse_when(text: str, option: str) -> datetime | timedelta:
    """The one parser of time arguments: an ISO 8601 instant (no offset = UTC) or a duration,
    which the option reads as "that long ago" (--since, --older-than) or "that long from now"
    (--run-at, --in)."""
    try:
        return timedelta(seconds=config_mod.parse_duration(text, option))
    except ConfigError:
        pass
    value = _instant(text)
    if value is None:
        raise UsageError(
            f"{option}: not an ISO 8601 time or a duration: {text!r} (e.g. "
            "2026-11-22T09:00:00+01:00, no offset = UTC; or 90m, 2h, 7d)"
        )
    return _readable(value, text, option)


def parse_since(text: str | None, option: str) -> datetime | timedelta | None:
    """An optional "that long ago" argument (None when not given)."""
    return None if text is None else parse_when(text, option)


def resolve_when(when: datetime | timedelta, now: datetime, *, ahead: bool) -> datetime:
    """An instant from ``parse_when``: a duration counts from ``now``, forward when ``ahead``."""
    if isinstance(when, datetime):
        return when
    try:
        return now + when if ahead else now - when
    except OverflowError:
        raise UsageError(f"duration out of range: {when}") from None


def _no_constant(name: str) -> NoReturn:
    raise UsageError(f"--payload: JSON has no {name} (PostgreSQL's jsonb refuses it)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UsageError(f"--payload: the number {text} is beyond what a float holds")
    return value


def _unstorable(value: Any) -> str | None:
    """Why jsonb would refuse a string in ``value`` (None: it takes them all). A walk, not a
    recursion: a document nested deeper than Python's recursion limit is refused at parsing
    already, but a walk makes no difference to what it takes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "a NUL character (\\u0000), which jsonb refuses"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "text that is not valid Unicode (a lone surrogate, or bytes not UTF-8)"
    return None


def parse_step(option: str, text: str | None) -> Any:
    """A --on-success / --on-dead argument as the config file writes it: a job type name, or
    JSON (a step object or a list); None stays None."""
    if text is None or not text.lstrip().startswith(("{", "[")):
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{option}: invalid JSON: {exc}") from None


def parse_chain(on_success: str | None, on_dead: str | None) -> dict[str, Any] | None:
    """--on-success / --on-dead: a job type name, or JSON (a step object or a list)."""
    from pgtick.scheduling import steps

    values = [parse_step("--on-success", on_success), parse_step("--on-dead", on_dead)]
    try:
        return steps.normalize(*values)
    except steps.StepError as exc:
        raise UsageError(str(exc)) from None


def parse_payload(text: str | None) -> dict[str, Any]:
    """A --payload argument (``-`` reads stdin) as a JSON object that jsonb will take."""
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read(operations.MAX_PAYLOAD_BYTES * 4 + 1)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > operations.MAX_PAYLOAD_BYTES:
        raise UsageError(
            f"--payload: {size} bytes, more than the {operations.MAX_PAYLOAD_BYTES // 1024} KiB"
            " (1 MiB) pgtick enqueue accepts: keep big data elsewhere and pass a reference"
        )
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload: invalid JSON: {exc}") from None
    except RecursionError:
        raise UsageError("--payload: nested too deep to be read") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UsageError(f"--payload: cannot be read: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--payload: must be a JSON object, got {type(value).__name__}")
    why = _unstorable(value)
    if why is not None:
        raise UsageError(f"--payload: {why}")
    return value
