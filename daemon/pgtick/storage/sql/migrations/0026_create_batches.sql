-- Batches (docs/composition.md, Batches): a set of runs whose callback is enqueued exactly
-- once, when the batch is closed and every member is terminal, with the counts by outcome.
--
-- The decision is made on the batch's row, under its row lock, in the transaction of the
-- member's terminal write: the statements that record outcomes (succeed, fail, the reaper's
-- reap_mark, cancel) call batch_ended() once per batch per statement with how many of its
-- members that statement ended, and batch_close() decides at the close. A member is counted
-- when it becomes terminal, once: failed-awaiting-retry is not terminal, and an operator's
-- retry of a dead or cancelled member takes its count back (batch_reopened) while the batch
-- is not done. So the counts do not depend on the members' rows: retention may drop finished
-- members while the batch is open, and the callback neither waits for them nor repeats.
-- A finish statement writes up to 500 results: 10 000 members take the row lock about 20
-- times per daemon, each for the rest of one statement, not once per member.
--
--   batches         LIST (state)
--     batches_active   open (members may be added) and closed (no more members)
--     batches_done     RANGE (done_at): the callback enqueued; dropped by retention with
--                      the longest of the terminal retentions (partitioned_tables)
--
-- The batch row is updated once per statement that ends some of its members: under a held
-- snapshot it keeps that many dead versions until the snapshot goes (docs/composition.md).
CREATE SEQUENCE batches_id_seq;
CREATE TABLE batches (
    id              bigint NOT NULL DEFAULT nextval('batches_id_seq'),
    state           text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'done')),
    callback        jsonb,          -- chain steps (chain_steps' normal form) enqueued when done
    members         integer NOT NULL DEFAULT 0,
    succeeded       integer NOT NULL DEFAULT 0,
    dead            integer NOT NULL DEFAULT 0,
    cancelled       integer NOT NULL DEFAULT 0,
    skipped         integer NOT NULL DEFAULT 0,
    callback_run_id bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    closed_at       timestamptz,
    done_at         timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (state <> 'done' OR done_at IS NOT NULL)
) PARTITION BY LIST (state);
ALTER SEQUENCE batches_id_seq OWNED BY batches.id;
CREATE TABLE batches_active PARTITION OF batches FOR VALUES IN ('open', 'closed');
CREATE TABLE batches_done PARTITION OF batches FOR VALUES IN ('done')
    PARTITION BY RANGE (done_at);
CREATE TABLE batches_done_default PARTITION OF batches_done DEFAULT;
CREATE INDEX batches_id_idx ON batches (id);
INSERT INTO partitioned_tables VALUES ('batches_done', 'done_at', 'created_at', NULL);
-- Members by batch, for `pgtick batch ID` (the runs still kept) and the console.
CREATE INDEX runs_batch_idx ON runs (batch_id) WHERE batch_id IS NOT NULL;
COMMENT ON TABLE batches IS
    'Batches of runs and their callbacks (docs/composition.md); counts by outcome.';

-- A new batch (open); callback: a job type name, a step object or an array of them.
CREATE FUNCTION batch_open(callback jsonb DEFAULT NULL) RETURNS bigint
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    INSERT INTO batches (callback) VALUES (chain_steps(callback, 1, 'callback')) RETURNING id
$$;

-- The callback of a batch that is done, enqueued (in the caller's transaction, under the
-- batch's row lock): its payload is the step's with "batch": {id, members, succeeded, dead,
-- cancelled, skipped}; key pgtick.batch.<id>.<step>. Returns the first callback's run id.
CREATE FUNCTION batch_callback(b batches) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    step jsonb;
    i integer := 0;
    first_id bigint;
    made record;
BEGIN
    FOR step IN SELECT e FROM jsonb_array_elements(coalesce(b.callback, '[]'::jsonb)) AS e LOOP
        i := i + 1;
        SELECT * INTO made FROM enqueue_run(
            step ->> 'job_type',
            coalesce(step -> 'payload', '{}'::jsonb) || jsonb_build_object('batch',
                jsonb_build_object('id', b.id, 'members', b.members, 'succeeded', b.succeeded,
                                   'dead', b.dead, 'cancelled', b.cancelled,
                                   'skipped', b.skipped)),
            NULL, 'pgtick.batch.' || b.id || '.' || i,
            (step ->> 'max_attempts')::integer, (step ->> 'priority')::integer,
            step ->> 'concurrency_key', NULL,
            valid_follow(step -> 'on_success', step -> 'on_dead'), NULL);
        first_id := coalesce(first_id, made.run_id);
    END LOOP;
    RETURN first_id;
END;
$$;

-- The batch done if it is closed and every member is terminal: moved to batches_done, its
-- callback enqueued. Under the row lock the caller holds. Returns whether it was done now.
CREATE FUNCTION batch_settle(batch_id bigint) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    b batches;
    cb bigint;
BEGIN
    SELECT * INTO b FROM batches WHERE id = batch_id AND state = 'closed';
    IF NOT FOUND OR b.succeeded + b.dead + b.cancelled + b.skipped < b.members THEN
        RETURN false;
    END IF;
    cb := batch_callback(b);
    UPDATE batches SET state = 'done', done_at = now(), updated_at = now(), callback_run_id = cb
    WHERE id = batch_id;
    RETURN true;
END;
$$;

-- n members of batch_id ended with outcome (succeeded, dead, cancelled, skipped): counted
-- under the batch's row lock, and the batch settled if that made it done. Called by the
-- statements that record outcomes, once per batch per statement, in batch id order (two
-- statements lock batches in the same order). A batch already done (a member an operator
-- retried after the callback) or gone (retention) counts nothing.
CREATE FUNCTION batch_ended(batch_id bigint, outcome text, n integer) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    state text;
BEGIN
    UPDATE batches b
    SET succeeded = b.succeeded + CASE WHEN outcome = 'succeeded' THEN n ELSE 0 END,
        dead = b.dead + CASE WHEN outcome = 'dead' THEN n ELSE 0 END,
        cancelled = b.cancelled + CASE WHEN outcome = 'cancelled' THEN n ELSE 0 END,
        skipped = b.skipped + CASE WHEN outcome = 'skipped' THEN n ELSE 0 END,
        updated_at = now()
    WHERE b.id = batch_ended.batch_id AND b.state IN ('open', 'closed')
    RETURNING b.state INTO state;
    IF state = 'closed' THEN
        PERFORM batch_settle(batch_ended.batch_id);
    END IF;
    RETURN coalesce(n, 0);
END;
$$;

-- An operator's retry of n members of batch_id that were counted with outcome (dead,
-- cancelled): their counts taken back, while the batch is not done (once done, its callback
-- has run with the counts of then; the retried member counts nothing more).
CREATE FUNCTION batch_reopened(batch_id bigint, outcome text, n integer) RETURNS integer
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    UPDATE batches b
    SET succeeded = b.succeeded - CASE WHEN outcome = 'succeeded' THEN n ELSE 0 END,
        dead = b.dead - CASE WHEN outcome = 'dead' THEN n ELSE 0 END,
        cancelled = b.cancelled - CASE WHEN outcome = 'cancelled' THEN n ELSE 0 END,
        skipped = b.skipped - CASE WHEN outcome = 'skipped' THEN n ELSE 0 END,
        updated_at = now()
    WHERE b.id = batch_reopened.batch_id AND b.state IN ('open', 'closed')
    RETURNING n
$$;

-- A member added to an open batch (enqueue()'s arguments): refused once the batch is closed.
-- A key already taken returns that run, which is not made a member.
CREATE FUNCTION batch_add(
    batch_id        bigint,
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    traceparent     text DEFAULT NULL,
    on_success      jsonb DEFAULT NULL,
    on_dead         jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    made record;
BEGIN
    SELECT * INTO made FROM enqueue_run(job_type, payload, run_at, idempotency_key,
                                        max_attempts, priority, concurrency_key, traceparent,
                                        valid_follow(on_success, on_dead), batch_add.batch_id);
    IF made.fresh THEN
        -- Refuses (and so rolls back the insert) unless the batch is open.
        PERFORM batch_members_added(batch_add.batch_id, 1);
    END IF;
    RETURN made.run_id;
END;
$$;

-- n members added to batch_id (enqueue_many's batches, batch_add): refused with a clear
-- error when the batch is not open. n = 0 only checks, taking the row lock.
CREATE FUNCTION batch_members_added(batch_id bigint, n integer) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    state text;
BEGIN
    UPDATE batches b SET members = b.members + n, updated_at = now()
    WHERE b.id = batch_members_added.batch_id AND b.state = 'open'
    RETURNING b.state INTO state;
    IF state IS NULL THEN
        SELECT b.state INTO state FROM batches b WHERE b.id = batch_members_added.batch_id;
        RAISE EXCEPTION 'batch %: %', batch_members_added.batch_id,
            CASE WHEN state IS NULL THEN 'no such batch'
                 ELSE 'is ' || state || ': members are added only while it is open' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN n;
END;
$$;

-- No more members: the batch is closed, and done at once if every member is terminal
-- already. Returns its state after ('closed' or 'done'; a done batch stays done).
CREATE FUNCTION batch_close(batch_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    state text;
BEGIN
    UPDATE batches b SET state = 'closed', closed_at = now(), updated_at = now()
    WHERE b.id = batch_close.batch_id AND b.state = 'open'
    RETURNING b.state INTO state;
    IF state IS NULL THEN
        SELECT b.state INTO state FROM batches b WHERE b.id = batch_close.batch_id;
        IF state IS NULL THEN
            RAISE EXCEPTION 'batch %: no such batch', batch_close.batch_id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN state;
    END IF;
    IF batch_settle(batch_close.batch_id) THEN
        RETURN 'done';
    END IF;
    RETURN 'closed';
END;
$$;

-- Privileges: whoever may execute enqueue() may execute these, and read and write batches.
DO $$
DECLARE
    acl aclitem[];
    fn text;
    g record;
BEGIN
    SELECT coalesce(p.proacl, acldefault('f', p.proowner)) INTO acl
    FROM pg_proc p
    WHERE p.oid = 'enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)'::regprocedure;
    FOREACH fn IN ARRAY ARRAY[
        'batch_open(jsonb)', 'batch_callback(batches)', 'batch_settle(bigint)',
        'batch_ended(bigint, text, integer)', 'batch_reopened(bigint, text, integer)',
        'batch_add(bigint, text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)',
        'batch_members_added(bigint, integer)', 'batch_close(bigint)'
    ] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
        FOR g IN SELECT a.grantee, a.is_grantable FROM aclexplode(acl) a
                 WHERE a.privilege_type = 'EXECUTE' LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', fn,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE g.grantee::regrole::text END);
        END LOOP;
    END LOOP;
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'INSERT'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON batches TO %s',
                       CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
        EXECUTE format('GRANT USAGE ON SEQUENCE batches_id_seq TO %s',
                       CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END;
$$;
