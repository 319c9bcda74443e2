"""Chain steps (docs/composition.md, Chains): what a run names to enqueue when it ends.

Pure: the config loader, the Python API and the CLI check a step here before anything is
sent; the database checks the same rules again (``valid_follow``, migration 0025) for
enqueues from SQL. A step is ``{"job_type": ..., "payload": {...}, "max_attempts": N,
"priority": N, "concurrency_key": "...", "on_success": STEP | [STEP...], "on_dead": ...}``;
the normal form of a run's chain is ``{"on_success": [STEP...], "on_dead": [STEP...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

OUTCOMES = ("on_success", "on_dead")
STEP_KEYS = ("job_type", "payload", "max_attempts", "priority", "concurrency_key", *OUTCOMES)
MAX_CHAIN_DEPTH = 16  # nested steps under one run, and runs one after another in a chain
MAX_STEPS_PER_OUTCOME = 16
MAX_FOLLOW_BYTES = 64 * 1024


class StepError(ValueError):
    """A chain step refused; the message names where and why."""


def normalize(
    on_success: Any = None, on_dead: Any = None, *, where: str = "chain"
) -> dict[str, list[dict[str, Any]]] | None:
    """The chain's normal form (None: no steps), checked: raises StepError."""
    follow: dict[str, list[dict[str, Any]]] = {}
    for name, value in (("on_success", on_success), ("on_dead", on_dead)):
        if value is None:
            continue
        steps = _steps(value, f"{where}.{name}", 1)
        if steps:
            follow[name] = steps
    if not follow:
        return None
    size = len(json.dumps(follow, separators=(",", ":")).encode())
    if size > MAX_FOLLOW_BYTES:
        raise StepError(
            f"{where}: the chain's steps take {size} bytes of JSON, over the bound of "
            f"{MAX_FOLLOW_BYTES}"
        )
    return follow


def _steps(value: Any, where: str, depth: int) -> list[dict[str, Any]]:
    if depth > MAX_CHAIN_DEPTH:
        raise StepError(f"{where}: steps nested deeper than {MAX_CHAIN_DEPTH}")
    items = list(value) if isinstance(value, list | tuple) else [value]
    if len(items) > MAX_STEPS_PER_OUTCOME:
        raise StepError(f"{where}: {len(items)} steps, at most {MAX_STEPS_PER_OUTCOME}")
    return [_step(item, f"{where}[{i}]", depth) for i, item in enumerate(items)]


def _step(value: Any, where: str, depth: int) -> dict[str, Any]:
    if isinstance(value, str):
        value = {"job_type": value}
    if not isinstance(value, Mapping):
        raise StepError(f"{where}: expected a job type name or a table with job_type")
    unknown = sorted(set(value) - set(STEP_KEYS))
    if unknown:
        raise StepError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(STEP_KEYS)})")
    job_type = value.get("job_type")
    if not isinstance(job_type, str) or not 1 <= len(job_type) <= 200:
        raise StepError(f"{where}.job_type: expected a job type name of 1 to 200 characters")
    step: dict[str, Any] = {"job_type": job_type, **_options(value, where)}
    for name in OUTCOMES:
        if value.get(name) is not None:
            step[name] = _steps(value[name], f"{where}.{name}", depth + 1)
    return step


def _options(value: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A step's payload, max_attempts, priority and concurrency_key, checked."""
    out: dict[str, Any] = {}
    payload = value.get("payload")
    if payload is not None:
        if not isinstance(payload, Mapping):
            raise StepError(f"{where}.payload: expected an object")
        out["payload"] = dict(payload)
    for key in ("max_attempts", "priority"):
        n = value.get(key)
        if n is None:
            continue
        if not isinstance(n, int) or isinstance(n, bool):
            raise StepError(f"{where}.{key}: expected an integer")
        if key == "max_attempts" and n < 1:
            raise StepError(f"{where}.max_attempts: must be at least 1")
        out[key] = n
    key_value = value.get("concurrency_key")
    if key_value is not None:
        if not isinstance(key_value, str):
            raise StepError(f"{where}.concurrency_key: expected a string")
        out["concurrency_key"] = key_value
    return out


def job_types(follow: Mapping[str, Any] | None) -> Iterable[str]:
    """Every job type a chain's steps name, nested ones included."""
    for name in OUTCOMES:
        for step in (follow or {}).get(name, ()):
            yield step["job_type"]
            yield from job_types(step)


def find_cycle(chains: Mapping[str, Mapping[str, Any] | None]) -> list[str] | None:
    """A cycle among job types' chains ({type: its normal form}): a run of a type whose chain
    leads back to the type would chain forever. Returns the cycle's types, or None."""
    edges = {t: set(job_types(f)) for t, f in chains.items()}

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None
