"""The operator's verbs as plain functions over a ``RunStore``, returning dataclasses: the
command line prints them, the web console renders them. No printing, no argument parsing.

- ``output``: what a run printed, and following a running attempt (``pgtick logs``);
- ``runs``: list, show, enqueue, retry and cancel (their state rules live there, nowhere
  else), prune;
- ``bulk``: retry or cancel the runs matching a filter, confirmed by their count and ids;
- ``schedules``: list, pause, resume, trigger, next occurrences, backfill;
- ``runtime_schedules``: schedules the database owns (add, edit, remove);
- ``audit``: who acts (the CLI's user@host, the console's session) and the audit log;
- ``controls``: a job type paused, resumed, or limited at runtime, and each limit's source;
- ``status``: workers, queues and schedules with the problems among them; the console overview;
- ``job_types``: one job type's page (its queue, running and waiting runs, schedules);
- ``rollup``: a job type's last 7 days by the hour, from the rollups the daemons keep;
- ``charts``: the overview's queue depth per job type over the last hour (its SQL in
  ``charts.sql`` beside it);
- ``batches``: create, add to, close and show batches (docs/composition.md);
- ``setup``: the one-connection store of a command, migrations, grants, ``check``.

Callers use this package's names (``operations.list_runs``); the modules are its rooms. May
import ``pgtick.core``, ``pgtick.config``, ``pgtick.storage``, ``pgtick.scheduling`` and
``pgtick.errors``.
"""

from __future__ import annotations

from pgtick.scheduling.words import cron_in_words
from pgtick.storage.store import STATUSES, TERMINAL_STATUSES
from pgtick.surfaces.operations.audit import Actor, audit_entries, cli_actor, record
from pgtick.surfaces.operations.batches import (
    add_members,
    callback_steps,
    close_batch,
    create_batch,
    members_from_lines,
    show_batch,
)
from pgtick.surfaces.operations.bulk import (
    MAX_FILTER_BULK_RUNS,
    FilterBulk,
    FilterBulkDone,
    FilterBulkPlan,
    filter_bulk,
    plan_filter_bulk,
    run_filter_bulk,
)
from pgtick.surfaces.operations.charts import queue_depth_per_type
from pgtick.surfaces.operations.controls import (
    LIMIT_NAMES,
    Limit,
    Limits,
    controls_for,
    describe,
    effective_limits,
    limits_in_force,
    pause_job_type,
    paused_types,
    reset_limits,
    resume_job_type,
    set_limits,
)
from pgtick.surfaces.operations.flow import describe_limits, flow_limits
from pgtick.surfaces.operations.job_types import (
    JobTypeView,
    check_job_type,
    job_type_view,
    limit_change,
)
from pgtick.surfaces.operations.output import (
    OUTPUT_STREAMS,
    SHOW_TAIL_LINES,
    OutputLine,
    follow_output,
    output_tail,
    run_output,
)
from pgtick.surfaces.operations.rollup import HISTORY_HOURS, TypeHistory, type_history
from pgtick.surfaces.operations.runs import (
    BULK_BATCH_ROWS,
    CANCEL,
    CANCELLABLE,
    CONFIRM_ABOVE_ROWS,
    DEFAULT_PAGE_SIZE,
    MAX_KEY_BYTES,
    MAX_PAGE_SIZE,
    MAX_PAYLOAD_BYTES,
    MAX_RUN_ID,
    RETRY,
    RETRYABLE,
    Action,
    Bulk,
    Changed,
    Pruned,
    RunDetail,
    RunPage,
    When,
    change_runs,
    check_new_run,
    check_statuses,
    declares_job_type,
    enqueue,
    list_runs,
    parse_run_id,
    plan_bulk,
    prune,
    run_bulk,
    show_run,
)
from pgtick.surfaces.operations.runtime_schedules import (
    add_schedule,
    edit_schedule,
    remove_schedule,
)
from pgtick.surfaces.operations.schedules import (
    MAX_OCCURRENCES,
    PAUSED_REASON_INVALID,
    PAUSED_REASON_REMOVED,
    Backfilled,
    ScheduleLine,
    ScheduleView,
    Upcoming,
    backfill,
    backfill_window,
    list_schedules,
    pause_schedule,
    resume_schedule,
    schedule_views,
    trigger_schedule,
    upcoming,
)
from pgtick.surfaces.operations.setup import (
    check_database,
    grants_sql,
    handler_summary,
    migrate,
    open_store,
)
from pgtick.surfaces.operations.status import (
    DEFAULT_HORIZON_THRESHOLD_SECONDS,
    STALE_AFTER_HEARTBEATS,
    STATUS_TIMEOUT_SECONDS,
    THROUGHPUT_MINUTES,
    Horizon,
    JobTypeStatus,
    Overview,
    ScheduleStatus,
    Status,
    WorkerStatus,
    describe_holder,
    overview,
    status,
)

__all__ = [
    "BULK_BATCH_ROWS",
    "CANCEL",
    "CANCELLABLE",
    "CONFIRM_ABOVE_ROWS",
    "DEFAULT_HORIZON_THRESHOLD_SECONDS",
    "DEFAULT_PAGE_SIZE",
    "HISTORY_HOURS",
    "LIMIT_NAMES",
    "MAX_FILTER_BULK_RUNS",
    "MAX_KEY_BYTES",
    "MAX_OCCURRENCES",
    "MAX_PAGE_SIZE",
    "MAX_PAYLOAD_BYTES",
    "MAX_RUN_ID",
    "OUTPUT_STREAMS",
    "PAUSED_REASON_INVALID",
    "PAUSED_REASON_REMOVED",
    "RETRY",
    "RETRYABLE",
    "SHOW_TAIL_LINES",
    "STALE_AFTER_HEARTBEATS",
    "STATUSES",
    "STATUS_TIMEOUT_SECONDS",
    "TERMINAL_STATUSES",
    "THROUGHPUT_MINUTES",
    "Action",
    "Actor",
    "Backfilled",
    "Bulk",
    "Changed",
    "FilterBulk",
    "FilterBulkDone",
    "FilterBulkPlan",
    "Horizon",
    "JobTypeStatus",
    "JobTypeView",
    "Limit",
    "Limits",
    "OutputLine",
    "Overview",
    "Pruned",
    "RunDetail",
    "RunPage",
    "ScheduleLine",
    "ScheduleStatus",
    "ScheduleView",
    "Status",
    "TypeHistory",
    "Upcoming",
    "When",
    "WorkerStatus",
    "add_members",
    "add_schedule",
    "audit_entries",
    "backfill",
    "backfill_window",
    "callback_steps",
    "change_runs",
    "check_database",
    "check_job_type",
    "check_new_run",
    "check_statuses",
    "cli_actor",
    "close_batch",
    "controls_for",
    "create_batch",
    "cron_in_words",
    "declares_job_type",
    "describe",
    "describe_holder",
    "describe_limits",
    "edit_schedule",
    "effective_limits",
    "enqueue",
    "filter_bulk",
    "flow_limits",
    "follow_output",
    "grants_sql",
    "handler_summary",
    "job_type_view",
    "limit_change",
    "limits_in_force",
    "list_runs",
    "list_schedules",
    "members_from_lines",
    "migrate",
    "open_store",
    "output_tail",
    "overview",
    "parse_run_id",
    "pause_job_type",
    "pause_schedule",
    "paused_types",
    "plan_bulk",
    "plan_filter_bulk",
    "prune",
    "queue_depth_per_type",
    "record",
    "remove_schedule",
    "reset_limits",
    "resume_job_type",
    "resume_schedule",
    "run_bulk",
    "run_filter_bulk",
    "run_output",
    "schedule_views",
    "set_limits",
    "show_batch",
    "show_run",
    "status",
    "trigger_schedule",
    "type_history",
    "upcoming",
]
