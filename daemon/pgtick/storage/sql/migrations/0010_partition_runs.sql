-- pgtick: stop-daemons
-- Runs, attempts and output partitioned so that retention drops whole partitions instead of
-- deleting rows, and a run's row versions leave the table the claim reads once it finishes
-- (docs/design/storage.md §14, docs/concepts.md "Where a run's rows go").
--
--   runs            LIST (status)
--     runs_live       queued, running, failed: every row the claim, heartbeat and reaper read
--     runs_succeeded  RANGE (finished_at): one partition per period, dropped whole
--     runs_dead, runs_cancelled, runs_skipped   the same
--   attempts        LIST (outcome)
--     attempts_open       NULL: attempts still running
--     attempts_succeeded  RANGE (finished_at), dropped with the succeeded retention
--     attempts_ended      failed, lost, released: RANGE (finished_at), with the longest
--   output_chunks   RANGE (attempt_started_at), dropped with the longest retention
--
-- Each ranged parent has a DEFAULT partition for a row no period partition covers (yet), and
-- on an install that has runs a "before_0010" partition holding the rows this migration
-- copies, dropped whole when the retention has passed the moment of the migration. maintain_partitions() (below) creates
-- the periods ahead and drops the expired ones; daemons call it from their reaper.
--
-- A unique index on a partitioned table must contain the partition key, so the two unique
-- keys of runs are kept by their writers instead: enqueue() takes a transaction-level
-- advisory lock on the idempotency key before it looks the key up, and every writer of a
-- schedule's occurrences holds the schedule's row lock (the ticker and backfill take it). The
-- foreign key from attempts to runs goes for the same reason (retention drops both).
--
-- Daemons of earlier versions must be stopped: they would read and write the renamed tables
-- (migrate refuses while any heartbeats; docs/operations: Rolling deploy). The copy reports its
-- progress as NOTICEs, which `pgtick migrate` shows and logs.

-- Its prelude (up to the line "-- pgtick: end of prelude") commits on its own before the
-- cut-over: enqueue() then no longer names a unique index of runs, so that an application's
-- enqueue waiting on the cut-over's lock (it reads and writes "runs" once the lock is granted:
-- the new, partitioned table) succeeds instead of failing on 0009's ON CONFLICT target. The
-- interim body works on either table: the key's advisory lock and a lookup (as after the
-- cut-over), and on the old table its unique index as well, through a targetless ON CONFLICT.
-- Enqueues wait for the cut-over's copy, about 3 s per 100 000 runs on the test machine
-- (docs/operations: Rolling deploy). Revised after release: a database that applied the earlier
-- text is where this one leaves it (storage/migrate.py, EARLIER_TEXTS).

-- The advisory lock of an idempotency key (one 64-bit space per schema).
CREATE OR REPLACE FUNCTION key_lock(idempotency_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT hashtextextended('pgtick.key.' || current_schema() || '.' || idempotency_key, 0) $$;

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
        PERFORM pg_advisory_xact_lock(key_lock(enqueue.idempotency_key));
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO runs (job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts,
            coalesce(enqueue.priority,
                     (SELECT s.priority FROM job_type_settings s
                      WHERE s.job_type = enqueue.job_type), 0),
            enqueue.concurrency_key)
    ON CONFLICT DO NOTHING
    RETURNING id, runs.run_at INTO new_id, new_run_at;
    IF new_id IS NULL THEN
        -- The old table's unique index: an enqueue of 0009's body took the key meanwhile.
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue.job_type);
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;

-- pgtick: end of prelude

ALTER TABLE runs RENAME TO runs_0009;
ALTER TABLE attempts RENAME TO attempts_0009;
ALTER TABLE output_chunks RENAME TO output_chunks_0009;
ALTER SEQUENCE runs_id_seq RENAME TO runs_0009_id_seq;
ALTER SEQUENCE attempts_id_seq RENAME TO attempts_0009_id_seq;
ALTER INDEX output_chunks_pkey RENAME TO output_chunks_0009_pkey;

CREATE SEQUENCE runs_id_seq;
CREATE SEQUENCE attempts_id_seq;

CREATE TABLE runs (
    id                  bigint NOT NULL DEFAULT nextval('runs_id_seq'),
    schedule_id         bigint REFERENCES schedules (id),
    scheduled_for       timestamptz,
    job_type            text NOT NULL,
    payload             jsonb NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key     text,
    status              text NOT NULL DEFAULT 'queued' CHECK (status IN (
                            'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled', 'skipped')),
    run_at              timestamptz NOT NULL DEFAULT now(),
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts        integer CHECK (max_attempts >= 1),
    locked_by           text,
    locked_until        timestamptz,
    last_error          text,
    error_type          text,
    started_at          timestamptz,
    finished_at         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    priority            integer NOT NULL DEFAULT 0,
    concurrency_key     text,
    CONSTRAINT runs_running_is_locked CHECK (
        status <> 'running' OR (locked_by IS NOT NULL AND locked_until IS NOT NULL))
) PARTITION BY LIST (status);
ALTER SEQUENCE runs_id_seq OWNED BY runs.id;
CREATE TABLE runs_live PARTITION OF runs FOR VALUES IN ('queued', 'running', 'failed');

CREATE TABLE attempts (
    id                  bigint NOT NULL DEFAULT nextval('attempts_id_seq'),
    run_id              bigint NOT NULL,
    attempt             integer NOT NULL,
    worker_id           text NOT NULL,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    outcome             text CHECK (outcome IN ('succeeded', 'failed', 'lost', 'released')),
    error               text,
    error_type          text
) PARTITION BY LIST (outcome);
ALTER SEQUENCE attempts_id_seq OWNED BY attempts.id;
CREATE TABLE attempts_open PARTITION OF attempts FOR VALUES IN (NULL);

CREATE TABLE output_chunks (
    run_id              bigint NOT NULL,
    attempt             integer NOT NULL,
    attempt_started_at  timestamptz NOT NULL,
    seq                 integer NOT NULL,
    at                  timestamptz NOT NULL DEFAULT now(),
    lines               jsonb NOT NULL,
    omitted_bytes       bigint NOT NULL DEFAULT 0 CHECK (omitted_bytes >= 0),
    PRIMARY KEY (run_id, attempt, seq, attempt_started_at)
) PARTITION BY RANGE (attempt_started_at);

-- The ranged partitions and their bounds (NULL: unbounded), as maintain_partitions() made
-- them: one row per partition, so that it never parses the catalog's bound expressions.
CREATE TABLE partitions (
    name        text PRIMARY KEY,
    parent      text NOT NULL,
    from_at     timestamptz,
    to_at       timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX partitions_parent_idx ON partitions (parent, to_at);

-- The ranged parents: for each, its partition key, and whose retention drops its partitions.
CREATE TABLE partitioned_tables (
    parent      text PRIMARY KEY,
    key_column  text NOT NULL,
    -- What dates a row of the DEFAULT partition whose key is NULL, for its retention.
    fallback    text NOT NULL,
    -- The terminal status whose retention applies; NULL: the longest of them.
    status      text
);
INSERT INTO partitioned_tables VALUES
    ('runs_succeeded', 'finished_at', 'updated_at', 'succeeded'),
    ('runs_dead', 'finished_at', 'updated_at', 'dead'),
    ('runs_cancelled', 'finished_at', 'updated_at', 'cancelled'),
    ('runs_skipped', 'finished_at', 'updated_at', 'skipped'),
    ('attempts_succeeded', 'finished_at', 'started_at', 'succeeded'),
    ('attempts_ended', 'finished_at', 'started_at', NULL),
    ('output_chunks', 'attempt_started_at', 'at', NULL);

CREATE TABLE runs_succeeded PARTITION OF runs FOR VALUES IN ('succeeded')
    PARTITION BY RANGE (finished_at);
CREATE TABLE runs_dead PARTITION OF runs FOR VALUES IN ('dead') PARTITION BY RANGE (finished_at);
CREATE TABLE runs_cancelled PARTITION OF runs FOR VALUES IN ('cancelled')
    PARTITION BY RANGE (finished_at);
CREATE TABLE runs_skipped PARTITION OF runs FOR VALUES IN ('skipped')
    PARTITION BY RANGE (finished_at);
CREATE TABLE attempts_succeeded PARTITION OF attempts FOR VALUES IN ('succeeded')
    PARTITION BY RANGE (finished_at);
CREATE TABLE attempts_ended PARTITION OF attempts FOR VALUES IN ('failed', 'lost', 'released')
    PARTITION BY RANGE (finished_at);

-- Per ranged parent: a DEFAULT partition, and (on an install that has runs) the partition of
-- the rows copied below.
DO $$
DECLARE
    p record;
    cutover timestamptz := now();
BEGIN
    FOR p IN SELECT parent FROM partitioned_tables LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', p.parent || '_default', p.parent);
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM runs_0009);
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       p.parent || '_before_0010', p.parent, cutover);
        INSERT INTO partitions (name, parent, from_at, to_at)
        VALUES (p.parent || '_before_0010', p.parent, NULL, cutover);
    END LOOP;
END;
$$;

-- The copy, in batches of ids, each reported as a NOTICE "pgtick progress: TABLE DONE TOTAL"
-- (`migrate` shows rows copied, rate and time left).
DO $$
DECLARE
    tbl text;
    total bigint;
    done bigint;
    lo bigint;
    hi bigint;
    top bigint;
    n bigint;
    batch constant bigint := 200000;
BEGIN
    FOREACH tbl IN ARRAY ARRAY['runs', 'attempts', 'output_chunks'] LOOP
        EXECUTE format('SELECT count(*) FROM %I', tbl || '_0009') INTO total;
        IF tbl = 'output_chunks' THEN
            EXECUTE 'INSERT INTO output_chunks SELECT * FROM output_chunks_0009';
            RAISE NOTICE 'pgtick progress: % % %', tbl, total, total;
            CONTINUE;
        END IF;
        EXECUTE format('SELECT coalesce(min(id), 1), coalesce(max(id), 0) FROM %I',
                       tbl || '_0009') INTO lo, top;
        done := 0;
        WHILE lo <= top LOOP
            hi := lo + batch;
            IF tbl = 'runs' THEN
                INSERT INTO runs (id, schedule_id, scheduled_for, job_type, payload,
                                  idempotency_key, status, run_at, attempts, max_attempts,
                                  locked_by, locked_until, last_error, error_type, started_at,
                                  finished_at, created_at, updated_at, priority, concurrency_key)
                SELECT id, schedule_id, scheduled_for, job_type, payload, idempotency_key,
                       status, run_at, attempts, max_attempts, locked_by, locked_until,
                       last_error, error_type, started_at, finished_at, created_at,
                       updated_at, priority, concurrency_key
                FROM runs_0009 WHERE id >= lo AND id < hi;
            ELSE
                INSERT INTO attempts (id, run_id, attempt, worker_id, started_at, finished_at,
                                      outcome, error, error_type)
                SELECT id, run_id, attempt, worker_id, started_at, finished_at, outcome,
                       error, error_type
                FROM attempts_0009 WHERE id >= lo AND id < hi;
            END IF;
            GET DIAGNOSTICS n = ROW_COUNT;
            done := done + n;
            lo := hi;
            RAISE NOTICE 'pgtick progress: % % %', tbl, done, total;
        END LOOP;
    END LOOP;
    PERFORM setval('runs_id_seq', greatest(
        (SELECT last_value FROM runs_0009_id_seq), (SELECT max(id) FROM runs), 1));
    PERFORM setval('attempts_id_seq', greatest(
        (SELECT last_value FROM attempts_0009_id_seq), (SELECT max(id) FROM attempts), 1));
END;
$$;

DROP TABLE output_chunks_0009;
DROP TABLE attempts_0009;
DROP TABLE runs_0009;

-- Indexes, built once the rows are in. Every index of runs is declared on the parent, so
-- each partition maintenance creates gets it; the partial ones (by status) stay empty in the
-- partitions whose rows never match.
CREATE INDEX runs_id_idx ON runs (id);
CREATE INDEX runs_idempotency_key_idx ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_schedule_occurrence_idx ON runs (schedule_id, scheduled_for);
CREATE INDEX runs_claim_idx ON runs (job_type, priority DESC, run_at, id)
    WHERE status IN ('queued', 'failed');
CREATE INDEX runs_lease_idx ON runs (locked_until) WHERE status = 'running';
CREATE INDEX runs_cancel_lease_idx ON runs (locked_until)
    WHERE status = 'cancelled' AND locked_until IS NOT NULL;
CREATE INDEX runs_held_idx ON runs (job_type) WHERE locked_by IS NOT NULL;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE status IN ('queued', 'running', 'failed');
CREATE INDEX runs_finished_idx ON runs (status, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_schedule_success_idx ON runs (schedule_id, finished_at)
    WHERE status = 'succeeded' AND schedule_id IS NOT NULL;
CREATE INDEX runs_job_type_id_idx ON runs (job_type, id);
CREATE INDEX attempts_run_idx ON attempts (run_id, attempt);

-- Transactional enqueue, as 0009's: the same signature, refusals and notifications. The
-- idempotency key is unique because every enqueue of a key takes the key's transaction-level
-- advisory lock before it looks the key up (READ COMMITTED: the lookup after the lock sees a
-- concurrent enqueue of the same key that committed meanwhile). CREATE OR REPLACE keeps every
-- grant on it.
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
        PERFORM pg_advisory_xact_lock(key_lock(enqueue.idempotency_key));
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO runs (job_type, payload, run_at, idempotency_key, max_attempts, priority,
                      concurrency_key)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts,
            coalesce(enqueue.priority,
                     (SELECT s.priority FROM job_type_settings s
                      WHERE s.job_type = enqueue.job_type), 0),
            enqueue.concurrency_key)
    RETURNING id, runs.run_at INTO new_id, new_run_at;
    PERFORM pg_notify(current_schema(),
                      '!due ' || floor(extract(epoch FROM new_run_at))::bigint || ' '
                      || enqueue.job_type);
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;


-- The period of a parent's partitions for a retention: the longest of 1 minute, 5 minutes,
-- 15 minutes, 1 hour, 6 hours and 1 day that is at most a quarter of it, so that a run is
-- kept at most a quarter longer than its retention.
CREATE FUNCTION partition_period(retention_seconds float8) RETURNS interval
LANGUAGE sql IMMUTABLE
AS $$
    SELECT make_interval(secs => coalesce(max(p), 60))
    FROM unnest(ARRAY[60, 300, 900, 3600, 21600, 86400]::float8[]) AS p
    WHERE p <= retention_seconds / 4
$$;

-- One step of retention and of the partitions ahead, per call, in the caller's (short)
-- transaction: create the next partition a ranged parent needs (from its last one up to
-- now() + ahead, aligned on its period), or drop one whose rows are all older than their
-- retention (retention: a JSON object of seconds per terminal status), or delete the rows of
-- a DEFAULT partition past it. Callers call again until it returns no row: each step's locks
-- (a DDL statement takes an ACCESS EXCLUSIVE lock on the parent, which writers of the parent
-- wait for) are held for that step only. One caller at a time (others get no row at once);
-- every statement gives up after lock_timeout rather than queue behind a long reader of the
-- table (pg_dump) and hold up the writers queued behind it ('busy': the caller passes the
-- parent in skip for the rest of its pass, and a later pass does it).
-- Rows that reached a DEFAULT partition (no partition covered their time yet) move into the
-- partition created for them. Returns what it did: (action, parent, table_name, row_count);
-- a dropped partition's rows are counted first.
-- SECURITY DEFINER: creating and dropping partitions needs the tables' owner, which daemons
-- are not; EXECUTE is granted to them by `pgtick grants`.
CREATE FUNCTION maintain_partitions(retention jsonb, ahead_seconds float8 DEFAULT 1800,
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
