"""`pgtick status`'s verdict on the MVCC horizon's holder and how it names each kind, without a
database (the live cases: tests/acceptance/test_vacuum_health.py)."""

from __future__ import annotations

from pgtick.storage.store import HorizonHolder
from pgtick.surfaces.operations import Horizon, describe_holder


def session(**changes: object) -> HorizonHolder:
    base = {
        "kind": "session",
        "ident": "4242",
        "user": "analyst",
        "application": "report",
        "client": "10.0.0.5/32",
        "state": "idle in transaction",
        "age_seconds": 1000.0,
        "xid_age": 12,
        "backend_type": "client backend",
    }
    return HorizonHolder(**{**base, **changes})  # type: ignore[arg-type]


def test_a_session_past_the_threshold_is_a_problem_naming_it() -> None:
    assert Horizon(session(), True, 900.0).problem == (
        "session pid 4242 (user analyst, application 'report', from 10.0.0.5/32, "
        "idle in transaction) holds the MVCC horizon for 1000s"
    )
    assert Horizon(session(age_seconds=899.0), True, 900.0).problem is None
    assert Horizon(None, True, 900.0).problem is None


def test_a_session_whose_age_is_hidden_is_named_but_not_judged() -> None:
    hidden = session(age_seconds=None, state=None, client=None)
    assert Horizon(hidden, False, 1.0).problem is None
    assert describe_holder(hidden) == "session pid 4242 (user analyst, application 'report')"


def test_walsender_slot_and_prepared_transaction() -> None:
    walsender = session(backend_type="walsender", client=None, state="streaming")
    assert describe_holder(walsender).startswith("walsender session pid 4242")
    assert "from local socket" in describe_holder(walsender)
    slot = HorizonHolder("slot", "standby1", None, "physical", None, "inactive", None, 900, None)
    assert Horizon(slot, True, 900.0).problem == (
        "inactive replication slot standby1 holds the MVCC horizon (900 transactions old)"
    )
    active = HorizonHolder("slot", "standby1", None, "physical", None, "active", None, 900, None)
    assert Horizon(active, True, 900.0).problem is None
    assert describe_holder(active) == "replication slot standby1 (physical, active)"
    prepared = HorizonHolder("prepared", "tx1", "app", None, None, "prepared", 1200.0, 3, None)
    assert Horizon(prepared, True, 900.0).problem == (
        "prepared transaction 'tx1' (user app) holds the MVCC horizon for 1200s"
    )
