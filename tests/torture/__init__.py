"""The guarantees harness (issue 43): pgtick's own FoundationDB simulation / Jepsen.

A torture run is a plan drawn from one seed, executed against real daemons on a real
PostgreSQL, recorded as a history outside the database's transactions, and judged by a checker
that knows only the promises of docs/guarantees.md, not how pgtick keeps them.

    plan.py        the world (job types, limits, schedules, retention) and the steps (operations
                   and faults at times relative to the start) drawn from random.Random(seed): pure
    history.py     the append-only JSON-lines files, one per process, and reading them back
    jobs.py        the Python handler the daemons run; cmd.py the command handler
    operations.py  the clients: enqueues at each isolation level, key races, CLI cancel, retry,
                   prune
    faults.py      the nemesis: signals to daemons, ended sessions, a restarted server, a row
                   held locked, a held snapshot (and the hook for a migration under traffic)
    observer.py    a reader sampling the runs and ended attempts into the history; the stalls
    cluster.py     the server, the database and the daemon processes
    run.py         executes a plan: start, steps, quiesce, stop, final state, then the checker
    model.py       the facts a history states (executions, enqueues, sightings, faults in force)
    checker.py     every guarantee's check over the model: idempotency.py (1, 7), locking.py
                   (2, 3), retries.py (4, 5, 6), daemons.py (8), sharing findings.py;
                   summary.py counts what was exercised; report.py prints the verdict

Imports point one way: run > operations, faults, observer, cluster > jobs > history, plan;
report > checker > the guarantees' modules > findings > model > history, plan. The daemon
side (jobs.py, cmd.py) imports history alone, so `pgtick run` loads little of the harness.
"""
