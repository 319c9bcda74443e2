-- Chains (docs/composition.md, Chains): a run names what to enqueue when it ends, by outcome
-- (on_success, on_dead). The steps are stored with the run (runs.follow), and the statement
-- that records the run's outcome (succeed, fail, the reaper's reap_mark) enqueues them in its
-- own transaction through follow_up(): the next run exists exactly when the outcome does,
-- whatever retries, kills, lease losses and the reaper do. A run without steps pays a NULL
-- column in the row it already writes; the statements call follow_up() only for rows that
-- have steps.
--
--   runs.follow              {"on_success": [STEP...], "on_dead": [STEP...], "depth": N}
--   job_type_settings.follow the steps of a job type's runs ([job_types.X] on_success/on_dead
--                            in a daemon's config), taken by enqueue when none are given
--   schedules.follow         the steps of a schedule's occurrences ([schedules.X])
--   runs.batch_id            the batch a run is a member of (migration 0026)
--
-- A STEP is {"job_type", "payload", "max_attempts", "priority", "concurrency_key",
-- "on_success", "on_dead"}; the next run's payload is the step's with "previous": {run_id,
-- job_type, outcome, result, depth} of the run that ended. Each next run is enqueued with the
-- idempotency key pgtick.chain.<run id>.<outcome>.<step>: an operator's retry of a run whose
-- steps were enqueued does not enqueue them again while they are kept.
--
-- Daemons of the previous version keep running: nullable columns without defaults change the
-- catalog only; their statements do not read them (their runs' steps wait for a new daemon to
-- record an outcome). enqueue() gains two arguments, DEFAULT NULL: every existing call is
-- unchanged.
DO $$
DECLARE
    pause double precision := 0.05;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE runs ADD COLUMN follow jsonb, ADD COLUMN batch_id bigint;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(pause);
            pause := least(pause * 2, 2.0);
        END;
    END LOOP;
END;
$$;
ALTER TABLE job_type_settings ADD COLUMN follow jsonb;
ALTER TABLE schedules ADD COLUMN follow jsonb;
COMMENT ON COLUMN runs.follow IS
    'Chain steps enqueued when the run ends, by outcome (docs/composition.md); NULL: none.';
COMMENT ON COLUMN runs.batch_id IS 'The batch the run is a member of (NULL: none).';

-- A run's steps, refused with a message naming where and why, or returned in the normal
-- form: a list of step objects. The same rules as the daemon's (pgtick/scheduling/steps.py).
CREATE FUNCTION chain_steps(value jsonb, depth integer, path text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    items jsonb;
    item jsonb;
    step jsonb;
    out jsonb := '[]'::jsonb;
    i integer := 0;
    k text;
BEGIN
    IF value IS NULL OR value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF depth > 16 THEN
        RAISE EXCEPTION '%: steps nested deeper than 16', path
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    items := CASE WHEN jsonb_typeof(value) = 'array' THEN value ELSE jsonb_build_array(value) END;
    IF jsonb_array_length(items) > 16 THEN
        RAISE EXCEPTION '%: % steps, at most 16', path, jsonb_array_length(items)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR item IN SELECT e FROM jsonb_array_elements(items) AS e LOOP
        IF jsonb_typeof(item) = 'string' THEN
            item := jsonb_build_object('job_type', item);
        END IF;
        IF jsonb_typeof(item) <> 'object' THEN
            RAISE EXCEPTION '%[%]: expected a job type name or an object with job_type', path, i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR k IN SELECT jsonb_object_keys(item) LOOP
            IF k <> ALL (ARRAY['job_type', 'payload', 'max_attempts', 'priority',
                               'concurrency_key', 'on_success', 'on_dead']) THEN
                RAISE EXCEPTION '%[%]: unknown key "%"', path, i, k
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
        IF jsonb_typeof(item -> 'job_type') IS DISTINCT FROM 'string'
           OR length(item ->> 'job_type') NOT BETWEEN 1 AND 200 THEN
            RAISE EXCEPTION '%[%].job_type: expected a job type name of 1 to 200 characters', path, i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF item ? 'payload' AND jsonb_typeof(item -> 'payload') NOT IN ('object', 'null') THEN
            RAISE EXCEPTION '%[%].payload: expected an object', path, i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF (item ? 'max_attempts' AND jsonb_typeof(item -> 'max_attempts') <> 'null'
            AND (jsonb_typeof(item -> 'max_attempts') <> 'number'
                 OR (item ->> 'max_attempts')::numeric < 1))
           OR (item ? 'priority' AND jsonb_typeof(item -> 'priority') NOT IN ('number', 'null')) THEN
            RAISE EXCEPTION '%[%]: max_attempts must be a number of at least 1, priority a number', path, i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        step := jsonb_strip_nulls(jsonb_build_object(
            'job_type', item -> 'job_type',
            'payload', item -> 'payload',
            'max_attempts', item -> 'max_attempts',
            'priority', item -> 'priority',
            'concurrency_key', item -> 'concurrency_key',
            'on_success', chain_steps(item -> 'on_success', depth + 1, path || '[' || i || '].on_success'),
            'on_dead', chain_steps(item -> 'on_dead', depth + 1, path || '[' || i || '].on_dead')));
        out := out || jsonb_build_array(step);
        i := i + 1;
    END LOOP;
    RETURN out;
END;
$$;

-- A run's chain in its stored form (NULL: no steps), from the arguments of enqueue().
CREATE FUNCTION valid_follow(on_success jsonb, on_dead jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    follow jsonb;
BEGIN
    follow := jsonb_strip_nulls(jsonb_build_object(
        'on_success', chain_steps(on_success, 1, 'on_success'),
        'on_dead', chain_steps(on_dead, 1, 'on_dead')));
    IF follow = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF octet_length(follow::text) > 65536 THEN
        RAISE EXCEPTION 'chain: the steps take % bytes of JSON, over the bound of 65536',
            octet_length(follow::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN follow;
END;
$$;

-- One run, as enqueue() adds it, with its chain (given, or its job type's) and its batch;
-- run_id is the existing run when the key is taken (fresh false). The one writer of new runs
-- for enqueue(), follow_up() and batch_add() (0026).
CREATE FUNCTION enqueue_run(
    job_type        text,
    payload         jsonb,
    run_at          timestamptz,
    idempotency_key text,
    max_attempts    integer,
    priority        integer,
    concurrency_key text,
    traceparent     text,
    follow          jsonb,
    batch_id        bigint,
    OUT run_id      bigint,
    OUT fresh       boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    new_run_at timestamptz;
    type_priority integer;
    type_follow jsonb;
BEGIN
    IF enqueue_run.job_type IS NULL OR length(enqueue_run.job_type) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue: job_type must be 1 to 200 characters, got %',
            coalesce(length(enqueue_run.job_type)::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.payload IS NOT NULL AND jsonb_typeof(enqueue_run.payload) <> 'object' THEN
        RAISE EXCEPTION 'enqueue: payload must be a JSON object, got a JSON %',
            jsonb_typeof(enqueue_run.payload)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.max_attempts IS NOT NULL AND enqueue_run.max_attempts < 1 THEN
        RAISE EXCEPTION 'enqueue: max_attempts must be at least 1, got %', enqueue_run.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.priority IS NOT NULL AND abs(enqueue_run.priority) > 1000000 THEN
        RAISE EXCEPTION 'enqueue: priority must be between -1000000 and 1000000, got %',
            enqueue_run.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.idempotency_key IS NOT NULL THEN
        SELECT t.run_id, t.fresh INTO run_id, fresh
        FROM take_idempotency_keys(ARRAY[enqueue_run.idempotency_key]) AS t;
        IF NOT fresh THEN
            RETURN;
        END IF;
    ELSE
        run_id := nextval('runs_id_seq');
        fresh := true;
    END IF;
    SELECT s.priority, s.follow INTO type_priority, type_follow
    FROM job_type_settings s WHERE s.job_type = enqueue_run.job_type;
    INSERT INTO runs (id, job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key, traceparent, follow, batch_id)
    VALUES (run_id, enqueue_run.job_type, coalesce(enqueue_run.payload, '{}'::jsonb),
            coalesce(enqueue_run.run_at, now()), enqueue_run.idempotency_key,
            enqueue_run.max_attempts, coalesce(enqueue_run.priority, type_priority, 0),
            enqueue_run.concurrency_key, valid_traceparent(enqueue_run.traceparent),
            coalesce(enqueue_run.follow, type_follow), enqueue_run.batch_id)
    RETURNING runs.run_at INTO new_run_at;
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue_run.job_type);
    PERFORM pg_notify(current_schema(), enqueue_run.job_type);
END;
$$;

-- enqueue() as 0018's, with a chain: on_success and on_dead (a job type name, a step object,
-- or an array of them). Its signature changes, so it is created anew with the old one's
-- privileges (as 0018 did); the new functions get the same.
ALTER FUNCTION enqueue(text, jsonb, timestamptz, text, integer, integer, text, text)
    RENAME TO enqueue_before_0025;

CREATE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    traceparent     text DEFAULT NULL,
    on_success      jsonb DEFAULT NULL,
    on_dead         jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT e.run_id FROM enqueue_run(job_type, payload, run_at, idempotency_key, max_attempts,
                                     priority, concurrency_key, traceparent,
                                     valid_follow(on_success, on_dead), NULL) AS e
$$;

-- The steps of a run that ended with `outcome` ('succeeded' or 'dead'), enqueued: called by
-- the statements that record outcomes, in their transaction, for the rows that have steps.
-- Returns how many runs it enqueued (a step whose key is taken, already enqueued, counts 0).
-- Past 100 runs one after another (a cycle of job types' chains across services, which one
-- config cannot make) the next run is written dead, with the reason, instead of queued.
CREATE FUNCTION follow_up(run_id bigint, job_type text, outcome text, follow jsonb,
                          result jsonb) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    steps jsonb := follow -> CASE outcome WHEN 'succeeded' THEN 'on_success' ELSE 'on_dead' END;
    depth integer := coalesce((follow ->> 'depth')::integer, 0) + 1;
    step jsonb;
    i integer := 0;
    n integer := 0;
    next_follow jsonb;
    next_payload jsonb;
    made record;
BEGIN
    IF steps IS NULL THEN
        RETURN 0;
    END IF;
    FOR step IN SELECT e FROM jsonb_array_elements(steps) AS e LOOP
        i := i + 1;
        next_follow := jsonb_strip_nulls(jsonb_build_object(
            'on_success', step -> 'on_success', 'on_dead', step -> 'on_dead'));
        IF next_follow = '{}'::jsonb THEN
            SELECT s.follow INTO next_follow FROM job_type_settings s
            WHERE s.job_type = step ->> 'job_type';
        END IF;
        IF next_follow IS NOT NULL THEN
            next_follow := next_follow || jsonb_build_object('depth', depth);
        END IF;
        next_payload := coalesce(step -> 'payload', '{}'::jsonb) || jsonb_build_object(
            'previous', jsonb_build_object('run_id', run_id, 'job_type', job_type,
                                           'outcome', outcome, 'result', result,
                                           'depth', depth));
        IF depth > 100 THEN
            INSERT INTO runs (job_type, payload, status, finished_at, last_error, error_type,
                              idempotency_key)
            SELECT step ->> 'job_type', next_payload, 'dead', now(),
                   'chain: 100 runs one after another; not run (a cycle of chains?)', 'chain_depth',
                   NULL;
            n := n + 1;
            CONTINUE;
        END IF;
        SELECT * INTO made FROM enqueue_run(
            step ->> 'job_type', next_payload, NULL,
            'pgtick.chain.' || run_id || '.' || outcome || '.' || i,
            (step ->> 'max_attempts')::integer, (step ->> 'priority')::integer,
            step ->> 'concurrency_key', NULL, next_follow, NULL);
        IF made.fresh THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END;
$$;

-- Privileges: whoever could execute the old enqueue() may execute the new functions (as
-- 0018); then the old one goes.
DO $$
DECLARE
    old_acl aclitem[];
    fn text;
    g record;
BEGIN
    SELECT coalesce(p.proacl, acldefault('f', p.proowner)) INTO old_acl
    FROM pg_proc p
    WHERE p.oid = 'enqueue_before_0025(text, jsonb, timestamptz, text, integer, integer, text, text)'::regprocedure;
    FOREACH fn IN ARRAY ARRAY[
        'enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)',
        'enqueue_run(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, bigint)',
        'valid_follow(jsonb, jsonb)',
        'chain_steps(jsonb, integer, text)',
        'follow_up(bigint, text, text, jsonb, jsonb)',
        'result(bigint)'
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

DROP FUNCTION enqueue_before_0025(text, jsonb, timestamptz, text, integer, integer, text, text);
