-- What a run's handler returned (docs/composition.md, Results): a JSON value stored with the
-- attempt that produced it, in attempts_history, so it lives in the same partitions as the
-- attempt and goes with them when retention drops them (no table of its own, nothing left
-- behind by a prune). A Python handler's return value, or a command's last line of stdout
-- when its job type says result_from_stdout; at most 1 MiB of JSON (the daemon refuses more
-- with a failed attempt, before anything is written).
--
-- Daemons of the previous version keep running: a nullable column without a default is a
-- change of the catalog only, and their statements name the columns they write. As in 0018,
-- the lock request waits at most 200 ms in the queue and is tried again.
DO $$
DECLARE
    pause double precision := 0.05;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE attempts_history ADD COLUMN result jsonb;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(pause);
            pause := least(pause * 2, 2.0);
        END;
    END LOOP;
END;
$$;
COMMENT ON COLUMN attempts_history.result IS
    'What the attempt''s handler returned (JSON, at most 1 MiB; NULL: nothing); docs/composition.md.';

-- The view gains the column at its end (an open attempt has no result yet).
CREATE OR REPLACE VIEW attempts AS
SELECT id, run_id, attempt, worker_id, started_at, finished_at, outcome, error, error_type, result
FROM attempts_history
UNION ALL
SELECT NULL::bigint, r.id, r.attempts, r.locked_by, r.started_at, NULL::timestamptz, NULL::text,
       NULL::text, NULL::text, NULL::jsonb
FROM runs r
WHERE r.locked_by IS NOT NULL AND r.status IN ('running', 'cancelled');

-- A run's result for applications in any language: the result of its succeeded attempt
-- (NULL: not succeeded, returned nothing, or pruned). The same value `pgtick show` prints.
CREATE FUNCTION result(run_id bigint) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT a.result FROM attempts_history a
    WHERE a.run_id = result.run_id AND a.outcome = 'succeeded'
    ORDER BY a.attempt DESC
    LIMIT 1
$$;
COMMENT ON FUNCTION result(bigint) IS
    'The result of a run''s succeeded attempt (NULL: none); docs/composition.md.';
