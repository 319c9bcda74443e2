-- The audit log (docs/operations/runtime.md, "Audit log"): every operator action, from the
-- CLI, the console or the operators' SQL functions, with who (the name the caller gives:
-- user@host for the CLI, the console session's name; and the database role), what, when, its
-- arguments and the runs it affected. Written only through record_action (SECURITY DEFINER):
-- the roles that act read it and append to it through the function, and nobody updates it.
-- Kept like runs (retention.audit, default 90 days): prune_audit_log deletes the rows older
-- than that, a day's worth at a time, from the daemons' retention pass.
-- A new table nothing earlier reads: daemons of the previous version run on beside it.
CREATE TABLE audit_log (
    id             bigserial PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    actor          text NOT NULL,
    via            text NOT NULL,
    db_role        text NOT NULL DEFAULT session_user,
    action         text NOT NULL,
    target         text,
    args           jsonb NOT NULL DEFAULT '{}',
    runs_affected  bigint,
    run_ids        bigint[]
);
CREATE INDEX audit_log_at_idx ON audit_log (at);
COMMENT ON TABLE audit_log IS
    'Every operator action: who (actor, via, db_role), what (action, target, args), when, and '
    'the runs it affected (run_ids: the first 1000).';

-- One row; its id. `run_ids` is cut to its first 1000 (runs_affected says how many there were).
CREATE FUNCTION record_action(action text, target text, args jsonb, actor text DEFAULT NULL,
                              via text DEFAULT 'sql', runs_affected bigint DEFAULT NULL,
                              run_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO audit_log (actor, via, action, target, args, runs_affected, run_ids)
    VALUES (coalesce(nullif(actor, ''), session_user::text), coalesce(via, 'sql'), action,
            target, coalesce(args, '{}'), runs_affected, run_ids[1:1000])
    RETURNING id;
$$;

-- Delete the rows older than `older_than_seconds`, at most `batch` of them; how many went.
CREATE FUNCTION prune_audit_log(older_than_seconds float8, batch integer DEFAULT 10000)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH gone AS (
        DELETE FROM audit_log
        WHERE id IN (SELECT id FROM audit_log
                     WHERE at < now() - make_interval(secs => older_than_seconds)
                     ORDER BY at LIMIT batch)
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;

-- The control functions of 0019, each recording its call.
CREATE OR REPLACE FUNCTION pause_job_type(job_type text, reason text DEFAULT NULL, actor text DEFAULT NULL,
                               via text DEFAULT 'sql')
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    changed boolean;
BEGIN
    INSERT INTO job_type_controls AS c (job_type, paused, paused_at, paused_by, paused_reason)
    VALUES (pause_job_type.job_type, true, now(), control_actor(actor), reason)
    ON CONFLICT ON CONSTRAINT job_type_controls_pkey DO UPDATE
    SET paused = true, paused_at = now(), paused_by = excluded.paused_by,
        paused_reason = excluded.paused_reason, updated_at = now()
    WHERE NOT c.paused
    RETURNING true INTO changed;
    PERFORM record_action('pause', pause_job_type.job_type,
                          jsonb_build_object('reason', reason, 'changed', coalesce(changed, false)),
                          actor, via);
    PERFORM pg_notify(current_schema(), '!controls');
    RETURN coalesce(changed, false);
END;
$$;

CREATE OR REPLACE FUNCTION resume_job_type(job_type text, actor text DEFAULT NULL, via text DEFAULT 'sql')
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    changed boolean;
BEGIN
    UPDATE job_type_controls c
    SET paused = false, paused_at = NULL, paused_by = NULL, paused_reason = NULL,
        updated_at = now()
    WHERE c.job_type = resume_job_type.job_type AND c.paused
    RETURNING true INTO changed;
    PERFORM record_action('resume', resume_job_type.job_type,
                          jsonb_build_object('changed', coalesce(changed, false)), actor, via);
    PERFORM pg_notify(current_schema(), '!controls');
    PERFORM pg_notify(current_schema(), '!rescan');
    PERFORM pg_notify(current_schema(), resume_job_type.job_type);
    RETURN coalesce(changed, false);
END;
$$;

CREATE OR REPLACE FUNCTION set_job_type_limits(job_type text, max_running integer DEFAULT NULL,
                                    max_running_per_key integer DEFAULT NULL,
                                    rate integer DEFAULT NULL, rate_window float8 DEFAULT NULL,
                                    rate_per_key integer DEFAULT NULL,
                                    rate_per_key_window float8 DEFAULT NULL,
                                    actor text DEFAULT NULL, via text DEFAULT 'sql')
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF (rate IS NULL) <> (rate_window IS NULL)
       OR (rate_per_key IS NULL) <> (rate_per_key_window IS NULL) THEN
        RAISE EXCEPTION 'a rate needs its window (seconds), and a window its rate'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO job_type_controls AS c (job_type, max_running, max_running_per_key, rate,
                                        rate_window, rate_per_key, rate_per_key_window,
                                        limits_at, limits_by)
    VALUES (set_job_type_limits.job_type, max_running, max_running_per_key, rate, rate_window,
            rate_per_key, rate_per_key_window, now(), control_actor(actor))
    ON CONFLICT ON CONSTRAINT job_type_controls_pkey DO UPDATE
    SET max_running = coalesce(excluded.max_running, c.max_running),
        max_running_per_key = coalesce(excluded.max_running_per_key, c.max_running_per_key),
        rate = coalesce(excluded.rate, c.rate),
        rate_window = coalesce(excluded.rate_window, c.rate_window),
        rate_per_key = coalesce(excluded.rate_per_key, c.rate_per_key),
        rate_per_key_window = coalesce(excluded.rate_per_key_window, c.rate_per_key_window),
        limits_at = now(), limits_by = excluded.limits_by, updated_at = now();
    PERFORM record_action('limits', set_job_type_limits.job_type,
                          jsonb_strip_nulls(jsonb_build_object(
                              'max_running', max_running,
                              'max_running_per_key', max_running_per_key,
                              'rate', rate, 'rate_window', rate_window,
                              'rate_per_key', rate_per_key,
                              'rate_per_key_window', rate_per_key_window)),
                          actor, via);
    PERFORM pg_notify(current_schema(), '!controls');
    -- A raised limit leaves room: claim now.
    PERFORM pg_notify(current_schema(), set_job_type_limits.job_type);
END;
$$;

CREATE OR REPLACE FUNCTION reset_job_type_limits(job_type text, actor text DEFAULT NULL,
                                      via text DEFAULT 'sql')
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    changed boolean;
BEGIN
    UPDATE job_type_controls c
    SET max_running = NULL, max_running_per_key = NULL, rate = NULL, rate_window = NULL,
        rate_per_key = NULL, rate_per_key_window = NULL, limits_at = NULL, limits_by = NULL,
        updated_at = now()
    WHERE c.job_type = reset_job_type_limits.job_type
      AND (c.max_running, c.max_running_per_key, c.rate, c.rate_per_key)
          IS DISTINCT FROM (NULL::integer, NULL::integer, NULL::integer, NULL::integer)
    RETURNING true INTO changed;
    PERFORM record_action('limits_reset', reset_job_type_limits.job_type,
                          jsonb_build_object('changed', coalesce(changed, false)), actor, via);
    PERFORM pg_notify(current_schema(), '!controls');
    PERFORM pg_notify(current_schema(), reset_job_type_limits.job_type);
    RETURN coalesce(changed, false);
END;
$$;

REVOKE ALL ON FUNCTION record_action(text, text, jsonb, text, text, bigint, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION prune_audit_log(float8, integer) FROM PUBLIC;
DO $$
DECLARE
    g record;
    who text;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'UPDATE'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        who := CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
        EXECUTE 'GRANT SELECT ON audit_log TO ' || who;
        EXECUTE 'GRANT EXECUTE ON FUNCTION record_action(text, text, jsonb, text, text, bigint, '
            || 'bigint[]), prune_audit_log(float8, integer) TO ' || who;
    END LOOP;
END;
$$;
