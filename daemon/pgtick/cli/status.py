"""The ``status`` verb: workers, queues, schedules and who holds the MVCC horizon on one
screen, as text or as a JSON document (its fields are the CLI's contract, docs/cli.md); exit 5
when something needs attention.
"""

from __future__ import annotations

import argparse
from datetime import UTC
from typing import Any

from pgtick import config as config_mod
from pgtick.cli import context
from pgtick.cli.exits import EXIT_ATTENTION, EXIT_OK
from pgtick.cli.render import (
    age_text,
    cut,
    in_zone,
    iso,
    local_short,
    one_line,
    print_json,
    print_table,
    utc_cell,
)
from pgtick.surfaces import operations


def cmd_status(args: argparse.Namespace) -> int:
    threshold = config_mod.parse_duration(args.horizon_threshold, "--horizon-threshold")
    cfg = context.begin(args)
    st = context.call(
        args,
        cfg,
        lambda store: operations.status(
            store,
            heartbeat_seconds=cfg.worker.heartbeat_seconds,
            tick_interval_seconds=cfg.ticker.interval_seconds,
            horizon_threshold_seconds=threshold,
            limits=operations.flow_limits(cfg),
        ),
    )
    if args.json:
        print_json(status_fields(st))
    else:
        print_status(st)
    return EXIT_OK if st.healthy else EXIT_ATTENTION


# A holder younger than this is a transaction at work, not one holding vacuum back.
HORIZON_MOVING_SECONDS = 1.0


def _horizon_fields(h: operations.Horizon) -> dict[str, Any]:
    holder = h.holder
    return {
        "holder": None
        if holder is None
        else {
            "kind": holder.kind,
            "pid": int(holder.ident) if holder.kind == "session" else None,
            "slot": holder.ident if holder.kind == "slot" else None,
            "gid": holder.ident if holder.kind == "prepared" else None,
            "user": holder.user,
            "application_name": holder.application if holder.kind == "session" else None,
            "client_addr": holder.client,
            "state": holder.state,
            "backend_type": holder.backend_type,
            "age_seconds": holder.age_seconds,
            "age_transactions": holder.xid_age,
        },
        "threshold_seconds": h.threshold_seconds,
        "sees_all_sessions": h.sees_all_sessions,
    }


def _limit_fields(t: operations.JobTypeStatus) -> dict[str, Any] | None:
    """Each limit in force: its value and source (config, or runtime)."""
    if t.in_force is None or not t.in_force.limits:
        return None
    return {lim.name: {"value": lim.value, "source": lim.source} for lim in t.in_force.limits}


def status_fields(st: operations.Status) -> dict[str, Any]:
    return {
        "healthy": st.healthy,
        "problems": st.problems,
        "notes": st.notes,
        "horizon": _horizon_fields(st.horizon),
        "db_now": iso(st.db_now),
        "stale_after_seconds": st.stale_after_seconds,
        "paused_job_types": [
            {
                "job_type": c.job_type,
                "paused_at": iso(c.paused_at),
                "paused_by": c.paused_by,
                "reason": c.paused_reason,
            }
            for c in st.paused
        ],
        "workers": [
            {
                "id": w.worker.id,
                "host": w.worker.hostname,
                "pid": w.worker.pid,
                "version": w.worker.version,
                "threads": w.worker.threads,
                "busy": w.worker.busy,
                "job_types": list(w.worker.job_types),
                "started_at": iso(w.worker.started_at),
                "heartbeat_age_seconds": w.worker.heartbeat_age_seconds,
                "stale": w.stale,
            }
            for w in st.workers
        ],
        "job_types": [
            {
                "job_type": t.stats.job_type,
                "due": t.stats.due,
                "oldest_due_seconds": t.stats.oldest_due_seconds,
                "scheduled": t.stats.scheduled,
                "running": t.stats.running,
                "stuck": t.stats.stuck,
                "awaiting_retry": t.stats.awaiting_retry,
                "dead_24h": t.stats.dead_recent,
                "live_workers": t.live_workers,
                "unserved": t.unserved,
                "limits": t.limits_text or None,
                "limit_sources": _limit_fields(t),
                "paused": t.paused,
                "waiting_concurrency": t.flow.waiting_concurrency if t.flow else 0,
                "waiting_rate": t.flow.waiting_rate if t.flow else 0,
            }
            for t in st.job_types
        ],
        "schedules": [
            {
                "name": s.state.name,
                "job_type": s.state.job_type,
                "cron": s.state.cron,
                "timezone": s.state.timezone,
                "next_at": iso(s.next_at),
                "next_at_local": None
                if s.next_at is None
                else in_zone(s.next_at, s.state.timezone) or None,
                "last_success_at": iso(s.last_success_at),
                "overdue": s.overdue,
                "paused": s.state.paused,
                "paused_reason": s.state.paused_reason,
                "paused_detail": s.state.paused_detail,
                "error": s.error,
            }
            for s in st.schedules
        ],
    }


def _schedule_state_text(s: operations.ScheduleStatus) -> str:
    if s.state.paused:
        why = s.state.paused_reason or "operator"
        detail = f": {one_line(s.state.paused_detail)}" if s.state.paused_detail else ""
        return cut(f"paused ({why}{detail})", 40)
    if s.error is not None:
        return cut(f"INVALID: {one_line(s.error)}", 40)
    return "OVERDUE" if s.overdue else "ok"


def print_status(st: operations.Status) -> None:
    verdict = "ok" if st.healthy else f"ATTENTION ({len(st.problems)})"
    print(f"pgtick status at {iso(st.db_now, whole_seconds=True)}: {verdict}")
    for problem in st.problems:
        print(f"  ! {problem}")
    live = sum(1 for w in st.workers if not w.stale)
    print()
    print(f"workers: {live} live, {len(st.workers) - live} stale")
    if st.workers:
        rows = [
            (
                w.worker.hostname,
                str(w.worker.pid),
                w.worker.version,
                f"{w.worker.busy}/{w.worker.threads}",
                age_text(w.worker.heartbeat_age_seconds) + (" STALE" if w.stale else ""),
                cut(",".join(w.worker.job_types) or "(schedules only)", 40),
            )
            for w in st.workers
        ]
        print_table(
            ("  HOST", "PID", "VERSION", "BUSY", "HEARTBEAT", "JOB TYPES"),
            [("  " + r[0], *r[1:]) for r in rows],
        )
    print()
    print("job types:" if st.job_types else "job types: no queued, running or recently dead runs")
    if st.job_types:
        print_table(
            (
                "  JOB TYPE",
                "DUE",
                "OLDEST",
                "RUNNING",
                "STUCK",
                "RETRYING",
                "DEAD 24H",
                "DAEMONS",
                "HELD BACK",
            ),
            [
                (
                    "  " + cut(t.stats.job_type, 30),
                    str(t.stats.due),
                    age_text(t.stats.oldest_due_seconds),
                    str(t.stats.running),
                    str(t.stats.stuck),
                    str(t.stats.awaiting_retry),
                    str(t.stats.dead_recent),
                    "NONE" if t.unserved else str(t.live_workers),
                    t.held_back_text or "-",
                )
                for t in st.job_types
            ],
        )
        for t in st.job_types:
            if t.limits_text:
                print(f"  {t.stats.job_type}: {t.limits_text}")
    _print_paused(st)
    print()
    print("schedules:" if st.schedules else "schedules: none")
    _print_schedules(st)
    print()
    _print_horizon(st)


def _print_paused(st: operations.Status) -> None:
    """The job types paused fleet-wide, with who, when and why (`pgtick resume TYPE`)."""
    if not st.paused:
        return
    print()
    print("paused job types (their runs wait; `pgtick resume TYPE`):")
    for c in st.paused:
        why = f": {one_line(c.paused_reason)}" if c.paused_reason else ""
        print(f"  {c.job_type} by {c.paused_by} at {iso(c.paused_at, whole_seconds=True)}{why}")


def _print_horizon(st: operations.Status) -> None:
    h = st.horizon.holder
    if h is None:
        print("MVCC horizon: nothing visible holds it")
    elif h.age_seconds is not None and h.age_seconds < HORIZON_MOVING_SECONDS:
        print(f"MVCC horizon: moving (oldest snapshot under {HORIZON_MOVING_SECONDS:g}s)")
    else:
        age = "age unknown" if h.age_seconds is None else age_text(h.age_seconds)
        print(
            f"MVCC horizon: held by {operations.describe_holder(h)}, {age} "
            f"({h.xid_age} transactions); problem past {age_text(st.horizon.threshold_seconds)}"
        )
    for note in st.notes:
        print(f"  note: {note}")


def _print_schedules(st: operations.Status) -> None:
    if st.schedules:
        print_table(
            ("  NAME", "NEXT (UTC)", "NEXT (LOCAL)", "LAST SUCCESS", "STATE"),
            [
                (
                    "  " + cut(s.state.name, 24),
                    "-" if s.next_at is None else f"{s.next_at.astimezone(UTC):%m-%d %H:%M}",
                    "-" if s.next_at is None else local_short(s.next_at, s.state.timezone),
                    utc_cell(s.last_success_at, st.db_now),
                    _schedule_state_text(s),
                )
                for s in st.schedules
            ],
        )
