"""The guarantees harness (issue 43): pgtick's own FoundationDB simulation / Jepsen.

A torture run is a plan drawn from one seed, executed against real daemons on a real
PostgreSQL, recorded as a history outside the database's transactions, and judged by a checker
that knows only the promises of docs/guarantees.md, not how pgtick keeps them.

    plan.py        the world (job types, limits, schedules, retention) and the steps (operations
                   and faults at times relative to the start), drawn from random.Random(seed); pure
    history.py     the append-only JSON-lines files (one per process) and how they are read back
    jobs.py        the Python handlers the daemons run (imported by `pgtick run`); cmd.py the command
    operations.py  the clients: enqueues at each isolation level, key races, CLI cancel/retry/prune
    faults.py      the nemesis: signals to daemons, killed sessions, a restarted server, held row
                   locks and snapshots
    observer.py    a reader that samples the runs table (what existed, when) into the history
    cluster.py     the server, the database and the daemon processes
    run.py         executes a plan: start, steps, quiesce, stop, final state; then the checker
    checker.py     one function per guarantee over the history and the final state
    report.py      the violations and the counts as text

Imports point one way: run > operations | faults | observer | cluster > history | plan;
checker > report? no: report > checker > history | plan. The daemon side (jobs.py, cmd.py)
imports history only, so `pgtick run` loads little of the harness.
"""
