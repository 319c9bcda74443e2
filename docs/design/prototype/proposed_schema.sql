-- The proposed storage (docs/design/storage.md), as one file that check_schema.py loads into an
-- empty PostgreSQL and exercises. A sketch of what migration 0005/0006 would create, not the
-- migration itself: names are schema-qualified with pgtick (the migrations would use the
-- configured schema through search_path, as today), and the unchanged tables (schedules,
-- effects, terminal_run_counts, schema_migrations) are left out, except workers.
--
-- Where a run's row lives:
--   queue        every run not finished: queued, running, failed (awaiting its retry) and
--                cancelled-but-still-held; LIST-partitioned into 3 slots rotated PgQ-style
--   run_history  finished runs (succeeded, dead, cancelled, skipped), insert-only, LIST by
--                status then RANGE by finished_at (daily); retention drops partitions
--   attempt_history  attempts that were not a run's last one (failed-then-retried, lost-then-
--                retried, released); the last attempt lives in the run_history row
--   output_chunks    what attempts printed, RANGE by time (daily)

CREATE SCHEMA pgtick;

CREATE TABLE pgtick.workers (
    id              text PRIMARY KEY,
    hostname        text NOT NULL DEFAULT '',
    pid             integer NOT NULL DEFAULT 0,
    version         text NOT NULL DEFAULT '',
    threads         integer NOT NULL DEFAULT 0,
    job_types       text[] NOT NULL DEFAULT '{}',
    started_at      timestamptz NOT NULL DEFAULT now(),
    -- The lease clock of every run this worker holds: a held run expires at
    -- greatest(heartbeat_at, its started_at) + its lease_s. Updated once per heartbeat
    -- (lease/3), never per claim: a row updated per claim would grow a chain of dead versions
    -- under a held horizon that every read walks (PgQue #61).
    heartbeat_at    timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

CREATE SEQUENCE pgtick.runs_id_seq;

-- ---------------------------------------------------------------------------------------------
-- The hot queue.
CREATE TABLE pgtick.queue (
    slot            smallint NOT NULL,
    id              bigint NOT NULL DEFAULT nextval('pgtick.runs_id_seq'),
    schedule_id     bigint,
    scheduled_for   timestamptz,
    job_type        text NOT NULL,
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key text,
    status          text NOT NULL DEFAULT 'queued'
                    CHECK (status IN ('queued', 'running', 'failed', 'cancelled')),
    priority        integer NOT NULL DEFAULT 0,
    concurrency_key text,
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer CHECK (max_attempts >= 1),
    locked_by       text,          -- the holder (running, or cancelled and not yet let go)
    lease_s         real,          -- this claim's lease; see workers.heartbeat_at
    last_error      text,
    error_type      text,
    started_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, slot),
    CHECK (status <> 'running' OR (locked_by IS NOT NULL AND lease_s IS NOT NULL))
) PARTITION BY LIST (slot);
CREATE TABLE pgtick.queue_0 PARTITION OF pgtick.queue FOR VALUES IN (0) WITH (fillfactor = 80);
CREATE TABLE pgtick.queue_1 PARTITION OF pgtick.queue FOR VALUES IN (1) WITH (fillfactor = 80);
CREATE TABLE pgtick.queue_2 PARTITION OF pgtick.queue FOR VALUES IN (2) WITH (fillfactor = 80);
-- The claim: one short range per (job_type, priority) level from the claimer's keyset bound.
CREATE INDEX queue_claim_idx ON pgtick.queue (job_type, priority DESC, run_at, id)
    WHERE status IN ('queued', 'failed');
-- Runs held by a worker (heartbeat's orphan check, the reaper, `status`); locked_by does not
-- move while a run is held, so heartbeats write nothing here.
CREATE INDEX queue_holder_idx ON pgtick.queue (locked_by) WHERE locked_by IS NOT NULL;
-- Flow control: running runs per (job type, key).
CREATE INDEX queue_running_key_idx ON pgtick.queue (job_type, concurrency_key)
    WHERE status = 'running';
-- overlap = skip: unfinished runs of a schedule.
CREATE INDEX queue_schedule_idx ON pgtick.queue (schedule_id) WHERE schedule_id IS NOT NULL;

-- Which slot takes new runs. Updated once per rotation (every 10 s at most), so its dead
-- versions under a held horizon stay few (90 in 15 minutes).
CREATE TABLE pgtick.queue_rotation (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    cur_slot    smallint NOT NULL,
    rotated_at  timestamptz NOT NULL DEFAULT now(),
    first_id    bigint NOT NULL DEFAULT 0      -- runs_id_seq at the last rotation
);
INSERT INTO pgtick.queue_rotation (cur_slot) VALUES (0);

-- Every (job_type, priority) ever enqueued: the keyset claim visits each level with its own
-- bound. Insert-only: enqueue's ON CONFLICT DO NOTHING writes nothing when the pair exists.
CREATE TABLE pgtick.queue_levels (
    job_type    text NOT NULL,
    priority    integer NOT NULL,
    PRIMARY KEY (job_type, priority)
);

-- Flow-control settings per job type, upserted by daemons from their config (only when they
-- differ, so the rows are not rewritten on every start); the claim reads them so that every
-- daemon enforces the same limits.
CREATE TABLE pgtick.job_type_limits (
    job_type            text PRIMARY KEY,
    max_running         integer CHECK (max_running >= 1),
    max_running_per_key integer CHECK (max_running_per_key >= 1),
    rate                integer CHECK (rate >= 1),
    rate_window         interval,
    rate_per_key        integer CHECK (rate_per_key >= 1),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- Starts of rate-limited runs, insert-only, partitioned by hour; partitions older than the
-- longest window are dropped. The claim counts the window: at most `rate` rows by construction.
CREATE TABLE pgtick.rate_log (
    job_type        text NOT NULL,
    concurrency_key text,
    started_at      timestamptz NOT NULL
) PARTITION BY RANGE (started_at);
CREATE INDEX ON pgtick.rate_log (job_type, started_at);
CREATE INDEX ON pgtick.rate_log (job_type, concurrency_key, started_at);

-- ---------------------------------------------------------------------------------------------
-- History: insert-only, partitioned by status (each has its own retention) and by day.
CREATE TABLE pgtick.run_history (
    id              bigint NOT NULL,
    schedule_id     bigint,
    scheduled_for   timestamptz,
    job_type        text NOT NULL,
    payload         jsonb NOT NULL,
    idempotency_key text,
    status          text NOT NULL CHECK (status IN ('succeeded', 'dead', 'cancelled', 'skipped')),
    priority        integer NOT NULL DEFAULT 0,
    concurrency_key text,
    run_at          timestamptz NOT NULL,
    attempts        integer NOT NULL,
    max_attempts    integer,
    last_error      text,
    error_type      text,
    started_at      timestamptz,
    finished_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    -- The run's last attempt (NULL worker_id: it never started, e.g. cancelled while queued):
    -- a run that succeeds at its first try writes this one row when it finishes.
    worker_id       text,
    final_outcome   text CHECK (final_outcome IN ('succeeded', 'failed', 'lost')),
    final_error     text           -- the bounded traceback of that attempt
) PARTITION BY LIST (status);
CREATE TABLE pgtick.run_history_succeeded PARTITION OF pgtick.run_history
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE pgtick.run_history_dead PARTITION OF pgtick.run_history
    FOR VALUES IN ('dead') PARTITION BY RANGE (finished_at);
CREATE TABLE pgtick.run_history_cancelled PARTITION OF pgtick.run_history
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE pgtick.run_history_skipped PARTITION OF pgtick.run_history
    FOR VALUES IN ('skipped') PARTITION BY RANGE (finished_at);
CREATE INDEX ON pgtick.run_history (id);
CREATE INDEX ON pgtick.run_history (job_type, id);
CREATE INDEX ON pgtick.run_history (schedule_id, finished_at) WHERE schedule_id IS NOT NULL;

CREATE TABLE pgtick.attempt_history (
    run_id          bigint NOT NULL,
    attempt         integer NOT NULL,
    worker_id       text NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    outcome         text NOT NULL CHECK (outcome IN ('failed', 'lost', 'released')),
    error           text,
    error_type      text
) PARTITION BY RANGE (finished_at);
CREATE INDEX ON pgtick.attempt_history (run_id, attempt);

-- What an attempt printed: appended ~1/s while it runs (readable at once), a bounded head
-- (seq 0, 1, 2 ... while the head budget lasts), then the tail as a ring of a few slots
-- (seq -1 .. -k, upserted in turn; omitted_bytes counts what fell out between head and tail).
-- Partitioned by the attempt's start, so all of an attempt's chunks share a partition and a
-- ring slot's upsert finds its row.
CREATE TABLE pgtick.output_chunks (
    run_id              bigint NOT NULL,
    attempt             integer NOT NULL,
    attempt_started_at  timestamptz NOT NULL,
    seq                 integer NOT NULL,
    at                  timestamptz NOT NULL DEFAULT now(),
    lines               jsonb NOT NULL,  -- [[offset_ms, stream, text], ...], text valid UTF-8
    omitted_bytes       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, attempt, seq, attempt_started_at)
) PARTITION BY RANGE (attempt_started_at);

-- Uniqueness that outlives the hot row: idempotency keys and schedule occurrences. Daily
-- partitions by creation, dropped with the longest retention; the check spans all partitions
-- under a transaction-scoped advisory lock on the key (see enqueue).
CREATE TABLE pgtick.run_keys (
    idempotency_key text NOT NULL,
    run_id          bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (created_at);
CREATE INDEX ON pgtick.run_keys (idempotency_key);
-- Occurrences carry their own time: partitioned by it, the key is a real UNIQUE constraint.
CREATE TABLE pgtick.schedule_occurrences (
    schedule_id     bigint NOT NULL,
    scheduled_for   timestamptz NOT NULL,
    run_id          bigint NOT NULL,
    PRIMARY KEY (schedule_id, scheduled_for)
) PARTITION BY RANGE (scheduled_for);
-- Backfills reach into days with no partition of their own.
CREATE TABLE pgtick.schedule_occurrences_other PARTITION OF pgtick.schedule_occurrences DEFAULT;

-- ---------------------------------------------------------------------------------------------
-- Partition upkeep: a day's partitions are created days ahead, standalone then ATTACHed
-- (SHARE UPDATE EXCLUSIVE on the parent: it does not wait for pg_dump's ACCESS SHARE, where
-- CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE).
CREATE FUNCTION pgtick.ensure_partitions(p_from date, p_days integer) RETURNS integer
LANGUAGE plpgsql AS $f$
DECLARE
    parent text;
    d date;
    child text;
    made integer := 0;
BEGIN
    FOREACH parent IN ARRAY ARRAY['run_history_succeeded', 'run_history_dead',
            'run_history_cancelled', 'run_history_skipped', 'attempt_history',
            'output_chunks', 'run_keys', 'schedule_occurrences', 'rate_log'] LOOP
        FOR i IN 0 .. p_days - 1 LOOP
            d := p_from + i;
            child := parent || '_' || to_char(d, 'YYYYMMDD');
            CONTINUE WHEN to_regclass('pgtick.' || child) IS NOT NULL;
            EXECUTE format('CREATE TABLE pgtick.%I (LIKE pgtick.%I INCLUDING DEFAULTS'
                           ' INCLUDING CONSTRAINTS)', child, parent);
            EXECUTE format('ALTER TABLE pgtick.%I ATTACH PARTITION pgtick.%I'
                           ' FOR VALUES FROM (%L) TO (%L)', parent, child,
                           d::timestamptz, (d + 1)::timestamptz);
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END;
$f$;

-- ---------------------------------------------------------------------------------------------
-- The public read surface: today's columns and states, plus priority and concurrency_key.
CREATE VIEW pgtick.runs AS
SELECT q.id, q.schedule_id, q.scheduled_for, q.job_type, q.payload, q.idempotency_key,
       q.status, q.run_at, q.attempts, q.max_attempts, q.locked_by,
       CASE WHEN q.locked_by IS NOT NULL
            THEN greatest(w.heartbeat_at, q.started_at) + make_interval(secs => q.lease_s)
       END AS locked_until,
       q.last_error, q.error_type, q.started_at,
       CASE WHEN q.status = 'cancelled' THEN q.updated_at END AS finished_at,
       q.created_at, q.updated_at, q.priority, q.concurrency_key
FROM pgtick.queue q LEFT JOIN pgtick.workers w ON w.id = q.locked_by
UNION ALL
SELECT h.id, h.schedule_id, h.scheduled_for, h.job_type, h.payload, h.idempotency_key,
       h.status, h.run_at, h.attempts, h.max_attempts, NULL::text, NULL::timestamptz,
       h.last_error, h.error_type, h.started_at, h.finished_at, h.created_at, h.updated_at,
       h.priority, h.concurrency_key
FROM pgtick.run_history h;

CREATE VIEW pgtick.attempts AS
SELECT a.run_id, a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome, a.error,
       a.error_type
FROM pgtick.attempt_history a
UNION ALL            -- the open attempt of a held run
SELECT q.id, q.attempts, q.locked_by, q.started_at, NULL::timestamptz, NULL::text, NULL::text,
       NULL::text
FROM pgtick.queue q WHERE q.locked_by IS NOT NULL
UNION ALL            -- the last attempt of a finished run
SELECT h.id, h.attempts, h.worker_id, h.started_at, h.finished_at, h.final_outcome,
       h.final_error, h.error_type
FROM pgtick.run_history h WHERE h.worker_id IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- Enqueue (SPEC §8's signature). The row goes to the current slot; the level is recorded.
CREATE FUNCTION pgtick.enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT 0,
    concurrency_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    new_id bigint;
    k text := enqueue.idempotency_key;
BEGIN
    IF enqueue.job_type IS NULL OR length(enqueue.job_type) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'enqueue: job_type must be 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF k IS NOT NULL THEN
        -- Serialize enqueues of one key until commit (transaction-scoped: PgBouncer-safe),
        -- then look in every partition: the UNIQUE index of one day's partition cannot see
        -- the others.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgtick.key.' || k, 0));
        SELECT r.run_id INTO new_id FROM pgtick.run_keys r WHERE r.idempotency_key = k LIMIT 1;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO pgtick.queue_levels (job_type, priority)
    VALUES (enqueue.job_type, coalesce(enqueue.priority, 0))
    ON CONFLICT DO NOTHING;
    INSERT INTO pgtick.queue (slot, job_type, payload, run_at, idempotency_key, max_attempts,
                              priority, concurrency_key)
    SELECT r.cur_slot, enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
           coalesce(enqueue.run_at, now()), k, enqueue.max_attempts,
           coalesce(enqueue.priority, 0), enqueue.concurrency_key
    FROM pgtick.queue_rotation r
    RETURNING id INTO new_id;
    IF k IS NOT NULL THEN
        INSERT INTO pgtick.run_keys (idempotency_key, run_id) VALUES (k, new_id);
    END IF;
    PERFORM pg_notify('pgtick', enqueue.job_type);
    RETURN new_id;
END;
$f$;

-- Applications that INSERT INTO runs directly keep working (and so does the CLI's trigger).
CREATE FUNCTION pgtick.runs_insert() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
    NEW.id := pgtick.enqueue(NEW.job_type, NEW.payload, NEW.run_at, NEW.idempotency_key,
                             NEW.max_attempts, coalesce(NEW.priority, 0), NEW.concurrency_key);
    RETURN NEW;
END;
$f$;
CREATE TRIGGER runs_insert INSTEAD OF INSERT ON pgtick.runs
    FOR EACH ROW EXECUTE FUNCTION pgtick.runs_insert();

-- ---------------------------------------------------------------------------------------------
-- Claim (job types without limits). The levels (job_type, priority) in priority order, each
-- one short index range from the claimer's bound (its last claimed run_at in that level minus a
-- margin; no bound = a rescan from the start), each taking only what is still missing, so no
-- row is locked that the claim does not take. Starvation rule: a first pass takes runs due for
-- longer than p_aging, whatever their priority. Returns the claim token (attempts) with each
-- run, in the order the handlers should start.
CREATE FUNCTION pgtick.claim(
    p_worker text, p_types text[], p_leases real[], p_max_attempts integer[], p_limit integer,
    p_lb_types text[], p_lb_prios integer[], p_lbs timestamptz[],
    p_aging interval DEFAULT '5 minutes'
) RETURNS TABLE (id bigint, job_type text, payload jsonb, attempts integer,
                 max_attempts integer, scheduled_for timestamptz, idempotency_key text,
                 run_at timestamptz, schedule_id bigint, started_at timestamptz,
                 priority integer, concurrency_key text)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    lv record;
    aged boolean;
    remaining integer := p_limit;
    n integer;
BEGIN
    FOREACH aged IN ARRAY ARRAY[true, false] LOOP
        FOR lv IN
            SELECT l.job_type, l.priority, coalesce(c.lb, '-infinity'::timestamptz) AS lb,
                   t.lease, t.max_attempts
            FROM pgtick.queue_levels l
            JOIN unnest(p_types, p_leases, p_max_attempts) AS t(job_type, lease, max_attempts)
                ON t.job_type = l.job_type
            LEFT JOIN unnest(p_lb_types, p_lb_prios, p_lbs) AS c(job_type, priority, lb)
                ON c.job_type = l.job_type AND c.priority = l.priority
            ORDER BY l.priority DESC
        LOOP
            EXIT WHEN remaining <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT r.id, r.slot FROM pgtick.queue r
                WHERE r.job_type = lv.job_type AND r.priority = lv.priority
                  AND r.status IN ('queued', 'failed') AND r.run_at >= lv.lb
                  AND r.run_at <= CASE WHEN aged THEN now() - p_aging ELSE now() END
                ORDER BY r.run_at, r.id
                LIMIT remaining FOR UPDATE SKIP LOCKED
            )
            UPDATE pgtick.queue r
            SET status = 'running', locked_by = p_worker, lease_s = lv.lease,
                attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, lv.max_attempts),
                started_at = now(), updated_at = now()
            FROM picked WHERE r.id = picked.id AND r.slot = picked.slot
            RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
                      r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.priority,
                      r.concurrency_key;
            GET DIAGNOSTICS n = ROW_COUNT;
            remaining := remaining - n;
        END LOOP;
    END LOOP;
END;
$f$;

-- Claim for one job type with limits (job_type_limits): max_running fleet-wide,
-- max_running_per_key, rate (per window). One claimer of the type at a time fleet-wide (an
-- advisory lock held to the end of the claim's transaction, so PgBouncer-safe); every statement
-- after the lock takes a fresh snapshot (READ COMMITTED) and sees the previous holder's claims.
-- Slots are running rows: a dead daemon's slots free when the reaper moves its runs on.
CREATE FUNCTION pgtick.claim_limited(
    p_worker text, p_type text, p_lease real, p_max_attempts integer, p_limit integer
) RETURNS TABLE (id bigint, job_type text, payload jsonb, attempts integer,
                 max_attempts integer, scheduled_for timestamptz, idempotency_key text,
                 run_at timestamptz, schedule_id bigint, started_at timestamptz,
                 priority integer, concurrency_key text)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
DECLARE
    lim pgtick.job_type_limits;
    free integer := p_limit;
    n integer;
    t timestamptz;
BEGIN
    SELECT * INTO lim FROM pgtick.job_type_limits l WHERE l.job_type = p_type;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgtick.limits.' || p_type, 0));
    t := clock_timestamp();   -- the window is measured from the lock, not the txn's start
    IF lim.max_running IS NOT NULL THEN
        SELECT lim.max_running - count(*) INTO n FROM pgtick.queue q
        WHERE q.job_type = p_type AND q.status = 'running';
        free := least(free, n);
    END IF;
    IF lim.rate IS NOT NULL THEN
        SELECT lim.rate - count(*) INTO n FROM pgtick.rate_log l
        WHERE l.job_type = p_type AND l.started_at > t - lim.rate_window;
        free := least(free, n);
    END IF;
    IF free <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH busy AS (
        SELECT q.concurrency_key AS k, count(*) AS n FROM pgtick.queue q
        WHERE q.job_type = p_type AND q.status = 'running' AND q.concurrency_key IS NOT NULL
        GROUP BY q.concurrency_key
    ), recent AS (
        SELECT l.concurrency_key AS k, count(*) AS n FROM pgtick.rate_log l
        WHERE lim.rate_per_key IS NOT NULL AND l.job_type = p_type
          AND l.concurrency_key IS NOT NULL AND l.started_at > t - lim.rate_window
        GROUP BY l.concurrency_key
    ), candidates AS (
        SELECT r.id, r.slot, r.priority, r.run_at, r.concurrency_key FROM pgtick.queue r
        WHERE r.job_type = p_type AND r.status IN ('queued', 'failed') AND r.run_at <= now()
          AND (r.concurrency_key IS NULL OR (
                (lim.max_running_per_key IS NULL OR NOT EXISTS (
                    SELECT FROM busy b WHERE b.k = r.concurrency_key
                                         AND b.n >= lim.max_running_per_key))
            AND (lim.rate_per_key IS NULL OR NOT EXISTS (
                    SELECT FROM recent x WHERE x.k = r.concurrency_key
                                           AND x.n >= lim.rate_per_key))))
        ORDER BY r.priority DESC, r.run_at, r.id
        LIMIT p_limit * 4 FOR UPDATE SKIP LOCKED
    ), ranked AS (
        SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key
                                       ORDER BY c.priority DESC, c.run_at, c.id) AS nth
        FROM candidates c
    ), picked AS (
        SELECT ranked.* FROM ranked
        LEFT JOIN busy ON busy.k = ranked.concurrency_key
        LEFT JOIN recent ON recent.k = ranked.concurrency_key
        WHERE ranked.concurrency_key IS NULL
           OR ((lim.max_running_per_key IS NULL
                OR ranked.nth + coalesce(busy.n, 0) <= lim.max_running_per_key)
               AND (lim.rate_per_key IS NULL
                OR ranked.nth + coalesce(recent.n, 0) <= lim.rate_per_key))
        ORDER BY priority DESC, run_at, id
        LIMIT free
    ), claimed AS (
        UPDATE pgtick.queue r
        SET status = 'running', locked_by = p_worker, lease_s = p_lease,
            attempts = r.attempts + 1, max_attempts = coalesce(r.max_attempts, p_max_attempts),
            started_at = now(), updated_at = now()
        FROM picked WHERE r.id = picked.id AND r.slot = picked.slot
        RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
                  r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.priority,
                  r.concurrency_key
    ), logged AS (
        INSERT INTO pgtick.rate_log (job_type, concurrency_key, started_at)
        SELECT p_type, c.concurrency_key, t FROM claimed c
        WHERE lim.rate IS NOT NULL OR lim.rate_per_key IS NOT NULL
    )
    SELECT * FROM claimed;
END;
$f$;

-- How long an idle dispatcher may sleep: the earliest runnable run_at of its job types, one
-- short range per level from the same bounds as the claim.
CREATE FUNCTION pgtick.next_due(p_types text[], p_lb_types text[], p_lb_prios integer[],
                                p_lbs timestamptz[])
RETURNS double precision
LANGUAGE sql STABLE AS $f$
    SELECT extract(epoch FROM min(n.run_at) - now())::float8
    FROM pgtick.queue_levels l
    LEFT JOIN unnest(p_lb_types, p_lb_prios, p_lbs) AS c(job_type, priority, lb)
        ON c.job_type = l.job_type AND c.priority = l.priority
    CROSS JOIN LATERAL (
        SELECT r.run_at FROM pgtick.queue r
        WHERE r.job_type = l.job_type AND r.priority = l.priority
          AND r.status IN ('queued', 'failed') AND r.run_at >= coalesce(c.lb, '-infinity')
        ORDER BY r.run_at LIMIT 1) n
    WHERE l.job_type = ANY(p_types)
$f$;

-- Heartbeat: one row written (the worker's), the held runs only read, in a statement that runs
-- after the update (so after any reaper holding the worker row has committed). Returns the
-- runs still held, whether the worker row exists, the held runs an operator cancelled, and
-- orphans: runs held in the database under this worker's name that it did not list (a claim
-- whose answer was lost with its connection); the caller hands them to reap_mark.
CREATE FUNCTION pgtick.heartbeat(p_worker text, p_held bigint[], p_grace interval)
RETURNS TABLE (held bigint[], alive boolean, cancelled bigint[], orphans bigint[])
LANGUAGE plpgsql AS $f$
DECLARE
    ok boolean;
BEGIN
    UPDATE pgtick.workers SET heartbeat_at = now() WHERE id = p_worker;
    ok := FOUND;
    RETURN QUERY
    SELECT ARRAY(SELECT q.id FROM pgtick.queue q
                 WHERE q.id = ANY(p_held) AND q.locked_by = p_worker AND q.status = 'running'),
           ok,
           ARRAY(SELECT q.id FROM pgtick.queue q
                 WHERE q.id = ANY(p_held) AND q.locked_by = p_worker AND q.status = 'cancelled'),
           ARRAY(SELECT q.id FROM pgtick.queue q
                 WHERE q.locked_by = p_worker AND q.status = 'running'
                   AND q.id <> ALL(p_held) AND q.started_at < now() - p_grace);
END;
$f$;

-- Succeed: the hot row moves to history, guarded by the holder and the claim token.
CREATE FUNCTION pgtick.succeed(p_worker text, p_ids bigint[], p_attempts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    WITH done AS (
        DELETE FROM pgtick.queue q
        USING unnest(p_ids, p_attempts) AS i(id, attempt)
        WHERE q.id = i.id AND q.attempts = i.attempt AND q.locked_by = p_worker
          AND q.status = 'running'
        RETURNING q.*
    ), hist AS (
        INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, finished_at, created_at, updated_at,
            worker_id, final_outcome)
        SELECT d.id, d.schedule_id, d.scheduled_for, d.job_type, d.payload, d.idempotency_key,
               'succeeded', d.priority, d.concurrency_key, d.run_at, d.attempts, d.max_attempts,
               d.last_error, d.error_type, d.started_at, now(), d.created_at, now(),
               d.locked_by, 'succeeded'
        FROM done d
    )
    SELECT d.id FROM done d;
END;
$f$;

-- Fail: a retry stays in the hot queue (its attempt goes to attempt_history); a dead run moves
-- to history with its last attempt folded in.
CREATE FUNCTION pgtick.fail(p_worker text, p_ids bigint[], p_attempts integer[],
                            p_errors text[], p_error_types text[], p_details text[],
                            p_delays double precision[])
RETURNS TABLE (id bigint, status text, run_at timestamptz)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_ids, p_attempts, p_errors, p_error_types, p_details, p_delays)
            AS f(id, attempt, error, error_type, detail, delay)
    ), held AS (
        SELECT q.id, q.slot, q.attempts, q.started_at, f.error, f.error_type, f.detail, f.delay,
               (f.delay IS NULL OR q.attempts >= coalesce(q.max_attempts, 1)) AS final
        FROM pgtick.queue q JOIN input f ON q.id = f.id AND q.attempts = f.attempt
        WHERE q.locked_by = p_worker AND q.status = 'running'
        FOR UPDATE OF q
    ), retry AS (
        UPDATE pgtick.queue q
        SET status = 'failed', run_at = now() + make_interval(secs => h.delay),
            last_error = h.error, error_type = h.error_type, locked_by = NULL, lease_s = NULL,
            updated_at = now()
        FROM held h WHERE q.id = h.id AND q.slot = h.slot AND NOT h.final
        RETURNING q.id, q.status, q.run_at
    ), retry_attempt AS (
        INSERT INTO pgtick.attempt_history (run_id, attempt, worker_id, started_at, finished_at,
                                            outcome, error, error_type)
        SELECT h.id, h.attempts, p_worker, h.started_at, now(), 'failed', h.detail, h.error_type
        FROM held h WHERE NOT h.final
    ), dead AS (
        DELETE FROM pgtick.queue q USING held h
        WHERE q.id = h.id AND q.slot = h.slot AND h.final
        RETURNING q.*, h.error AS f_error, h.error_type AS f_error_type, h.detail AS f_detail
    ), dead_history AS (
        INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, finished_at, created_at, updated_at,
            worker_id, final_outcome, final_error)
        SELECT d.id, d.schedule_id, d.scheduled_for, d.job_type, d.payload, d.idempotency_key,
               'dead', d.priority, d.concurrency_key, d.run_at, d.attempts, d.max_attempts,
               d.f_error, d.f_error_type, d.started_at, now(), d.created_at, now(),
               d.locked_by, 'failed', d.f_detail
        FROM dead d
    )
    SELECT r.id, r.status, r.run_at FROM retry r
    UNION ALL
    SELECT d.id, 'dead'::text, d.run_at FROM dead d;
END;
$f$;

-- Release on shutdown: back to queued, the attempt not counted (recorded as released).
CREATE FUNCTION pgtick.release(p_worker text, p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    WITH done AS (
        UPDATE pgtick.queue q
        SET status = 'queued', attempts = q.attempts - 1, locked_by = NULL, lease_s = NULL,
            updated_at = now()
        WHERE q.id = ANY(p_ids) AND q.locked_by = p_worker AND q.status = 'running'
        RETURNING q.id, q.attempts + 1 AS attempt, q.started_at
    ), closed AS (
        INSERT INTO pgtick.attempt_history (run_id, attempt, worker_id, started_at, finished_at,
                                            outcome, error)
        SELECT d.id, d.attempt, p_worker, d.started_at, now(), 'released', 'released on shutdown'
        FROM done d
    )
    SELECT d.id FROM done d;
    -- run_at is kept, so these runs are behind the claimers' keyset bounds: tell them to rescan.
    PERFORM pg_notify('pgtick', 'rescan');
END;
$f$;

-- Reaper, step 1: runs whose holder stopped heartbeating for longer than their lease. The
-- worker row is locked (SKIP LOCKED: a heartbeat in flight means it is alive), so a heartbeat
-- cannot interleave with the reaping of its runs.
CREATE FUNCTION pgtick.reap_select(p_min_lease real, p_limit integer)
RETURNS TABLE (id bigint, job_type text, attempts integer, max_attempts integer,
               locked_by text)
LANGUAGE sql AS $f$
    WITH stale AS (
        SELECT w.id, w.heartbeat_at FROM pgtick.workers w
        WHERE w.heartbeat_at < now() - make_interval(secs => p_min_lease)
        FOR UPDATE SKIP LOCKED
    )
    SELECT q.id, q.job_type, q.attempts, q.max_attempts, q.locked_by
    FROM stale w
    JOIN pgtick.queue q ON q.locked_by = w.id AND q.status IN ('running', 'cancelled')
    WHERE greatest(w.heartbeat_at, q.started_at) + make_interval(secs => q.lease_s) < now()
    ORDER BY q.started_at
    LIMIT p_limit
$f$;

-- Reaper, step 2 (and orphans from heartbeat): failed with backoff, or dead (delay NULL), the
-- attempt recorded as lost; a cancelled run that was still held goes to history as cancelled.
CREATE FUNCTION pgtick.reap_mark(p_ids bigint[], p_delays double precision[])
RETURNS TABLE (id bigint, status text, job_type text)
LANGUAGE plpgsql AS $f$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_ids, p_delays) AS f(id, delay)
    ), held AS (
        SELECT q.id, q.slot, q.status, q.attempts, q.locked_by, q.started_at, f.delay
        FROM pgtick.queue q JOIN input f ON q.id = f.id
        WHERE q.status IN ('running', 'cancelled') AND q.locked_by IS NOT NULL
        FOR UPDATE OF q
    ), retry AS (
        UPDATE pgtick.queue q
        SET status = 'failed',
            run_at = CASE WHEN h.delay = 0 THEN q.run_at
                          ELSE now() + make_interval(secs => h.delay) END,
            last_error = 'lease expired while running on ' || h.locked_by,
            error_type = 'lease_expired', locked_by = NULL, lease_s = NULL, updated_at = now()
        FROM held h
        WHERE q.id = h.id AND q.slot = h.slot AND h.status = 'running' AND h.delay IS NOT NULL
        RETURNING q.id, q.status, q.job_type
    ), retry_attempt AS (
        INSERT INTO pgtick.attempt_history (run_id, attempt, worker_id, started_at, finished_at,
                                            outcome, error, error_type)
        SELECT h.id, h.attempts, h.locked_by, h.started_at, now(), 'lost', 'lease expired',
               'lease_expired'
        FROM held h WHERE h.status = 'running' AND h.delay IS NOT NULL
    ), gone AS (
        DELETE FROM pgtick.queue q USING held h
        WHERE q.id = h.id AND q.slot = h.slot AND (h.status = 'cancelled' OR h.delay IS NULL)
        RETURNING q.*, h.status AS was
    ), gone_history AS (
        INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, finished_at, created_at, updated_at,
            worker_id, final_outcome, final_error)
        SELECT g.id, g.schedule_id, g.scheduled_for, g.job_type, g.payload, g.idempotency_key,
               CASE WHEN g.was = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               g.priority, g.concurrency_key, g.run_at, g.attempts, g.max_attempts,
               CASE WHEN g.was = 'cancelled' THEN g.last_error
                    ELSE 'lease expired while running on ' || g.locked_by END,
               CASE WHEN g.was = 'cancelled' THEN g.error_type ELSE 'lease_expired' END,
               g.started_at, now(), g.created_at, now(), g.locked_by, 'lost',
               CASE WHEN g.was = 'cancelled' THEN 'cancelled by operator'
                    ELSE 'lease expired' END
        FROM gone g
    )
    SELECT r.id, r.status, r.job_type FROM retry r
    UNION ALL
    SELECT g.id, CASE WHEN g.was = 'cancelled' THEN 'cancelled' ELSE 'dead' END, g.job_type
    FROM gone g;
    PERFORM pg_notify('pgtick', 'rescan');
END;
$f$;

-- Operator cancel: a queued or failed run goes to history at once; a running one stays held
-- (status cancelled, not claimable) until its holder lets go (abandon) or its lease expires
-- (reap_mark), so it never runs twice at once (SPEC rule 10).
CREATE FUNCTION pgtick.cancel(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    WITH held AS (
        UPDATE pgtick.queue q SET status = 'cancelled', updated_at = now()
        WHERE q.id = ANY(p_ids) AND q.status = 'running'
        RETURNING q.id
    ), waiting AS (
        DELETE FROM pgtick.queue q
        WHERE q.id = ANY(p_ids) AND q.status IN ('queued', 'failed')
        RETURNING q.*
    ), moved AS (
        INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, finished_at, created_at, updated_at)
        SELECT w.id, w.schedule_id, w.scheduled_for, w.job_type, w.payload, w.idempotency_key,
               'cancelled', w.priority, w.concurrency_key, w.run_at, w.attempts, w.max_attempts,
               w.last_error, w.error_type, w.started_at, now(), w.created_at, now()
        FROM waiting w
    )
    SELECT h.id FROM held h UNION ALL SELECT w.id FROM waiting w;
END;
$f$;

-- The holder of a cancelled run lets go of it (its handler has stopped).
CREATE FUNCTION pgtick.abandon(p_worker text, p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $f$
    WITH gone AS (
        DELETE FROM pgtick.queue q
        WHERE q.id = ANY(p_ids) AND q.locked_by = p_worker AND q.status = 'cancelled'
        RETURNING q.*
    ), moved AS (
        INSERT INTO pgtick.run_history (id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, finished_at, created_at, updated_at,
            worker_id, final_outcome, final_error)
        SELECT g.id, g.schedule_id, g.scheduled_for, g.job_type, g.payload, g.idempotency_key,
               'cancelled', g.priority, g.concurrency_key, g.run_at, g.attempts, g.max_attempts,
               g.last_error, g.error_type, g.started_at, g.updated_at, g.created_at, now(),
               g.locked_by, 'lost', 'cancelled by operator'
        FROM gone g
    )
    SELECT g.id FROM gone g
$f$;

-- Operator retry: a failed run in the queue is due now; a dead or cancelled run comes back
-- from history (a DELETE in history: rare, operator-driven) into the current slot, same id.
CREATE FUNCTION pgtick.retry(p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $f$
BEGIN
    RETURN QUERY
    WITH waiting AS (
        UPDATE pgtick.queue q SET run_at = now(), updated_at = now()
        WHERE q.id = ANY(p_ids) AND q.status = 'failed'
        RETURNING q.id
    ), back AS (
        DELETE FROM pgtick.run_history h
        WHERE h.id = ANY(p_ids) AND h.status IN ('dead', 'cancelled')
        RETURNING h.*
    ), requeued AS (
        INSERT INTO pgtick.queue (slot, id, schedule_id, scheduled_for, job_type, payload,
            idempotency_key, status, priority, concurrency_key, run_at, attempts, max_attempts,
            last_error, error_type, started_at, created_at, updated_at)
        SELECT r.cur_slot, b.id, b.schedule_id, b.scheduled_for, b.job_type, b.payload,
               b.idempotency_key, 'queued', b.priority, b.concurrency_key, now(), b.attempts,
               CASE WHEN b.max_attempts IS NOT NULL AND b.attempts >= b.max_attempts
                    THEN b.attempts + 1 ELSE b.max_attempts END,
               b.last_error, b.error_type, b.started_at, b.created_at, now()
        FROM back b, pgtick.queue_rotation r
        RETURNING id
    ), last_attempt AS (   -- the folded last attempt becomes an attempt row of its own
        INSERT INTO pgtick.attempt_history (run_id, attempt, worker_id, started_at, finished_at,
                                            outcome, error, error_type)
        SELECT b.id, b.attempts, b.worker_id, b.started_at, b.finished_at, b.final_outcome,
               b.final_error, b.error_type
        FROM back b WHERE b.worker_id IS NOT NULL
    )
    SELECT w.id FROM waiting w UNION ALL SELECT q.id FROM requeued q;
END;
$f$;

-- ---------------------------------------------------------------------------------------------
-- Rotation, called by any daemon's maintenance tick (one at a time: the rotation row's lock).
-- Rotates when the current slot is older than p_period or took more than p_max_rows runs:
-- the oldest slot's live rows (runs scheduled ahead, job types no daemon handles, long leases,
-- retries waiting) move to the current slot, the oldest slot is TRUNCATEd and becomes current.
-- Its ACCESS EXCLUSIVE lock is asked with NOWAIT: a pg_dump or a long transaction that touched
-- the slot makes the rotation give up (and retry next tick) instead of queueing every claim
-- behind it. A backlog (more than p_carry_max live rows) postpones the rotation: the claim
-- drains it first.
CREATE FUNCTION pgtick.rotate(p_period interval, p_max_rows bigint, p_carry_max integer)
RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    rot pgtick.queue_rotation;
    nxt smallint;
    live bigint;
    moved bigint;
BEGIN
    SELECT * INTO rot FROM pgtick.queue_rotation FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 'busy';
    END IF;
    IF rot.rotated_at > now() - p_period
       AND (SELECT last_value FROM pgtick.runs_id_seq) - rot.first_id < p_max_rows THEN
        RETURN 'not due';
    END IF;
    nxt := (rot.cur_slot + 1) % 3;
    BEGIN
        EXECUTE format('LOCK TABLE pgtick.%I IN ACCESS EXCLUSIVE MODE NOWAIT', 'queue_' || nxt);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'locked';
    END;
    EXECUTE format('SELECT count(*) FROM pgtick.%I', 'queue_' || nxt) INTO live;
    IF live > p_carry_max THEN
        RETURN 'backlog';
    END IF;
    UPDATE pgtick.queue SET slot = rot.cur_slot WHERE slot = nxt;
    GET DIAGNOSTICS moved = ROW_COUNT;
    EXECUTE format('TRUNCATE pgtick.%I', 'queue_' || nxt);
    UPDATE pgtick.queue_rotation
    SET cur_slot = nxt, rotated_at = now(),
        first_id = (SELECT last_value FROM pgtick.runs_id_seq);
    RETURN format('rotated to %s, %s carried', nxt, moved);
END;
$f$;

-- Retention: drop whole day partitions past their status's retention. DETACH ... CONCURRENTLY
-- (PostgreSQL 14+) cannot run in a function (it needs its own transaction), so the daemon
-- sends the statements this lists one by one, each with a short lock_timeout; on PostgreSQL 13
-- a plain DETACH (a brief ACCESS EXCLUSIVE on the status parent) does the same job.
CREATE FUNCTION pgtick.expired_partitions(p_retention jsonb)
RETURNS TABLE (parent text, child text)
LANGUAGE sql STABLE AS $f$
    SELECT p.relname::text, c.relname::text
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class p ON p.oid = i.inhparent
    JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'pgtick'
    CROSS JOIN LATERAL (SELECT CASE
        WHEN p.relname LIKE 'run_history_%' THEN p_retention ->> substr(p.relname, 13)
        ELSE p_retention ->> 'longest' END AS keep) k
    WHERE p.relname IN ('run_history_succeeded', 'run_history_dead', 'run_history_cancelled',
                        'run_history_skipped', 'attempt_history', 'output_chunks', 'run_keys',
                        'rate_log')
      AND k.keep IS NOT NULL
      AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 < (now() - k.keep::interval)::date
$f$;
