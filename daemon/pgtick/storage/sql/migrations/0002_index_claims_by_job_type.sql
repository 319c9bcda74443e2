-- Claims and the idle dispatcher's next_due poll look for due runs of the job types one daemon
-- handles. Leading the claim index with job_type lets them skip the due runs of other fleets'
-- job types (a fleet split by job type) instead of walking past them on every poll.
DROP INDEX runs_claim_idx;
CREATE INDEX runs_claim_idx ON runs (job_type, run_at, id)
    WHERE status IN ('queued', 'failed');

-- A schedule row this version cannot compute (a cron or time zone it refuses, written by an
-- older or newer version or by hand) is paused with reason 'invalid' and the error in
-- paused_detail, instead of stopping every daemon's ticker.
ALTER TABLE schedules DROP CONSTRAINT schedules_paused_reason_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_paused_reason_check
    CHECK (paused_reason IN ('operator', 'removed', 'invalid'));
ALTER TABLE schedules ADD COLUMN paused_detail text;

-- The schedule's next occurrence after materialized_until, kept by the ticker: a tick locks
-- and updates only the schedules whose next_due_at falls within its lookahead (NULL: not yet
-- known, so due).
ALTER TABLE schedules ADD COLUMN next_due_at timestamptz;
CREATE INDEX schedules_next_due_idx ON schedules (next_due_at) WHERE NOT paused;
