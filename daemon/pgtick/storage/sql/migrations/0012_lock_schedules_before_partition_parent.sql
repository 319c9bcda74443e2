-- maintain_partitions (0010) took the parent's ACCESS EXCLUSIVE lock before creating a
-- partition of it; creating a partition of a runs table also clones the foreign key to
-- schedules, which takes SHARE ROW EXCLUSIVE on schedules and so waits for any transaction
-- writing schedules (the ticker materializing, an operator's pause). Meanwhile every finish
-- routed to that parent (a run succeeding, failing for good, being cancelled) waited on the
-- parent's lock: up to the function's lock_timeout (50 ms) and the creation, once a period,
-- more on a busy machine (a finish held over the 100 ms bar of
-- tests/integration/test_prune_under_load.py, once, on PostgreSQL 15 in CI: the wait found
-- that can do it). The lock order was also the reverse of the ticker's, whose materialize
-- statement writes schedules and then routes a skipped occurrence into runs_skipped: the two
-- could deadlock until the timeout. The function now takes the schedules lock first.
-- The same function otherwise; replacing it keeps its owner and grants, so daemons may keep
-- running.
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
            -- Output of an attempt still running stays until the attempt ends.
            IF t.parent = 'output_chunks' AND EXISTS (
                SELECT 1 FROM attempts_open a, partitions p
                WHERE p.name = old.name AND a.started_at < p.to_at) THEN
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
                               'a AS (DELETE FROM attempts WHERE run_id IN (SELECT id FROM gone)), '
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
