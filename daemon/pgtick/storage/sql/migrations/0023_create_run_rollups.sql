-- Throughput and failures per job type over 24 hours and 7 days (issue 46), from two small
-- tables the daemons keep, so that the console's charts never scan runs:
--
--   rollup_minutes   one row per job type and minute in which any of its runs ended or any
--                    attempt failed, plus a row of job type '' for every minute rolled up
--                    (the mark of how far roll_up_runs got, minutes without any run
--                    included); kept a day (maintenance: rollup.py)
--   rollup_hours     the same per hour, summed from rollup_minutes once an hour's minutes
--                    are all there; kept as long as the longest run retention
--
-- Both are insert-only: roll_up_runs adds the minutes closed since its last call, from the
-- runs that ended in them (runs_finished_idx) and the attempts that failed or were lost, and
-- writes nothing else (no counter updated per finish, no row updated per minute), so a
-- snapshot held elsewhere leaves no dead version in them (docs/design/storage.md). Both are
-- partitioned by their bucket and dropped by maintain_partitions like the runs' partitions,
-- under the retention keys 'rollup_minutes' and 'rollup_hours' that the daemons' retention
-- passes give (a `pgtick prune` leaves them to the daemons).
-- New tables nothing earlier reads: daemons of the previous version run on beside them.
CREATE TABLE rollup_minutes (
    job_type     text NOT NULL,         -- '': the minute is rolled up (its mark)
    bucket       timestamptz NOT NULL,  -- the minute's (or hour's) start, aligned on UTC
    succeeded    integer NOT NULL DEFAULT 0,  -- runs that succeeded
    failed       integer NOT NULL DEFAULT 0,  -- attempts that failed (a dead run's last too)
    lost         integer NOT NULL DEFAULT 0,  -- attempts lost (their daemon died or froze)
    dead         integer NOT NULL DEFAULT 0,  -- runs that went dead
    cancelled    integer NOT NULL DEFAULT 0,
    skipped      integer NOT NULL DEFAULT 0,
    run_seconds  float8 NOT NULL DEFAULT 0,   -- succeeded runs' last attempts, summed
    PRIMARY KEY (job_type, bucket)
) PARTITION BY RANGE (bucket);
COMMENT ON TABLE rollup_minutes IS
    'Per job type and minute: runs ended and attempts failed (roll_up_runs); insert-only.';
CREATE TABLE rollup_hours (LIKE rollup_minutes INCLUDING DEFAULTS) PARTITION BY RANGE (bucket);
ALTER TABLE rollup_hours ADD PRIMARY KEY (job_type, bucket);
COMMENT ON TABLE rollup_hours IS
    'Per job type and hour: rollup_minutes summed once the hour is rolled up; insert-only.';

-- Their partitions come and go with maintain_partitions; its `status` column names the key
-- of the retention object that gives their retention (not a run status here).
INSERT INTO partitioned_tables VALUES
    ('rollup_minutes', 'bucket', 'bucket', 'rollup_minutes'),
    ('rollup_hours', 'bucket', 'bucket', 'rollup_hours');
CREATE TABLE rollup_minutes_default PARTITION OF rollup_minutes DEFAULT;
CREATE TABLE rollup_hours_default PARTITION OF rollup_hours DEFAULT;

-- Roll up the minutes closed since the last call (at most max_minutes of them, from the hour
-- back_seconds ago on a first call or after a longer gap), a minute being closed
-- settle_seconds after its end (a finish is dated by its transaction's start and commits a
-- little later); then every hour whose minutes are all rolled up. One caller at a time (the
-- others return 0 at once); returns the minutes rolled up. SECURITY DEFINER: the daemons'
-- role needs EXECUTE only.
CREATE FUNCTION roll_up_runs(settle_seconds float8, back_seconds float8, max_minutes integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    upto timestamptz;
    since timestamptz;
    hours_from timestamptz;
    hours_upto timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgtick.rollup.' || current_schema(), 0)) THEN
        RETURN 0;
    END IF;
    upto := to_timestamp(floor(extract(epoch FROM now() - make_interval(secs => settle_seconds))
                               / 60) * 60);
    SELECT max(m.bucket) + interval '1 minute' INTO since
    FROM rollup_minutes m WHERE m.job_type = '';
    since := greatest(coalesce(since, '-infinity'),
                      to_timestamp(floor(extract(epoch FROM upto - make_interval(secs => back_seconds))
                                         / 3600) * 3600));
    upto := least(upto, since + make_interval(mins => max_minutes));
    IF since >= upto THEN
        RETURN 0;
    END IF;
    INSERT INTO rollup_minutes AS m (job_type, bucket, succeeded, failed, lost, dead, cancelled,
                                     skipped, run_seconds)
    SELECT x.job_type, x.bucket, sum(x.succeeded), sum(x.failed), sum(x.lost), sum(x.dead),
           sum(x.cancelled), sum(x.skipped), sum(x.run_seconds)
    FROM (
        -- Runs that ended, through runs_finished_idx (status, finished_at) of each terminal
        -- partition the range reaches.
        SELECT r.job_type, to_timestamp(floor(extract(epoch FROM r.finished_at) / 60) * 60) AS bucket,
               count(*) FILTER (WHERE r.status = 'succeeded') AS succeeded, 0 AS failed,
               0 AS lost, count(*) FILTER (WHERE r.status = 'dead') AS dead,
               count(*) FILTER (WHERE r.status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE r.status = 'skipped') AS skipped,
               coalesce(sum(extract(epoch FROM r.finished_at - r.started_at))
                        FILTER (WHERE r.status = 'succeeded'), 0) AS run_seconds
        FROM runs r
        WHERE r.status IN ('succeeded', 'dead', 'cancelled', 'skipped')
          AND r.finished_at >= since AND r.finished_at < upto
        GROUP BY 1, 2
        UNION ALL
        -- Attempts that failed or were lost (attempts_ended's partitions of the range), each
        -- with its run's job type by the run's id (runs_id_idx); one whose run is gone (a
        -- retention or prune meanwhile) is left out.
        SELECT r.job_type, to_timestamp(floor(extract(epoch FROM a.finished_at) / 60) * 60),
               0, count(*) FILTER (WHERE a.outcome = 'failed'),
               count(*) FILTER (WHERE a.outcome = 'lost'), 0, 0, 0, 0
        FROM attempts_history a
        CROSS JOIN LATERAL (SELECT r.job_type FROM runs r WHERE r.id = a.run_id LIMIT 1) r
        WHERE a.outcome IN ('failed', 'lost') AND a.finished_at >= since AND a.finished_at < upto
        GROUP BY 1, 2
        UNION ALL
        -- The marks: every minute of the range is rolled up, runs or not.
        SELECT '', g, 0, 0, 0, 0, 0, 0, 0
        FROM generate_series(since, upto - interval '1 minute', interval '1 minute') g
    ) x
    GROUP BY x.job_type, x.bucket
    ON CONFLICT DO NOTHING;

    -- The hours after the last hour rolled up (on a first call, from the first whole hour of
    -- minutes) whose minutes are all rolled up, summed from rollup_minutes.
    SELECT max(h.bucket) + interval '1 hour' INTO hours_from
    FROM rollup_hours h WHERE h.job_type = '';
    IF hours_from IS NULL THEN
        SELECT to_timestamp(ceil(extract(epoch FROM min(m.bucket)) / 3600) * 3600) INTO hours_from
        FROM rollup_minutes m WHERE m.job_type = '';
    END IF;
    hours_upto := to_timestamp(floor(extract(epoch FROM upto) / 3600) * 3600);
    IF hours_from < hours_upto THEN
        INSERT INTO rollup_hours AS h (job_type, bucket, succeeded, failed, lost, dead, cancelled,
                                       skipped, run_seconds)
        SELECT m.job_type, to_timestamp(floor(extract(epoch FROM m.bucket) / 3600) * 3600),
               sum(m.succeeded), sum(m.failed), sum(m.lost), sum(m.dead), sum(m.cancelled),
               sum(m.skipped), sum(m.run_seconds)
        FROM rollup_minutes m
        WHERE m.bucket >= hours_from AND m.bucket < hours_upto
        GROUP BY 1, 2
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN extract(epoch FROM upto - since)::integer / 60;
END;
$$;
REVOKE ALL ON FUNCTION roll_up_runs(float8, float8, integer) FROM PUBLIC;

-- Whoever could run retention (EXECUTE on maintain_partitions: the daemons' role, by `pgtick
-- grants`) rolls up; whoever could read runs reads the rollups (the console).
DO $$
DECLARE
    g record;
    who text;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.routine_privileges
             WHERE routine_schema = current_schema() AND routine_name = 'maintain_partitions'
               AND privilege_type = 'EXECUTE'
               AND grantee <> (SELECT pg_get_userbyid(proowner) FROM pg_proc
                               WHERE oid = 'maintain_partitions'::regproc) LOOP
        who := CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
        EXECUTE 'GRANT EXECUTE ON FUNCTION roll_up_runs(float8, float8, integer) TO ' || who;
    END LOOP;
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'SELECT'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        who := CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
        EXECUTE 'GRANT SELECT ON rollup_minutes, rollup_hours TO ' || who;
    END LOOP;
END;
$$;
