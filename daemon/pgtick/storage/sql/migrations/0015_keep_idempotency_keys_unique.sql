-- Two guarantees the partitioned storage (0010) had come to hold only at READ COMMITTED or
-- only by luck of timing, made real again:
--
-- 1. One run per idempotency key, whatever the caller's isolation level. 0010 dropped the
--    unique index on runs.idempotency_key (a unique index on a partitioned table must contain
--    the partition key) and kept the key unique by an advisory lock and a lookup: exact only
--    with a fresh snapshot. An application enqueueing inside a REPEATABLE READ or SERIALIZABLE
--    transaction looked the key up with a snapshot older than the lock, missed the run another
--    transaction committed meanwhile, and inserted a second one. Now the key is a row of
--    run_keys, with a real primary key: a second enqueue of a key waits for the first
--    transaction, and then (READ COMMITTED) finds its run or (REPEATABLE READ, SERIALIZABLE,
--    whose snapshot cannot see that run) fails with a serialization failure (SQLSTATE 40001),
--    which the caller retries like any other. A key row outlives its run only until
--    retention's next pass (maintain_partitions deletes the keys of what it drops); a key
--    whose run is gone (pruned, deleted by hand) is taken by the next enqueue.
--
-- 2. Retention never drops a run that is still held. A run an operator cancelled keeps its
--    holder (locked_by) until its handler stops, and it sits in runs_cancelled's partition of
--    the cancel's period: with a short cancelled retention that partition was dropped while
--    the handler still ran, and the max_running slot it held freed. maintain_partitions now
--    keeps a runs partition (and a DEFAULT partition's row) while any of its runs is held,
--    and `pgtick prune` does not delete one.
--
-- Daemons keep running: daemons of the version before this one take the key's advisory lock
-- and look the key up in runs (their enqueue_many); take_idempotency_keys takes the same lock
-- and, for a key it has no row for, looks for such a run first. Nothing is rewritten but the
-- functions; run_keys is filled from the runs that have a key.

CREATE TABLE run_keys (
    idempotency_key text PRIMARY KEY,
    run_id          bigint NOT NULL
);
COMMENT ON TABLE run_keys IS
    'One row per idempotency key: the run that has it (enqueue() and take_idempotency_keys()).';

-- A key that two runs already share (enqueued under REPEATABLE READ before this migration)
-- keeps the newest.
INSERT INTO run_keys (idempotency_key, run_id)
SELECT r.idempotency_key, max(r.id) FROM runs r
WHERE r.idempotency_key IS NOT NULL
GROUP BY r.idempotency_key;

-- For each distinct key of `keys`, in key order (two batches sharing keys never deadlock):
-- the run that has it (fresh = false), or the id the caller must insert its run with
-- (fresh = true; the key is then taken until the caller's transaction ends). SECURITY
-- DEFINER: callers need EXECUTE on it, not rights on run_keys.
CREATE FUNCTION take_idempotency_keys(keys text[])
RETURNS TABLE (idempotency_key text, run_id bigint, fresh boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    k text;
    drawn bigint;
    found_id bigint;
BEGIN
    FOR k IN SELECT DISTINCT u.k FROM unnest(keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
        -- The lock daemons of the version before 0015 take before they look a key up.
        PERFORM pg_advisory_xact_lock(key_lock(k));
        drawn := nextval('runs_id_seq');
        -- Waits for a transaction that took the key and has not ended. Under REPEATABLE READ
        -- or SERIALIZABLE, a key row committed after this transaction's snapshot is a
        -- serialization failure here: the one case where the lookup could not be exact.
        INSERT INTO run_keys AS rk (idempotency_key, run_id) VALUES (k, drawn)
        ON CONFLICT (idempotency_key) DO NOTHING;
        IF FOUND THEN
            -- A run with this key that has no key row: written by a daemon of the version
            -- before 0015 during a rolling deploy (under the lock taken above).
            SELECT r.id INTO found_id FROM runs r WHERE r.idempotency_key = k
            ORDER BY r.id LIMIT 1;
            IF FOUND THEN
                UPDATE run_keys rk SET run_id = found_id WHERE rk.idempotency_key = k;
                idempotency_key := k; run_id := found_id; fresh := false;
            ELSE
                idempotency_key := k; run_id := drawn; fresh := true;
            END IF;
        ELSE
            -- A statement of its own: at READ COMMITTED its snapshot sees the key's run,
            -- committed with the key row this transaction may have waited for.
            SELECT rk.run_id INTO found_id FROM run_keys rk WHERE rk.idempotency_key = k
            FOR UPDATE;
            IF EXISTS (SELECT 1 FROM runs r WHERE r.id = found_id) THEN
                idempotency_key := k; run_id := found_id; fresh := false;
            ELSE
                -- Its run is gone (retention, prune, a DELETE by hand): the key is free.
                UPDATE run_keys rk SET run_id = drawn WHERE rk.idempotency_key = k;
                idempotency_key := k; run_id := drawn; fresh := true;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Transactional enqueue, as 0010's (the same signature, refusals and notifications), the
-- key taken through take_idempotency_keys. CREATE OR REPLACE keeps every grant on it.
CREATE OR REPLACE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    is_fresh boolean;
    new_run_at timestamptz;
BEGIN
    IF enqueue.job_type IS NULL OR length(enqueue.job_type) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue: job_type must be 1 to 200 characters, got %',
            coalesce(length(enqueue.job_type)::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.payload IS NOT NULL AND jsonb_typeof(enqueue.payload) <> 'object' THEN
        RAISE EXCEPTION 'enqueue: payload must be a JSON object, got a JSON %',
            jsonb_typeof(enqueue.payload)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'enqueue: max_attempts must be at least 1, got %', enqueue.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.priority IS NOT NULL AND abs(enqueue.priority) > 1000000 THEN
        RAISE EXCEPTION 'enqueue: priority must be between -1000000 and 1000000, got %',
            enqueue.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.idempotency_key IS NOT NULL THEN
        SELECT t.run_id, t.fresh INTO new_id, is_fresh
        FROM take_idempotency_keys(ARRAY[enqueue.idempotency_key]) AS t;
        IF NOT is_fresh THEN
            RETURN new_id;
        END IF;
    ELSE
        new_id := nextval('runs_id_seq');
    END IF;
    INSERT INTO runs (id, job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key)
    VALUES (new_id, enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts,
            coalesce(enqueue.priority,
                     (SELECT s.priority FROM job_type_settings s
                      WHERE s.job_type = enqueue.job_type), 0),
            enqueue.concurrency_key)
    RETURNING runs.run_at INTO new_run_at;
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue.job_type);
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;

-- Whoever could enqueue (EXECUTE on enqueue) may take keys; key_lock, which enqueue_many of
-- the version before this one calls as the caller, likewise (a database whose default
-- privileges do not grant EXECUTE to PUBLIC). Whoever could delete runs (`pgtick prune`)
-- deletes their keys.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.routine_privileges
             WHERE routine_schema = current_schema() AND routine_name = 'enqueue'
               AND privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION take_idempotency_keys(text[]), key_lock(text) TO %s',
                       CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'DELETE'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        EXECUTE format('GRANT SELECT, DELETE ON run_keys TO %s',
                       CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END;
$$;

-- maintain_partitions as in 0013, but a runs partition (or a DEFAULT partition's row) with a
-- run still held is kept, and what it drops or deletes takes its runs' keys with it.
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
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', old.name);
                    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE locked_by IS NOT NULL)',
                                   old.name) INTO held;
                    IF held THEN
                        RAISE EXCEPTION USING ERRCODE = 'lock_not_available';
                    END IF;
                END IF;
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
