"""What this process's runs came to: the attempt counters and durations (metrics), the tally
of the periodic ``runs_summary`` line, and the one log line per run outcome. Counting and
telling are not transitions: the lifecycle decides each outcome under its lock, then reports
it here (under a lock of this class's own for the tally).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence

import structlog

from pgtick.core.held import Held, State, fields
from pgtick.core.outcome import Outcome
from pgtick.observability.metrics import Metrics
from pgtick.storage.store import FailResult

# One line per run outcome; successes only at DEBUG (the attempts table and the metrics
# already record every run, and an INFO line per success would be the largest per-run cost).
RUNS_LOGGER = "pgtick.runs"
runs_log = structlog.get_logger(RUNS_LOGGER)


class Tally:
    """Counts ended attempts by job type and outcome."""

    def __init__(self, metrics: Metrics, log_each_run: bool = False) -> None:
        self._metrics = metrics
        # `pgtick demo` shows every success at INFO; a production daemon only counts them
        # (at DEBUG, which a batch of results looks up once rather than formatting a line
        # per run for nothing).
        self._log_each_run = log_each_run
        self._log_success = runs_log.info if log_each_run else runs_log.debug
        self._lock = threading.Lock()
        self._tally: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.finished_total = 0  # attempts ended other than by a release

    def record(self, held: Held, outcome: str, duration: float | None, dead: bool = False) -> None:
        self.record_many(outcome, [(held, duration)], "dead" if dead else outcome)

    def record_many(
        self, outcome: str, ended: list[tuple[Held, float | None]], tally: str | None = None
    ) -> None:
        """Count attempts that ended with ``outcome`` (in the summary's tally as ``tally``):
        the metrics once per job type, the tally under one lock; a batch of successes is
        counted in one call."""
        durations: dict[str, list[float | None]] = collections.defaultdict(list)
        for held, duration in ended:
            durations[held.run.job_type].append(duration)
        for job_type, seconds in durations.items():
            self._metrics.attempts_finished(job_type, outcome, seconds)
        with self._lock:
            for job_type, seconds in durations.items():
                self._tally[job_type][tally or outcome] += len(seconds)
            if outcome != "released":
                self.finished_total += len(ended)

    def take_summary(self) -> dict[str, dict[str, int]]:
        """{job type: {outcome: count}} since the last call, for the periodic summary line."""
        with self._lock:
            tally, self._tally = self._tally, collections.defaultdict(collections.Counter)
        return {jt: dict(c) for jt, c in sorted(tally.items()) if c}

    # -- what the lifecycle decided ------------------------------------------------------------

    def replaced(self, running: Iterable[Held], superseded: Iterable[Held]) -> None:
        """A new claim replaced older copies: one whose handler still runs, or never started."""
        for old in running:
            runs_log.warning("run_reclaimed_while_running", **fields(old))
        for old in superseded:
            self.record(old, "lost", None)

    def returned(self, held: Held, gone: str | None, outcome: Outcome, duration: float) -> None:
        """A handler returned with nothing to write: committed by ``ctx.transaction()`` (gone
        None), or lost or cancelled meanwhile."""
        if gone is not None:
            self.record(held, gone, duration)
            return
        if outcome.kind != "succeeded":
            runs_log.warning(
                "handler_error_after_commit",
                run_id=held.id,
                job_type=held.run.job_type,
                error=outcome.error,
            )
        self.record(held, "succeeded", duration)
        self._log_success("run_succeeded", **fields(held), duration=round(duration, 6))

    def given_up(self, given_up: Iterable[Held]) -> None:
        """Runs the heartbeat found gone (lost, or cancelled by an operator)."""
        for held in given_up:
            if held.gone == "lost":
                self._metrics.lease_lost(held.run.job_type)
                runs_log.warning("lease_lost", **fields(held))
            else:
                runs_log.info("run_cancelled", **fields(held))
            if held.state not in (State.LOST, State.FINISHING):  # never started: counted now
                self.record(held, "lost", None)

    def written(
        self,
        mine: Sequence[tuple[Held, Outcome, float | None]],
        succeeded: set[int],
        failed: Mapping[int, FailResult],
        let_go: Iterable[int],
    ) -> None:
        """The results of a batch that were ours to record, as the write found them."""
        let_go = set(let_go)
        log_each = self._log_each_run or logging.getLogger(RUNS_LOGGER).isEnabledFor(logging.DEBUG)
        ok: list[tuple[Held, float | None]] = []
        for held, outcome, duration in mine:
            if outcome.kind == "succeeded" and held.id in succeeded:
                ok.append((held, duration))
                if log_each:
                    self._log_success(
                        "run_succeeded", **fields(held), duration=round(duration or 0.0, 6)
                    )
            elif held.id in failed:
                self._failed(held, outcome, duration, failed[held.id])
            elif held.gone == "cancelled" or held.id in let_go:
                # Cancelled by an operator: seen by the heartbeat (logged then), or only now
                # that the write found the run cancelled.
                self.record(held, "cancelled", duration)
                if held.gone != "cancelled":
                    runs_log.info("run_cancelled", **fields(held), at="finish")
            else:
                self._metrics.lease_lost(held.run.job_type)
                self.record(held, "lost", duration)
                runs_log.warning("lease_lost", **fields(held), at="finish")
        if ok:
            self.record_many("succeeded", ok)

    def _failed(
        self, held: Held, outcome: Outcome, duration: float | None, result: FailResult
    ) -> None:
        self.record(held, "failed", duration, dead=result.status == "dead")
        if result.status == "dead":
            runs_log.error(
                "run_dead", **fields(held), error_type=outcome.error_type, error=outcome.error
            )
        else:
            runs_log.warning(
                "run_failed",
                **fields(held),
                error_type=outcome.error_type,
                error=outcome.error,
                retry_at=result.run_at.isoformat(),
            )
