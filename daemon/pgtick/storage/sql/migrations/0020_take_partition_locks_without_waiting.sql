-- maintain_partitions as in 0015, but no step waits in the queue of a lock that claims and
-- finishes take, and creating a partition no longer takes its parent's ACCESS EXCLUSIVE lock
-- (issue 44, item 2: `pgtick prune` on a loaded 2-core machine held a finish over the 100 ms
-- bar of tests/integration/test_prune_under_load.py). Before, each step waited up to its
-- lock_timeout (50 ms) for the parent's lock behind whatever held it (a reader of the parent,
-- the ticker's write of schedules), and every finish routed to that parent queued behind the
-- step's request, then behind the creation itself (catalog work, the indexes and the foreign
-- key of the new table: tens of milliseconds on a busy machine, a few dozen steps when a
-- history's partitions are made at once). Now:
-- - a partition ahead (its range starts a minute or more from now: every step but those that
--   catch up a gap after downtime) is created as a table of its own and attached (SHARE UPDATE
--   EXCLUSIVE on the parent: no statement on rows waits for it), under the DEFAULT
--   partition's lock instead of the parent's, which only writers routed to the DEFAULT
--   partition take; one for the present or the past still takes the parent's lock (writers
--   routed to the DEFAULT partition by the partitions as they were would fail after the
--   attach), NOWAIT like every other, and only once its table and indexes are made;
-- - every lock a step takes is taken NOWAIT: held elsewhere, the step is "busy" at once and
--   tried again later (by the daemon's next retention pass; `pgtick prune` backs off and tries
--   again itself), never queued in front of a claim or a finish;
-- - a drop takes the parent's lock last, only for the DROP.
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
    held boolean;
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
                -- The new table with the parent's columns, defaults, constraints and indexes,
                -- made before any lock a writer of rows waits for: the attach below finds its
                -- indexes and only attaches them, so that lock is held for little more than
                -- the attach.
                EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                               ' INCLUDING INDEXES)', part_name, t.parent);
                -- A partition of runs gets the foreign key to schedules, and attaching it
                -- takes SHARE ROW EXCLUSIVE on schedules, which the ticker's writes wait for:
                -- taken once the table is made. Every lock from here on is taken NOWAIT: a
                -- step never waits in a lock's queue, where every statement that comes after
                -- it waits too (the finishes routed to the parent, behind a step waiting on a
                -- reader); a lock held elsewhere makes the step "busy", tried again later
                -- (maintenance.py). Waiting for none, it can deadlock with no one either
                -- (0012 took schedules first for that).
                IF t.parent LIKE 'runs\_%' THEN
                    LOCK TABLE schedules IN SHARE ROW EXCLUSIVE MODE NOWAIT;
                END IF;
                IF last_to < now() + interval '1 minute' THEN
                    -- A range that starts in the past or within a minute (a gap caught up
                    -- after downtime): writers may be routing its rows to the DEFAULT
                    -- partition now, by a view of the partitions from before the attach, and
                    -- would fail its partition check after it. The parent's lock keeps them
                    -- out, as before 0020 but NOWAIT, for the attach alone.
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT', t.parent);
                ELSE
                    -- A range ahead (every other step): no row is routed to it yet, nor to the
                    -- DEFAULT partition in its stead, once the partitions of now exist. Only
                    -- the DEFAULT partition's lock (which the attach takes anyway): writers
                    -- routed to the parent's other partitions carry on.
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT',
                                   t.parent || '_default');
                END IF;
                EXECUTE format('SELECT count(*) FROM %I WHERE %I >= %L AND %I < %L',
                               t.parent || '_default', t.key_column, last_to, t.key_column,
                               next_to) INTO moved;
                IF moved > 0 THEN
                    EXECUTE format('WITH m AS (DELETE FROM %I WHERE %I >= %L AND %I < %L RETURNING *) '
                                   'INSERT INTO %I SELECT * FROM m',
                                   t.parent || '_default', t.key_column, last_to, t.key_column,
                                   next_to, part_name);
                END IF;
                -- ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which no read or write of
                -- rows waits for (CREATE TABLE ... PARTITION OF took ACCESS EXCLUSIVE).
                EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                               t.parent, part_name, last_to, next_to);
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
            -- A run still held (cancelled, its handler not stopped yet) keeps its partition:
            -- dropped, its row and its max_running slot would go while the handler runs.
            -- Served by runs_held_idx; the later partitions are looked at all the same.
            IF t.parent LIKE 'runs\_%' THEN
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE locked_by IS NOT NULL)',
                               old.name) INTO held;
                CONTINUE WHEN held;
            END IF;
            BEGIN
                IF t.parent LIKE 'runs\_%' THEN
                    -- Its runs' keys go with them (before the parent's lock: the drop takes
                    -- it, and finishes routed to the parent wait for it). Then the partition's
                    -- own lock, and the check again under it: a cancel of a running run
                    -- lands in the current period, never in an expired one, but a
                    -- transaction started long ago writes its now().
                    EXECUTE format('DELETE FROM run_keys k USING %I r WHERE r.idempotency_key'
                                   ' IS NOT NULL AND k.idempotency_key = r.idempotency_key'
                                   ' AND k.run_id = r.id', old.name);
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT', old.name);
                    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE locked_by IS NOT NULL)',
                                   old.name) INTO held;
                    IF held THEN
                        RAISE EXCEPTION USING ERRCODE = 'lock_not_available';
                    END IF;
                ELSE
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT', old.name);
                END IF;
                EXECUTE format('SELECT count(*) FROM %I', old.name) INTO n;
                -- Dropping a partition takes its parent's ACCESS EXCLUSIVE lock, which every
                -- write routed to the parent waits for: taken last, NOWAIT, and held only for
                -- the drop itself.
                EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT', t.parent);
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
                               ' AND locked_by IS NULL RETURNING id, idempotency_key), '
                               'k AS (DELETE FROM run_keys k USING gone g WHERE'
                               ' k.idempotency_key = g.idempotency_key AND k.run_id = g.id), '
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
