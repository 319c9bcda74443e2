-- pgtick: no-transaction
-- runs_job_type_id_idx (job_type, id) becomes partial on `job_type > ''`, so that no statement
-- that names no job type can read it (issue 42, finding 12). With runs_live's statistics taken
-- while the queue was empty (reltuples 0, the usual state of a queue that keeps up), the
-- generic plans of the hot path's lookups by id (claim, finish, heartbeat, release) cost it
-- exactly as runs_id_idx on PostgreSQL 15 and took it; before 17 a B-tree bound on its second
-- column only reads the whole index once per id (a finish of 10 runs read 1 543 pages against
-- 23). `pgtick runs --type T` still reads it: `job_type = 'T'` implies the predicate. Every run
-- enqueue() accepts is in it (a job type of 1 to 200 characters).
--
-- Built without holding up daemons of the previous version, on every partition there is:
-- the new index on each partitioned table alone (ON ONLY: no rows, a moment's lock), a
-- concurrent build on each leaf partition, each attached to its parent's (the parents become
-- valid once all theirs are), then the old index dropped and the new ones renamed to the old
-- names. Partitions created meanwhile (retention's maintenance) get the new index from their
-- parent; one dropped meanwhile is passed over. The statements that need a lock on runs take
-- it through ddl_when_unlocked(), which gives up the lock's queue after 200 ms and tries again,
-- so that an open transaction on runs (an operator's psql) never holds up the traffic behind
-- the migration's lock request. Each statement is safe to run again.

CREATE OR REPLACE FUNCTION ddl_when_unlocked(statement text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    pause double precision := 0.05;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            EXECUTE statement;
            PERFORM set_config('lock_timeout', '0', true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(pause);
            pause := least(pause * 2, 2.0);
        END;
    END LOOP;
END;
$$;

-- The new index on each partitioned table alone, the root first.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.relname FROM pg_partition_tree('runs'::regclass) p
        JOIN pg_class c ON c.oid = p.relid
        WHERE NOT p.isleaf ORDER BY p.level, c.relname
    LOOP
        PERFORM ddl_when_unlocked(format(
            'CREATE INDEX IF NOT EXISTS %I ON ONLY %I (job_type, id) WHERE job_type > %L',
            left(t.relname, 40) || '_job_type_id_pidx', t.relname, ''));
    END LOOP;
END;
$$;

-- pgtick: gexec
-- A concurrent build on each leaf partition that has no index attached to its parent's new
-- one yet (an invalid one, left by an interrupted build, is dropped first).
WITH leaves AS (
    SELECT c.relname, left(c.relname, 40) || '_job_type_id_pidx' AS index_name
    FROM pg_partition_tree('runs'::regclass) p JOIN pg_class c ON c.oid = p.relid
    WHERE p.isleaf AND NOT EXISTS (
        SELECT FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid
        JOIN pg_class pi ON pi.oid = i.inhparent
        WHERE x.indrelid = p.relid AND pi.relname LIKE '%\_job\_type\_id\_pidx')
)
SELECT s.statement FROM (
    SELECT relname, 1 AS step, format('DROP INDEX CONCURRENTLY IF EXISTS %I', index_name)
        AS statement
    FROM leaves
    UNION ALL
    SELECT relname, 2, format(
        'CREATE INDEX CONCURRENTLY %I ON %I (job_type, id) WHERE job_type > %L',
        index_name, relname, '')
    FROM leaves
) s ORDER BY s.relname, s.step;

-- pgtick: gexec
-- Each partition's new index attached to its parent's, the deepest first, each in a
-- transaction of its own: a parent's becomes valid once every partition's is attached.
SELECT format('SELECT ddl_when_unlocked(%L)', format('ALTER INDEX %I ATTACH PARTITION %I',
        left(parent.relname, 40) || '_job_type_id_pidx',
        left(child.relname, 40) || '_job_type_id_pidx'))
FROM pg_partition_tree('runs'::regclass) p
JOIN pg_class child ON child.oid = p.relid
JOIN pg_class parent ON parent.oid = p.parentrelid
WHERE NOT EXISTS (
    SELECT FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid
    JOIN pg_class pi ON pi.oid = i.inhparent
    WHERE x.indrelid = p.relid AND pi.relname LIKE '%\_job\_type\_id\_pidx')
ORDER BY p.level DESC, child.relname;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
        WHERE x.indrelid = 'runs'::regclass AND c.relname = 'runs_job_type_id_pidx'
          AND x.indisvalid
    ) THEN
        RAISE EXCEPTION 'runs_job_type_id_pidx is not valid on every partition yet: run migrate again';
    END IF;
END;
$$;

-- Then the old index goes and the new ones take its names, in one transaction.
DO $$
DECLARE
    t record;
BEGIN
    PERFORM ddl_when_unlocked('DROP INDEX IF EXISTS runs_job_type_id_idx');
    FOR t IN
        SELECT ic.relname AS index_name, tc.relname AS table_name
        FROM pg_partition_tree('runs'::regclass) p
        JOIN pg_index x ON x.indrelid = p.relid
        JOIN pg_class ic ON ic.oid = x.indexrelid
        JOIN pg_class tc ON tc.oid = p.relid
        WHERE pg_get_indexdef(x.indexrelid) LIKE '%(job_type, id) WHERE (job_type > %'
          AND ic.relname <> left(tc.relname, 50) || '_job_type_id_idx'
        ORDER BY p.level
    LOOP
        PERFORM ddl_when_unlocked(format('ALTER INDEX %I RENAME TO %I',
            t.index_name, left(t.table_name, 50) || '_job_type_id_idx'));
    END LOOP;
END;
$$;

DROP FUNCTION ddl_when_unlocked(text);
