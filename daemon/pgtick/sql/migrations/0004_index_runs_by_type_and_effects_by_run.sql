-- pgtick: no-transaction
-- Built with CREATE INDEX CONCURRENTLY, outside a transaction, so that daemons of the previous
-- version keep claiming, finishing and enqueueing while the indexes build on a large table (a
-- plain CREATE INDEX would block every write to runs for the whole build). migrate.py runs the
-- statements of a "no-transaction" file one by one; each is safe to run again: an index left
-- invalid by an interrupted build is dropped and built afresh, and the file is recorded only
-- once every statement succeeded.

-- `pgtick runs --type T`: the newest runs of one job type, one page at a time (keyset on id),
-- without walking the primary key past every other type's rows.
DROP INDEX CONCURRENTLY IF EXISTS runs_job_type_id_idx;
CREATE INDEX CONCURRENTLY runs_job_type_id_idx ON runs (job_type, id);

-- `pgtick show RUN_ID`: the side-effect keys a run recorded, without reading all of effects.
DROP INDEX CONCURRENTLY IF EXISTS effects_run_id_idx;
CREATE INDEX CONCURRENTLY effects_run_id_idx ON effects (run_id);
