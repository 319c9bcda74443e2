-- pgtick: no-transaction
-- The claim index leads with job_type and priority (higher first), then the due time: the
-- claim reads the runs of priority 0 (the default, nearly all) as one range from its lower
-- bound, exactly as before, and the few of other priorities ahead of or after them. Built
-- concurrently beside the old one, which is then dropped and the new one takes its name (as
-- 0004: daemons keep claiming meanwhile; each statement is safe to run again).
DROP INDEX CONCURRENTLY IF EXISTS runs_claim_priority_idx;
CREATE INDEX CONCURRENTLY runs_claim_priority_idx ON runs (job_type, priority DESC, run_at, id)
    WHERE status IN ('queued', 'failed');
DROP INDEX CONCURRENTLY IF EXISTS runs_claim_idx;
ALTER INDEX runs_claim_priority_idx RENAME TO runs_claim_idx;

-- The runs held now (claimed, or cancelled and not let go of), per job type: what a
-- concurrency limit counts. Only held rows are in it, so counting costs the number of runs
-- running, not the size of the table.
DROP INDEX CONCURRENTLY IF EXISTS runs_held_idx;
CREATE INDEX CONCURRENTLY runs_held_idx ON runs (job_type) WHERE locked_by IS NOT NULL;
