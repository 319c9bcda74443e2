-- pgtick initial schema. Applied by migrate.py with search_path set to the configured schema,
-- so nothing here names the schema; functions capture it with SET search_path FROM CURRENT.

CREATE TABLE schedules (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                text NOT NULL UNIQUE,
    job_type            text NOT NULL,
    payload             jsonb NOT NULL DEFAULT '{}'::jsonb,
    cron                text NOT NULL,
    timezone            text NOT NULL DEFAULT 'UTC',
    max_attempts        integer CHECK (max_attempts >= 1),
    catchup             text NOT NULL DEFAULT 'latest' CHECK (catchup IN ('latest', 'all', 'none')),
    catchup_limit       integer NOT NULL DEFAULT 100 CHECK (catchup_limit >= 1),
    overlap             text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    jitter_seconds      double precision NOT NULL DEFAULT 0 CHECK (jitter_seconds >= 0),
    paused              boolean NOT NULL DEFAULT false,
    -- Why it is paused: 'operator' (pgtick schedules pause) or 'removed' (gone from the
    -- config file; un-paused if it comes back).
    paused_reason       text CHECK (paused_reason IN ('operator', 'removed')),
    -- The materialization cursor: every occurrence <= this instant has been turned into a run
    -- (or deliberately not, per catchup). Pruning runs never moves it back (SPEC §2 rule 5).
    materialized_until  timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE runs (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id         bigint REFERENCES schedules (id),
    scheduled_for       timestamptz,
    job_type            text NOT NULL,
    payload             jsonb NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key     text,
    status              text NOT NULL DEFAULT 'queued' CHECK (status IN (
                            'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled', 'skipped')),
    run_at              timestamptz NOT NULL DEFAULT now(),
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- NULL until claimed: the claiming daemon fills in its job type's max_attempts.
    max_attempts        integer CHECK (max_attempts >= 1),
    locked_by           text,
    locked_until        timestamptz,
    last_error          text,
    error_type          text,
    started_at          timestamptz,
    finished_at         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_schedule_occurrence_key UNIQUE (schedule_id, scheduled_for),
    CONSTRAINT runs_running_is_locked CHECK (
        status <> 'running' OR (locked_by IS NOT NULL AND locked_until IS NOT NULL))
);

-- One logical job per business key (SPEC §2 rule 8).
CREATE UNIQUE INDEX runs_idempotency_key_key ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Serves the claim query: runnable rows only, in due order, so claiming stays O(log n)
-- however many finished rows the table holds.
CREATE INDEX runs_claim_idx ON runs (run_at, id)
    WHERE status IN ('queued', 'failed');

-- Serves the reaper: running rows by lease expiry.
CREATE INDEX runs_lease_idx ON runs (locked_until)
    WHERE status = 'running';

-- Serves the overlap check: unfinished runs of a schedule.
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE status IN ('queued', 'running', 'failed');

-- Serves pruning by status and age.
CREATE INDEX runs_finished_idx ON runs (status, finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE attempts (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id              bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    -- The run's attempt number. A released attempt is not counted, so the next claim reuses
    -- its number: (run_id, attempt) is not unique, outcome tells them apart.
    attempt             integer NOT NULL,
    worker_id           text NOT NULL,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    outcome             text CHECK (outcome IN ('succeeded', 'failed', 'lost', 'released')),
    error               text,
    error_type          text
);
CREATE INDEX attempts_run_idx ON attempts (run_id, attempt);

CREATE TABLE workers (
    id                  text PRIMARY KEY,
    hostname            text NOT NULL,
    pid                 integer NOT NULL,
    version             text NOT NULL,
    threads             integer NOT NULL,
    job_types           text[] NOT NULL DEFAULT '{}',
    started_at          timestamptz NOT NULL DEFAULT now(),
    heartbeat_at        timestamptz NOT NULL DEFAULT now()
);

-- The generic "record before you act" guard behind JobContext.effect_once().
CREATE TABLE effects (
    key                 text PRIMARY KEY,
    run_id              bigint,
    created_at          timestamptz NOT NULL DEFAULT now()
);

-- Transactional enqueue for applications in any language. Returns the new run's id, or the
-- existing run's id when idempotency_key is already taken (and then changes nothing).
-- Wakes idle daemons with a NOTIFY on the channel named after this schema.
CREATE FUNCTION enqueue(
    job_type        text,
    payload         jsonb DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts    integer DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
BEGIN
    IF enqueue.idempotency_key IS NOT NULL THEN
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        IF FOUND THEN
            RETURN new_id;
        END IF;
    END IF;
    INSERT INTO runs (job_type, payload, run_at, idempotency_key, max_attempts)
    VALUES (enqueue.job_type, coalesce(enqueue.payload, '{}'::jsonb),
            coalesce(enqueue.run_at, now()), enqueue.idempotency_key, enqueue.max_attempts)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        -- A concurrent transaction inserted the same key first and has committed.
        SELECT r.id INTO new_id FROM runs r WHERE r.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;
    PERFORM pg_notify(current_schema(), enqueue.job_type);
    RETURN new_id;
END;
$$;
