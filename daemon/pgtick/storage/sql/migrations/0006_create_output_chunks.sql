-- What an attempt printed (SPEC §5 Output), kept per attempt as chunks of lines written about
-- once a second while it runs. No foreign key to runs (in the storage redesign, runs becomes
-- a view): `pgtick prune` and the daemon's retention delete a run's chunks with the run.
-- seq >= 0: head chunks, in order; seq -1..-4: the tail ring's slots, upserted in turn.
-- (run_id, attempt) is not unique across released attempts, attempt_started_at tells them
-- apart. lines: a JSON array of [offset_ms, stream, text]; omitted_bytes, on tail slots: what
-- the attempt printed that is kept neither in the head nor in the tail, so far.
CREATE TABLE output_chunks (
    run_id              bigint NOT NULL,
    attempt             integer NOT NULL,
    attempt_started_at  timestamptz NOT NULL,
    seq                 integer NOT NULL,
    at                  timestamptz NOT NULL DEFAULT now(),
    lines               jsonb NOT NULL,
    omitted_bytes       bigint NOT NULL DEFAULT 0 CHECK (omitted_bytes >= 0),
    PRIMARY KEY (run_id, attempt, seq, attempt_started_at)
);
