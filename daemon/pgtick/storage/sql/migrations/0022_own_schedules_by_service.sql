-- Schedules owned per service (docs/scheduling.md, "Who owns a schedule"): every daemon belongs
-- to a named service (worker.service, default "default"), and its config sync creates, updates
-- and pauses only the schedules of its service. A schedule whose service is NULL is owned by
-- the database: created at runtime (`pgtick schedules add`, create_schedule() below) and never
-- touched by any config sync.
-- Every schedule that exists came from a config: they belong to the default service (a
-- constant default: no rewrite). The default also serves the daemons of the previous version
-- during a rolling deploy, whose sync inserts without naming a service; they still pause the
-- vanished schedules of their job types whatever their owner (upgrade every daemon before
-- creating schedules at runtime).
ALTER TABLE schedules ADD COLUMN service text DEFAULT 'default';
COMMENT ON COLUMN schedules.service IS
    'The service whose config sync owns it (worker.service); NULL: owned by the database.';

-- A schedule owned by the database, created by an operator or an application. Its name must
-- be free, or be a removed database-owned schedule's (which comes back, from now). The cron
-- and time zone are checked by the daemons' ticker: one they cannot compute is paused as
-- invalid with the reason (`pgtick schedules` shows it); `pgtick schedules add` checks first.
-- Its id. SECURITY DEFINER: callers need EXECUTE, not rights on schedules.
CREATE FUNCTION create_schedule(name text, job_type text, cron text, timezone text DEFAULT 'UTC',
                                payload jsonb DEFAULT '{}', catchup text DEFAULT 'latest',
                                catchup_limit integer DEFAULT 100, overlap text DEFAULT 'skip',
                                on_pause text DEFAULT 'hold', jitter_seconds float8 DEFAULT 0,
                                max_attempts integer DEFAULT NULL, priority integer DEFAULT 0,
                                actor text DEFAULT NULL, via text DEFAULT 'sql')
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
                                service, materialized_until)
    VALUES (create_schedule.name, create_schedule.job_type, coalesce(create_schedule.payload, '{}'),
            create_schedule.cron, coalesce(create_schedule.timezone, 'UTC'),
            create_schedule.max_attempts, coalesce(create_schedule.catchup, 'latest'),
            coalesce(create_schedule.catchup_limit, 100), coalesce(create_schedule.overlap, 'skip'),
            coalesce(create_schedule.jitter_seconds, 0), coalesce(create_schedule.priority, 0),
            coalesce(create_schedule.on_pause, 'hold'), NULL, now())
    ON CONFLICT ON CONSTRAINT schedules_name_key DO UPDATE
    SET job_type = excluded.job_type, payload = excluded.payload, cron = excluded.cron,
        timezone = excluded.timezone, max_attempts = excluded.max_attempts,
        catchup = excluded.catchup, catchup_limit = excluded.catchup_limit,
        overlap = excluded.overlap, jitter_seconds = excluded.jitter_seconds,
        priority = excluded.priority, on_pause = excluded.on_pause, paused = false,
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
                              'max_attempts', max_attempts, 'priority', priority)),
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
                                actor text DEFAULT NULL, via text DEFAULT 'sql')
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
                                  'max_attempts', max_attempts, 'priority', priority)),
                              actor, via);
    END IF;
    RETURN coalesce(changed, false);
END;
$$;

-- Remove a database-owned schedule: paused as 'removed' (never deleted: its runs keep their
-- history, and `schedules add` with its name brings it back). False: no such schedule, or it
-- belongs to a service's config.
CREATE FUNCTION remove_schedule(name text, actor text DEFAULT NULL, via text DEFAULT 'sql')
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    changed boolean;
BEGIN
    UPDATE schedules s
    SET paused = true, paused_reason = 'removed', paused_detail = NULL, next_due_at = NULL,
        updated_at = now()
    WHERE s.name = remove_schedule.name AND s.service IS NULL
      AND s.paused_reason IS DISTINCT FROM 'removed'
    RETURNING true INTO changed;
    IF changed THEN
        PERFORM record_action('schedule_remove', remove_schedule.name, '{}', actor, via);
    END IF;
    RETURN coalesce(changed, false);
END;
$$;

REVOKE ALL ON FUNCTION create_schedule(text, text, text, text, jsonb, text, integer, text, text,
                                       float8, integer, integer, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION update_schedule(text, text, text, text, jsonb, text, integer, text, text,
                                       float8, integer, integer, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION remove_schedule(text, text, text) FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'UPDATE'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION '
            || 'create_schedule(text, text, text, text, jsonb, text, integer, text, text, '
            || 'float8, integer, integer, text, text), '
            || 'update_schedule(text, text, text, text, jsonb, text, integer, text, text, '
            || 'float8, integer, integer, text, text), remove_schedule(text, text, text) TO '
            || CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
    END LOOP;
END;
$$;
