"""operations.bulk over a real database: a confirmed bulk retry changes only the runs it was
confirmed for that still match, in transactions of at most ``batch`` runs; filters that name
no status the action accepts are refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from pgtick.errors import UsageError
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations


def _ids(conn: db.Connection, where: str) -> set[int]:
    return {int(r[0]) for r in conn.execute(f"SELECT id FROM runs WHERE {where}").fetchall()}  # type: ignore[arg-type]


def test_a_confirmed_bulk_retry_changes_what_was_confirmed_and_still_matches(
    store: RunStore, conn: db.Connection
) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        " SELECT CASE WHEN g % 26 = 0 THEN 'other' ELSE 'email' END, 'dead', 2, 2, now()"
        " FROM generate_series(1, 260) g"
    )
    sizes: list[int] = []

    def counted(s: RunStore, ids: Sequence[int]) -> list[int]:
        sizes.append(len(ids))  # one call, one transaction (RunStore.retry)
        return RunStore.retry(s, ids)

    bulk = operations.filter_bulk(operations.RETRY, ["dead"], "email", None)
    plan = operations.plan_filter_bulk(store, bulk)
    assert plan.matching == 250 and len(plan.ids) == 250
    # after the confirmation: 5 of them retried elsewhere, 3 new ones dead
    retried_elsewhere = set(plan.ids[:5])
    conn.execute(
        "UPDATE runs SET status = 'queued', finished_at = NULL WHERE id = ANY(%s)",
        (sorted(retried_elsewhere),),
    )
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        " SELECT 'email', 'dead', 1, 1, now() FROM generate_series(1, 3)"
    )
    counting = dataclasses.replace(bulk, action=dataclasses.replace(bulk.action, apply=counted))
    done = operations.run_filter_bulk(store, counting, plan.ids, batch=100)
    assert (done.confirmed, done.changed, done.skipped) == (250, 245, 5)
    assert sizes == [95, 100, 50]  # the first batch narrowed by the 5 retried elsewhere
    assert _ids(conn, "job_type = 'email' AND status = 'queued'") == set(plan.ids)
    assert len(_ids(conn, "job_type = 'email' AND status = 'dead'")) == 3
    assert len(_ids(conn, "job_type = 'other' AND status = 'dead'")) == 10
    # a confirmation of a limited plan carries the oldest
    small = operations.plan_filter_bulk(
        store, operations.filter_bulk(operations.CANCEL, [], None, None), 7
    )
    assert small.matching == 250 and small.ids == sorted(small.ids)[:7] == sorted(plan.ids)[:7]


def test_a_filter_without_a_status_the_action_takes_is_refused() -> None:
    with pytest.raises(UsageError, match="none that can be retried"):
        operations.filter_bulk(operations.RETRY, ["queued", "running"], None, None)
    assert operations.filter_bulk(operations.RETRY, [], None, None).statuses == (
        "failed",
        "dead",
        "cancelled",
    )
    assert operations.filter_bulk(operations.CANCEL, ["dead", "queued"], "x", None).statuses == (
        "queued",
    )
    with pytest.raises(UsageError, match="no runs confirmed"):
        operations.run_filter_bulk(
            None, operations.filter_bulk(operations.RETRY, [], None, None), []
        )  # type: ignore[arg-type]
