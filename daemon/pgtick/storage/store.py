"""RunStore: one typed method per named query in ``sql/queries.sql``; the only caller of it.

Methods take and return plain values and frozen dataclasses; psycopg errors leave as
``DatabaseError`` (via ``db.wrap_errors``). The queries live with their aggregate (``runs``:
runs and attempts on the daemon's hot path; ``run_admin``: the operator's reads and actions
on them; ``schedules``; ``workers``; ``maintenance``: reaping, pruning and the metrics
reads; ``output``: job output; ``console``: the console's logouts; ``controls``: job types
paused and limited at runtime; ``audit``: the operators' actions; ``rollup``: runs ended
per job type and hour, for the charts), each a class over
``base.StoreBase``; ``RunStore`` is all of them on one pool, because a daemon's loops, a
command and a console page each hold one store and cross aggregates in one unit (a claim's
lease and its attempt; a schedule and the runs it materializes). This module is the storage
API the rest of pgtick imports: the store and the records it returns.
"""

from __future__ import annotations

from pgtick.storage.audit import AuditEntry, AuditQueries
from pgtick.storage.base import Pool
from pgtick.storage.batches import Batch, BatchQueries
from pgtick.storage.console import ConsoleQueries
from pgtick.storage.controls import ControlQueries, JobTypeControl, LimitChange
from pgtick.storage.maintenance import (
    HOLDER_ALIVE_SECONDS,
    LEASE_END_SLACK_SECONDS,
    PRUNE_BATCH_ROWS,
    PRUNE_BUSY_RETRIES,
    REAP_BATCH_ROWS,
    HorizonHolder,
    JobTypeStats,
    MaintenanceQueries,
    MetricsSnapshot,
    PartitionChange,
    QueueCounts,
    ReapedRun,
    ReapLook,
    ScheduleHealth,
    warm_metrics_connection,
)
from pgtick.storage.notify import Notifications, listening
from pgtick.storage.output import AttemptState, Chunk, OutputQueries, StoredChunk
from pgtick.storage.rollup import RollupBucket, RollupQueries, rollup_retention
from pgtick.storage.run_admin import Attempt, EffectKey, Run, RunAdminQueries, RunQuery, RunSummary
from pgtick.storage.run_values import (
    ACTIVE_STATUSES,
    STATUSES,
    TERMINAL_STATUSES,
    Beat,
    Claim,
    ClaimedRun,
    ClaimType,
    FailResult,
    Failure,
    FlowState,
    Lease,
    NewRun,
)
from pgtick.storage.runs import RunQueries, enqueue_on
from pgtick.storage.schedules import (
    Occurrence,
    ScheduleDef,
    ScheduleListing,
    ScheduleQueries,
    ScheduleRef,
    ScheduleRow,
    ScheduleState,
)
from pgtick.storage.workers import WorkerInfo, WorkerQueries, WorkerRow


class RunStore(
    RunQueries,
    BatchQueries,
    RunAdminQueries,
    ScheduleQueries,
    WorkerQueries,
    MaintenanceQueries,
    OutputQueries,
    ConsoleQueries,
    ControlQueries,
    AuditQueries,
    RollupQueries,
):
    """Typed access to the pgtick schema through a connection pool."""


__all__ = [
    "ACTIVE_STATUSES",
    "HOLDER_ALIVE_SECONDS",
    "LEASE_END_SLACK_SECONDS",
    "PRUNE_BATCH_ROWS",
    "PRUNE_BUSY_RETRIES",
    "REAP_BATCH_ROWS",
    "STATUSES",
    "TERMINAL_STATUSES",
    "Attempt",
    "AttemptState",
    "AuditEntry",
    "Batch",
    "Beat",
    "Chunk",
    "Claim",
    "ClaimType",
    "ClaimedRun",
    "EffectKey",
    "FailResult",
    "Failure",
    "FlowState",
    "HorizonHolder",
    "JobTypeControl",
    "JobTypeStats",
    "Lease",
    "LimitChange",
    "MetricsSnapshot",
    "NewRun",
    "Notifications",
    "Occurrence",
    "PartitionChange",
    "Pool",
    "QueueCounts",
    "ReapLook",
    "ReapedRun",
    "RollupBucket",
    "Run",
    "RunQuery",
    "RunStore",
    "RunSummary",
    "ScheduleDef",
    "ScheduleHealth",
    "ScheduleListing",
    "ScheduleRef",
    "ScheduleRow",
    "ScheduleState",
    "StoredChunk",
    "WorkerInfo",
    "WorkerRow",
    "enqueue_on",
    "listening",
    "rollup_retention",
    "warm_metrics_connection",
]
