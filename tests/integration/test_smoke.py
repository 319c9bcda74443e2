from __future__ import annotations

from pgtick.storage.store import ClaimType, NewRun, RunStore


def test_enqueue_claim_succeed(store: RunStore) -> None:
    run_id = store.enqueue(NewRun("noop", {"a": 1}))
    claimed = store.claim("w1", [ClaimType("noop", 60, 10)], 10)
    assert [c.id for c in claimed] == [run_id]
    assert store.succeed("w1", [(run_id, 1)]) == {run_id}
    run = store.get_run(run_id)
    assert run is not None and run.status == "succeeded"
