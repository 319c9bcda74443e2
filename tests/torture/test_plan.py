"""The plan and the history files, no database: a seed replays its plan, --only keeps the kept
kinds' steps as they were, the world is a config pgtick accepts, and a line cut by a kill is
dropped when the history is read back."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pgtick.config import load_config
from tests.torture import plan
from tests.torture.cluster import config_text
from tests.torture.history import INVOKE, OK, HistoryFile, parse_lines, read_directory
from tests.torture.test_seeds import CI_SEEDS, MINUTES


def test_a_seed_replays_its_plan_and_another_seed_does_not() -> None:
    first = plan.draw(7, 3, 3)
    assert plan.draw(7, 3, 3) == first
    assert plan.draw(7, 3, 3).to_json() == first.to_json()
    assert plan.draw(8, 3, 3).steps != first.steps


def test_only_keeps_the_steps_of_the_kinds_it_keeps_exactly() -> None:
    full = plan.draw(11, 3, 3)
    only = plan.draw(11, 3, 3, ("row-lock", "key-race"))
    assert {s.kind for s in only.steps} == {"row-lock", "key-race"}
    assert list(only.steps) == [s for s in full.steps if s.kind in ("row-lock", "key-race")]
    assert only.world == full.world


def test_steps_are_in_order_inside_the_active_time_and_faults_wait_for_the_settling() -> None:
    drawn = plan.draw(3, 3, 3)
    times = [s.at for s in drawn.steps]
    assert times == sorted(times)
    assert all(0 < t < drawn.active_seconds for t in times)
    assert all(s.at >= plan.SETTLE_SECONDS for s in drawn.steps if s.kind in plan.FAULTS)
    assert drawn.active_seconds + drawn.quiesce_seconds == pytest.approx(180)
    kinds = {s.kind for s in drawn.steps}
    assert {"enqueue", "key-race", "cancel", "row-lock"} <= kinds


def test_an_upgrade_is_drawn_at_most_once_in_the_first_half_and_by_about_half_the_seeds() -> None:
    plans = [plan.draw(seed, 3, 3) for seed in range(200)]
    upgraded = [p for p in plans if p.upgrade]
    assert 70 <= len(upgraded) <= 130
    for p in upgraded:
        [step] = [s for s in p.steps if s.kind == "migrate"]
        assert plan.SETTLE_SECONDS < step.at <= p.active_seconds / 2


def test_each_ci_seed_draws_every_kind_of_operation_and_fault() -> None:
    for seed in CI_SEEDS:
        drawn = plan.draw(seed, MINUTES, 3).counts()
        assert set(plan.KINDS) <= set(drawn), (seed, drawn)


def test_every_kind_draws_its_arguments() -> None:
    world = plan.draw_world(random.Random(1))
    for kind in plan.KINDS:
        args = plan.draw_args(kind, random.Random(kind), world, 3)
        json.dumps(args)  # a plan is data


@pytest.mark.parametrize(
    ("only", "minutes", "daemons", "message"),
    [
        (("kill", "nosuch"), 3, 3, "unknown kind nosuch"),
        ((), 0.5, 3, "too short"),
        ((), 3, 0, "at least 1"),
    ],
)
def test_impossible_plans_are_usage_errors(
    only: tuple[str, ...], minutes: float, daemons: int, message: str
) -> None:
    with pytest.raises(plan.PlanError, match=message):
        plan.draw(1, minutes, daemons, only)


def test_the_world_is_a_config_pgtick_accepts_with_its_limits(tmp_path: Path) -> None:
    world = plan.draw(5, 3, 3).world
    path = tmp_path / "config.toml"
    path.write_text(config_text(world))
    config = load_config(path)
    types = config.job_types
    assert types["capped"].max_running == 1
    assert types["keyed"].max_running_per_key == 1
    assert types["cmd"].command
    assert config.worker.lease_seconds == world.lease_seconds
    assert set(config.schedules) == {s.name for s in world.schedules}
    assert config.retention.cancelled_seconds == plan.seconds(world.retention["cancelled"])


def test_a_line_cut_by_a_kill_is_dropped_and_the_rest_read_in_time_order(tmp_path: Path) -> None:
    first = HistoryFile(tmp_path / "a.jsonl", "a")
    first.write(INVOKE, "handler", {"run": 1})
    first.write(OK, "handler", {"run": 1})
    first.close()
    with (tmp_path / "b.jsonl").open("w") as cut:
        cut.write(
            '{"t": 1, "process": "b", "type": "invoke", "f": "x", "value": {}}\n{"t": 2, "pro'
        )
    events = read_directory(tmp_path)
    assert [e.process for e in events] == ["b", "a", "a"]
    assert [e.source for e in events] == ["b.jsonl:1", "a.jsonl:1", "a.jsonl:2"]
    assert list(parse_lines("c.jsonl", "not json\n")) == []


def test_faults_multiplies_the_faults_only() -> None:
    base = plan.draw(4320, 30, 3)
    tripled = plan.draw(4320, 30, 3, faults=3.0)
    ops = [s for s in base.steps if s.kind not in plan.FAULTS]
    assert ops == [s for s in tripled.steps if s.kind not in plan.FAULTS]
    for kind in plan.FAULTS:
        assert tripled.counts()[kind] > 2 * base.counts()[kind], kind
    assert tripled.faults == 3.0 and '"faults": 3.0' in tripled.to_json()
    with pytest.raises(plan.PlanError, match="--faults 0"):
        plan.draw(1, 3, 3, faults=0)
