-- The audit log (docs/operations/runtime.md, "Audit log"): every operator action, from the
-- CLI, the console or the operators' SQL functions, with who (the name the caller gives:
-- user@host for the CLI, the console session's name; and the database role), what, when, its
-- arguments and the runs it affected. Written only through record_action (SECURITY DEFINER):
-- the roles that act read it and append to it through the function, and nobody updates it.
-- Kept like runs (retention.audit, default 90 days): prune_audit_log deletes the rows older
-- than that, in batches, from the daemons' retention pass. The functions that change things
-- at runtime (0021, 0022) call record_action in their own transaction.
-- A new table nothing earlier reads: daemons of the previous version run on beside it.
CREATE TABLE audit_log (
    id             bigserial PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    actor          text NOT NULL,
    via            text NOT NULL,
    db_role        text NOT NULL DEFAULT session_user,
    action         text NOT NULL,
    target         text,
    args           jsonb NOT NULL DEFAULT '{}',
    runs_affected  bigint,
    run_ids        bigint[]
);
CREATE INDEX audit_log_at_idx ON audit_log (at);
COMMENT ON TABLE audit_log IS
    'Every operator action: who (actor, via, db_role), what (action, target, args), when, and '
    'the runs it affected (run_ids: the first 1000).';

-- One row; its id. `run_ids` is cut to its first 1000 (runs_affected says how many there were).
CREATE FUNCTION record_action(action text, target text, args jsonb, actor text DEFAULT NULL,
                              via text DEFAULT 'sql', runs_affected bigint DEFAULT NULL,
                              run_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO audit_log (actor, via, action, target, args, runs_affected, run_ids)
    VALUES (coalesce(nullif(actor, ''), session_user::text), coalesce(via, 'sql'), action,
            target, coalesce(args, '{}'), runs_affected, run_ids[1:1000])
    RETURNING id;
$$;

-- Delete the rows older than `older_than_seconds`, at most `batch` of them; how many went.
CREATE FUNCTION prune_audit_log(older_than_seconds float8, batch integer DEFAULT 10000)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH gone AS (
        DELETE FROM audit_log
        WHERE id IN (SELECT id FROM audit_log
                     WHERE at < now() - make_interval(secs => older_than_seconds)
                     ORDER BY at LIMIT batch)
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;

REVOKE ALL ON FUNCTION record_action(text, text, jsonb, text, text, bigint, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION prune_audit_log(float8, integer) FROM PUBLIC;
DO $$
DECLARE
    g record;
    who text;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'UPDATE'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        who := CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
        EXECUTE 'GRANT SELECT ON audit_log TO ' || who;
        EXECUTE 'GRANT EXECUTE ON FUNCTION record_action(text, text, jsonb, text, text, bigint, '
            || 'bigint[]), prune_audit_log(float8, integer) TO ' || who;
    END LOOP;
END;
$$;
