-- What the metrics endpoint reads cheaply at any table size.

-- Counts of runs in terminal states per job type. Counting ten million finished rows takes
-- seconds, far too long for a scrape, so one daemon at a time recounts them at most every few
-- minutes (RunStore.refresh_terminal_counts) and every scrape reads this small table.
-- Non-terminal states are always counted exactly, from the partial indexes.
CREATE TABLE terminal_run_counts (
    job_type    text NOT NULL,
    status      text NOT NULL,
    n           bigint NOT NULL,
    PRIMARY KEY (job_type, status)
);

-- One row: when terminal_run_counts was last recounted (NULL: never).
CREATE TABLE terminal_run_counts_refresh (
    id              boolean PRIMARY KEY DEFAULT true CHECK (id),
    refreshed_at    timestamptz
);
INSERT INTO terminal_run_counts_refresh (refreshed_at) VALUES (NULL);

-- A schedule's last success without walking its whole history: only successful scheduled
-- runs are indexed, so runs enqueued directly add no index entry.
CREATE INDEX runs_schedule_success_idx ON runs (schedule_id, finished_at)
    WHERE status = 'succeeded' AND schedule_id IS NOT NULL;
