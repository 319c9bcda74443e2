-- runs_schedule_active_idx, (schedule_id) WHERE status IN ('queued', 'running', 'failed'),
-- has been redundant since 0010: those statuses are runs_live, whose part of
-- runs_schedule_occurrence_idx (schedule_id, scheduled_for) serves every lookup of a
-- schedule's unfinished runs. And it did harm: its predicate is implied by every statement
-- that writes live rows it knows by id (they name the live statuses so that the planner
-- reads runs_live only), and while another session holds a snapshot, ANALYZE shows runs_live
-- nearly empty: the planner then read this whole index, which the held snapshot fills with
-- an entry for every run enqueued or claimed since, instead of looking the ids up (the claim
-- and the finish grew linearly for a minute or more of a pin, until the next ANALYZE).
-- Dropping it also spares every enqueue and every claim one index entry. The lock it takes
-- is held for the drop only: daemons may keep running. Waiting for that lock behind a long
-- reader of runs (a pg_dump) would hold up every claim queued behind it, so it gives up
-- after 5 s instead (migrate fails; run it again when the reader is done).
SET LOCAL lock_timeout = '5s';
DROP INDEX runs_schedule_active_idx;
