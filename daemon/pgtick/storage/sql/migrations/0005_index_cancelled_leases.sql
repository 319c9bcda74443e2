-- pgtick: no-transaction
-- A running run an operator cancels stays held by its daemon until the handler has stopped
-- (locked_until kept). If that daemon dies first, the reaper lets go of the run once the lease
-- has expired; this index serves it, holding only such rows, so the reaper's pass costs the
-- same however many cancelled runs the table keeps. Built concurrently, as 0004.
DROP INDEX CONCURRENTLY IF EXISTS runs_cancel_lease_idx;
CREATE INDEX CONCURRENTLY runs_cancel_lease_idx ON runs (locked_until)
    WHERE status = 'cancelled' AND locked_until IS NOT NULL;
