-- Flow control (docs/flow-control.md): a priority and a concurrency key per run, and the
-- starts of rate limited job types. Adding a column with a constant default rewrites nothing (PostgreSQL 11+),
-- so every existing run keeps its row and gets priority 0 (the default) and no key.
ALTER TABLE runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN concurrency_key text;
-- The priority a schedule's runs are created with (its own, else its job type's).
ALTER TABLE schedules ADD COLUMN priority integer NOT NULL DEFAULT 0;

-- Each job type's default priority, as the config of the daemons that handle it says (each
-- writes its own on start): enqueue() gives it to a run enqueued without a priority, from any
-- language. A job type without a row: 0.
CREATE TABLE job_type_settings (
    job_type            text PRIMARY KEY,
    priority            integer NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- One row per start of a run of a rate-limited job type (rate, rate_per_key): the claim
-- counts those inside the window, and removes those older than it, under the job type's
-- transaction-level advisory lock. Rows of types without a rate are never written.
CREATE TABLE rate_starts (
    job_type            text NOT NULL,
    concurrency_key     text,
    started_at          timestamptz NOT NULL
);
CREATE INDEX rate_starts_idx ON rate_starts (job_type, started_at);

-- enqueue() takes a priority (NULL: the job type's default) and a concurrency key; it refuses
-- what 0004's refused, and a priority beyond one million either way. The old five-argument
-- function goes: callers that named or positioned those five arguments call the new one
-- unchanged. A role granted EXECUTE on the old one needs `pgtick grants` again (PUBLIC keeps
-- PostgreSQL's default EXECUTE on the new one).
DROP FUNCTION enqueue(text, jsonb, timestamptz, text, integer);
CREATE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL
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
    IF enqueue.priority IS NOT NULL AND abs(enqueue.priority) > 1000000 THEN
        RAISE EXCEPTION 'enqueue: priority must be between -1000000 and 1000000, got %',
            enqueue.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.idempotency_key IS NOT NULL THEN
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO runs (job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts,
            coalesce(enqueue.priority,
                     (SELECT s.priority FROM job_type_settings s
                      WHERE s.job_type = enqueue.job_type), 0),
            enqueue.concurrency_key)
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
