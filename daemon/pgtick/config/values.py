"""Config values: durations (``"1h30m"`` <-> seconds), the checkers that turn one raw TOML value
into a typed one or refuse it, and how a value or a DSN is shown in a message or a log.

Every checker takes the full key and the raw value and raises one ``ConfigError`` line that
starts with the key; these messages are pinned by tests (tests/unit/test_config*.py). Pure.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from datetime import date, time
from typing import Any, NamedTuple

from pgtick.errors import ConfigError

MINUTE_SECONDS = 60.0
HOUR_SECONDS = 3600.0
DAY_SECONDS = 86400.0
MAX_DURATION_SECONDS = 100 * 365 * DAY_SECONDS  # beyond this a duration is a typo, not a plan
MAX_INT4 = 2**31 - 1  # counters that end up in integer columns
# Job type and schedule names: the runs table refuses longer job types (runs_job_type_length).
MAX_NAME_CHARS = 200

# -- Durations ------------------------------------------------------------------------------------

_UNIT_SECONDS = {"d": DAY_SECONDS, "h": HOUR_SECONDS, "m": MINUTE_SECONDS, "s": 1.0, "ms": 0.001}
_UNIT_ORDER = list(_UNIT_SECONDS)  # largest first: "1h30m" yes, "30m1h" no
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)", re.ASCII)
_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*", re.ASCII)
_DURATION_HINT = 'a duration like "90s", "5m", "2h", "7d", "250ms" or "1h30m"'


def parse_duration(text: str | int | float, key: str) -> float:
    """Seconds from ``"90s"``, ``"1h30m"``, ``"250ms"`` or a bare number of seconds."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {show(text)}")
    if isinstance(text, str):
        seconds = _parse_duration_text(text, key)
    else:
        seconds = float(text)
        if not math.isfinite(seconds):
            raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {show(text)}")
    if seconds < 0:
        raise ConfigError(f"{key}: must not be negative, got {show(text)}")
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"{key}: must be at most 100 years, got {show(text)}")
    return seconds


def _parse_duration_text(text: str, key: str) -> float:
    if _NUMBER.fullmatch(text):
        return float(text)
    if text.strip().startswith("-"):
        raise ConfigError(f"{key}: must not be negative, got {show(text)}")
    total, pos, last_rank = 0.0, 0, -1
    for match in _DURATION_PART.finditer(text):
        rank = _UNIT_ORDER.index(match.group(2))
        if match.start() != pos or rank <= last_rank:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos, last_rank = match.end(), rank
    if last_rank < 0 or text[pos:].strip():
        raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {show(text)}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest ``parse_duration`` spelling of ``seconds`` >= 0 ("1h30m"), for messages."""
    millis = round(seconds * 1000)
    if not math.isclose(millis, seconds * 1000, abs_tol=1e-6):
        return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"
    if millis == 0:
        return "0s"
    parts = []
    for unit in _UNIT_ORDER:
        size = round(_UNIT_SECONDS[unit] * 1000)
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


# -- Value checkers: each takes the full key and the raw value ------------------------------------

Checker = Callable[[str, Any], Any]

_NAME = re.compile(r"[A-Za-z0-9_.:-]+", re.ASCII)
_NAME_TEXT = "[A-Za-z0-9_.:-]+"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}", re.ASCII)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?", re.ASCII)


def show(value: object) -> str:
    """A value as the user wrote it in TOML, short enough for a one-line message."""
    if isinstance(value, str):
        shown = json.dumps(value, ensure_ascii=False)
        return shown if len(shown) <= 60 else shown[:56] + '..."'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, date | time):
        return f"a date/time ({value.isoformat()})"
    return "null" if value is None else type(value).__name__


def string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {show(value)}")
    return value


def flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {show(value)}")
    return value


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "kb": 1000, "mib": 1024**2, "mb": 1000**2}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def byte_size(low: int, high: int) -> Checker:
    """A size in bytes: an integer, or a string such as "64KiB", "1MiB", "500kB", "4096B"."""

    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f'{key}: expected a size such as "64KiB", got {show(value)}')
        if isinstance(value, int):
            size = value
        else:
            match = _SIZE.match(value)
            unit = match.group(2).lower() if match else ""
            if match is None or unit not in _SIZE_UNITS:
                raise ConfigError(
                    f'{key}: expected a size such as "64KiB" (B, kB, KiB, MB, MiB), '
                    f"got {show(value)}"
                )
            size = int(match.group(1)) * _SIZE_UNITS[unit]
        if size < low or size > high:
            raise ConfigError(f"{key}: must be between {low} and {high} bytes, got {show(value)}")
        return size

    return parse


def optional_string(key: str, value: Any) -> str:
    """A string that may be empty ("" means "not set")."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {show(value)}")
    return value


def optional_path(key: str, value: Any) -> str:
    """A file path, or "" for none."""
    if not isinstance(value, str):
        raise ConfigError(f'{key}: expected a file path or "" (none), got {show(value)}')
    return value


def integer(low: int, high: int = MAX_INT4, why: str = "") -> Checker:
    wanted = (
        "a positive integer" if low > 0 else "a non-negative integer" if low == 0 else "an integer"
    )
    because = f" ({why})" if why else ""

    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or (value < low and low >= 0):
            raise ConfigError(f"{key}: expected {wanted}, got {show(value)}")
        if value < low:
            raise ConfigError(f"{key}: must be at least {low}, got {show(value)}{because}")
        if value > high:
            raise ConfigError(f"{key}: must be at most {high}, got {show(value)}{because}")
        return value

    return parse


AUTO = "auto"


def process_count(high: int) -> Checker:
    """An integer 1..high, or "auto" (kept as such: it is counted on the machine that runs)."""

    def parse(key: str, value: Any) -> int | str:
        if value == AUTO:
            return AUTO
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ConfigError(f'{key}: expected an integer 1-{high} or "auto", got {show(value)}')
        return value

    return parse


def cpus_available(cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self") -> int:
    """The CPUs this process may use: its affinity (a cgroup's cpuset, taskset), lowered to its
    cgroup v2 CPU quota rounded up (systemd's ``CPUQuota=150%`` gives 2), so that ``"auto"``
    starts no more interpreters than the unit may keep busy."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_self)
    return max(1, min(cpus, quota)) if quota is not None else cpus


def cgroup_cpu_quota(cgroup_root: str, proc_self: str) -> int | None:
    """The tightest ``cpu.max`` quota (in CPUs, rounded up) of this process's cgroup v2 and its
    parents, or None when there is none (no limit, cgroup v1, not readable)."""
    try:
        with open(os.path.join(proc_self, "cgroup"), encoding="utf-8") as lines:
            unified = [line for line in lines if line.startswith("0::")]
    except OSError:
        return None
    if not unified:
        return None
    quotas: list[int] = []
    path = unified[0][3:].strip().strip("/")
    parts = path.split("/") if path else []
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(cgroup_root, *parts[:depth], "cpu.max"), encoding="utf-8") as f:
                limit, _, period = f.read().partition(" ")
        except OSError:
            continue
        if limit.strip().isdigit() and period.strip().isdigit() and int(period) > 0:
            quotas.append(math.ceil(int(limit) / int(period)))
    return min(quotas) if quotas else None


class Rate(NamedTuple):
    """A rate limit: at most ``limit`` starts in any window of ``window_seconds``."""

    limit: int
    window_seconds: float

    def __str__(self) -> str:
        unit = {1.0: "second", MINUTE_SECONDS: "minute", HOUR_SECONDS: "hour"}
        return f"{self.limit}/{unit[self.window_seconds]}"


_RATE_UNITS = {"second": 1.0, "minute": MINUTE_SECONDS, "hour": HOUR_SECONDS}
_RATE = re.compile(r"(\d+)\s*/\s*([a-z]+)", re.ASCII)


def rate(key: str, value: Any) -> Rate:
    """``"N/second"``, ``"N/minute"`` or ``"N/hour"`` with N >= 1."""
    match = _RATE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f'{key}: expected "N/second", "N/minute" or "N/hour", got {show(value)}')
    limit, unit = int(match[1]), match[2]
    if unit not in _RATE_UNITS:
        raise ConfigError(f"{key}: unknown unit {unit!r} (second, minute or hour)")
    if not 1 <= limit <= MAX_INT4:
        raise ConfigError(f"{key}: the number of starts must be at least 1, got {show(value)}")
    return Rate(limit, _RATE_UNITS[unit])


_FIELD = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def payload_field(key: str, value: Any) -> tuple[str, ...]:
    """``"payload.FIELD"`` (or ``"payload.a.b"`` for a nested object): the path of the field."""
    parts = value.split(".") if isinstance(value, str) else []
    if len(parts) < 2 or parts[0] != "payload" or not all(_FIELD.fullmatch(p) for p in parts[1:]):
        raise ConfigError(
            f'{key}: expected "payload.FIELD" (a field of the run\'s payload), got {show(value)}'
        )
    return tuple(parts[1:])


def choice(choices: tuple[str, ...]) -> Checker:
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(choices)} (got {show(value)})")
        return value

    return parse


def duration(
    *,
    allow_zero: bool = False,
    low: float | None = None,
    high: float | None = None,
    why: str = "",
) -> Checker:
    """A duration, optionally within [low, high]; ``why`` says what the bound protects."""
    because = f" ({why})" if why else ""

    def parse(key: str, value: Any) -> float:
        seconds = parse_duration(value, key)
        if seconds == 0 and not allow_zero:
            raise ConfigError(f"{key}: must be longer than 0s, got {show(value)}")
        if low is not None and seconds < low:
            raise ConfigError(
                f"{key}: must be at least {format_duration(low)}, got {show(value)}{because}"
            )
        if high is not None and seconds > high:
            raise ConfigError(
                f"{key}: must be at most {format_duration(high)}, got {show(value)}{because}"
            )
        return seconds

    return parse


def fraction(key: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < 1  # also refuses nan
    ):
        raise ConfigError(f"{key}: expected a number in [0, 1), got {show(value)}")
    return float(value)


def name(key: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ConfigError(f"{key}: name must match {_NAME_TEXT}, got {show(value)}")
    if len(value) > MAX_NAME_CHARS:
        raise ConfigError(
            f"{key}: name must be at most {MAX_NAME_CHARS} characters, got {len(value)}"
        )
    return value


def job_type_name(key: str, value: str) -> str:
    """A job type named outside the config file (``pgtick enqueue TYPE``), checked like the
    file's names: a daemon could never declare a handler for any other name."""
    return name(key, value)


def job_type_ref(key: str, value: Any) -> str:
    return name(key, string(key, value))


def schema(key: str, value: Any) -> str:
    schema = string(key, value)
    if not _IDENTIFIER.fullmatch(schema):
        raise ConfigError(
            f"{key}: expected a plain identifier (letters, digits, underscore; not starting with "
            f"a digit; at most 63 characters), got {show(schema)}"
        )
    if schema.lower().startswith("pg_"):
        raise ConfigError(f"{key}: the pg_ prefix is reserved by PostgreSQL, got {show(schema)}")
    return schema


def schema_name(key: str, value: str) -> str:
    """A schema name given outside the config file (``--schema``), checked like the file's."""
    return schema(key, value)


def _dotted(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def imports(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key}: expected an array of module names, got {show(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not _dotted(item):
            raise ConfigError(
                f'{key}[{index}]: expected a dotted module name (e.g. "myapp.jobs"), '
                f"got {show(item)}"
            )
    return tuple(value)


def host_names(key: str, value: Any) -> tuple[str, ...]:
    """Host names as a ``Host`` header carries them (no port), lower-cased."""
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key}: expected an array of host names, got {show(value)}")
    names = []
    for index, item in enumerate(value):
        ok = isinstance(item, str) and item and ":" not in item and "/" not in item
        if not ok or not all(part.isascii() and part.isprintable() for part in item):
            raise ConfigError(
                f'{key}[{index}]: expected a host name without a port (e.g. "pgtick.internal"), '
                f"got {show(item)}"
            )
        names.append(item.lower())
    return tuple(names)


def handler(key: str, value: Any) -> str:
    module, colon, function = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not colon or not _dotted(module) or not _dotted(function):
        raise ConfigError(
            f'{key}: expected "module:function" (e.g. "myapp.jobs:send_invoice_emails"), '
            f"got {show(value)}"
        )
    return str(value)


def command(key: str, value: Any) -> tuple[str, ...]:
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(arg, str) and "\0" not in arg for arg in value)
        or not value[0]
    ):
        raise ConfigError(
            f'{key}: expected a non-empty array of strings (e.g. ["/usr/local/bin/cleanup", '
            f'"--days", "30"]), got {show(value)}'
        )
    return tuple(value)


def _json_value(key: str, value: Any) -> Any:
    """A payload value as it will look in jsonb; TOML-only types are refused, not mangled."""
    if isinstance(value, Mapping):
        for name in value:
            if "\x00" in name:
                raise ConfigError(f"{key}: a key with a NUL character, which jsonb refuses")
        return {name: _json_value(f"{key}.{name}", item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(f"{key}[{index}]", item) for index, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: JSON has no {show(value)}; use a string or a finite number")
    if isinstance(value, date | time):
        raise ConfigError(f"{key}: JSON has no dates or times, quote it: got {show(value)}")
    if value is None or not isinstance(value, str | int | float):
        raise ConfigError(f"{key}: expected a JSON-compatible value, got {show(value)}")
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError(f"{key}: a NUL character (\\u0000), which jsonb refuses")
    return value


def payload(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table like {{ days = 30 }}, got {show(value)}")
    payload: dict[str, Any] = _json_value(key, value)
    return payload


def chain_steps(key: str, value: Any) -> list[dict[str, Any]]:
    """``on_success`` / ``on_dead``: a job type name, a table with job_type, or a list of
    them (scheduling/steps.py); kept in the chain's normal form, a list of steps."""
    from pgtick.scheduling import steps

    try:
        follow = steps.normalize(_json_value(key, value), where=key.rsplit(".", 1)[0])
    except steps.StepError as exc:
        raise ConfigError(str(exc)) from None
    assert follow is not None
    return follow["on_success"]


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises ValueError with the reason."""
    host, colon, port_text = listen.rpartition(":")
    if not colon or not host:
        raise ValueError('expected "host:port" like "127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464"')
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port_text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
        return host[1:-1], int(port_text)
    if ":" in host:
        raise ValueError(f'IPv6 addresses go in brackets, e.g. "[{host}]:{port_text}"')
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a host name or IPv4 address")
    return host, int(port_text)


def listen(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f'{key}: expected "host:port" or "" (disabled), got {show(value)}')
    if value:
        try:
            split_listen(value)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc} (got {show(value)})") from None
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` can only be reached from this machine (``localhost``, 127.0.0.0/8,
    ``::1``); a name other than ``localhost`` may resolve anywhere, so it is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
