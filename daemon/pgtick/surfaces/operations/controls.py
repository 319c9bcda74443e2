"""The operator's verbs on a job type at runtime: pause, resume, and limits that override the
config's until reset (docs/operations/runtime.md); and each limit's value with its source,
for ``status``, ``pgtick limits`` and the console.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgtick.config import Rate
from pgtick.core.controls import overridden
from pgtick.errors import UsageError
from pgtick.storage.store import ClaimType, JobTypeControl, LimitChange, RunStore
from pgtick.surfaces.operations.audit import MAX_ACTOR_CHARS, Actor

MAX_REASON_CHARS = 500
LIMIT_NAMES = ("max_running", "max_running_per_key", "rate", "rate_per_key")
SOURCE_CONFIG = "config"
SOURCE_RUNTIME = "runtime"


def _job_type(job_type: str) -> str:
    if not job_type or job_type.startswith("!") or len(job_type) > MAX_ACTOR_CHARS:
        raise UsageError(f"TYPE: not a job type name: {job_type!r}")
    return job_type


def pause_job_type(store: RunStore, job_type: str, reason: str | None, actor: Actor) -> bool:
    """Pause ``job_type`` on every daemon (its runs stay queued); False: it was paused."""
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise UsageError(f"--reason: at most {MAX_REASON_CHARS} characters")
    return store.pause_job_type(_job_type(job_type), reason or None, actor.name, actor.via)


def resume_job_type(store: RunStore, job_type: str, actor: Actor) -> bool:
    """Resume ``job_type``; False: it was not paused."""
    return store.resume_job_type(_job_type(job_type), actor.name, actor.via)


def set_limits(store: RunStore, job_type: str, change: LimitChange, actor: Actor) -> None:
    """Override the limits ``change`` names, fleet-wide from every daemon's next claim."""
    if change.empty:
        raise UsageError(
            "limits: give --max-running, --max-running-per-key, --rate, "
            "--rate-per-key or --reset (or none of them to show the limits)"
        )
    store.set_job_type_limits(_job_type(job_type), change, actor.name, actor.via)


def reset_limits(store: RunStore, job_type: str, actor: Actor) -> bool:
    """Back to the config's limits; False: none was overridden."""
    return store.reset_job_type_limits(_job_type(job_type), actor.name, actor.via)


@dataclass(frozen=True)
class Limit:
    """One limit of a job type as it holds now: its value in the config's words, and where
    it comes from (``config`` or ``runtime``)."""

    name: str
    value: str
    source: str


@dataclass(frozen=True)
class Limits:
    """A job type's limits in force, each with its source, and who changed them at runtime."""

    job_type: str
    limits: list[Limit]
    control: JobTypeControl | None


def _value(name: str, t: ClaimType) -> str | None:
    value = getattr(t, name)
    if value is None:
        return None
    return str(Rate(*value)) if name in ("rate", "rate_per_key") else str(value)


def limits_in_force(
    job_type: str, config_type: ClaimType | None, control: JobTypeControl | None
) -> Limits:
    """What holds for ``job_type``: each limit the config sets or an operator overrides."""
    base = config_type or ClaimType(job_type, 0.0, 0)
    found = []
    for name in LIMIT_NAMES:
        runtime = None if control is None else _value(name, overridden(base, control))
        configured = _value(name, base)
        if control is not None and getattr(control, name) is not None and runtime is not None:
            found.append(Limit(name, runtime, SOURCE_RUNTIME))
        elif configured is not None:
            found.append(Limit(name, configured, SOURCE_CONFIG))
    return Limits(job_type, found, control)


def effective_limits(
    config_types: Sequence[ClaimType], controls: Mapping[str, JobTypeControl]
) -> list[ClaimType]:
    """The limited job types as a claim now sees them: the config's with the runtime
    overrides, and the types limited at runtime only."""
    by_type = {t.job_type: overridden(t, controls.get(t.job_type)) for t in config_types}
    for job_type, control in controls.items():
        if job_type not in by_type and control.overrides:
            by_type[job_type] = overridden(ClaimType(job_type, 0.0, 0), control)
    return [t for _, t in sorted(by_type.items()) if t.limited]


def describe(limits: Limits) -> str:
    """``max_running 1 (runtime), rate 60/second (config)``; '' without limits."""
    return ", ".join(f"{lim.name} {lim.value} ({lim.source})" for lim in limits.limits)


def controls_for(store: RunStore) -> dict[str, JobTypeControl]:
    """Every job type an operator paused or limited."""
    return store.job_type_controls()


def paused_types(controls: Mapping[str, JobTypeControl]) -> list[JobTypeControl]:
    return [c for _, c in sorted(controls.items()) if c.paused]
