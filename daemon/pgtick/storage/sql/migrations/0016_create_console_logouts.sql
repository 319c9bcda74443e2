-- The console's sessions logged out before they expired, so that a logout ends the session
-- on every daemon's console, not only on the one it was sent to
-- (docs/console.md, Log out ends the session on every daemon). A session is a signed cookie that every daemon holding the token accepts, and nothing
-- is stored at login; a logout stores the cookie's nonce here with its expiry, and a
-- console asks before it acts on a session (and every few seconds for its pages). A row is
-- deleted by a later logout a day after its cookie expired (the daemons' clocks may differ
-- from the database's), so the table holds at most the logouts of one session_ttl and a day.
-- A new table nothing earlier reads: daemons of the previous version run on beside it.
CREATE TABLE console_logouts (
    nonce          text PRIMARY KEY,
    expires_at     timestamptz NOT NULL,
    logged_out_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_logouts_expires_idx ON console_logouts (expires_at);
COMMENT ON TABLE console_logouts IS
    'Console sessions logged out before their cookie expired; every daemon refuses them.';

-- The roles the daemons run as (those that may write runs) may record and read logouts
-- without `pgtick grants` run again (it grants the same; running it does no harm).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'runs'
               AND privilege_type = 'INSERT'
               AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class
                               WHERE oid = 'runs'::regclass) LOOP
        EXECUTE 'GRANT SELECT, INSERT, DELETE ON console_logouts TO '
            || CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END;
    END LOOP;
END;
$$;
