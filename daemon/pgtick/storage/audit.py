"""The audit log (``audit_log``, migration 0019): every operator action with who, what, when,
its arguments and the runs it affected. Rows are only appended (``record_action``, SECURITY
DEFINER) and dropped by retention (``prune_audit_log``); nothing updates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from pgtick.storage.base import StoreBase

# run_ids kept per row (runs_affected counts them all).
MAX_AUDITED_RUN_IDS = 1000
AUDIT_PRUNE_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit log."""

    id: int
    at: datetime
    actor: str
    via: str  # cli | console | sql
    db_role: str
    action: str
    target: str | None
    args: Mapping[str, Any]
    runs_affected: int | None
    run_ids: list[int] | None


class AuditQueries(StoreBase):
    """The audit aggregate (``audit_log``)."""

    def record_action(
        self,
        action: str,
        target: str | None,
        args: Mapping[str, Any],
        *,
        actor: str,
        via: str,
        run_ids: Sequence[int] | None = None,
        runs_affected: int | None = None,
    ) -> int:
        """Append one action; its id."""
        ids = None if run_ids is None else list(run_ids)[:MAX_AUDITED_RUN_IDS]
        if runs_affected is None and run_ids is not None:
            runs_affected = len(run_ids)
        params = {
            "action": action,
            "target": target,
            "args": Jsonb(dict(args)),
            "actor": actor,
            "via": via,
            "runs_affected": runs_affected,
            "run_ids": ids,
        }
        return int(self._all("audit", "record_action", params)[0][0])

    def audit_log(self, since: datetime | None, limit: int) -> list[AuditEntry]:
        """The actions since ``since`` (None: all), newest first, at most ``limit``."""
        rows = self._all("audit", "audit_log", {"since": since, "limit": limit})
        return [AuditEntry(*row) for row in rows]

    def prune_audit_log(self, older_than_seconds: float) -> int:
        """Delete the actions older than the cutoff, in batches; how many went."""
        total = 0
        while True:
            params = {"older_than_seconds": older_than_seconds, "batch": AUDIT_PRUNE_BATCH_ROWS}
            gone = int(self._all("retention", "prune_audit_log", params)[0][0])
            total += gone
            if gone < AUDIT_PRUNE_BATCH_ROWS:
                return total
