"""The fixed seeds CI runs (marker ``torture``): each a short torture run whose checker must
find no violation. `make test` runs them alone, after the serial tests. By hand:
``pytest -m torture tests/torture/test_seeds.py`` (a few minutes; an embedded server of its
own, or $PGTICK_TEST_DSN, never restarted then). A failure prints the seed, the checker's
blocks and where the history was kept."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tests.torture.run import Options, execute

# Seeds whose two-minute plans each draw every kind of operation and fault, the migrate fault
# included (the run starts on the previous release, tests/torture/upgrade.py): test_plan.py
# checks it. They replaced 103 and 619, which draw no upgrade (103 found the results held up
# by one row lock, docs/guarantees.md; test_lease_row_lock.py keeps that case).
CI_SEEDS = (82, 659)
MINUTES = 2.0
SEED_TIMEOUT_SECONDS = 600

pytestmark = [pytest.mark.torture, pytest.mark.timeout(SEED_TIMEOUT_SECONDS)]


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_a_seed_keeps_every_guarantee(seed: int, tmp_path: Path) -> None:
    out = io.StringIO()
    history = tmp_path / f"history-{seed}"
    options = Options(
        seed=seed,
        minutes=MINUTES,
        daemons=3,
        dsn=os.environ.get("PGTICK_TEST_DSN") or None,
        keep=history,
    )
    verdict = execute(options, out)
    if verdict.violations:
        pytest.fail(f"{out.getvalue()}\n(history kept in {history})", pytrace=False)


# One seed with every daemon a supervisor and two worker processes (worker.processes = 2,
# issue 47): the same promises, whatever the process model.
PROCESSES_SEED = 103


def test_a_seed_keeps_every_guarantee_with_two_processes_per_daemon(tmp_path: Path) -> None:
    out = io.StringIO()
    history = tmp_path / f"history-{PROCESSES_SEED}-processes-2"
    options = Options(
        seed=PROCESSES_SEED,
        minutes=MINUTES,
        daemons=3,
        dsn=os.environ.get("PGTICK_TEST_DSN") or None,
        keep=history,
        processes=2,
    )
    verdict = execute(options, out)
    if verdict.violations:
        pytest.fail(f"{out.getvalue()}\n(history kept in {history})", pytrace=False)
