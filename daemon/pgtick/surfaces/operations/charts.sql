-- The console's pictures that no store query gives, read by charts.py (loaded with
-- storage.sqlfile's parser; {schema} is the schema's quoted identifier). Kept out of
-- storage/sql/queries.sql on purpose: they serve the console's overview only.

-- queue_depth_per_type_minute --
-- Per job type, how many runs were due and waiting to start at each of the last %(minutes)s
-- minutes (0 = now, 1 = one minute before now, ...), rebuilt from the rows alone so every
-- console, and one after a restart, shows the same picture. A run waits from its due time
-- (never before it existed) until an attempt starts, until it is cancelled, or to now. The
-- start of each wait is an attempt's started_at; the due time is runs.run_at, which a failure
-- that is retried (fail, reaper) and an operator's retry overwrite, and which claim, succeed,
-- release and going dead keep. So a wait is counted:
--   - from run_at (or the previous attempt's end, if later) when no retried failure came
--     after it: the pending wait, the last one, every wait of a run never retried;
--   - otherwise from the previous attempt's end when that attempt was released (its run was
--     due again at once), or, for a scheduled run's first wait, from its occurrence
--     (scheduled_for; jitter is not counted);
--   - otherwise not at all: an earlier wait whose due time was overwritten (an ad-hoc run's
--     first wait, a retry before the last one) is not known, so it is left out rather than
--     guessed; a retry's backoff never counts, it waits only from its run_at.
-- Reads the active runs (queued, running, failed: what job_type_stats reads, served by the
-- partial indexes on them) and the runs finished within the window (runs_finished_idx on
-- status and finished_at), and the ended attempts of those ever claimed through
-- attempts_run_idx, one index probe per run and partition (the LATERAL subquery's ORDER BY
-- keeps it a nested loop, never a scan of attempts). A backlog's runs never claimed
-- (started_at NULL: a claim sets it, nothing clears it) have no attempt and are not probed; a
-- run's open attempt is its own row (locked_by, started_at, as the attempts view reads it); and
-- the partitions of attempts that ended over a day before the run was created, or that begin
-- over a day from now (the ones made ahead), are pruned (none can have one: an attempt ends
-- after its run exists, and before this statement's snapshot; the day is slack for clocks).
-- Each wait becomes a +1 at the oldest minute it covers and a -1 after the newest; the rows
-- are the running sum at the minutes where it changes, newest last per job type (a minute
-- without a row has the depth of the older one before it).
WITH recent AS (
    SELECT id, job_type, status, run_at, created_at, scheduled_for, finished_at, started_at,
           attempts, locked_by
    FROM {schema}.runs
    WHERE status IN ('queued', 'running', 'failed')
    UNION ALL
    SELECT id, job_type, status, run_at, created_at, scheduled_for, finished_at, started_at,
           attempts, locked_by
    FROM {schema}.runs
    WHERE status IN ('succeeded', 'dead', 'cancelled')
      AND finished_at > now() - make_interval(mins => %(minutes)s)
), tried AS (
    SELECT r.id AS run_id, a.started_at, a.finished_at, a.outcome,
           lag(a.finished_at) OVER w AS prev_finished,
           lag(a.outcome) OVER w AS prev_outcome,
           row_number() OVER w = 1 AS first,
           row_number() OVER w = count(*) OVER (PARTITION BY r.id) AS last,
           count(*) FILTER (WHERE a.outcome IN ('failed', 'lost')) OVER (
               w ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS failures_from_here
    FROM recent r
    CROSS JOIN LATERAL (
        SELECT a.id, a.attempt, a.started_at, a.finished_at, a.outcome
        FROM {schema}.attempts_history a
        WHERE a.run_id = r.id AND a.finished_at >= r.created_at - interval '1 day'
          AND a.finished_at < now() + interval '1 day'
        UNION ALL
        SELECT NULL, r.attempts, r.started_at, NULL, NULL
        WHERE r.locked_by IS NOT NULL AND r.status IN ('running', 'cancelled')
        ORDER BY attempt
    ) a
    WHERE r.started_at IS NOT NULL
    WINDOW w AS (PARTITION BY r.id ORDER BY a.started_at, a.id)
), runs_then AS (
    -- requeued: the run waits again after its last attempt (or never had one): queued or
    -- failed now, or cancelled while waiting. spent: its last attempt failed and the run was
    -- not retried after it, so that failure did not overwrite run_at.
    SELECT r.*, l.finished_at AS last_finished, rq.requeued,
           (coalesce(l.outcome IN ('failed', 'lost'), false) AND NOT rq.requeued)::int AS spent
    FROM recent r
    LEFT JOIN tried l ON l.run_id = r.id AND l.last
    CROSS JOIN LATERAL (
        SELECT r.status IN ('queued', 'failed')
               OR (r.status = 'cancelled'
                   AND (l.run_id IS NULL OR coalesce(l.finished_at < r.finished_at, false)))
               AS requeued
    ) rq
), waits AS (
    -- the wait that ended when each attempt started (began NULL: not known)
    SELECT r.job_type,
           CASE WHEN t.failures_from_here = r.spent
                    THEN greatest(r.run_at, r.created_at, t.prev_finished)
                WHEN t.prev_outcome = 'released' THEN t.prev_finished
                WHEN t.first AND r.scheduled_for IS NOT NULL
                    THEN greatest(r.scheduled_for, r.created_at)
           END AS began,
           t.started_at AS ended
    FROM tried t
    JOIN runs_then r ON r.id = t.run_id
    UNION ALL
    -- the wait after the last attempt: to now (ended NULL), or to the cancel
    SELECT job_type, greatest(run_at, created_at, last_finished),
           CASE WHEN status = 'cancelled' THEN finished_at END
    FROM runs_then
    WHERE requeued
), spans AS (
    -- the minutes (ago) a wait covers: m is covered when began <= now - m min < ended
    SELECT job_type,
           least(floor(extract(epoch FROM now() - began) / 60), %(minutes)s - 1)::int AS oldest,
           CASE WHEN ended IS NULL THEN 0
                ELSE greatest(floor(extract(epoch FROM now() - ended) / 60) + 1, 0)::int
           END AS newest
    FROM waits
    WHERE began IS NOT NULL
), steps AS (
    SELECT job_type, oldest AS minutes_ago, 1 AS step FROM spans WHERE newest <= oldest
    UNION ALL
    SELECT job_type, newest - 1, -1 FROM spans WHERE newest <= oldest AND newest > 0
)
SELECT job_type, minutes_ago,
       sum(sum(step)) OVER (PARTITION BY job_type ORDER BY minutes_ago DESC)::int AS depth
FROM steps
GROUP BY job_type, minutes_ago
ORDER BY job_type, minutes_ago DESC;
