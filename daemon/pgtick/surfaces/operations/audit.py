"""Who acts, and the record of what they did: every operator verb (pause, resume, limits,
schedules add/edit/remove/pause/resume/trigger/backfill, retry, cancel, prune) is written to
the audit log with the actor the CLI or the console names (``pgtick audit`` reads it). The
verbs that are the schema's own SQL functions (pause, resume, limits, runtime schedules)
record themselves in their transaction; the others are recorded here right after they
commit.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgtick.storage.store import AuditEntry, RunStore

MAX_ACTOR_CHARS = 200
VIA_CLI = "cli"
VIA_CONSOLE = "console"
DEFAULT_AUDIT_PAGE = 100


@dataclass(frozen=True)
class Actor:
    """Who does an operator action: a name (``alice@build-7`` for the CLI, the console
    session's) and through what (``cli``, ``console``)."""

    name: str
    via: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.name[:MAX_ACTOR_CHARS])


def cli_actor() -> Actor:
    """Who runs this command: ``user@host`` (the OS user; the database role is recorded by
    the database)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return Actor(f"{user}@{socket.gethostname()}", VIA_CLI)


def record(
    store: RunStore,
    actor: Actor | None,
    action: str,
    target: str | None,
    args: Mapping[str, Any] | None = None,
    run_ids: Sequence[int] | None = None,
    runs_affected: int | None = None,
) -> None:
    """Append the action to the audit log (nothing without an actor: a library call, a
    test)."""
    if actor is None:
        return
    store.record_action(
        action,
        target,
        args or {},
        actor=actor.name,
        via=actor.via,
        run_ids=run_ids,
        runs_affected=runs_affected,
    )


def audit_entries(store: RunStore, since: Any, limit: int = DEFAULT_AUDIT_PAGE) -> list[AuditEntry]:
    """The audit log since ``since`` (a database time; None: from the start), newest first."""
    return store.audit_log(since, limit)
