-- enqueue() also announces the due second of the run it inserts ("!due SECONDS JOB_TYPE"),
-- delivered at commit like its plain NOTIFY: a claimer whose keyset lower bound (core/keyset.py)
-- is already past a run committed late by a long transaction, or enqueued due in the past,
-- lowers that bound to it instead of probing the index below the bound. Same signature and
-- refusals as 0007's; CREATE OR REPLACE keeps every grant on it.
CREATE OR REPLACE FUNCTION enqueue(
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
    new_run_at timestamptz;
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
    RETURNING id, runs.run_at INTO new_id, new_run_at;
    IF new_id IS NULL THEN
        -- A concurrent transaction inserted the same key first and has committed.
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;
    -- The run's due second first, for claimers whose scan already passed it (a long
    -- transaction commits it late; daemons of earlier versions ignore payloads starting with
    -- "!"), then the wake-up: delivered in this order, the claim it wakes starts low enough.
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue.job_type);
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;
