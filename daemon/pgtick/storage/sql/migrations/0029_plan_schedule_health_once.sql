-- The schedules' health for the metrics (pgtick_schedule_last_success_timestamp_seconds,
-- pgtick_schedules_overdue) and `pgtick status`, moved out of metrics_snapshot into a
-- function so that PostgreSQL plans it once per connection rather than at every scrape (issue
-- 47: a scrape under 100 ms). Its three correlated subqueries read `runs` by schedule, not by
-- a partition key, so the planner plans each of them over every partition: 12-48 ms of the
-- aggregate's planning with a month of partitions, growing with retention; the query
-- without them plans in about 1 ms. PL/pgSQL keeps a statement's plan for the session, and
-- a generic plan (forced here: the first five calls would otherwise plan anew) loses nothing:
-- no predicate on a partition key takes a parameter. Pooler-safe, unlike a prepared
-- statement: the plan lives in the server's session, whichever client's transaction uses it.
--
-- Per configured schedule (names[i], due_at[i]: the occurrence that should have started by
-- now, NULL for none): [name, paused, last success's finish (Unix seconds, NULL: none kept),
-- due_started]. due_started says whether a run for that occurrence started (or was
-- deliberately skipped or cancelled), and is NULL for an occurrence from before the schedule
-- existed. Names with no schedule row are left out.
CREATE FUNCTION schedule_health(names text[], due_at timestamptz[])
RETURNS json
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
        SELECT coalesce(json_agg(json_build_array(
                   s.name, s.paused,
                   (SELECT extract(epoch FROM max(r.finished_at))::float8
                    FROM runs r WHERE r.schedule_id = s.id AND r.status = 'succeeded'),
                   CASE WHEN want.due_at IS NULL OR want.due_at < s.created_at THEN NULL
                   ELSE EXISTS (
                       SELECT FROM runs r
                       WHERE r.schedule_id = s.id AND r.scheduled_for = want.due_at
                         AND (r.started_at IS NOT NULL OR r.status IN ('skipped', 'cancelled')))
                   -- Passed by the ticker with no run, deliberately (paused then, resumed
                   -- from now, catchup = "none"), or its run pruned since: handled.
                   OR (coalesce(s.materialized_until >= want.due_at, false) AND NOT EXISTS (
                       SELECT FROM runs r
                       WHERE r.schedule_id = s.id AND r.scheduled_for = want.due_at))
                   END)), '[]')
        FROM unnest(schedule_health.names, schedule_health.due_at) AS want(name, due_at)
        JOIN schedules s ON s.name = want.name);
END;
$$;

-- Whoever may enqueue may read the metrics: the roles `pgtick grants` gave EXECUTE on the
-- schema's functions before this one existed (a database whose default privileges give
-- PUBLIC no EXECUTE), as migration 0027 does for settle_waiting.
DO $$
DECLARE
    acl aclitem[];
    g record;
BEGIN
    SELECT coalesce(p.proacl, acldefault('f', p.proowner)) INTO acl
    FROM pg_proc p
    WHERE p.oid = 'enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)'::regprocedure;
    EXECUTE 'REVOKE ALL ON FUNCTION schedule_health(text[], timestamptz[]) FROM PUBLIC';
    FOR g IN SELECT a.grantee FROM aclexplode(acl) a WHERE a.privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION schedule_health(text[], timestamptz[]) TO %s',
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END;
$$;
