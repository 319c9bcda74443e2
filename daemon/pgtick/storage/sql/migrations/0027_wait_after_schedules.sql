-- `after` between schedules (docs/composition.md, After): an occurrence of a schedule with
-- `after = "billing_check"` waits, queued, until billing_check's occurrence of the same period
-- (its latest occurrence at or before this one's, computed by the ticker in its own time zone
-- and stored as a UTC instant) has succeeded; when that occurrence is dead, skipped,
-- cancelled, or not succeeded by the deadline, the schedule's `after_missed` policy applies:
-- skip (recorded skipped, with the reason) or run (released anyway, the reason kept).
--
--   schedules.after_on  {"schedule": NAME, "deadline_seconds": N, "missed": "skip" | "run"}
--   runs.after_on       {"schedule": NAME, "occurrence": T, "deadline": T, "missed": ...,
--                        and once settled "released": why}; while waiting the run's run_at
--                        is far ahead (it is not due), set to now() when released
--
-- A waiting run is settled by settle_waiting(): in the transaction that records the outcome of
-- the other schedule's run (follow_up(), for runs of schedules that others wait for, whose
-- follow carries "release"), and by every tick (the deadline, an occurrence that never got a
-- run, and a race between materializing and finishing). Nullable columns without defaults:
-- daemons of the previous version keep running (their ticks leave after unapplied).
DO $$
DECLARE
    pause double precision := 0.05;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            ALTER TABLE runs ADD COLUMN after_on jsonb;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(pause);
            pause := least(pause * 2, 2.0);
        END;
    END LOOP;
END;
$$;
ALTER TABLE schedules ADD COLUMN after_on jsonb;
COMMENT ON COLUMN runs.after_on IS
    'The occurrence of another schedule this run waits for (docs/composition.md, After).';
-- The waiting runs, for the sweep and the metrics: few, in the live partition only.
CREATE INDEX runs_live_after_idx ON runs_live ((after_on ->> 'schedule'), scheduled_for)
    WHERE after_on IS NOT NULL;

-- Settle the runs waiting for an occurrence of another schedule: those waiting for the
-- schedule of run `ended` (which just ended with `outcome`, in the caller's transaction), or
-- every waiting run (ended NULL: the tick's sweep). Returns how many it settled.
CREATE FUNCTION settle_waiting(ended bigint DEFAULT NULL, outcome text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    w record;
    why text;
    n integer := 0;
    upstream text;
BEGIN
    IF ended IS NOT NULL THEN
        SELECT s.name INTO upstream FROM runs r JOIN schedules s ON s.id = r.schedule_id
        WHERE r.id = ended;
        IF upstream IS NULL THEN
            RETURN 0;
        END IF;
    END IF;
    FOR w IN
        SELECT r.id, r.job_type, r.after_on, us.materialized_until,
               CASE WHEN u.id = ended THEN outcome ELSE u.status END AS up_status
        FROM runs r
        LEFT JOIN schedules us ON us.name = r.after_on ->> 'schedule'
        LEFT JOIN LATERAL (
            SELECT u.id, u.status FROM runs u
            WHERE u.schedule_id = us.id
              AND u.scheduled_for = (r.after_on ->> 'occurrence')::timestamptz
            ORDER BY u.id LIMIT 1) u ON true
        WHERE r.status = 'queued' AND r.after_on IS NOT NULL
          AND NOT (r.after_on ? 'released')
          AND (upstream IS NULL OR r.after_on ->> 'schedule' = upstream)
        FOR UPDATE OF r SKIP LOCKED
    LOOP
        why := CASE
            WHEN w.up_status = 'succeeded' THEN NULL
            WHEN w.up_status IN ('dead', 'skipped', 'cancelled') THEN
                'its occurrence ' || (w.after_on ->> 'occurrence') || ' ended ' || w.up_status
            WHEN now() >= (w.after_on ->> 'deadline')::timestamptz THEN
                'its occurrence ' || (w.after_on ->> 'occurrence') || ' had not succeeded by '
                || (w.after_on ->> 'deadline')
            WHEN w.up_status IS NULL AND w.materialized_until IS NOT NULL
                 AND w.materialized_until >= (w.after_on ->> 'occurrence')::timestamptz THEN
                'its occurrence ' || (w.after_on ->> 'occurrence') || ' has no run (paused,'
                || ' not caught up, or pruned)'
            WHEN w.materialized_until IS NULL AND NOT EXISTS (
                SELECT 1 FROM schedules s WHERE s.name = w.after_on ->> 'schedule') THEN
                'no schedule ' || (w.after_on ->> 'schedule')
            ELSE 'wait'
        END;
        CONTINUE WHEN why = 'wait';
        IF why IS NULL OR w.after_on ->> 'missed' = 'run' THEN
            UPDATE runs SET run_at = now(), updated_at = now(),
                after_on = after_on || jsonb_build_object('released',
                    coalesce('run anyway: ' || why, 'its occurrence succeeded'))
            WHERE id = w.id AND status = 'queued';
            PERFORM pg_notify(current_schema(),
                              '!due ' || floor(extract(epoch FROM now()))::bigint || ' '
                              || w.job_type);
            PERFORM pg_notify(current_schema(), w.job_type);
        ELSE
            UPDATE runs SET status = 'skipped', finished_at = now(), updated_at = now(),
                last_error = 'after ' || (w.after_on ->> 'schedule') || ': ' || why,
                error_type = 'after',
                after_on = after_on || jsonb_build_object('released', 'skipped: ' || why)
            WHERE id = w.id AND status = 'queued';
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;

-- follow_up as in 0025, and the release of the runs that wait for this one's schedule.
CREATE OR REPLACE FUNCTION follow_up(run_id bigint, job_type text, outcome text, follow jsonb,
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
    -- A run of a schedule that others wait for (`after`): their occurrences of this one's
    -- period settled now, in this transaction.
    IF follow ? 'release' THEN
        PERFORM settle_waiting(run_id, outcome);
    END IF;
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


DO $$
DECLARE
    acl aclitem[];
    g record;
BEGIN
    SELECT coalesce(p.proacl, acldefault('f', p.proowner)) INTO acl
    FROM pg_proc p
    WHERE p.oid = 'enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)'::regprocedure;
    EXECUTE 'REVOKE ALL ON FUNCTION settle_waiting(bigint, text) FROM PUBLIC';
    FOR g IN SELECT a.grantee FROM aclexplode(acl) a WHERE a.privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION settle_waiting(bigint, text) TO %s',
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END;
$$;
