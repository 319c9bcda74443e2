-- Schedules created at runtime take chains and `after` as a config's do (docs/composition.md,
-- docs/operations/runtime.md): create_schedule and update_schedule gain `follow` (the chain of
-- its runs: {"on_success": ..., "on_dead": ...}, as runs.follow) and `after_on` ({"schedule",
-- "deadline_seconds", "missed"}, as schedules.after_on), last, with defaults, so a call of the
-- earlier signature (by position or by name) still resolves. In update_schedule NULL leaves
-- the setting and JSON null clears it. The functions are replaced (their signature changes),
-- and whoever could execute the earlier ones can execute these.

CREATE TEMPORARY TABLE schedule_function_grantees ON COMMIT DROP AS
SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                     ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee
FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.oid = 'create_schedule(text, text, text, text, jsonb, text, integer, text, text, '
              'float8, integer, integer, text, text)'::regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

DROP FUNCTION create_schedule(text, text, text, text, jsonb, text, integer, text, text, float8,
                              integer, integer, text, text);
DROP FUNCTION update_schedule(text, text, text, text, jsonb, text, integer, text, text, float8,
                              integer, integer, text, text);

CREATE FUNCTION create_schedule(name text, job_type text, cron text, timezone text DEFAULT 'UTC',
                                payload jsonb DEFAULT '{}', catchup text DEFAULT 'latest',
                                catchup_limit integer DEFAULT 100, overlap text DEFAULT 'skip',
                                on_pause text DEFAULT 'hold', jitter_seconds float8 DEFAULT 0,
                                max_attempts integer DEFAULT NULL, priority integer DEFAULT 0,
                                actor text DEFAULT NULL, via text DEFAULT 'sql',
                                follow jsonb DEFAULT NULL, after_on jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO schedules AS s (name, job_type, payload, cron, timezone, max_attempts, catchup,
                                catchup_limit, overlap, jitter_seconds, priority, on_pause,
                                service, materialized_until, follow, after_on)
    VALUES (create_schedule.name, create_schedule.job_type, coalesce(create_schedule.payload, '{}'),
            create_schedule.cron, coalesce(create_schedule.timezone, 'UTC'),
            create_schedule.max_attempts, coalesce(create_schedule.catchup, 'latest'),
            coalesce(create_schedule.catchup_limit, 100), coalesce(create_schedule.overlap, 'skip'),
            coalesce(create_schedule.jitter_seconds, 0), coalesce(create_schedule.priority, 0),
            coalesce(create_schedule.on_pause, 'hold'), NULL, now(),
            nullif(create_schedule.follow, 'null'), nullif(create_schedule.after_on, 'null'))
    ON CONFLICT ON CONSTRAINT schedules_name_key DO UPDATE
    SET job_type = excluded.job_type, payload = excluded.payload, cron = excluded.cron,
        timezone = excluded.timezone, max_attempts = excluded.max_attempts,
        catchup = excluded.catchup, catchup_limit = excluded.catchup_limit,
        overlap = excluded.overlap, jitter_seconds = excluded.jitter_seconds,
        priority = excluded.priority, on_pause = excluded.on_pause, follow = excluded.follow,
        after_on = excluded.after_on, paused = false,
        paused_reason = NULL, paused_detail = NULL, materialized_until = now(),
        next_due_at = NULL, updated_at = now()
    WHERE s.service IS NULL AND s.paused_reason = 'removed'
    RETURNING s.id INTO new_id;
    IF new_id IS NULL THEN
        RAISE EXCEPTION 'schedule % exists', create_schedule.name
            USING ERRCODE = '23505',
                  HINT = 'pgtick schedules edit changes a schedule created at runtime; a '
                         'schedule of a config is changed in that config';
    END IF;
    PERFORM record_action('schedule_add', create_schedule.name,
                          jsonb_strip_nulls(jsonb_build_object(
                              'job_type', job_type, 'cron', cron, 'timezone', timezone,
                              'payload', payload, 'catchup', catchup, 'overlap', overlap,
                              'on_pause', on_pause, 'jitter_seconds', jitter_seconds,
                              'max_attempts', max_attempts, 'priority', priority,
                              'follow', nullif(follow, 'null'),
                              'after', nullif(after_on, 'null'))),
                          actor, via);
    RETURN new_id;
END;
$$;

-- Change a database-owned schedule (a NULL argument leaves that setting). The next tick plans
-- it afresh; occurrences already materialized stay. False: no such schedule, or it belongs to
-- a service's config (changed there, not here).
CREATE FUNCTION update_schedule(name text, job_type text DEFAULT NULL, cron text DEFAULT NULL,
                                timezone text DEFAULT NULL, payload jsonb DEFAULT NULL,
                                catchup text DEFAULT NULL, catchup_limit integer DEFAULT NULL,
                                overlap text DEFAULT NULL, on_pause text DEFAULT NULL,
                                jitter_seconds float8 DEFAULT NULL,
                                max_attempts integer DEFAULT NULL, priority integer DEFAULT NULL,
                                actor text DEFAULT NULL, via text DEFAULT 'sql',
                                follow jsonb DEFAULT NULL, after_on jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    changed boolean;
BEGIN
    UPDATE schedules s
    SET job_type = coalesce(update_schedule.job_type, s.job_type),
        cron = coalesce(update_schedule.cron, s.cron),
        timezone = coalesce(update_schedule.timezone, s.timezone),
        payload = coalesce(update_schedule.payload, s.payload),
        catchup = coalesce(update_schedule.catchup, s.catchup),
        catchup_limit = coalesce(update_schedule.catchup_limit, s.catchup_limit),
        overlap = coalesce(update_schedule.overlap, s.overlap),
        on_pause = coalesce(update_schedule.on_pause, s.on_pause),
        jitter_seconds = coalesce(update_schedule.jitter_seconds, s.jitter_seconds),
        max_attempts = coalesce(update_schedule.max_attempts, s.max_attempts),
        priority = coalesce(update_schedule.priority, s.priority),
        follow = CASE WHEN update_schedule.follow IS NULL THEN s.follow
                      ELSE nullif(update_schedule.follow, 'null') END,
        after_on = CASE WHEN update_schedule.after_on IS NULL THEN s.after_on
                        ELSE nullif(update_schedule.after_on, 'null') END,
        -- A schedule paused as invalid gets another chance with the new definition.
        paused = s.paused AND s.paused_reason IS DISTINCT FROM 'invalid',
        paused_reason = nullif(s.paused_reason, 'invalid'),
        paused_detail = CASE WHEN s.paused_reason = 'invalid' THEN NULL ELSE s.paused_detail END,
        next_due_at = NULL, updated_at = now()
    WHERE s.name = update_schedule.name AND s.service IS NULL
      AND s.paused_reason IS DISTINCT FROM 'removed'
    RETURNING true INTO changed;
    IF changed THEN
        PERFORM record_action('schedule_edit', update_schedule.name,
                              jsonb_strip_nulls(jsonb_build_object(
                                  'job_type', job_type, 'cron', cron, 'timezone', timezone,
                                  'payload', payload, 'catchup', catchup, 'overlap', overlap,
                                  'on_pause', on_pause, 'jitter_seconds', jitter_seconds,
                                  'max_attempts', max_attempts, 'priority', priority,
                                  'follow', follow, 'after', after_on)),
                              actor, via);
    END IF;
    RETURN coalesce(changed, false);
END;
$$;

REVOKE ALL ON FUNCTION create_schedule(text, text, text, text, jsonb, text, integer, text, text,
                                       float8, integer, integer, text, text, jsonb, jsonb)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION update_schedule(text, text, text, text, jsonb, text, integer, text, text,
                                       float8, integer, integer, text, text, jsonb, jsonb)
    FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT grantee FROM schedule_function_grantees LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION '
            || 'create_schedule(text, text, text, text, jsonb, text, integer, text, text, '
            || 'float8, integer, integer, text, text, jsonb, jsonb), '
            || 'update_schedule(text, text, text, text, jsonb, text, integer, text, text, '
            || 'float8, integer, integer, text, text, jsonb, jsonb) TO ' || g.grantee;
    END LOOP;
END;
$$;
