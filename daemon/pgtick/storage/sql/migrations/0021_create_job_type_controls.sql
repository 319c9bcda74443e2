-- Operating at runtime (docs/operations/runtime.md): a job type paused fleet-wide, and its
-- flow-control limits changed without a deploy. One row per job type an operator touched;
-- a job type without a row runs as its daemons' configs say. A limit column that is NULL is
-- the config's (no override); `pgtick limits TYPE --reset` clears them all.
--
-- The daemons read this table when a `!controls` NOTIFY says it changed (the functions below
-- send it in their transaction), when their LISTEN connection (re)connects, and at their poll
-- interval when they have no LISTEN connection: a paused type is then left out of the job
-- types their claims name (the claim itself is unchanged). claim_limited and flow_state also
-- read a limited type's row in the statement (a primary-key probe of this tiny table), so a
-- changed limit holds from the next claim on, whatever a daemon last read.
-- A new table nothing earlier reads: daemons of the previous version run on beside it (they
-- neither see a pause nor a live limit).
CREATE TABLE job_type_controls (
    job_type             text PRIMARY KEY,
    paused               boolean NOT NULL DEFAULT false,
    paused_at            timestamptz,
    paused_by            text,
    paused_reason        text,
    max_running          integer CHECK (max_running >= 1),
    max_running_per_key  integer CHECK (max_running_per_key >= 1),
    rate                 integer CHECK (rate >= 1),
    rate_window          float8 CHECK (rate_window > 0),
    rate_per_key         integer CHECK (rate_per_key >= 1),
    rate_per_key_window  float8 CHECK (rate_per_key_window > 0),
    limits_at            timestamptz,
    limits_by            text,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (rate_window IS NULL)),
    CHECK ((rate_per_key IS NULL) = (rate_per_key_window IS NULL))
);
COMMENT ON TABLE job_type_controls IS
    'Per job type: paused fleet-wide (who, when, why) and limits overriding the config.';

-- What a schedule does while its job type is paused: 'hold' materializes its occurrences as
-- queued runs (they start after the resume), 'skip' records them as skipped. A constant
-- default: no rewrite, and the previous version's inserts get it.
ALTER TABLE schedules ADD COLUMN on_pause text NOT NULL DEFAULT 'hold'
    CHECK (on_pause IN ('hold', 'skip'));

-- Who did it, as recorded: the name given (the CLI gives user@host, the console its session's
-- name), else the database role that called. `via` in the functions below: cli, console, or
-- sql (the default: an application or a person calling the function). Each call is recorded
-- in the audit log (record_action, migration 0019).
CREATE FUNCTION control_actor(actor text) RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT coalesce(nullif(actor, ''), session_user::text) $$;

-- Pause a job type: no daemon claims its runs (they stay queued) until resume_job_type; its
-- schedules hold or skip (schedules.on_pause, above). True if it was not paused.
-- SECURITY DEFINER: callers need EXECUTE, not rights on the table.
CREATE FUNCTION pause_job_type(job_type text, reason text DEFAULT NULL, actor text DEFAULT NULL,
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

-- Resume a paused job type: its runs are claimed again at once (the NOTIFYs wake the daemons
-- that handle it). True if it was paused.
CREATE FUNCTION resume_job_type(job_type text, actor text DEFAULT NULL, via text DEFAULT 'sql')
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

-- Override some of a job type's limits (a NULL argument leaves that limit as it is; a rate is
-- starts per window seconds). Effective at the next claim of every daemon.
CREATE FUNCTION set_job_type_limits(job_type text, max_running integer DEFAULT NULL,
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

-- Back to the config's limits. True if some limit was overridden.
CREATE FUNCTION reset_job_type_limits(job_type text, actor text DEFAULT NULL,
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

-- Operators' functions: not for PUBLIC. Whoever may change runs (UPDATE on runs: the roles
-- `pgtick grants` set up, which retry and cancel) may call them, and read the table.
REVOKE ALL ON FUNCTION pause_job_type(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION resume_job_type(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION set_job_type_limits(text, integer, integer, integer, float8, integer,
                                           float8, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION reset_job_type_limits(text, text, text) FROM PUBLIC;
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
        EXECUTE 'GRANT SELECT ON job_type_controls TO ' || who;
        EXECUTE 'GRANT EXECUTE ON FUNCTION pause_job_type(text, text, text, text), '
            || 'resume_job_type(text, text, text), '
            || 'set_job_type_limits(text, integer, integer, integer, float8, integer, float8, '
            || 'text, text), reset_job_type_limits(text, text, text) TO ' || who;
    END LOOP;
END;
$$;
