-- pgtick: no-transaction
-- Built with CREATE INDEX CONCURRENTLY, outside a transaction, so that daemons of the previous
-- version keep claiming, finishing and enqueueing while the indexes build on a large table (a
-- plain CREATE INDEX would block every write to runs for the whole build). migrate.py runs the
-- statements of a "no-transaction" file one by one; each is safe to run again: an index left
-- invalid by an interrupted build is dropped and built afresh, and the file is recorded only
-- once every statement succeeded.

-- `pgtick runs --type T`: the newest runs of one job type, one page at a time (keyset on id),
-- without walking the primary key past every other type's rows.
DROP INDEX CONCURRENTLY IF EXISTS runs_job_type_id_idx;
CREATE INDEX CONCURRENTLY runs_job_type_id_idx ON runs (job_type, id);

-- `pgtick show RUN_ID`: the side-effect keys a run recorded, without reading all of effects.
DROP INDEX CONCURRENTLY IF EXISTS effects_run_id_idx;
CREATE INDEX CONCURRENTLY effects_run_id_idx ON effects (run_id);

-- enqueue() refuses, with a message naming the argument, what no daemon could run: a job type
-- that is empty or longer than 200 characters (the longest name a config or @pgtick.job may
-- declare) and a payload that is not a JSON object. Replacing a function takes no lock on runs,
-- so callers of the old definition are not held up.
CREATE OR REPLACE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
BEGIN
    IF enqueue.job_type IS NULL OR length(enqueue.job_type) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue: job_type must be 1 to 200 characters, got %',
            coalesce(length(enqueue.job_type)::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.payload IS NOT NULL AND jsonb_typeof(enqueue.payload) <> 'object' THEN
        RAISE EXCEPTION 'enqueue: payload must be a JSON object, got a JSON %',
            jsonb_typeof(enqueue.payload)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'enqueue: max_attempts must be at least 1, got %', enqueue.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.idempotency_key IS NOT NULL THEN
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO runs (job_type, payload, run_at, idempotency_key, max_attempts)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        -- A concurrent transaction inserted the same key first and has committed.
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;
