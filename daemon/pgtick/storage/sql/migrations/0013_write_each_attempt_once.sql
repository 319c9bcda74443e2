-- pgtick: stop-daemons
-- An attempt is written once, when it ends, instead of opened by the claim and closed by the
-- finish (docs/design/storage.md §15). While an attempt runs, its run's row already says all
-- an open attempt row said (the worker in locked_by, the attempt number in attempts, the
-- start in started_at), so the claim inserted a row the finish then moved from
-- attempts_open to an ended partition: three of a run's seven row writes, with their index
-- entries, and the dead versions a held snapshot keeps in attempts_open. Now:
--
--   attempts_history   the table (partitioned by outcome as before, less attempts_open):
--                      one row per ended attempt, inserted by whatever ends it (finish,
--                      fail, release, the let-go of a cancelled run, the reaper, retry)
--   attempts           a view with the same columns: attempts_history, and one row per
--                      attempt still open, read from its run (locked_by set: running, or
--                      cancelled and not let go yet), with id, finished_at and outcome NULL
--
-- Operators, dashboards and the CLI read `attempts` as before. Daemons of earlier versions
-- must be stopped: they insert into and update `attempts` (migrate refuses while any
-- heartbeats; docs/operations.md, Rolling deploy).
--
-- An open attempt row of a run still held is the same attempt as its run row: deleted (the
-- view shows it from the run, with the same run, attempt, worker and start). An open row of a
-- run not held any more cannot come from pgtick (the claim wrote both in one statement, and
-- every end closed both); one that does exist is closed as lost, not dropped.
ALTER TABLE attempts RENAME TO attempts_history;
DELETE FROM attempts_open a USING runs r
WHERE r.id = a.run_id AND r.attempts = a.attempt AND r.locked_by IS NOT NULL
  AND r.status IN ('running', 'cancelled');
UPDATE attempts_history
SET outcome = 'lost', finished_at = now(), error = 'open attempt of a run no longer held, closed by migration 0013'
WHERE outcome IS NULL;
DROP TABLE attempts_open;

CREATE VIEW attempts AS
SELECT id, run_id, attempt, worker_id, started_at, finished_at, outcome, error, error_type
FROM attempts_history
UNION ALL
SELECT NULL::bigint, r.id, r.attempts, r.locked_by, r.started_at, NULL::timestamptz, NULL::text,
       NULL::text, NULL::text
FROM runs r
WHERE r.locked_by IS NOT NULL AND r.status IN ('running', 'cancelled');
COMMENT ON VIEW attempts IS
    'One row per attempt: ended ones (attempts_history) and open ones, read from their run.';

-- Whoever could read the attempts table reads the view (`pgtick grants` gives new roles both).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'attempts_history'
               AND privilege_type = 'SELECT'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'attempts_history'::regclass) LOOP
        EXECUTE 'GRANT SELECT ON attempts TO ' || CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC'
                                                       ELSE quote_ident(g.grantee) END;
    END LOOP;
END;
$$;

-- maintain_partitions as in 0012, but for the two places that named attempts: an open
-- attempt is now a held run (an output partition stays while one started in it), and the
-- DEFAULT partitions' old runs take their rows of attempts_history with them.
CREATE OR REPLACE FUNCTION maintain_partitions(retention jsonb, ahead_seconds float8 DEFAULT 1800,
                                    skip text[] DEFAULT '{}', delete_default boolean DEFAULT true)
RETURNS TABLE (action text, parent text, table_name text, row_count bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '50ms'
AS $$
DECLARE
    t record;
    old record;
    keep float8;
    period interval;
    period_s float8;
    last_to timestamptz;
    grid_now timestamptz;
    upto timestamptz;
    next_to timestamptz;
    part_name text;
    moved bigint;
    n bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgtick.partitions.' || current_schema(), 0)) THEN
        RETURN;
    END IF;
    FOR t IN SELECT * FROM partitioned_tables pt WHERE pt.parent <> ALL (skip)
             ORDER BY pt.parent LOOP
        parent := t.parent;
        IF t.status IS NULL THEN
            -- Attempts and output of runs in any state: the longest retention, and only when
            -- every terminal status has one (`pgtick prune --status S` leaves them).
            SELECT CASE WHEN count(*) = 4 THEN max(value::float8) END INTO keep
            FROM jsonb_each_text(retention)
            WHERE key IN ('succeeded', 'dead', 'cancelled', 'skipped');
        ELSE
            keep := (retention ->> t.status)::float8;
        END IF;
        CONTINUE WHEN keep IS NULL;
        period := partition_period(keep);
        period_s := extract(epoch FROM period);
        grid_now := to_timestamp(floor(extract(epoch FROM now()) / period_s) * period_s);
        upto := now() + make_interval(secs => greatest(ahead_seconds, 4 * period_s));
        SELECT max(p.to_at) INTO last_to FROM partitions p WHERE p.parent = t.parent;
        last_to := coalesce(last_to, grid_now);
        WHILE last_to < upto LOOP
            -- After a gap (no daemon for a while) one partition covers it, up to this period.
            next_to := CASE WHEN last_to < grid_now THEN grid_now
                            ELSE to_timestamp((floor(extract(epoch FROM last_to) / period_s) + 1)
                                              * period_s) END;
            part_name := t.parent || '_' || to_char(last_to AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
            BEGIN
                -- A partition of runs gets the foreign key to schedules, and creating it
                -- takes SHARE ROW EXCLUSIVE on schedules, which waits for any transaction
                -- writing schedules (the ticker's). Taken first, while no writer of runs
                -- waits on us: taken after the parent's lock, the wait (up to lock_timeout)
                -- held every finish routed to the parent (0012 says more).
                IF t.parent LIKE 'runs\_%' THEN
                    LOCK TABLE schedules IN SHARE ROW EXCLUSIVE MODE;
                END IF;
                -- The lock creating a partition takes anyway, first: no row can reach the
                -- DEFAULT partition between the count and the partition (a writer routed to
                -- the DEFAULT partition before an ATTACH would fail its partition check).
                EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', t.parent);
                EXECUTE format('SELECT count(*) FROM %I WHERE %I >= %L AND %I < %L',
                               t.parent || '_default', t.key_column, last_to, t.key_column,
                               next_to) INTO moved;
                IF moved = 0 THEN
                    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                                   part_name, t.parent, last_to, next_to);
                ELSE
                    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                                   part_name, t.parent);
                    EXECUTE format('WITH m AS (DELETE FROM %I WHERE %I >= %L AND %I < %L RETURNING *) '
                                   'INSERT INTO %I SELECT * FROM m',
                                   t.parent || '_default', t.key_column, last_to, t.key_column,
                                   next_to, part_name);
                    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                                   t.parent, part_name, last_to, next_to);
                END IF;
                INSERT INTO partitions (name, parent, from_at, to_at)
                VALUES (part_name, t.parent, last_to, next_to);
                action := 'created'; table_name := part_name; row_count := moved;
            EXCEPTION WHEN lock_not_available THEN
                action := 'busy'; table_name := part_name; row_count := 0;
            END;
            RETURN NEXT;
            RETURN;
        END LOOP;
        FOR old IN SELECT p.name FROM partitions p
                   WHERE p.parent = t.parent AND p.to_at <= now() - make_interval(secs => keep)
                   ORDER BY p.to_at LOOP
            -- Output of an attempt still running stays until the attempt ends: a run
            -- still held (running, or cancelled and not let go) is an open attempt (0013).
            IF t.parent = 'output_chunks' AND EXISTS (
                SELECT 1 FROM runs r, partitions p
                WHERE p.name = old.name AND r.locked_by IS NOT NULL
                  AND r.status IN ('running', 'cancelled') AND r.started_at < p.to_at) THEN
                EXIT;
            END IF;
            BEGIN
                EXECUTE format('SELECT count(*) FROM %I', old.name) INTO n;
                EXECUTE format('DROP TABLE %I', old.name);
                DELETE FROM partitions p WHERE p.name = old.name;
                action := 'dropped'; table_name := old.name; row_count := n;
            EXCEPTION WHEN lock_not_available THEN
                action := 'busy'; table_name := old.name; row_count := 0;
            END;
            RETURN NEXT;
            RETURN;
        END LOOP;
        -- Rows left in the DEFAULT partition (no end time, or from before its period's
        -- partition existed and not moved yet) older than the retention: few, deleted (a
        -- run with its attempts and output). Not for delete_default = false (`pgtick prune`
        -- deletes them itself, showing its progress).
        CONTINUE WHEN NOT delete_default;
        BEGIN
            IF t.parent LIKE 'runs\_%' THEN
                EXECUTE format('WITH gone AS (DELETE FROM %I WHERE coalesce(%I, %I) < %L'
                               ' RETURNING id), '
                               'a AS (DELETE FROM attempts_history WHERE run_id IN (SELECT id FROM gone)), '
                               'o AS (DELETE FROM output_chunks WHERE run_id IN (SELECT id FROM gone)) '
                               'SELECT count(*) FROM gone',
                               t.parent || '_default', t.key_column, t.fallback,
                               now() - make_interval(secs => keep)) INTO n;
            ELSE
                EXECUTE format('DELETE FROM %I WHERE coalesce(%I, %I) < %L',
                               t.parent || '_default', t.key_column, t.fallback,
                               now() - make_interval(secs => keep));
                GET DIAGNOSTICS n = ROW_COUNT;
            END IF;
            IF n > 0 THEN
                action := 'deleted'; table_name := t.parent || '_default'; row_count := n;
                RETURN NEXT;
                RETURN;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION maintain_partitions(jsonb, float8, text[], boolean) FROM PUBLIC;
