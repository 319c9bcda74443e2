-- Every statement pgtick sends, as named blocks: a "-- name --" line, description comment
-- lines, then the SQL. Loaded once by sqlfile.py. Parameters are %(name)s. Every table and
-- function is qualified with {schema}, filled once per schema with psycopg.sql.Identifier (a
-- value is never interpolated): no statement depends on a connection's search_path, which a
-- transaction-mode pooler (PgBouncer) does not keep from one transaction to the next. Literal
-- braces are doubled ('{{}}' is an empty JSON object).
--
-- runs is partitioned by status (migration 0010): a statement on the hot path names the
-- statuses it reads or writes, even where the other conditions imply them, so that the
-- planner reads runs_live (or runs_cancelled) only instead of every terminal partition.
--
-- The statements of the hot path (claim, finish, heartbeat, the claimer's probes) are written so
-- that the planner cannot choose a plan that reads what a held snapshot piles up. While a snapshot
-- is held elsewhere (pg_dump, a long analytics query, a replica's feedback), vacuum removes
-- nothing, so runs_live keeps a dead version, and its indexes an entry, of every run claimed and
-- finished since (attempts_open did too, until 0013 wrote attempts once); (auto)ANALYZE then shows
-- a few live rows in many pages. With that estimate every plan looks equally cheap, and the planner
-- picked, one minute or another, plans that read a whole index or table (measured, bench
-- queue-health under auto_explain): a sequential scan of attempts_open for each finished run, the
-- id index read from end to end as the outer side of a join, the (job_type, id) index and a sort
-- instead of the claim index, the whole lease index for `status = 'running'`. Hence:
-- - rows known by id are given as a list (`r.id = ANY(%(ids)s)`, `ANY(ARRAY(SELECT id FROM
--   done))` for the rows an earlier CTE wrote), never joined with their input: a join lets
--   the planner read an index in order from the start (useful to it for a merge); each row's
--   values come from the input lists by its position, `width_bucket(r.id, ids)`: a binary
--   search, as the store sends every list of ids sorted (runs.py, by_id), where array_position
--   was a linear scan per row (a finish of n runs compared n²/2 ids; an update of 264 rows by
--   id took 1.82 ms with it, 1.42 with width_bucket, measured apart); a guard also checks
--   `ids[position] = r.id`, so a list not sorted matches nothing rather than a wrong attempt;
-- - a list read row by row is cast once, in a sub-select of its own, `(SELECT
--   %(ids)s::bigint[])`, evaluated once per statement: psycopg sends short integers as
--   int2[] or int4[], and a prepared statement's generic plan casts a list written inline
--   again for every row that reads it, so a finish of 400 runs cast 400 lists of 400 ids
--   (the cast was a fifth of PostgreSQL's time in a drain, perf);
-- - a condition never implies a partial index's predicate unless that index is the one to
--   read: the holder's guard is `locked_by IS NOT DISTINCT FROM %(worker_id)s` (the same
--   test for a worker id, never NULL), not `locked_by = ...`, which implies runs_held_idx's
--   `locked_by IS NOT NULL`; "running" is said as the live partition's statuses;
-- - the store sends each of them after planner_hints (base.by_index), in one round trip:
--   no sequential scan, no sort where an index gives the order.

-- planner_hints --
-- For the next statement of the hot path only (the header says why): transaction-local, and
-- sent in the same pipeline, so it ends with that statement's transaction. JIT off too:
-- before PostgreSQL 18 a disabled plan node adds 1e10 to the plan's cost, far above
-- jit_above_cost, and a server built with LLVM (jit = on is the default, and Debian's and
-- PGDG's packages have it) then compiled every claim and finish, inlined and optimized:
-- 0.8-4.5 s a statement on PostgreSQL 15 instead of milliseconds. And a prepared statement
-- runs on its generic plan, always (force_generic_plan): under the default (auto) a re-plan,
-- after autoanalyze or a partition that maintain_partitions created or dropped, weighs the
-- generic plan against custom ones again, and could settle on planning the claim at every
-- call for the rest of the run: 0.8 ms of planning for 0.2 ms of execution, the claim
-- backend's CPU doubled and the daemon's claim p99 up from about 2.5 to 5-6 ms (bench soak,
-- 2026-11-27: pg_stat_statements' plans counting up with its calls from one minute on). The
-- hints above hold the plan to index paths either way; executions took 0.17-0.20 ms a claim
-- on the generic plan as on the custom ones. Without prepared statements (a pooler) every
-- statement is planned anyway.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),
       set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true);

-- lock_wait --
-- For the next statement only, as planner_hints: how long it may wait for a row lock. A
-- finish waits at most this long for a run's row that another session holds (an operator's
-- open transaction, a FOR UPDATE): the completer then writes the batch's other results
-- without that run and tries it again later, so one locked row never holds up every result
-- of the daemon (completer.py).
SELECT set_config('lock_timeout', %(ms)s, true) AS lock_wait;

-- utc_by_name --
-- A pool connection whose server zone is UTC under another name (Etc/UTC, the default of
-- initdb on most systems): the session's zone named "UTC" instead. The same instants and the
-- same offset (zero) in every value and every SQL function; what changes is the client's
-- cost: psycopg gives each timestamptz in the session's zone, Python's own UTC for "UTC" and
-- a ZoneInfo conversion per value for any other name (a claim's result, 264 rows of three
-- timestamps, took 1.13 ms to fetch with Etc/UTC and 0.65-0.70 ms with UTC). A session
-- setting, the one pgtick makes: behind a transaction-mode pooler it is kept too (PgBouncer
-- tracks TimeZone for each client), and nothing depends on it but that cost.
SELECT set_config('TimeZone', 'UTC', false);

-- db_now --
-- The database clock; every time comparison uses it, never a daemon's clock (clocks on VMs
-- drift).
SELECT now();

-- current_user --
-- The role this connection acts as (`pgtick status` names it when it lacks pg_monitor).
SELECT current_user::text;

-- enqueue --
-- One run through the schema's own SQL function, so the rules live in one place.
SELECT {schema}.enqueue(%(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s, %(max_attempts)s,
                        %(priority)s, %(concurrency_key)s);

-- enqueue_traced --
-- The same with the enqueuing trace's context (migration 0018). Only a run that has one is
-- sent this way: an application on a newer pgtick than its schema still enqueues the others.
SELECT {schema}.enqueue(%(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s, %(max_attempts)s,
                        %(priority)s, %(concurrency_key)s, traceparent => %(traceparent)s);

-- enqueue_qualified --
-- The same from a caller's connection, whose search_path we must not touch.
SELECT {schema}.enqueue(%(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s, %(max_attempts)s,
                        %(priority)s, %(concurrency_key)s);

-- enqueue_qualified_traced --
-- enqueue_traced from a caller's connection.
SELECT {schema}.enqueue(%(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s, %(max_attempts)s,
                        %(priority)s, %(concurrency_key)s, traceparent => %(traceparent)s);

-- enqueue_composed --
-- The same with a chain (migration 0025): only a run that has one is sent this way.
SELECT {schema}.enqueue(%(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s, %(max_attempts)s,
                        %(priority)s, %(concurrency_key)s, traceparent => %(traceparent)s,
                        on_success => %(on_success)s, on_dead => %(on_dead)s);

-- enqueue_member --
-- A member of an open batch (migration 0026), with its chain if it has one.
SELECT {schema}.batch_add(%(batch_id)s, %(job_type)s, %(payload)s, %(run_at)s, %(idempotency_key)s,
                          %(max_attempts)s, %(priority)s, %(concurrency_key)s, %(traceparent)s,
                          %(on_success)s, %(on_dead)s);

-- batch_members_added --
-- enqueue_many's members of one batch counted, under its row lock; refused unless open.
SELECT {schema}.batch_members_added(%(batch_id)s, %(n)s);

-- batch_open --
-- A new batch, open, with its callback steps (a normal form of scheduling/steps.py).
SELECT {schema}.batch_open(%(callback)s);

-- batch_close --
-- No more members; done at once (callback enqueued) if every member is terminal.
SELECT {schema}.batch_close(%(batch_id)s);

-- get_batch --
-- One batch, and its members still kept by state (retention may have dropped finished ones).
SELECT b.id, b.state, b.callback, b.members, b.succeeded, b.dead, b.cancelled, b.skipped,
       b.callback_run_id, b.created_at, b.closed_at, b.done_at,
       (SELECT coalesce(jsonb_object_agg(s.status, s.n), '{{}}'::jsonb)
        FROM (SELECT r.status, count(*) AS n FROM {schema}.runs r
              WHERE r.batch_id = b.id GROUP BY r.status) s) AS kept
FROM {schema}.batches b WHERE b.id = %(batch_id)s;

-- take_idempotency_keys --
-- The batch's idempotency keys taken (migration 0015): per distinct key, the run that has it
-- (fresh false) or the id to insert its run with (fresh true). Before enqueue_many, in its
-- transaction, which then inserts only the fresh ones.
SELECT idempotency_key, run_id, fresh FROM {schema}.take_idempotency_keys(%(keys)s::text[]);

-- enqueue_many --
-- Many runs in one statement, after take_idempotency_keys: a keyed run with the id its key
-- was taken with, the others with ids drawn here, in input order.
WITH input AS (
    SELECT i.*, coalesce(i.given_id, nextval(pg_get_serial_sequence({runs_table}, 'id'))) AS new_id
    FROM unnest(%(ids)s::bigint[], %(job_types)s::text[], %(payloads)s::jsonb[],
                %(run_ats)s::timestamptz[], %(keys)s::text[], %(max_attempts)s::int[],
                %(priorities)s::int[], %(concurrency_keys)s::text[], %(traceparents)s::text[],
                %(follows)s::jsonb[], %(batch_ids)s::bigint[])
         WITH ORDINALITY AS i(given_id, job_type, payload, run_at, idempotency_key, max_attempts,
                              priority, concurrency_key, traceparent, follow, batch_id, ord)
), inserted AS (
    -- A run's chain: its own (checked by the caller), else its job type's (migration 0025).
    INSERT INTO {schema}.runs (id, job_type, payload, run_at, idempotency_key, max_attempts,
                               priority, concurrency_key, traceparent, follow, batch_id)
    OVERRIDING SYSTEM VALUE
    SELECT new_id, input.job_type, coalesce(payload, '{{}}'::jsonb), coalesce(run_at, now()),
           idempotency_key, max_attempts, coalesce(input.priority, s.priority, 0),
           concurrency_key, {schema}.valid_traceparent(input.traceparent),
           coalesce(input.follow, s.follow), input.batch_id
    FROM input
    LEFT JOIN {schema}.job_type_settings s ON s.job_type = input.job_type
    ORDER BY ord
)
SELECT new_id FROM input ORDER BY ord;

-- sync_job_type_settings --
-- Record the default priority and chain of this daemon's job types (enqueue() reads them);
-- rows change only when a value does.
INSERT INTO {schema}.job_type_settings (job_type, priority, follow)
SELECT * FROM unnest(%(job_types)s::text[], %(priorities)s::int[], %(follows)s::jsonb[])
ON CONFLICT (job_type) DO UPDATE
SET priority = excluded.priority, follow = excluded.follow, updated_at = now()
WHERE job_type_settings.priority IS DISTINCT FROM excluded.priority
   OR job_type_settings.follow IS DISTINCT FROM excluded.follow;

-- listen --
-- The LISTEN connection subscribes to the channel named after the schema (enqueue NOTIFYs it
-- with the job type as payload).
LISTEN {schema};

-- backend_pid --
-- The server process serving this connection: behind a pooler it differs from the pid the
-- connection was given at startup (the LISTEN connection's pooler detection).
SELECT pg_backend_pid();

-- notify --
-- Wake idle daemons that handle this job type.
SELECT pg_notify({channel}, %(job_type)s);

-- notify_rescan --
-- Runs were put behind the claimers' lower bounds (materialized late, backfilled):
-- every daemon's next claim scans each type from the start. The payload is no job type name
-- (names cannot start with "!"), so daemons of earlier versions ignore it.
SELECT pg_notify({channel}, '!rescan');

-- notify_due --
-- Runs were made claimable: announce each job type's earliest due second ("!due SECONDS
-- JOB_TYPE", as enqueue() does). A claimer whose lower bound for the type is past it lowers
-- the bound to it (core/keyset.py): a run committed late by a long transaction, enqueued due
-- in the past, or recovered by the reaper keeping its run_at is found without a scan from the
-- start. Daemons of earlier versions ignore payloads starting with "!".
SELECT pg_notify({channel}, '!due ' || floor(extract(epoch FROM min(coalesce(t.run_at, now()))))::bigint
                            || ' '
                            || t.job_type)
FROM unnest(%(job_types)s::text[], %(run_ats)s::timestamptz[]) AS t(job_type, run_at)
GROUP BY t.job_type;

-- claim --
-- Claim up to %(limit)s due runs of the given job types in one statement (a run is held by
-- exactly one daemon at a time):
-- SKIP LOCKED so claimers never wait on each other. Index range scans of runs_claim_idx per
-- job type (it leads with job_type), so due runs of types this daemon does not handle are
-- never read. Higher priority first, oldest due first within a priority (flow control): the
-- runs of priority above 0, then those of 0 (the default, nearly all), then those below,
-- each read in index order; the outer LIMIT stops reading once it has enough, so a type
-- whose runs all have priority 0 costs one empty probe more than before, nothing else. Fills
-- in max_attempts from the job type when the run did not set one. No attempt row: the run's
-- row is the open attempt (locked_by, attempts, started_at) until whatever ends it writes
-- the attempt, once (migration 0013).
-- The priority-0 range starts at the type's lower bound (%(lows)s, NULL: from the start):
-- the claimer keeps it just below the run_at it last claimed, so the scan skips the index
-- entries of runs consumed since, which a snapshot held elsewhere keeps from being removed
-- (the "keyset claim"; keyset.py says when it starts from the beginning again). Every few
-- seconds a claim also looks back behind the bounds (claim_result).
WITH types AS (
    SELECT * FROM unnest(%(job_types)s::text[], %(leases)s::float8[], %(max_attempts)s::int[],
                         %(lows)s::timestamptz[])
        AS t(job_type, lease, max_attempts, low)
), candidates AS (
    SELECT t.job_type, c.id, c.priority, c.run_at
    FROM types t
    CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority > 0 AND r.run_at <= now()
             ORDER BY r.priority DESC, r.run_at, r.id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED) lane)
            UNION ALL
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority = 0
               AND r.run_at >= coalesce(t.low, '-infinity') AND r.run_at <= now()
             ORDER BY r.run_at, r.id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED) lane)
            UNION ALL
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority < 0 AND r.run_at <= now()
             ORDER BY r.priority DESC, r.run_at, r.id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED) lane)
        ) lanes
        LIMIT %(limit)s
    ) c
), picked AS (
    SELECT job_type, id, priority, run_at FROM candidates ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
), claimed AS (
    UPDATE {schema}.runs r
    SET status = 'running',
        locked_by = %(worker_id)s,
        locked_until = now() + make_interval(
            secs => ((SELECT %(leases)s::float8[]))[
                array_position((SELECT %(job_types)s::text[]), r.job_type)]),
        attempts = r.attempts + 1,
        max_attempts = coalesce(
            r.max_attempts,
            ((SELECT %(max_attempts)s::int[]))[
                array_position((SELECT %(job_types)s::text[]), r.job_type)]),
        started_at = now(),
        updated_at = now()
    -- Each row by its id, as a list and not a join (the header says why); the job type's
    -- lease by its position in the lists. The statuses are the live partition's, not the
    -- claim index's, so that the planner cannot read that index instead.
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked)) AND r.status IN ('queued', 'running', 'failed')
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.locked_until,
              r.traceparent
)
-- include: claim_result

-- claim_result --
-- The end of claim and claim_limited: the runs claimed, in the order they were picked, each
-- with its priority (only the priority-0 lane's runs move the claimer's bound), then
-- one row per job type with a due run of priority 0 behind its bound: only its job type and
-- the earliest such run_at (the claimer lowers the bound to it and claims again). The payload
-- as JSON text: the handler's thread parses it, not the dispatcher. The run's traceparent
-- (migration 0018, NULL unless enqueued in a trace) comes in the same row: tracing adds no
-- statement and no round trip to the hot path. Looked for
-- only for the types whose %(looks)s is set (keyset.py's look back, every few seconds), from
-- their %(look_froms)s (NULL: from the start) up to the bound: runs a claim skipped while
-- another transaction held them, which then rolled back. A non-locking read: a run still
-- held is reported too, and looked for again. Under a held snapshot this walks the index
-- entries of the runs claimed in that range (a few seconds of them): once every few seconds,
-- inside a claim, instead of in a statement and round trip of its own.
, behind AS (
    SELECT t.job_type, b.run_at
    FROM unnest(%(job_types)s::text[], %(lows)s::timestamptz[], %(looks)s::bool[],
                %(look_froms)s::timestamptz[]) AS t(job_type, low, look, from_at)
    CROSS JOIN LATERAL (
        SELECT r.run_at
        FROM {schema}.runs r
        WHERE t.look AND r.job_type = t.job_type AND r.status IN ('queued', 'failed')
          AND r.priority = 0
          -- Up to the bound plus keyset.MARGIN_SECONDS: an idle daemon's probe starts at
          -- the run_at last claimed, the bound's margin above it, so a run skipped there while
          -- another transaction held it, let go of since, is found by a look and by nothing
          -- else (a run this very claim took is seen queued here and looked for again: the
          -- next claim starts from it, harmless).
          AND r.run_at >= coalesce(t.from_at, '-infinity')
          AND r.run_at < t.low + interval '1 second'
          AND r.run_at <= now()
        ORDER BY r.run_at
        LIMIT 1
    ) b
)
SELECT id, job_type, payload::text, attempts, max_attempts, scheduled_for, idempotency_key,
       -- Within what the daemon can read: a run_at written by hand outside years 1-9999 (or
       -- -infinity) would otherwise fail the claim's result after it committed.
       least(greatest(run_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00') AS run_at,
       schedule_id, started_at, locked_until, priority, traceparent
FROM (
    SELECT c.*, p.priority, 0 AS part FROM claimed c JOIN picked p ON p.id = c.id
    UNION ALL
    SELECT NULL, b.job_type, NULL, NULL, NULL, NULL, NULL, b.run_at, NULL, NULL, NULL, NULL, 0, 1
    FROM behind b
) x
ORDER BY x.part, x.priority DESC, x.run_at, x.id;

-- claim_limit_lock --
-- Before a claim of job types with a concurrency or rate limit: take each such type's
-- transaction-level advisory lock, in name order (no deadlock between claimers of
-- overlapping sets). Claimers of one limited type queue here for the length of a claim, so
-- the next statement's snapshot, taken after the lock, sees every claim committed before:
-- counting and claiming cannot let N+1 through. Transaction-level: nothing outlives the
-- transaction, through a pooler or a crash.
SELECT count(pg_advisory_xact_lock(hashtextextended(%(lock_prefix)s || s.job_type, 0)))
FROM (SELECT DISTINCT job_type FROM unnest(%(job_types)s::text[]) AS u(job_type)
      ORDER BY job_type) s;

-- limit_counts --
-- The counts flow control's limits are checked against, as CTEs over a `types` CTE with the
-- claim_limited columns (included by claim_limited and flow_state): the runs held now
-- (runs_held_idx: claimed, or cancelled and not let go of) per limited type and per
-- concurrency key, and the starts inside each rate window (rate_starts), per type and per key.
held AS (
    SELECT r.job_type, coalesce(r.concurrency_key, r.payload #>> t.key_path::text[]) AS ckey
    FROM types t
    JOIN {schema}.runs r ON r.job_type = t.job_type AND r.locked_by IS NOT NULL
                          AND r.status IN ('running', 'cancelled')
    WHERE t.max_running IS NOT NULL OR t.per_key IS NOT NULL
), held_type AS (
    SELECT job_type, count(*) AS n FROM held GROUP BY job_type
), held_key AS (
    SELECT job_type, ckey, count(*) AS n FROM held WHERE ckey IS NOT NULL GROUP BY job_type, ckey
), started_type AS (
    SELECT t.job_type, count(*) AS n
    FROM types t
    JOIN {schema}.rate_starts s ON s.job_type = t.job_type
     AND s.started_at > statement_timestamp() - make_interval(secs => t.rate_window)
    WHERE t.rate IS NOT NULL
    GROUP BY t.job_type
), started_key AS (
    SELECT t.job_type, s.concurrency_key AS ckey, count(*) AS n
    FROM types t
    JOIN {schema}.rate_starts s ON s.job_type = t.job_type AND s.concurrency_key IS NOT NULL
     AND s.started_at > statement_timestamp() - make_interval(secs => t.key_window)
    WHERE t.key_rate IS NOT NULL
    GROUP BY t.job_type, s.concurrency_key
)

-- claim_limited --
-- The claim (above) for a set of job types of which some have limits, after
-- claim_limit_lock in the same transaction. Counts, per limited type, the runs held now
-- (runs_held_idx: claimed, or cancelled and not let go of; a slot of a dead daemon frees when
-- the reaper recovers its run) and the starts inside each rate window (rate_starts), then
-- claims at most what the limits leave: per type (max_running, rate) and per concurrency key
-- (max_running_per_key, rate_per_key; a run's key is the one given at enqueue, else the
-- payload field the type names; a run without one is limited per type only). Runs of a key
-- at its limit are skipped in the scan, so one busy key does not hold back the others.
-- started_at and the rate rows use statement_timestamp(): claims of one limited type run
-- one after another under the lock, so their times are in the order of their counting, and
-- no window of the rate's length ever holds more starts than the rate.
-- A limit changed at runtime (job_type_controls, migration 0021) overrides the one sent: read
-- here, after the lock, so a lowered limit holds from the next claim of every daemon, whatever
-- it last read (one primary-key probe of a table of a row per job type an operator touched).
WITH types AS (
    SELECT t.job_type, t.lease, t.max_attempts, t.low,
           coalesce(o.max_running, t.max_running) AS max_running, t.key_path,
           coalesce(o.max_running_per_key, t.per_key) AS per_key,
           coalesce(o.rate, t.rate) AS rate, coalesce(o.rate_window, t.rate_window) AS rate_window,
           coalesce(o.rate_per_key, t.key_rate) AS key_rate,
           coalesce(o.rate_per_key_window, t.key_window) AS key_window
    FROM unnest(%(job_types)s::text[], %(leases)s::float8[], %(max_attempts)s::int[],
                %(lows)s::timestamptz[], %(max_running)s::int[], %(key_paths)s::text[],
                %(per_key)s::int[], %(rates)s::int[], %(rate_windows)s::float8[],
                %(key_rates)s::int[], %(key_windows)s::float8[])
        AS t(job_type, lease, max_attempts, low, max_running, key_path, per_key, rate,
             rate_window, key_rate, key_window)
    LEFT JOIN {schema}.job_type_controls o ON o.job_type = t.job_type
),
-- include: limit_counts
, rooms AS (
    -- Per type, what its lanes check each run against, computed once: its key's path as an
    -- array, and the keys at their limit (held or started; never NULL, so a run without a
    -- key passes: `<> ALL` is NULL for it, which IS NOT FALSE). A scan that passes over many
    -- runs of busy keys (docs/flow-control.md, "Limits") evaluated the key's path three
    -- times a run and two correlated subqueries on the counts before.
    SELECT t.*, greatest(0, least(%(limit)s, t.max_running - coalesce(h.n, 0),
                                  t.rate - coalesce(s.n, 0))) AS room,
           t.key_path::text[] AS path,
           ARRAY(SELECT k.ckey FROM held_key k WHERE k.job_type = t.job_type AND k.n >= t.per_key
                 UNION
                 SELECT k.ckey FROM started_key k
                 WHERE k.job_type = t.job_type AND k.n >= t.key_rate) AS blocked
    FROM types t
    LEFT JOIN held_type h ON h.job_type = t.job_type
    LEFT JOIN started_type s ON s.job_type = t.job_type
), candidates AS (
    SELECT t.job_type, c.id, c.priority, c.run_at, c.ckey
    FROM rooms t
    CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at,
                    coalesce(r.concurrency_key, r.payload #>> t.path) AS ckey
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority > 0 AND r.run_at <= now()
               AND (coalesce(r.concurrency_key, r.payload #>> t.path) <> ALL (t.blocked))
                   IS NOT FALSE
             ORDER BY r.priority DESC, r.run_at, r.id
             LIMIT t.room
             FOR UPDATE SKIP LOCKED) lane)
            UNION ALL
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at,
                    coalesce(r.concurrency_key, r.payload #>> t.path) AS ckey
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority = 0
               AND r.run_at >= coalesce(t.low, '-infinity') AND r.run_at <= now()
               AND (coalesce(r.concurrency_key, r.payload #>> t.path) <> ALL (t.blocked))
                   IS NOT FALSE
             ORDER BY r.run_at, r.id
             LIMIT t.room
             FOR UPDATE SKIP LOCKED) lane)
            UNION ALL
            (SELECT * FROM (SELECT r.id, r.priority, r.run_at,
                    coalesce(r.concurrency_key, r.payload #>> t.path) AS ckey
             FROM {schema}.runs r
             WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
               AND r.priority < 0 AND r.run_at <= now()
               AND (coalesce(r.concurrency_key, r.payload #>> t.path) <> ALL (t.blocked))
                   IS NOT FALSE
             ORDER BY r.priority DESC, r.run_at, r.id
             LIMIT t.room
             FOR UPDATE SKIP LOCKED) lane)
        ) lanes
        LIMIT t.room
    ) c
), keyed AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.job_type, c.ckey
                                   ORDER BY c.priority DESC, c.run_at, c.id) AS key_rank
    FROM candidates c
), picked AS (
    SELECT k.job_type, k.id, k.ckey, k.priority, k.run_at
    FROM keyed k
    JOIN types t ON t.job_type = k.job_type
    LEFT JOIN held_key hk ON hk.job_type = k.job_type AND hk.ckey = k.ckey
    LEFT JOIN started_key sk ON sk.job_type = k.job_type AND sk.ckey = k.ckey
    WHERE k.ckey IS NULL
       OR ((t.per_key IS NULL OR k.key_rank <= t.per_key - coalesce(hk.n, 0))
           AND (t.key_rate IS NULL OR k.key_rank <= t.key_rate - coalesce(sk.n, 0)))
    ORDER BY k.priority DESC, k.run_at, k.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE {schema}.runs r
    SET status = 'running',
        locked_by = %(worker_id)s,
        locked_until = statement_timestamp() + make_interval(
            secs => ((SELECT %(leases)s::float8[]))[
                array_position((SELECT %(job_types)s::text[]), r.job_type)]),
        attempts = r.attempts + 1,
        max_attempts = coalesce(
            r.max_attempts,
            ((SELECT %(max_attempts)s::int[]))[
                array_position((SELECT %(job_types)s::text[]), r.job_type)]),
        started_at = statement_timestamp(),
        updated_at = statement_timestamp()
    -- By id, as the claim's (above).
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked)) AND r.status IN ('queued', 'running', 'failed')
    RETURNING r.id, r.job_type, r.payload, r.attempts, r.max_attempts, r.scheduled_for,
              r.idempotency_key, r.run_at, r.schedule_id, r.started_at, r.locked_until,
              r.traceparent
), counted AS (
    INSERT INTO {schema}.rate_starts (job_type, concurrency_key, started_at)
    SELECT c.job_type, p.ckey, statement_timestamp()
    FROM claimed c
    JOIN picked p ON p.id = c.id
    JOIN types t ON t.job_type = c.job_type
    WHERE t.rate IS NOT NULL OR (t.key_rate IS NOT NULL AND p.ckey IS NOT NULL)
), pruned AS (
    DELETE FROM {schema}.rate_starts s
    USING types t
    WHERE s.job_type = t.job_type AND (t.rate IS NOT NULL OR t.key_rate IS NOT NULL)
      AND s.started_at <= statement_timestamp()
          - make_interval(secs => greatest(coalesce(t.rate_window, 0), coalesce(t.key_window, 0)))
)
-- include: claim_result

-- rate_free_in --
-- Seconds until the oldest start inside a saturated rate window leaves it (NULL: no rate of
-- these types is saturated): when a dispatcher whose claim was held back by a rate claims
-- again, to the millisecond rather than at its next poll.
SELECT min(extract(epoch FROM w.oldest + make_interval(secs => t.rate_window)
                              - statement_timestamp()))::float8
FROM unnest(%(job_types)s::text[], %(rates)s::int[], %(rate_windows)s::float8[])
     AS t(job_type, rate, rate_window)
CROSS JOIN LATERAL (
    SELECT min(s.started_at) AS oldest, count(*) AS n
    FROM {schema}.rate_starts s
    WHERE s.job_type = t.job_type
      AND s.started_at > statement_timestamp() - make_interval(secs => t.rate_window)
) w
WHERE w.n >= t.rate;

-- flow_state --
-- Per limited job type (the claim_limited parameters), what its limits hold back now: runs
-- held (running, or cancelled and not let go of) and starts inside the rate window, the due
-- runs not claimed, and how many of those wait on a concurrency limit (the type's or their
-- key's) and how many on a rate; the rest wait for a free thread. With %(run_id)s, the due
-- runs are that one run alone (`pgtick show`: why it is not starting). Read-only; counts
-- may be a moment old by the time they are shown. Limits changed at runtime override the
-- ones sent, as in claim_limited.
WITH types AS (
    SELECT t.job_type, coalesce(o.max_running, t.max_running) AS max_running, t.key_path,
           coalesce(o.max_running_per_key, t.per_key) AS per_key,
           coalesce(o.rate, t.rate) AS rate, coalesce(o.rate_window, t.rate_window) AS rate_window,
           coalesce(o.rate_per_key, t.key_rate) AS key_rate,
           coalesce(o.rate_per_key_window, t.key_window) AS key_window
    FROM unnest(%(job_types)s::text[], %(max_running)s::int[], %(key_paths)s::text[],
                %(per_key)s::int[], %(rates)s::int[], %(rate_windows)s::float8[],
                %(key_rates)s::int[], %(key_windows)s::float8[])
        AS t(job_type, max_running, key_path, per_key, rate, rate_window, key_rate, key_window)
    LEFT JOIN {schema}.job_type_controls o ON o.job_type = t.job_type
),
-- include: limit_counts
, due AS (
    SELECT t.job_type, coalesce(r.concurrency_key, r.payload #>> t.key_path::text[]) AS ckey
    FROM types t
    JOIN {schema}.runs r ON r.job_type = t.job_type AND r.status IN ('queued', 'failed')
     AND r.run_at <= now()
    WHERE %(run_id)s::bigint IS NULL OR r.id = %(run_id)s::bigint
), reasons AS (
    SELECT d.job_type,
           CASE WHEN coalesce(ht.n, 0) >= t.max_running THEN 'concurrency'
                WHEN coalesce(st.n, 0) >= t.rate THEN 'rate'
                WHEN coalesce(hk.n, 0) >= t.per_key THEN 'concurrency'
                WHEN coalesce(sk.n, 0) >= t.key_rate THEN 'rate'
           END AS reason
    FROM due d
    JOIN types t ON t.job_type = d.job_type
    LEFT JOIN held_type ht ON ht.job_type = d.job_type
    LEFT JOIN started_type st ON st.job_type = d.job_type
    LEFT JOIN held_key hk ON hk.job_type = d.job_type AND hk.ckey = d.ckey
    LEFT JOIN started_key sk ON sk.job_type = d.job_type AND sk.ckey = d.ckey
)
SELECT t.job_type, coalesce(ht.n, 0), coalesce(st.n, 0),
       (SELECT count(*) FROM reasons x WHERE x.job_type = t.job_type),
       (SELECT count(*) FROM reasons x WHERE x.job_type = t.job_type AND x.reason = 'concurrency'),
       (SELECT count(*) FROM reasons x WHERE x.job_type = t.job_type AND x.reason = 'rate')
FROM types t
LEFT JOIN held_type ht ON ht.job_type = t.job_type
LEFT JOIN started_type st ON st.job_type = t.job_type
ORDER BY t.job_type;

-- next_due --
-- Seconds until the earliest runnable run of these job types comes due (negative: overdue),
-- on the database clock: how long an idle dispatcher may sleep. One index probe per job type,
-- from the type's lower bound as the claim's (priority 0), and the earliest of the few runs
-- of other priorities. Those are read in the claim index's order (and the minimum taken of
-- them): a bare min() let the planner read every version of the type from the
-- (job_type, id) index while a snapshot was held (15 000 buffers a call); with the order
-- asked for and sorts off (planner_hints), only the claim index serves it.
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM unnest(%(job_types)s::text[], %(lows)s::timestamptz[]) AS t(job_type, low)
CROSS JOIN LATERAL (
    (SELECT r.run_at
     FROM {schema}.runs r
     WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed') AND r.priority = 0
       AND r.run_at >= coalesce(t.low, '-infinity')
     ORDER BY r.run_at
     LIMIT 1)
    UNION ALL
    (SELECT min(p.run_at)
     FROM (SELECT r.run_at
           FROM {schema}.runs r
           WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed') AND r.priority > 0
           ORDER BY r.priority DESC, r.run_at, r.id) p)
    UNION ALL
    (SELECT min(p.run_at)
     FROM (SELECT r.run_at
           FROM {schema}.runs r
           WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed') AND r.priority < 0
           ORDER BY r.priority DESC, r.run_at, r.id) p)
) n;

-- heartbeat --
-- Extend the leases this worker still holds (a lease not renewed expires and the run is
-- recovered) and mark the worker alive, in one round trip. Guarded by the claim: this
-- worker, and the attempt it claimed. A run an operator cancelled stays held, its lease
-- renewed, until the worker lets go of it (acknowledge_cancel): until then its handler may
-- still run, and no retry may start a second copy. Returns the ids renewed, running or
-- cancelled (a run missing from them and from the busy ones is gone), whether the workers
-- row still exists (other daemons forget a worker silent for long), which of the given runs
-- an operator cancelled (their handlers are stopped, not "lost"), and the busy ones: still
-- ours in this statement's snapshot but row-locked by another transaction (our own result
-- being written, an operator's cancel, a session that took FOR UPDATE), skipped rather than
-- waited for, so one locked row never holds up the renewal of every other lease; the next
-- beat looks again. A cancelled run is busy so too: its handler may still run, and the reaper
-- leaves it to a holder that beats (reap_cancelled). Busy ones are looked for by status
-- list: `status = 'running'` would imply runs_lease_idx's predicate, and the planner then
-- read that whole index.
WITH alive AS (
    UPDATE {schema}.workers SET heartbeat_at = now() WHERE id = %(worker_id)s RETURNING id
), mine AS (
    SELECT r.id
    FROM {schema}.runs r
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.attempts = ((SELECT %(attempts)s::int[]))[
          width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
      AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
      AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND r.status IN ('running', 'cancelled')
    FOR UPDATE OF r SKIP LOCKED
), held AS (
    UPDATE {schema}.runs r
    SET locked_until = now() + make_interval(
        secs => ((SELECT %(leases)s::float8[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))])
    WHERE r.id = ANY(ARRAY(SELECT id FROM mine)) AND r.status IN ('running', 'cancelled')
    RETURNING r.id, r.status
)
SELECT ARRAY(SELECT id FROM held), EXISTS (SELECT 1 FROM alive),
       ARRAY(SELECT r.id FROM {schema}.runs r
             WHERE r.id = ANY(%(ids)s::bigint[]) AND r.status = 'cancelled'),
       ARRAY(SELECT r.id FROM {schema}.runs r
             WHERE r.id = ANY(%(ids)s::bigint[])
               AND r.attempts = ((SELECT %(attempts)s::int[]))[
                   width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
               AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
               AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
               AND r.status IN ('queued', 'running', 'failed', 'cancelled')
               AND r.id NOT IN (SELECT id FROM mine));

-- succeed --
-- Finish runs as succeeded, guarded by the claim: only the holder may write a result, and
-- only for the attempt it claimed, so that a result of an earlier claim never lands on a
-- later claim of the same run by the same daemon. Writes each ended attempt, once. Returns
-- those finished.
-- A run this worker holds is `running`, or `cancelled` and not let go of yet (nothing else
-- keeps locked_by), so "in the live partition" (queued, running, failed) means running here.
-- Said that way on purpose: the planner reads runs_live only, and cannot serve it from
-- runs_lease_idx, which statistics taken while a backlog was still queued show as empty when
-- it is full of dead entries of runs finished since (each statement then walked them all);
-- it takes each claim by id instead. Each run's attempt is looked up by its position in the
-- lists rather than by a join with them: a prepared statement's generic plan cannot know the
-- lists' length, and for a join it chose a nested loop that compared every run with every
-- input (500 x 500 at a drain's batches, 38 ms a call).
-- The finish time is statement_timestamp(), the time the outcome is written: inside a
-- handler's ctx.transaction() now() is when that transaction began (a handler that worked 5 s
-- in it showed 10 ms), and a row dated in a period retention has dropped since would land in
-- the DEFAULT partition, already past its retention. A time past the periods created so far
-- lands in the DEFAULT partition too, and moves to its period when that is created.
WITH done AS (
    UPDATE {schema}.runs r
    SET status = 'succeeded', locked_by = NULL, locked_until = NULL,
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.attempts = ((SELECT %(attempts)s::int[]))[
          width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
      AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
      AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND r.status IN ('queued', 'running', 'failed')
    RETURNING r.id, r.attempts, r.started_at, r.job_type, r.follow, r.batch_id
), ended AS (
    -- With each attempt its handler's result (migration 0024), by its position in the list.
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, result)
    SELECT id, attempts, %(worker_id)s, started_at, statement_timestamp(), 'succeeded',
           ((SELECT %(results)s::text[]))[width_bucket(id, (SELECT %(ids)s::bigint[]))]::jsonb
    FROM done
)
-- Composition in the transaction that records success (docs/composition.md): the steps of
-- the runs that have them enqueued, and the members of batches counted per batch (rows with
-- a NULL id, for the caller to ignore). Runs without either cost two empty scans of `done`.
SELECT id, NULL FROM done
UNION ALL
SELECT NULL, {schema}.follow_up(d.id, d.job_type, 'succeeded', d.follow,
       ((SELECT %(results)s::text[]))[width_bucket(d.id, (SELECT %(ids)s::bigint[]))]::jsonb)
FROM done d WHERE d.follow IS NOT NULL
UNION ALL
SELECT NULL, {schema}.batch_ended(b.batch_id, 'succeeded', b.n)
FROM (SELECT d.batch_id, count(*)::int AS n FROM done d WHERE d.batch_id IS NOT NULL
      GROUP BY d.batch_id ORDER BY d.batch_id) b;

-- fail --
-- Finish runs as failed (retry at now() + delay) or dead (delay NULL, or attempts exhausted),
-- guarded by the claim (as succeed, "in the live partition" meaning running). The short
-- error goes to the run, the bounded detail to the attempt.
-- Each run's values are read from the lists by its position in them, as succeed's attempts.
WITH done AS (
    UPDATE {schema}.runs r
    SET (status, run_at, finished_at, last_error, error_type) = (
            SELECT CASE WHEN f.delay IS NULL OR r.attempts >= r.max_attempts
                        THEN 'dead' ELSE 'failed' END,
                   CASE WHEN f.delay IS NULL OR r.attempts >= r.max_attempts
                        THEN r.run_at ELSE now() + make_interval(secs => f.delay) END,
                   CASE WHEN f.delay IS NULL OR r.attempts >= r.max_attempts THEN now() END,
                   f.error, f.error_type
            FROM (SELECT ((SELECT %(delays)s::float8[]))[i] AS delay,
                         ((SELECT %(errors)s::text[]))[i] AS error,
                         ((SELECT %(error_types)s::text[]))[i] AS error_type
                  FROM width_bucket(r.id, (SELECT %(ids)s::bigint[])) AS i) f),
        locked_by = NULL, locked_until = NULL, updated_at = now()
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.attempts = ((SELECT %(attempts)s::int[]))[
          width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
      AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
      AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND r.status IN ('queued', 'running', 'failed')
    RETURNING r.id, r.status, r.run_at, r.attempts, r.started_at, r.job_type, r.follow,
              r.batch_id
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error, error_type)
    SELECT id, attempts, %(worker_id)s, started_at, now(), 'failed',
           ((SELECT %(details)s::text[]))[width_bucket(id, (SELECT %(ids)s::bigint[]))],
           ((SELECT %(error_types)s::text[]))[width_bucket(id, (SELECT %(ids)s::bigint[]))]
    FROM done
)
SELECT id, status,
       -- Readable whatever was written by hand (claim_result says why).
       least(greatest(run_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00') AS run_at
FROM done
-- The dead runs' on_dead steps and batches (as succeed's; rows with a NULL id).
UNION ALL
SELECT NULL, {schema}.follow_up(d.id, d.job_type, 'dead', d.follow, NULL)::text, NULL
FROM done d WHERE d.status = 'dead' AND d.follow IS NOT NULL
UNION ALL
SELECT NULL, {schema}.batch_ended(b.batch_id, 'dead', b.n)::text, NULL
FROM (SELECT d.batch_id, count(*)::int AS n FROM done d
      WHERE d.status = 'dead' AND d.batch_id IS NOT NULL
      GROUP BY d.batch_id ORDER BY d.batch_id) b;

-- mark_timed_out --
-- Python runs past their timeout whose handlers have not returned (a thread cannot be
-- killed): each stays running and held, its lease renewed and its slot counted, until its
-- handler returns and fail writes the attempt; until then its last_error and error_type say
-- it timed out and is stopping (`pgtick show`). Guarded by the claim (as succeed, "in the
-- live partition" meaning running); each run's error by its position in the list.
UPDATE {schema}.runs r
SET last_error = ((SELECT %(errors)s::text[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))],
    error_type = 'timeout', updated_at = now()
WHERE r.id = ANY(%(ids)s::bigint[])
  AND r.attempts = ((SELECT %(attempts)s::int[]))[
      width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
  AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
  AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
  AND r.status IN ('queued', 'running', 'failed')
RETURNING r.id;

-- release --
-- Give runs back unfinished (shutdown, or claimed ahead and not started): queued again, the
-- attempt not counted. Guarded by the claim (as succeed, "in the live partition" meaning
-- running). A hold of more than 0 seconds makes them due no sooner than that from now: the
-- shutdown's last act gives back runs whose Python handlers still run, in the moment before
-- the process (and they) end, and no other daemon may start them before it has.
WITH done AS (
    UPDATE {schema}.runs r
    SET status = 'queued', attempts = r.attempts - 1,
        run_at = CASE WHEN %(hold)s::float8 > 0
                      THEN greatest(r.run_at, now() + %(hold)s::float8 * interval '1 second')
                      ELSE r.run_at END,
        locked_by = NULL, locked_until = NULL, updated_at = now()
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.attempts = ((SELECT %(attempts)s::int[]))[
          width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
      AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
      AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND r.status IN ('queued', 'running', 'failed')
    RETURNING r.id, r.job_type, r.run_at, r.started_at, r.attempts + 1 AS attempt
), ended AS (
    -- The attempt claimed: the guard matched it, and the update gave it back to the count.
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error)
    SELECT id, attempt, %(worker_id)s, started_at, now(), 'released', 'released on shutdown'
    FROM done
)
SELECT id, job_type,
       -- Readable whatever was written by hand (claim_result says why).
       least(greatest(run_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00') AS run_at
FROM done;

-- acknowledge_cancel --
-- The holder of runs an operator cancelled lets go once their handlers have stopped (or
-- never started): the lease is cleared, so that retry may queue the run again, and the
-- attempt closed now, when it really ended. Guarded by the claim; returns the runs let go.
WITH done AS (
    UPDATE {schema}.runs r
    SET locked_by = NULL, locked_until = NULL, updated_at = now()
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.attempts = ((SELECT %(attempts)s::int[]))[
          width_bucket(r.id, (SELECT %(ids)s::bigint[]))]
      AND ((SELECT %(ids)s::bigint[]))[width_bucket(r.id, (SELECT %(ids)s::bigint[]))] = r.id
      AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND r.status = 'cancelled'
    RETURNING r.id, r.attempts, r.started_at
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error)
    SELECT id, attempts, %(worker_id)s, started_at, now(), 'lost', 'cancelled by operator'
    FROM done
)
SELECT id FROM done;

-- reap_cancelled --
-- Cancelled runs whose holder never let go (it died) and whose lease has expired: nothing
-- runs them any more. Clear the lease and write the attempt as lost, ended at the latest when
-- its lease did. A lease that ended while another session held the row locked (the holder's
-- beats skip it) is left to a holder that is alive, as the reaper leaves a running one
-- (holder_not_alive): its handler may still run, and a retry would start a second copy.
-- Served by runs_cancel_lease_idx.
WITH expired AS (
    SELECT r.id, r.locked_until, r.locked_by FROM {schema}.runs r
    WHERE r.status = 'cancelled' AND r.locked_until < now()
-- include: holder_not_alive
    ORDER BY r.locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), done AS (
    UPDATE {schema}.runs r
    SET locked_by = NULL, locked_until = NULL, updated_at = now()
    FROM expired e
    WHERE r.id = e.id AND r.status = 'cancelled'
    RETURNING r.id, r.attempts, r.started_at, e.locked_by AS worker_id,
              e.locked_until AS lease_end
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error)
    SELECT id, attempts, worker_id, started_at, lease_end, 'lost', 'cancelled by operator'
    FROM done
)
SELECT count(*) FROM done;

-- reap_look --
-- The reaper's first look, outside a transaction: the database clock (the pass sees every
-- lease that ended before it; the next pass starts a margin before it), whether a lease in
-- the pass's range awaits the reaper (reap_select's condition), and the earliest lease in
-- that range that ended and is still running, taken or not: one the pass cannot take now (its
-- row locked by another session, or its holder alive) keeps the next pass's range from moving
-- past it, so it is taken as soon as it may be, not at the next look at every lease. Only
-- when a lease awaits does the pass lock them, in a transaction: an idle daemon's reaper
-- sends this statement and reap_cancelled per interval, not a transaction of three.
SELECT now(),
       EXISTS (
           SELECT 1 FROM {schema}.runs r
-- include: ended_leases
-- include: holder_not_alive
       ),
       (SELECT min(r.locked_until) FROM {schema}.runs r
-- include: ended_leases
       );

-- ended_leases --
-- The reaper's range, said once for reap_look and reap_select (the look must ask exactly
-- what the select would lock): running runs whose lease ended, at or after %(since)s (NULL:
-- any).
WHERE r.status = 'running' AND r.locked_until < now()
  AND r.locked_until >= coalesce(%(since)s::timestamptz, '-infinity')

-- holder_not_alive --
-- ... and whose holder is not alive: its workers row is gone, or its last heartbeat is older
-- than %(alive)s seconds, or came before the lease's last %(slack)s seconds. A holder renews
-- every lease it holds at each heartbeat, but skips (SKIP LOCKED) a run whose row another
-- session holds locked; such a holder beats at least every second, and once just before
-- that lease ends (heartbeat.py), so its heartbeat is recent and at or after the lease's
-- end, and the run is left to it: its next beat after the lock goes renews the lease. A
-- holder stopped or dead beat last when it renewed the lease, a whole lease (1 s at least,
-- more than %(slack)s) before its end, and is taken from at once; one stopped after it beat
-- past the end, %(alive)s seconds after that beat (the exception: docs/concepts, The reaper).
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.workers w
      WHERE w.id = r.locked_by
        AND w.heartbeat_at > r.locked_until - make_interval(secs => %(slack)s)
        AND w.heartbeat_at > now() - make_interval(secs => %(alive)s))

-- reap_select --
-- Lock running runs whose lease expired (crashed or frozen daemon), oldest first; served by
-- runs_lease_idx. The caller computes each one's backoff and calls reap_mark. Only leases
-- that ended at or after %(since)s (NULL: any): the reaper's previous pass took every lease
-- that had ended before it, and under a snapshot held elsewhere the index keeps an entry for
-- every lease a finished run ever had, all of them ended: this range holds a few seconds of
-- them, not the whole time the snapshot has been held. A run whose row another session holds
-- locked is skipped, not waited for: it stays in the range (reap_look) and is looked at
-- again next pass.
SELECT r.id, r.job_type, r.attempts, r.max_attempts, r.locked_by
FROM {schema}.runs r
-- include: ended_leases
-- include: holder_not_alive
ORDER BY locked_until
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;

-- reap_mark --
-- Turn reaped runs into failed (delay given) or dead (delay NULL), and write each attempt as
-- 'lost', with the worker reap_select read in locked_by (%(workers)s): a run whose daemon died
-- is retried or dead, never lost silently.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(delays)s::float8[], %(workers)s::text[])
        AS f(id, delay, worker_id)
), done AS (
    UPDATE {schema}.runs r
    SET status = CASE WHEN f.delay IS NULL THEN 'dead' ELSE 'failed' END,
        -- No delay: keep run_at, so the recovered run goes to the front of the queue.
        run_at = CASE WHEN f.delay IS NULL OR f.delay = 0 THEN r.run_at
                      ELSE now() + make_interval(secs => f.delay) END,
        finished_at = CASE WHEN f.delay IS NULL THEN now() END,
        last_error = 'lease expired while running on ' || r.locked_by,
        error_type = 'lease_expired',
        locked_by = NULL, locked_until = NULL, updated_at = now()
    FROM input f
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.id = f.id AND r.status = 'running' AND r.locked_until < now()
    RETURNING r.id, r.attempts, r.status, r.job_type, r.run_at, r.started_at, f.worker_id,
              r.follow, r.batch_id
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error, error_type)
    SELECT id, attempts, worker_id, started_at, now(), 'lost', 'lease expired', 'lease_expired'
    FROM done
)
SELECT id, status, job_type,
       -- Readable whatever was written by hand (claim_result says why).
       least(greatest(run_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00') AS run_at,
       worker_id
FROM done
-- A run the reaper makes dead fires its on_dead steps and counts in its batch, in this
-- transaction, as fail's (rows with a NULL id).
UNION ALL
SELECT NULL, {schema}.follow_up(d.id, d.job_type, 'dead', d.follow, NULL)::text, NULL, NULL,
       NULL
FROM done d WHERE d.status = 'dead' AND d.follow IS NOT NULL
UNION ALL
SELECT NULL, {schema}.batch_ended(b.batch_id, 'dead', b.n)::text, NULL, NULL, NULL
FROM (SELECT d.batch_id, count(*)::int AS n FROM done d
      WHERE d.status = 'dead' AND d.batch_id IS NOT NULL
      GROUP BY d.batch_id ORDER BY d.batch_id) b;

-- reap_holder_select --
-- A worker process of this daemon died (its supervisor saw it exit, worker.processes above
-- 1): lock the runs its worker id holds, whatever their lease, of the job types whose
-- handlers died with it (%(job_types)s: Python handlers; a command's process group may
-- outlive it, so its runs wait for their lease and the reaper). A row another session holds
-- locked is skipped and left to the reaper.
SELECT r.id, r.job_type, r.attempts, r.max_attempts, r.locked_by
FROM {schema}.runs r
WHERE r.status = 'running' AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
  AND r.job_type = ANY(%(job_types)s::text[])
ORDER BY r.id
FOR UPDATE OF r SKIP LOCKED;

-- reap_holder_mark --
-- reap_mark for the runs reap_holder_select locked: the same outcome as a lease that expired
-- under a daemon that died (failed with its backoff, or dead; the attempt written lost), at
-- once, guarded by the claim (the dead process's worker id) rather than by the lease's end.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(delays)s::float8[], %(workers)s::text[])
        AS f(id, delay, worker_id)
), done AS (
    UPDATE {schema}.runs r
    SET status = CASE WHEN f.delay IS NULL THEN 'dead' ELSE 'failed' END,
        run_at = CASE WHEN f.delay IS NULL OR f.delay = 0 THEN r.run_at
                      ELSE now() + make_interval(secs => f.delay) END,
        finished_at = CASE WHEN f.delay IS NULL THEN now() END,
        last_error = 'worker process died while running on ' || r.locked_by,
        error_type = 'lease_expired',
        locked_by = NULL, locked_until = NULL, updated_at = now()
    FROM input f
    WHERE r.id = ANY(%(ids)s::bigint[])
      AND r.id = f.id AND r.status = 'running'
      AND r.locked_by IS NOT DISTINCT FROM f.worker_id
    RETURNING r.id, r.attempts, r.status, r.job_type, r.run_at, r.started_at, f.worker_id
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error, error_type)
    SELECT id, attempts, worker_id, started_at, now(), 'lost', 'worker process died',
           'lease_expired'
    FROM done
)
SELECT id, status, job_type,
       least(greatest(run_at, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00') AS run_at,
       worker_id
FROM done;

-- reap_holder_cancelled --
-- The cancelled runs a dead worker process had not let go of yet: let go of at once (as
-- reap_cancelled does once their lease expired), the attempt written lost.
WITH held AS (
    SELECT id, locked_by FROM {schema}.runs
    WHERE status = 'cancelled' AND locked_by IS NOT DISTINCT FROM %(worker_id)s
      AND job_type = ANY(%(job_types)s::text[])
    FOR UPDATE SKIP LOCKED
), done AS (
    UPDATE {schema}.runs r
    SET locked_by = NULL, locked_until = NULL, updated_at = now()
    FROM held h
    WHERE r.id = h.id AND r.status = 'cancelled'
    RETURNING r.id, r.attempts, r.started_at, h.locked_by AS worker_id
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error)
    SELECT id, attempts, worker_id, started_at, now(), 'lost', 'cancelled by operator'
    FROM done
)
SELECT count(*) FROM done;

-- retry --
-- Operator retry: failed/dead/cancelled back to queued, due now, lease cleared. A run that
-- had used up its attempts gets one more. A cancelled run whose holder has not let go (its
-- lease is live) is left alone: its handler may still run, and a second copy must not start.
-- One whose holder died (lease expired) has its attempt written as lost, ended when the lease
-- did.
WITH picked AS (
    SELECT id, locked_until, locked_by, status, batch_id FROM {schema}.runs
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('failed', 'dead', 'cancelled')
      AND (locked_until IS NULL OR locked_until < now())
    FOR UPDATE
), done AS (
    UPDATE {schema}.runs r
    SET status = 'queued', run_at = now(), locked_by = NULL, locked_until = NULL,
        finished_at = NULL, updated_at = now(),
        max_attempts = CASE WHEN r.max_attempts IS NOT NULL AND r.attempts >= r.max_attempts
                            THEN r.attempts + 1 ELSE r.max_attempts END
    FROM picked p
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
      AND r.id = p.id AND r.status IN ('failed', 'dead', 'cancelled')
    RETURNING r.id, r.job_type, r.attempts, r.started_at, p.locked_by AS worker_id,
              p.locked_until AS lease_end, p.status AS was, p.batch_id
), ended AS (
    INSERT INTO {schema}.attempts_history (run_id, attempt, worker_id, started_at, finished_at,
                                          outcome, error)
    SELECT id, attempts, worker_id, started_at, lease_end, 'lost', 'cancelled by operator'
    FROM done
    WHERE worker_id IS NOT NULL
)
SELECT id, job_type FROM done
-- Members of batches not done yet take back the counts of their terminal outcome (0026).
UNION ALL
SELECT NULL, {schema}.batch_reopened(b.batch_id, b.was, b.n)::text
FROM (SELECT d.batch_id, d.was, count(*)::int AS n FROM done d
      WHERE d.batch_id IS NOT NULL AND d.was IN ('dead', 'cancelled')
      GROUP BY d.batch_id, d.was ORDER BY d.batch_id, d.was) b;

-- held_after_cancel --
-- Of the given cancelled runs, those whose holder has not let go yet (lease live): its daemon
-- and the seconds left on the lease, for retry's refusal.
SELECT id, locked_by, ceil(extract(epoch FROM locked_until - now()))::int
FROM {schema}.runs
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'cancelled' AND locked_until >= now()
ORDER BY id;

-- cancel --
-- Operator cancel of non-terminal runs. A running one stays held by its daemon (locked_by,
-- locked_until and the open attempt are left as they are): its next heartbeat, or its result
-- write, finds the run cancelled, stops the handler and lets go (acknowledge_cancel), which
-- closes the attempt when it really ended. Until then the run cannot be retried.
WITH done AS (
    UPDATE {schema}.runs
    SET status = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'running', 'failed')
    RETURNING id, batch_id
)
SELECT id FROM done
-- A cancelled member counts in its batch (0026); a cancel fires no chain step.
UNION ALL
SELECT NULL FROM (SELECT d.batch_id, count(*)::int AS n FROM done d
                  WHERE d.batch_id IS NOT NULL GROUP BY d.batch_id ORDER BY d.batch_id) b
WHERE {schema}.batch_ended(b.batch_id, 'cancelled', b.n) IS NULL;

-- maintain_partitions --
-- One step of retention and of the partitions ahead (the function, in migration 0010, says
-- how), in a transaction of its own: what it created, dropped or deleted, and the rows.
SELECT action, parent, table_name, row_count
FROM {schema}.maintain_partitions(%(retention)s, %(ahead)s, %(skip)s, %(delete_default)s);

-- kept_history_age --
-- `pgtick prune --older-than`: the age of the oldest run it keeps (not terminal, or finished
-- less than %(seconds)s ago), by when it was enqueued: its ended attempts and output may be as
-- old, and the partitions holding them stay. The terminal part reads only the partitions of
-- finish times after the cutoff (partition pruning by finished_at).
SELECT extract(epoch FROM now() - least(
    (SELECT min(created_at) FROM {schema}.runs WHERE status IN ('queued', 'running', 'failed')),
    (SELECT min(created_at) FROM {schema}.runs
     WHERE status IN ('succeeded', 'dead', 'cancelled', 'skipped')
       AND finished_at >= now() - make_interval(secs => %(seconds)s))))::float8;

-- prune --
-- `pgtick prune` after maintain_partitions dropped the partitions wholly past the cutoff: the
-- rest of the cutoff, exact, as rows. Deletes up to %(batch)s terminal runs of one status
-- finished before it, with their attempts and output. Called in a loop until it deletes
-- fewer than a batch; returns how many runs.
WITH victims AS (
    SELECT id FROM {schema}.runs
    WHERE status = %(status)s
      AND finished_at < now() - make_interval(secs => %(older_than)s)
      AND locked_by IS NULL
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.runs r USING victims v WHERE r.id = v.id
    RETURNING r.id, r.idempotency_key
), keys AS (
    DELETE FROM {schema}.run_keys k USING gone g
    WHERE k.idempotency_key = g.idempotency_key AND k.run_id = g.id
), attempts AS (
    DELETE FROM {schema}.attempts_history a USING gone g WHERE a.run_id = g.id
), output AS (
    DELETE FROM {schema}.output_chunks o USING gone g WHERE o.run_id = g.id
)
SELECT count(*) FROM gone;

-- get_run --
-- One run by id.
SELECT id, schedule_id, scheduled_for, job_type, payload, idempotency_key, status, run_at,
       attempts, max_attempts, locked_by, locked_until, last_error, error_type, started_at,
       finished_at, created_at, updated_at, priority, concurrency_key, after_on
FROM {schema}.runs WHERE id = %(id)s;

-- get_attempts --
-- A run's attempts in order: the ended ones by their start, the open one (id NULL) last.
SELECT run_id, attempt, worker_id, started_at, finished_at, outcome, error, error_type, result
FROM {schema}.attempts WHERE run_id = %(id)s ORDER BY id IS NULL, started_at, id;

-- connection_limit --
-- How many connections the server accepts from an ordinary role (max_connections less the
-- slots reserved for superusers and, PostgreSQL 16+, for pg_use_reserved_connections), and
-- max_connections itself: `pgtick run` refuses a pool that could never fit.
SELECT current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(current_setting('reserved_connections', true)::int, 0),
       current_setting('max_connections')::int;

-- register_worker --
-- A daemon announces itself on start.
INSERT INTO {schema}.workers (id, hostname, pid, version, threads, job_types)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(version)s, %(threads)s, %(job_types)s)
ON CONFLICT (id) DO UPDATE
SET hostname = excluded.hostname, pid = excluded.pid, version = excluded.version,
    threads = excluded.threads, job_types = excluded.job_types, heartbeat_at = now();

-- alive_workers --
-- Daemons that heartbeated within the last `within` seconds, for a migration that needs every
-- daemon stopped (migrate.py): host, pid, version, seconds since the heartbeat.
SELECT hostname, pid, version, extract(epoch FROM now() - heartbeat_at)::float8
FROM {schema}.workers
WHERE heartbeat_at > now() - make_interval(secs => %(within)s)
ORDER BY hostname, pid;

-- beat_workers --
-- A supervisor marks its idle worker processes alive (service/beats.py), one statement for
-- them all: a process holding no run sends no heartbeat of its own. Returns the ids found (a
-- row another daemon's reaper removed is not made again here: its process registers again).
UPDATE {schema}.workers SET heartbeat_at = now() WHERE id = ANY(%(ids)s::text[]) RETURNING id;

-- deregister_worker --
-- A daemon removes itself on clean exit.
DELETE FROM {schema}.workers WHERE id = %(id)s;

-- reap_workers --
-- Forget daemons that stopped heartbeating long ago (killed, host gone).
DELETE FROM {schema}.workers
WHERE heartbeat_at < now() - make_interval(secs => %(older_than)s)
RETURNING id;

-- effect_once --
-- Record a side effect's key; returns a row only the first time the key is seen.
INSERT INTO {schema}.effects (key, run_id) VALUES (%(key)s, %(run_id)s)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- sync_schedule --
-- Upsert one schedule from the config file by name, if it is this service's (migration 0022):
-- one another service's config or the database owns is left alone (sync_owned_elsewhere says
-- which). A schedule paused because it had vanished
-- from the config, or because its row was invalid, comes back un-paused and continues from now;
-- an operator's pause stays. Any change forgets next_due_at, so the next tick plans it afresh.
INSERT INTO {schema}.schedules (name, job_type, payload, cron, timezone, max_attempts, catchup,
                       catchup_limit, overlap, jitter_seconds, priority, on_pause,
                       service, materialized_until, follow, after_on)
VALUES (%(name)s, %(job_type)s, %(payload)s, %(cron)s, %(timezone)s, %(max_attempts)s,
        %(catchup)s, %(catchup_limit)s, %(overlap)s, %(jitter_seconds)s, %(priority)s,
        %(on_pause)s, %(service)s, now(), %(follow)s, %(after_on)s)
ON CONFLICT (name) DO UPDATE
SET job_type = excluded.job_type, payload = excluded.payload, cron = excluded.cron,
    timezone = excluded.timezone, max_attempts = excluded.max_attempts,
    catchup = excluded.catchup, catchup_limit = excluded.catchup_limit,
    overlap = excluded.overlap, jitter_seconds = excluded.jitter_seconds,
    priority = excluded.priority, on_pause = excluded.on_pause, follow = excluded.follow,
    after_on = excluded.after_on,
    paused = schedules.paused AND schedules.paused_reason NOT IN ('removed', 'invalid'),
    paused_reason = CASE WHEN schedules.paused_reason IN ('removed', 'invalid') THEN NULL
                         ELSE schedules.paused_reason END,
    paused_detail = CASE WHEN schedules.paused_reason IN ('removed', 'invalid') THEN NULL
                         ELSE schedules.paused_detail END,
    materialized_until = CASE WHEN schedules.paused_reason IN ('removed', 'invalid') THEN now()
                              ELSE schedules.materialized_until END,
    next_due_at = NULL,
    updated_at = now()
WHERE schedules.service IS NOT DISTINCT FROM excluded.service
  AND (schedules.job_type, schedules.payload, schedules.cron, schedules.timezone,
       schedules.max_attempts, schedules.catchup, schedules.catchup_limit, schedules.overlap,
       schedules.jitter_seconds, schedules.priority, schedules.on_pause, schedules.paused_reason,
       schedules.follow, schedules.after_on)
      IS DISTINCT FROM
      (excluded.job_type, excluded.payload, excluded.cron, excluded.timezone,
       excluded.max_attempts, excluded.catchup, excluded.catchup_limit, excluded.overlap,
       excluded.jitter_seconds, excluded.priority, excluded.on_pause, NULL, excluded.follow,
       excluded.after_on)
RETURNING name;

-- pause_vanished_schedules --
-- Pause (never delete) this service's schedules of this daemon's job types that are gone from
-- its config: never another service's, nor one the database owns (service NULL).
UPDATE {schema}.schedules
SET paused = true, paused_reason = 'removed', updated_at = now()
WHERE NOT paused AND service = %(service)s AND job_type = ANY(%(job_types)s::text[])
  AND name <> ALL(%(names)s::text[])
RETURNING name;

-- sync_owned_elsewhere --
-- The config's schedules whose names another service or the database owns (not synced):
-- (name, owner; NULL: the database).
SELECT name, service FROM {schema}.schedules
WHERE name = ANY(%(names)s::text[]) AND service IS DISTINCT FROM %(service)s
ORDER BY name;

-- create_schedule --
-- A schedule owned by the database (the schema's function; recorded in the audit log).
SELECT {schema}.create_schedule(%(name)s, %(job_type)s, %(cron)s, %(timezone)s, %(payload)s,
                                %(catchup)s, %(catchup_limit)s, %(overlap)s, %(on_pause)s,
                                %(jitter_seconds)s, %(max_attempts)s, %(priority)s, %(actor)s,
                                %(via)s, %(follow)s, %(after_on)s);

-- update_schedule --
-- Change a database-owned schedule (NULL: leave that setting; JSON null: clear follow or
-- after_on).
SELECT {schema}.update_schedule(%(name)s, %(job_type)s, %(cron)s, %(timezone)s, %(payload)s,
                                %(catchup)s, %(catchup_limit)s, %(overlap)s, %(on_pause)s,
                                %(jitter_seconds)s, %(max_attempts)s, %(priority)s, %(actor)s,
                                %(via)s, %(follow)s, %(after_on)s);

-- remove_schedule --
-- Remove a database-owned schedule (paused as removed, never deleted).
SELECT {schema}.remove_schedule(%(name)s, %(actor)s, %(via)s);

-- lock_due_schedules --
-- The enabled schedules that need a tick now (next_due_at reached, or unknown), locked for one
-- materialization pass; served by schedules_next_due_idx, so schedules that are not due are
-- neither read nor locked. A schedule another daemon is materializing right now is skipped
-- (it does the same work).
SELECT id, name, job_type, payload, cron, timezone, max_attempts, catchup, catchup_limit,
       overlap, jitter_seconds, materialized_until, now(), priority, on_pause, follow, after_on
FROM {schema}.schedules
WHERE NOT paused AND (next_due_at IS NULL OR next_due_at <= now())
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- next_schedule_due --
-- The earliest next_due_at of the enabled schedules that were not due when this transaction
-- started (those that were are being materialized by this or another daemon), and the
-- database clock: when the ticker must wake next. One probe of schedules_next_due_idx.
SELECT (SELECT min(next_due_at) FROM {schema}.schedules WHERE NOT paused AND next_due_at > now()), now();

-- pause_invalid_schedule --
-- Pause a schedule this version cannot compute (a cron, time zone or setting it refuses), with
-- the one-line reason, instead of failing the tick. Syncing a valid definition un-pauses it.
UPDATE {schema}.schedules
SET paused = true, paused_reason = 'invalid', paused_detail = %(detail)s, next_due_at = NULL,
    updated_at = now()
WHERE id = %(id)s;

-- materialize --
-- Insert a schedule's occurrences that have no run yet (a backfill may have made one) and
-- move its cursor and its next_due_at in the same transaction, under the schedule's row lock
-- (lock_due_schedules): every writer of occurrences holds it, which keeps an occurrence to
-- one run across runs' partitions, however many daemons tick. With overlap = skip an
-- occurrence is recorded as skipped when an earlier run is still queued, running or
-- failed-awaiting-retry, and only the last of a catch-up batch is queued. While the job type
-- is paused (job_type_controls) a schedule whose on_pause is 'skip' records every occurrence
-- as skipped; one that holds (the default) queues them as ever: the paused type's runs wait.
-- An occurrence of a schedule with `after` (migration 0027) waits: not due (run_at far
-- ahead) until settle_waiting releases it; a schedule others wait for marks its runs'
-- follow with "release", so that the outcome's statement settles their waits at once.
WITH occ AS (
    SELECT o.scheduled_for, o.run_at, o.ord, o.wait, count(*) OVER () AS total
    FROM unnest(%(scheduled_for)s::timestamptz[], %(run_at)s::timestamptz[],
                %(waits)s::jsonb[])
         WITH ORDINALITY AS o(scheduled_for, run_at, wait, ord)
), awaited AS (
    SELECT EXISTS (SELECT 1 FROM {schema}.schedules d
                   WHERE d.after_on ->> 'schedule' = %(name)s AND NOT d.paused) AS awaited
), busy AS (
    SELECT EXISTS (
        SELECT 1 FROM {schema}.runs
        WHERE schedule_id = %(schedule_id)s AND status IN ('queued', 'running', 'failed')
    ) AS busy
), paused AS (
    SELECT %(skip_paused)s AND EXISTS (
        SELECT 1 FROM {schema}.job_type_controls c WHERE c.job_type = %(job_type)s AND c.paused
    ) AS skipping
), inserted AS (
    -- Its chain: the schedule's, else its job type's (migration 0025).
    INSERT INTO {schema}.runs (schedule_id, scheduled_for, job_type, payload, run_at, max_attempts,
                      priority, status, finished_at, follow, after_on)
    SELECT %(schedule_id)s, occ.scheduled_for, %(job_type)s, %(payload)s,
           CASE WHEN occ.wait IS NULL THEN occ.run_at ELSE '3000-01-01 00:00:00+00' END,
           %(max_attempts)s, %(priority)s,
           CASE WHEN paused.skipping OR (%(skip)s AND (busy.busy OR occ.ord < occ.total))
                THEN 'skipped' ELSE 'queued' END,
           CASE WHEN paused.skipping OR (%(skip)s AND (busy.busy OR occ.ord < occ.total))
                THEN now() END,
           CASE WHEN awaited.awaited
                THEN coalesce(%(follow)s::jsonb, (SELECT s.follow FROM {schema}.job_type_settings s
                                                  WHERE s.job_type = %(job_type)s), '{{}}')
                     || '{{"release": true}}'
                ELSE coalesce(%(follow)s::jsonb, (SELECT s.follow FROM {schema}.job_type_settings s
                                                  WHERE s.job_type = %(job_type)s)) END,
           occ.wait
    FROM occ, busy, paused, awaited
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.runs r
                      WHERE r.schedule_id = %(schedule_id)s
                        AND r.scheduled_for = occ.scheduled_for)
    ORDER BY occ.ord
    RETURNING status
), moved AS (
    UPDATE {schema}.schedules SET materialized_until = %(until)s, next_due_at = %(next_due_at)s
    WHERE id = %(schedule_id)s
)
SELECT status, count(*) FROM inserted GROUP BY status;

-- after_source --
-- The cron and zone of a schedule another waits for (`after`, migration 0027).
SELECT cron, timezone FROM {schema}.schedules WHERE name = %(name)s;

-- settle_waiting --
-- The tick's sweep of the runs waiting for another schedule's occurrence: released when it
-- succeeded, the policy applied when it is dead, skipped, missing or past the deadline.
SELECT {schema}.settle_waiting();

-- list_schedules --
-- Every schedule with its latest run and latest success, for `pgtick schedules`. The latest
-- run is the latest occurrence (by scheduled_for, not by id: a backfill creates old occurrences
-- after newer ones), or a triggered run (no occurrence) made after it. Each branch is one
-- probe of runs_schedule_occurrence_idx (schedule_id, scheduled_for) per partition: the
-- triggered runs are that index's NULL entries of the schedule (few), sorted by `r.id + 0`,
-- an expression no index gives; by `r.id` the planner walked runs_id_idx backward from the
-- newest run, past every run of other schedules and of none (linear in the runs table: 0.65 s
-- at 200 000 runs, bench console).
SELECT s.id, s.name, s.job_type, s.cron, s.timezone, s.paused, s.paused_reason,
       s.paused_detail, s.overlap, s.catchup, s.materialized_until,
       last.status, last.scheduled_for, last.finished_at, ok.finished_at, s.service, s.on_pause
FROM {schema}.schedules s
LEFT JOIN LATERAL (
    SELECT c.status, c.scheduled_for, c.finished_at
    FROM ((SELECT r.status, r.scheduled_for, r.finished_at, r.scheduled_for AS at
           FROM {schema}.runs r
           WHERE r.schedule_id = s.id AND r.scheduled_for IS NOT NULL
           ORDER BY r.scheduled_for DESC LIMIT 1)
          UNION ALL
          (SELECT r.status, r.scheduled_for, r.finished_at, r.created_at AS at
           FROM {schema}.runs r
           WHERE r.schedule_id = s.id AND r.scheduled_for IS NULL
           ORDER BY r.id + 0 DESC LIMIT 1)) c
    ORDER BY c.at DESC LIMIT 1
) last ON true
LEFT JOIN LATERAL (
    SELECT r.finished_at FROM {schema}.runs r
    WHERE r.schedule_id = s.id AND r.status = 'succeeded'
    ORDER BY r.finished_at DESC LIMIT 1
) ok ON true
ORDER BY s.name;

-- get_schedule --
SELECT id, name, job_type, payload, cron, timezone, max_attempts, catchup, catchup_limit,
       overlap, jitter_seconds, paused, paused_reason, paused_detail, materialized_until,
       service, on_pause, priority, follow, after_on
FROM {schema}.schedules WHERE name = %(name)s;

-- pause_schedule --
UPDATE {schema}.schedules
SET paused = true, paused_reason = 'operator', paused_detail = NULL, updated_at = now()
WHERE name = %(name)s
RETURNING id;

-- resume_schedule --
-- Resuming continues from now: the paused period is not caught up, and the next tick plans
-- the schedule afresh (a schedule still invalid is paused again, with the reason).
UPDATE {schema}.schedules
SET paused = false, paused_reason = NULL, paused_detail = NULL, updated_at = now(),
    materialized_until = CASE WHEN paused THEN now() ELSE materialized_until END,
    next_due_at = CASE WHEN paused THEN NULL ELSE next_due_at END
WHERE name = %(name)s
RETURNING id;

-- trigger_schedule --
-- Run a schedule now, outside its cron: an extra run (scheduled_for NULL never conflicts).
-- It changes neither the cursor nor next_due_at: the schedule's own occurrences stay due when
-- they were.
INSERT INTO {schema}.runs (schedule_id, job_type, payload, max_attempts, priority)
SELECT id, job_type, payload, max_attempts, priority FROM {schema}.schedules WHERE name = %(name)s
RETURNING id, job_type;

-- schedule_active_run --
-- Of a schedule with overlap = "skip", after lock_schedule: a run of it queued, running or
-- awaiting a retry (the ticker's own test before it creates an occurrence's run), if any.
SELECT r.id, r.status
FROM {schema}.runs r JOIN {schema}.schedules s ON s.id = r.schedule_id
WHERE s.name = %(name)s AND s.overlap = 'skip' AND r.status IN ('queued', 'running', 'failed')
ORDER BY r.id
LIMIT 1;

-- lock_schedule --
-- A schedule's row lock, which every writer of its occurrences holds (see materialize).
SELECT id FROM {schema}.schedules WHERE name = %(name)s FOR UPDATE;

-- backfill_schedule --
-- Create runs for given past occurrences, after lock_schedule; existing occurrences are left
-- alone. The cursor and next_due_at do not move: backfill is behind the cursor, the ticker
-- ahead of it.
INSERT INTO {schema}.runs (schedule_id, scheduled_for, job_type, payload, run_at, max_attempts,
                           priority)
SELECT s.id, o.t, s.job_type, s.payload, now(), s.max_attempts, s.priority
FROM {schema}.schedules s,
     (SELECT DISTINCT t FROM unnest(%(occurrences)s::timestamptz[]) AS t) AS o
WHERE s.name = %(name)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.runs r
                  WHERE r.schedule_id = s.id AND r.scheduled_for = o.t)
ORDER BY o.t
RETURNING id, job_type;

-- migrations_unlock --
SELECT pg_advisory_unlock(hashtext('pgtick.migrate.' || %(schema)s));

-- create_schema --
CREATE SCHEMA IF NOT EXISTS {schema};

-- create_migrations_table --
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version     text PRIMARY KEY,
    name        text NOT NULL,
    sha256      text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- applied_migrations --
-- What has been applied; NULL table name means the schema was never migrated.
SELECT version, name, sha256 FROM {schema}.schema_migrations ORDER BY version;

-- migrations_table_exists --
SELECT to_regclass(%(table)s) IS NOT NULL;

-- set_local_search_path --
SET LOCAL search_path TO {schema};

-- migration_search_path --
-- For a migration that cannot run inside a transaction, on migrate's own connection.
SET search_path TO {schema};

-- record_migration --
INSERT INTO {schema}.schema_migrations (version, name, sha256)
VALUES (%(version)s, %(name)s, %(sha256)s);

-- mark_stops_daemons --
-- A stop-daemons migration, recorded as such (the column is migration 0014's): daemons of
-- earlier versions that do not know it refuse to start (migrate.check_current).
UPDATE {schema}.schema_migrations SET stops_daemons = true WHERE version = %(version)s;

-- stop_daemons_migrations --
SELECT version, name FROM {schema}.schema_migrations WHERE stops_daemons ORDER BY version;

-- job_type_stats --
-- Per job type, on the database clock: exact counts of the non-terminal states and of runs
-- gone dead in the last 24 h (the operator's status, the metrics, the console). It reads only
-- active rows (runs_live, the partition of those statuses) and recent dead ones
-- (runs_finished_idx), so its cost does not grow with the finished rows kept.
WITH per_type AS (
    SELECT job_type,
           count(*) FILTER (WHERE status IN ('queued', 'failed') AND run_at <= now()) AS due,
           extract(epoch FROM now() - min(run_at) FILTER (
               WHERE status IN ('queued', 'failed') AND run_at <= now()))::float8 AS oldest_due,
           count(*) FILTER (WHERE status = 'queued' AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'running' AND locked_until < now()) AS stuck,
           count(*) FILTER (WHERE status = 'failed' AND run_at > now()) AS awaiting_retry
    FROM {schema}.runs
    WHERE status IN ('queued', 'running', 'failed')
    GROUP BY job_type
), dead AS (
    SELECT job_type, count(*) AS dead_recent
    FROM {schema}.runs
    WHERE status = 'dead' AND finished_at > now() - interval '24 hours'
    GROUP BY job_type
)
SELECT job_type, coalesce(due, 0), oldest_due, coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(stuck, 0), coalesce(awaiting_retry, 0), coalesce(dead_recent, 0)
FROM per_type FULL JOIN dead USING (job_type)
ORDER BY job_type;

-- metrics_snapshot --
-- Everything the database-derived metrics show, in one statement (the metrics collector
-- sends it at most once per cache period; the comment below lets tests and operators find it
-- in pg_stat_statements and pg_stat_activity). Non-terminal counts are exact and read only
-- active rows (runs_live); terminal counts come from terminal_run_counts; the schedules'
-- health comes from schedule_health() (migration 0029: a schedule's last success uses
-- runs_schedule_success_idx). %(names)s / %(due_at)s give, per configured schedule, the
-- occurrence that should have started by now (NULL: none).
-- Vacuum health: the oldest holders of this database's MVCC horizon, oldest first by
-- transaction age (what really orders them): sessions of this database with a snapshot or
-- a transaction id (backend_xmin/backend_xid; a walsender's hot_standby_feedback; not an
-- autovacuum worker: a VACUUM's snapshot holds back no other vacuum, an autoanalyze's lasts
-- one table's sample, and a vacuum of hours would raise a false alarm), replication
-- slots (xmin, catalog_xmin) and prepared transactions. Each as [kind, ident, user,
-- application, client address, state, age in seconds (NULL: not known, a slot or a
-- walsender, or a session of another role whose times this role may not see), age in
-- transactions, backend type]. Without pg_read_all_stats (pg_monitor), other roles' sessions
-- still show their pid, user, application and backend_xmin, but not their state, client or
-- transaction start (the next column says whether they are visible). Then the dead row
-- versions of each of pgtick's tables.
SELECT /* pgtick_metrics_snapshot */
    extract(epoch FROM now())::float8,
    (SELECT coalesce(json_agg(json_build_array(
                job_type, queued, running, failed, due, oldest_due, stuck)), '[]')
     -- Grouped by status first: each active row compared on times only, not on its status
     -- six times (100 000 active rows: 20 against 24 ms).
     FROM (SELECT job_type,
                  coalesce(sum(n) FILTER (WHERE status = 'queued'), 0) AS queued,
                  coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
                  coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
                  coalesce(sum(due) FILTER (WHERE status <> 'running'), 0) AS due,
                  extract(epoch FROM now() - min(oldest) FILTER (WHERE status <> 'running'))::float8
                      AS oldest_due,
                  coalesce(sum(expired) FILTER (WHERE status = 'running'), 0) AS stuck
           FROM (SELECT job_type, status, count(*) AS n,
                        count(*) FILTER (WHERE run_at <= now()) AS due,
                        min(run_at) FILTER (WHERE run_at <= now()) AS oldest,
                        count(*) FILTER (WHERE locked_until < now()) AS expired
                 FROM {schema}.runs
                 WHERE status IN ('queued', 'running', 'failed')
                 GROUP BY job_type, status) AS by_status
           GROUP BY job_type) AS active),
    (SELECT coalesce(json_agg(json_build_array(job_type, status, n)), '[]')
     FROM {schema}.terminal_run_counts),
    (SELECT extract(epoch FROM refreshed_at)::float8 FROM {schema}.terminal_run_counts_refresh),
    -- Planned once per connection (migration 0029), not at every scrape.
    {schema}.schedule_health(%(names)s::text[], %(due_at)s::timestamptz[]),
    (SELECT coalesce(json_agg(json_build_array(
                kind, ident, usename, application, client, state, age_seconds, xid_age,
                backend_type) ORDER BY xid_age DESC), '[]')
     FROM (SELECT * FROM (
               SELECT 'session' AS kind, a.pid::text AS ident, a.usename::text,
                      a.application_name::text AS application, a.client_addr::text AS client,
                      a.state::text,
                      CASE WHEN a.backend_type = 'walsender' THEN NULL
                      ELSE extract(epoch FROM now() - coalesce(a.xact_start, a.query_start))
                      END::float8 AS age_seconds,
                      greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
                      a.backend_type::text
               FROM pg_stat_activity a
               WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
                 AND a.pid <> pg_backend_pid()
                 -- Not an autovacuum worker (a process of no user, to a role that may
                 -- not see its type).
                 AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
                 AND (a.usesysid IS NOT NULL OR a.backend_type IS NOT NULL)
                 AND (a.datname = current_database() OR a.backend_type = 'walsender')
               UNION ALL
               SELECT 'slot', r.slot_name::text, NULL, r.slot_type::text,
                      NULL, CASE WHEN r.active THEN 'active' ELSE 'inactive' END,
                      NULL, greatest(age(r.xmin), age(r.catalog_xmin)), NULL
               FROM pg_replication_slots r
               WHERE (r.xmin IS NOT NULL OR r.catalog_xmin IS NOT NULL)
                 AND (r.database IS NULL OR r.database = current_database())
               UNION ALL
               SELECT 'prepared', p.gid, p.owner::text, NULL, NULL, 'prepared',
                      extract(epoch FROM now() - p.prepared)::float8, age(p.transaction), NULL
               FROM pg_prepared_xacts p
               WHERE p.database = current_database()) AS holders
           ORDER BY xid_age DESC
           LIMIT 5) AS oldest),
    pg_has_role('pg_read_all_stats', 'USAGE'),
    -- Dead tuples per table, a partitioned one's summed over its partitions (one series per
    -- table, however many partitions retention creates and drops).
    (SELECT coalesce(json_agg(json_build_array(t.relname, t.dead)), '[]')
     FROM (SELECT root.relname, sum(pg_stat_get_dead_tuples(c.oid))::bigint AS dead
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_class root ON root.oid = coalesce(pg_partition_root(c.oid), c.oid)
           WHERE n.nspname = %(schema)s AND c.relkind = 'r'
           GROUP BY root.relname) AS t),
    -- Batches not done (migration 0026): open (members may come) and closed (their callback
    -- waits for members still running): the partition batches_active, through the parent.
    (SELECT json_build_array(count(*) FILTER (WHERE state = 'open'),
                             count(*) FILTER (WHERE state = 'closed'))
     FROM {schema}.batches WHERE state IN ('open', 'closed')),
    -- Runs waiting for another schedule's occurrence (`after`, migration 0027), per type.
    (SELECT coalesce(json_agg(json_build_array(job_type, n)), '[]')
     FROM (SELECT job_type, count(*) AS n FROM {schema}.runs
           WHERE status = 'queued' AND after_on IS NOT NULL AND NOT (after_on ? 'released')
           GROUP BY job_type) AS w);

-- claim_terminal_counts_refresh --
-- Take the right to recount terminal runs if the counts are older than %(max_age)s seconds;
-- SKIP LOCKED: while one daemon recounts, the others go on without waiting. The row lock is
-- held until the caller's transaction (which recounts) commits.
UPDATE {schema}.terminal_run_counts_refresh SET refreshed_at = now()
WHERE id IN (SELECT id FROM {schema}.terminal_run_counts_refresh
             WHERE refreshed_at IS NULL
                OR refreshed_at < now() - make_interval(secs => %(max_age)s)
             FOR UPDATE SKIP LOCKED)
RETURNING refreshed_at;

-- set_local_statement_timeout --
-- Bounds one transaction's statements; %(ms)s is milliseconds.
SELECT set_config('statement_timeout', %(ms)s::text, true);

-- recount_terminal_runs --
-- Replace the terminal counts in one statement: upsert every (job type, status) found and
-- delete the pairs that no longer have runs. The one full pass over finished rows pgtick makes.
WITH fresh AS (
    SELECT job_type, status, count(*) AS n
    FROM {schema}.runs
    WHERE status IN ('succeeded', 'dead', 'cancelled', 'skipped')
    GROUP BY job_type, status
), upserted AS (
    INSERT INTO {schema}.terminal_run_counts (job_type, status, n)
    SELECT job_type, status, n FROM fresh
    ON CONFLICT (job_type, status) DO UPDATE SET n = excluded.n
    RETURNING 1
)
DELETE FROM {schema}.terminal_run_counts t
WHERE NOT EXISTS (SELECT FROM fresh f WHERE f.job_type = t.job_type AND f.status = t.status);

-- list_runs --
-- The operator's run listing, newest first, one page at a time: keyset pagination on the
-- primary key (%(before)s), so a page costs the same on the ten-millionth row as on the
-- first. A NULL parameter means "no filter"; the CLI's statement is planned with its values,
-- so unused filters fold away. %(limit)s is one more than the page, to tell whether more exist.
SELECT r.id, r.job_type, r.status, r.attempts, r.max_attempts, r.run_at, r.started_at,
       r.finished_at, r.last_error, s.name, now()
FROM {schema}.runs r
LEFT JOIN {schema}.schedules s ON s.id = r.schedule_id
WHERE (%(statuses)s::text[] IS NULL OR r.status = ANY(%(statuses)s::text[]))
  AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
  AND (%(schedule)s::text IS NULL
       OR r.schedule_id = (SELECT id FROM {schema}.schedules WHERE name = %(schedule)s::text))
  AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR r.id < %(before)s::bigint)
ORDER BY r.id DESC
LIMIT %(limit)s;

-- list_finished_runs --
-- list_runs for terminal statuses only: every terminal run has finished_at set, and saying so
-- lets the planner use runs_finished_idx (status, finished_at) when those statuses are rare.
SELECT r.id, r.job_type, r.status, r.attempts, r.max_attempts, r.run_at, r.started_at,
       r.finished_at, r.last_error, s.name, now()
FROM {schema}.runs r
LEFT JOIN {schema}.schedules s ON s.id = r.schedule_id
WHERE r.status = ANY(%(statuses)s::text[]) AND r.finished_at IS NOT NULL
  AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
  AND (%(schedule)s::text IS NULL
       OR r.schedule_id = (SELECT id FROM {schema}.schedules WHERE name = %(schedule)s::text))
  AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR r.id < %(before)s::bigint)
ORDER BY r.id DESC
LIMIT %(limit)s;

-- schedule_of_run --
-- The schedule a run came from, for `pgtick show` (NULL schedule_id: no row).
SELECT id, name, job_type, cron, timezone, paused, paused_reason
FROM {schema}.schedules WHERE id = %(id)s;

-- effect_keys --
-- The side-effect keys a run recorded through effect_once, oldest first.
SELECT key, created_at FROM {schema}.effects WHERE run_id = %(run_id)s ORDER BY created_at, key;

-- list_workers --
-- Registered daemons with their heartbeat age on the database clock and how many runs each
-- holds now (running rows only, through runs_lease_idx), for `pgtick status`.
SELECT w.id, w.hostname, w.pid, w.version, w.threads, w.job_types, w.started_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8,
       (SELECT count(*) FROM {schema}.runs r WHERE r.status = 'running' AND r.locked_by = w.id)
FROM {schema}.workers w
ORDER BY w.hostname, w.pid, w.id;

-- status_schedules --
-- Every schedule's definition and pause state, for `pgtick status` (its last success and
-- overdue flag come from metrics_snapshot).
SELECT name, job_type, cron, timezone, jitter_seconds, paused, paused_reason, paused_detail
FROM {schema}.schedules
ORDER BY name;

-- run_statuses --
-- The current status of the given runs (ids not found are missing), checked by retry and
-- cancel before they change anything.
SELECT id, status FROM {schema}.runs WHERE id = ANY(%(ids)s::bigint[]);

-- count_bulk --
-- How many runs a bulk retry or cancel would change: one status and job type, optionally
-- only those finished (or, unfinished, last changed) since a time.
SELECT count(*)
FROM {schema}.runs
WHERE status = %(status)s AND job_type = %(job_type)s
  AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s::timestamptz
       OR (finished_at IS NULL AND updated_at >= %(since)s::timestamptz));

-- bulk_ids --
-- One batch of count_bulk's runs, in id order after %(after)s (keyset), for retry or cancel.
SELECT id
FROM {schema}.runs
WHERE status = %(status)s AND job_type = %(job_type)s
  AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s::timestamptz
       OR (finished_at IS NULL AND updated_at >= %(since)s::timestamptz))
  AND id > %(after)s
ORDER BY id
LIMIT %(batch)s;

-- filter_count --
-- How many runs match the console's runs filter (statuses, job type, schedule; a NULL: any),
-- for a bulk action's confirmation page: the statuses are those the action accepts.
SELECT count(*)
FROM {schema}.runs r
WHERE r.status = ANY(%(statuses)s::text[])
  AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
  AND (%(schedule)s::text IS NULL
       OR r.schedule_id = (SELECT id FROM {schema}.schedules WHERE name = %(schedule)s::text));

-- filter_ids --
-- The ids of filter_count's runs, oldest first, at most %(limit)s: what the confirmation
-- page carries. With %(ids)s (the ids confirmed), only those among them that match still,
-- checked again batch by batch as a bulk action changes them: a run that came to match
-- after the confirmation is never among them.
SELECT r.id
FROM {schema}.runs r
WHERE r.status = ANY(%(statuses)s::text[])
  AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
  AND (%(schedule)s::text IS NULL
       OR r.schedule_id = (SELECT id FROM {schema}.schedules WHERE name = %(schedule)s::text))
  AND (%(ids)s::bigint[] IS NULL OR r.id = ANY(%(ids)s::bigint[]))
ORDER BY r.id
LIMIT %(limit)s;

-- count_prunable --
-- What prune would delete for one status and age (`pgtick prune --dry-run`); the same
-- condition (a cancelled run still held is kept), read through runs_finished_idx.
SELECT count(*)
FROM {schema}.runs
WHERE status = %(status)s
  AND finished_at < now() - make_interval(secs => %(older_than)s)
  AND locked_by IS NULL;

-- console_read_only --
-- The console reads in a read-only transaction: a GET can never change anything.
SET TRANSACTION READ ONLY;

-- console_no_jit --
-- ... and without JIT compilation: the overview's queue depth, planned with estimates far
-- above its few thousand rows, spent 3 s of its 3.1 s compiling on PostgreSQL 15 (built with
-- LLVM, jit on by default) at 1 M runs; every console read is short.
SET LOCAL jit = off;

-- console_succeeded_per_minute --
-- Runs that succeeded in each of the last %(minutes)s minutes (0 = the current minute), for the
-- console's chart. A run succeeds once, with its one succeeded attempt, so this counts the
-- same as the attempts table would, but through runs_finished_idx (status, finished_at): an
-- index on attempts' finish time would slow every finish to serve one chart.
SELECT floor(extract(epoch FROM now() - finished_at) / 60)::int AS minutes_ago, count(*)
FROM {schema}.runs
WHERE status = 'succeeded' AND finished_at IS NOT NULL
  AND finished_at > now() - make_interval(mins => %(minutes)s)
GROUP BY 1;

-- console_finished_per_type_minute --
-- Runs that finished in each of the last %(minutes)s minutes (0 = the current minute) per job
-- type: succeeded, and dead (out of attempts or not retryable), for the console's small charts.
-- Through runs_finished_idx (status, finished_at) like console_succeeded_per_minute; a run
-- awaiting a retry has no finish time yet, so its failure shows when it finally dies.
SELECT job_type, floor(extract(epoch FROM now() - finished_at) / 60)::int AS minutes_ago,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'dead') AS dead
FROM {schema}.runs
WHERE status IN ('succeeded', 'dead') AND finished_at IS NOT NULL
  AND finished_at > now() - make_interval(mins => %(minutes)s)
GROUP BY 1, 2;

-- roll_up_runs --
-- One step of the rollups (migration 0023): the minutes closed since the last step, at most
-- %(max_minutes)s of them, and the hours they complete; the number of minutes rolled up (0:
-- nothing to do, or another daemon is at it). Its own short transaction.
SELECT {schema}.roll_up_runs(%(settle)s, %(back)s, %(max_minutes)s);

-- rollup_per_hour --
-- One job type's runs ended and attempts failed per hour from %(since)s on, from the rollups
-- alone: the hours rolled up from rollup_hours, the later ones (the current hour, and one
-- whose minutes are not all rolled up yet) summed from rollup_minutes. Primary-key ranges of
-- two small tables; no read of runs.
WITH done AS (
    SELECT coalesce(max(bucket) + interval '1 hour', '-infinity'::timestamptz) AS upto
    FROM {schema}.rollup_hours WHERE job_type = ''
)
SELECT x.bucket, sum(x.succeeded)::bigint, sum(x.failed)::bigint, sum(x.lost)::bigint,
       sum(x.dead)::bigint, sum(x.cancelled)::bigint, sum(x.skipped)::bigint,
       sum(x.run_seconds)::float8
FROM (
    SELECT h.bucket, h.succeeded, h.failed, h.lost, h.dead, h.cancelled, h.skipped, h.run_seconds
    FROM {schema}.rollup_hours h, done
    WHERE h.job_type = %(job_type)s AND h.bucket >= %(since)s AND h.bucket < done.upto
    UNION ALL
    SELECT to_timestamp(floor(extract(epoch FROM m.bucket) / 3600) * 3600), m.succeeded, m.failed,
           m.lost, m.dead, m.cancelled, m.skipped, m.run_seconds
    FROM {schema}.rollup_minutes m, done
    WHERE m.job_type = %(job_type)s AND m.bucket >= greatest(%(since)s, done.upto)
) x
GROUP BY x.bucket
ORDER BY x.bucket;

-- rollup_totals_since --
-- The sums from %(since)s on per job type of %(types)s (the overview's rows), from the
-- rollups as rollup_per_hour reads them: a primary-key range of each table per job type.
WITH done AS (
    SELECT coalesce(max(bucket) + interval '1 hour', '-infinity'::timestamptz) AS upto
    FROM {schema}.rollup_hours WHERE job_type = ''
)
SELECT x.job_type, sum(x.succeeded)::bigint, sum(x.failed)::bigint, sum(x.lost)::bigint,
       sum(x.dead)::bigint, sum(x.cancelled)::bigint, sum(x.skipped)::bigint,
       sum(x.run_seconds)::float8
FROM (
    SELECT h.job_type, h.succeeded, h.failed, h.lost, h.dead, h.cancelled, h.skipped,
           h.run_seconds
    FROM {schema}.rollup_hours h, done
    WHERE h.job_type = ANY(%(types)s::text[]) AND h.bucket >= %(since)s AND h.bucket < done.upto
    UNION ALL
    SELECT m.job_type, m.succeeded, m.failed, m.lost, m.dead, m.cancelled, m.skipped,
           m.run_seconds
    FROM {schema}.rollup_minutes m, done
    WHERE m.job_type = ANY(%(types)s::text[]) AND m.bucket >= greatest(%(since)s, done.upto)
) x
GROUP BY x.job_type;

-- rollup_rolled_up_to --
-- The end of the last minute rolled up (NULL: none yet): the charts say how fresh they are.
SELECT max(bucket) + interval '1 minute' FROM {schema}.rollup_minutes WHERE job_type = '';

-- migrations_try_lock --
-- The migrators' session lock, for a migration that cannot run in a transaction (concurrent
-- index builds), on a direct connection only, without blocking: migrate.py polls it, because
-- a session blocked in pg_advisory_lock holds a snapshot that a concurrent index build in the
-- holder waits for.
SELECT pg_try_advisory_lock(hashtext('pgtick.migrate.' || %(schema)s));

-- migrations_try_xact_lock --
-- The migrators' lock for one transaction (the same key): every transactional migration
-- takes it in the transaction that applies it, so it is released by COMMIT or ROLLBACK on
-- whichever server connection a pooler (PgBouncer, transaction mode) ran it, never left
-- behind on one. Polled like the session lock, each try in a transaction of its own.
SELECT pg_try_advisory_xact_lock(hashtext('pgtick.migrate.' || %(schema)s));

-- migrate_privileges --
-- Who may migrate: the schema's owner (or a member of its role, or a superuser), or, before
-- the schema exists, a role with CREATE on the database. Returns whether the schema exists,
-- its owner, whether the current role acts as that owner, CREATE on the database, and the
-- current role's name.
SELECT n.oid IS NOT NULL, pg_get_userbyid(n.nspowner),
       coalesce(pg_has_role(n.nspowner, 'USAGE'), false),
       has_database_privilege(current_database(), 'CREATE'), current_user
FROM (SELECT 1) AS one
LEFT JOIN pg_namespace n ON n.nspname = %(schema)s;

-- grants --
-- What the daemon's and the CLI's role needs, and nothing more: no CREATE, no ownership
-- (`pgtick grants ROLE` prints it; migrations run as the schema owner). `pgtick prune`
-- deletes the runs, attempts and output a cutoff splits from their partition. runs_id_seq:
-- enqueue_many draws ids with nextval before inserting; whatever ends an attempt draws its id
-- from attempts_id_seq. EXECUTE on functions is PostgreSQL's default for PUBLIC; granted
-- here on every function of the schema so a locked-down database works (enqueue and what it
-- calls as its caller: take_idempotency_keys, key_lock), maintain_partitions included, whose
-- EXECUTE is revoked from PUBLIC. A migration that adds a function grants it to whoever
-- could execute enqueue (0015 does). run_keys: `pgtick prune` deletes the keys of the runs it
-- deletes (take_idempotency_keys writes it as its owner). maintain_partitions creates and drops
-- partitions as the tables' owner (SECURITY DEFINER): retention without DDL rights. The rollups
-- are read (the console) and written by roll_up_runs as their owner (SECURITY DEFINER).
-- batches: the finish statements count members and settle batches; applications open and
-- close them.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.runs TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.attempts_history TO {role};
GRANT SELECT ON {schema}.attempts TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.schedules TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.workers TO {role};
GRANT SELECT, INSERT ON {schema}.effects TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.terminal_run_counts TO {role};
GRANT SELECT, UPDATE ON {schema}.terminal_run_counts_refresh TO {role};
GRANT SELECT ON {schema}.rollup_minutes, {schema}.rollup_hours TO {role};
GRANT SELECT ON {schema}.schema_migrations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.output_chunks TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.rate_starts TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.job_type_settings TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.console_logouts TO {role};
GRANT SELECT ON {schema}.job_type_controls TO {role};
GRANT SELECT ON {schema}.audit_log TO {role};
GRANT USAGE ON SEQUENCE {schema}.runs_id_seq TO {role};
GRANT USAGE ON SEQUENCE {schema}.attempts_id_seq TO {role};
GRANT SELECT ON {schema}.partitions TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};
GRANT SELECT, DELETE ON {schema}.run_keys TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.batches TO {role};
GRANT USAGE ON SEQUENCE {schema}.batches_id_seq TO {role};

-- grant_monitor --
-- `pgtick grants ROLE --monitor`: pg_monitor (through pg_read_all_stats) lets the role see
-- backend_xmin, state and client of other roles' sessions in pg_stat_activity, so that the
-- metrics and `pgtick status` can name a session of any role holding the MVCC horizon. Read
-- access to statistics only; a superuser (or a role with ADMIN on pg_monitor) runs it.
GRANT pg_monitor TO {role};
-- ===== Job output (issue 20): output_chunks, storage/output.py ==============================

-- output_write --
-- Write chunks of an attempt's output in one statement (atomic by itself: one round trip, no
-- BEGIN/COMMIT): head chunks (seq >= 0, written once) and tail slots (seq < 0, upserted in
-- turn). Guarded by the claim, as results are: only the holder of this attempt writes, so a
-- stale holder cannot write into a later attempt. `at` orders the tail slots: a microsecond
-- apart within the statement, in the order given. Returns the seqs written.
-- include: output_insert
WHERE r.id = %(run_id)s AND r.attempts = %(attempt)s
  AND r.locked_by IS NOT DISTINCT FROM %(worker_id)s
  AND r.status IN ('running', 'cancelled')
-- include: output_upsert

-- output_write_committed --
-- output_write for an attempt whose handler committed its success itself (ctx.transaction()):
-- the run is succeeded and no longer held, and what the handler logged until it returned is
-- written under the attempt that worker ended, found in attempts_history.
-- include: output_insert
WHERE r.id = %(run_id)s AND r.attempts = %(attempt)s AND r.status = 'succeeded'
  AND EXISTS (
    SELECT 1 FROM {schema}.attempts_history a
    WHERE a.run_id = r.id AND a.attempt = r.attempts AND a.outcome = 'succeeded'
      AND a.worker_id = %(worker_id)s AND a.started_at = %(started_at)s)
-- include: output_upsert

-- output_insert --
-- The start of output_write and output_write_committed: the chunks, for a run found by its
-- guard (which follows).
INSERT INTO {schema}.output_chunks
    (run_id, attempt, attempt_started_at, seq, at, lines, omitted_bytes)
SELECT r.id, r.attempts, %(started_at)s, c.seq,
       clock_timestamp() + make_interval(secs => c.ord / 1e6), c.lines, c.omitted
FROM {schema}.runs r,
     unnest(%(seqs)s::int[], %(lines)s::jsonb[], %(omitted)s::bigint[])
         WITH ORDINALITY AS c(seq, lines, omitted, ord)

-- output_upsert --
-- The end of output_write and output_write_committed.
ON CONFLICT (run_id, attempt, seq, attempt_started_at) DO UPDATE
SET lines = excluded.lines, omitted_bytes = excluded.omitted_bytes, at = excluded.at
RETURNING seq;

-- output_read --
-- A run's output chunks, of one attempt or all, in the order they are shown: by attempt,
-- head chunks by seq, then the tail slots in the order they were last written (`at` is the
-- clock time of each write, so slots written in one transaction keep their order).
SELECT attempt, attempt_started_at, seq, at, lines, omitted_bytes
FROM {schema}.output_chunks
WHERE run_id = %(run_id)s AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s)
ORDER BY attempt_started_at, attempt, seq < 0, CASE WHEN seq >= 0 THEN seq END, at;

-- output_attempt_state --
-- Whether an attempt of a run exists and is still open (pgtick logs --follow): the run's
-- status, its current attempt number, and that attempt's outcome (NULL while it runs).
SELECT r.status, r.attempts,
       (SELECT a.outcome FROM {schema}.attempts a
        WHERE a.run_id = r.id AND a.attempt = %(attempt)s ORDER BY a.id DESC NULLS FIRST LIMIT 1)
FROM {schema}.runs r WHERE r.id = %(run_id)s;

-- ===== Console logouts (migration 0016): console_logouts, storage/console.py ================

-- console_logout --
-- Log a console session out on every daemon: its cookie's nonce, kept until a day after the
-- cookie expires (%(expiry)s, epoch seconds; a day for the daemons' clocks against the
-- database's). The logouts past that go in the same statement, so the table holds at most
-- one session_ttl's worth and a day; a second logout of a session changes nothing.
WITH expired AS (
    DELETE FROM {schema}.console_logouts WHERE expires_at < now() - interval '1 day'
)
INSERT INTO {schema}.console_logouts (nonce, expires_at)
VALUES (%(nonce)s, to_timestamp(%(expiry)s))
ON CONFLICT (nonce) DO NOTHING;

-- console_logged_out --
-- Whether a console session was logged out, on any daemon (through the primary key).
SELECT EXISTS (SELECT 1 FROM {schema}.console_logouts WHERE nonce = %(nonce)s);

-- job_type_controls --
-- What operators changed at runtime, per job type (migration 0021): paused (who, when, why)
-- and the limits that override the config's. A daemon reads it on a `!controls` NOTIFY, when
-- its LISTEN connection (re)connects, and at its poll interval without one; status and the
-- console read it to show each limit's value and source.
SELECT job_type, paused, paused_at, paused_by, paused_reason, max_running, max_running_per_key,
       rate, rate_window, rate_per_key, rate_per_key_window, limits_at, limits_by
FROM {schema}.job_type_controls
ORDER BY job_type;

-- pause_job_type --
-- Pause a job type fleet-wide (the schema's function: it NOTIFYs the daemons).
SELECT {schema}.pause_job_type(%(job_type)s, %(reason)s, %(actor)s, %(via)s);

-- resume_job_type --
-- Resume a paused job type (the schema's function).
SELECT {schema}.resume_job_type(%(job_type)s, %(actor)s, %(via)s);

-- set_job_type_limits --
-- Override some of a job type's limits (NULL: leave that one as it is).
SELECT {schema}.set_job_type_limits(%(job_type)s, %(max_running)s, %(max_running_per_key)s,
                                    %(rate)s, %(rate_window)s, %(rate_per_key)s,
                                    %(rate_per_key_window)s, %(actor)s, %(via)s);

-- reset_job_type_limits --
-- Back to the config's limits.
SELECT {schema}.reset_job_type_limits(%(job_type)s, %(actor)s, %(via)s);

-- record_action --
-- One operator action in the audit log (migration 0019), after it was done: who (the name
-- given, and how: cli, console), what, its arguments, the runs it affected.
SELECT {schema}.record_action(%(action)s, %(target)s, %(args)s, %(actor)s, %(via)s,
                              %(runs_affected)s, %(run_ids)s::bigint[]);

-- audit_log --
-- The audit log since a time, newest first, up to a page (`pgtick audit`); served by
-- audit_log_at_idx.
SELECT id, at, actor, via, db_role, action, target, args, runs_affected, run_ids
FROM {schema}.audit_log
WHERE at >= coalesce(%(since)s::timestamptz, '-infinity')
ORDER BY at DESC, id DESC
LIMIT %(limit)s;

-- prune_audit_log --
-- Retention of the audit log (retention.audit): a batch of the rows older than the cutoff.
SELECT {schema}.prune_audit_log(%(older_than_seconds)s, %(batch)s);
