-- The trace that enqueued a run, stored with it (docs/tracing.md): a W3C traceparent
-- ("00-<trace id>-<span id>-<flags>"), or NULL. Daemons with tracing on make each attempt's
-- span a child of it; every daemon hands it on to handlers (ctx.traceparent) and commands
-- (TRACEPARENT) and writes its ids into a run's log lines.
--
-- Daemons of the previous version keep running: a nullable column without a default is a
-- change of the catalog only (no row is rewritten, on the parent and every partition, the
-- partitions maintain_partitions creates later included), their statements name the columns
-- they read and write, and their inserts leave it NULL. The exclusive lock it takes on runs
-- and its partitions lasts an instant; as in 0017, a lock request waits at most 200 ms in the
-- queue and is tried again, so an open transaction on runs (an operator's psql) never holds up
-- the traffic behind the migration's lock request.
DO $$
DECLARE
    pause double precision := 0.05;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE runs ADD COLUMN traceparent text;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(pause);
            pause := least(pause * 2, 2.0);
        END;
    END LOOP;
END;
$$;
COMMENT ON COLUMN runs.traceparent IS
    'W3C traceparent of the span that enqueued the run (NULL: none); see docs/tracing.md.';

-- A traceparent as stored: the value if it is a valid W3C traceparent of version 00 (or the
-- version-00 part of a later version's), else NULL. The W3C rule for a receiver: a malformed
-- header starts a new trace rather than failing the request, so a bad value passed through
-- from a client's request never refuses an enqueue.
CREATE FUNCTION valid_traceparent(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
    SELECT CASE
        WHEN value ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
             AND left(value, 2) <> 'ff'
             AND (left(value, 2) <> '00' OR length(value) = 55)
             AND substr(value, 4, 32) <> repeat('0', 32)
             AND substr(value, 37, 16) <> repeat('0', 16)
        THEN left(value, 55)
    END
$$;

-- enqueue() takes the enqueuing trace's context as a last argument, DEFAULT NULL: every
-- existing caller, positional or named, calls the new function unchanged. Its signature
-- changes, so it is created anew; the old one is renamed first and dropped last, after its
-- privileges (whoever may EXECUTE it, PUBLIC or a locked-down list) are copied to the new
-- one, so no role needs `pgtick grants` again. Otherwise the body is 0015's.
ALTER FUNCTION enqueue(text, jsonb, timestamptz, text, integer, integer, text)
    RENAME TO enqueue_before_0018;

CREATE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    traceparent     text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    is_fresh boolean;
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
        SELECT t.run_id, t.fresh INTO new_id, is_fresh
        FROM take_idempotency_keys(ARRAY[enqueue.idempotency_key]) AS t;
        IF NOT is_fresh THEN
            RETURN new_id;
        END IF;
    ELSE
        new_id := nextval('runs_id_seq');
    END IF;
    INSERT INTO runs (id, job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key, traceparent)
    VALUES (new_id, enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts,
            coalesce(enqueue.priority,
                     (SELECT s.priority FROM job_type_settings s
                      WHERE s.job_type = enqueue.job_type), 0),
            enqueue.concurrency_key, valid_traceparent(enqueue.traceparent))
    RETURNING runs.run_at INTO new_run_at;
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue.job_type);
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;

-- The old function's privileges, exactly: its ACL (NULL: PostgreSQL's default, EXECUTE for
-- PUBLIC) replaces whatever the new one got from the default privileges. valid_traceparent
-- gets the same, as enqueue calls it as its caller.
DO $$
DECLARE
    old_acl aclitem[];
    fn text;
    g record;
BEGIN
    SELECT coalesce(p.proacl, acldefault('f', p.proowner)) INTO old_acl
    FROM pg_proc p
    WHERE p.oid = 'enqueue_before_0018(text, jsonb, timestamptz, text, integer, integer, text)'::regprocedure;
    FOREACH fn IN ARRAY ARRAY[
        'enqueue(text, jsonb, timestamptz, text, integer, integer, text, text)',
        'valid_traceparent(text)'
    ] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
        FOR g IN SELECT DISTINCT a.grantee FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.oid = fn::regprocedure AND a.grantee <> p.proowner LOOP
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %s', fn, g.grantee::regrole::text);
        END LOOP;
        FOR g IN SELECT a.grantee, a.is_grantable FROM aclexplode(old_acl) a
                 WHERE a.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', fn,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE g.grantee::regrole::text END,
                           CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END;
$$;

DROP FUNCTION enqueue_before_0018(text, jsonb, timestamptz, text, integer, integer, text);
