-- Which applied migrations daemons of earlier versions cannot run across (the files marked
-- "-- pgtick: stop-daemons"), so that a daemon refuses to start against a schema with such a
-- migration it does not know, rather than claim and finish by rules the tables no longer
-- follow: a daemon from before 0013, started after it, claimed nothing and logged
-- claim_failed until someone noticed. migrate marks each later stop-daemons file as it records
-- it; this marks the two before it. Daemons keep running: a column with a default, which
-- the inserts of earlier versions' migrate leave false.
ALTER TABLE schema_migrations ADD COLUMN stops_daemons boolean NOT NULL DEFAULT false;
UPDATE schema_migrations SET stops_daemons = true WHERE version IN ('0010', '0013');
