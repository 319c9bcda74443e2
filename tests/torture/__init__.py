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
                   held locked, a held snapshot
    observer.py    a reader sampling the runs table into the history; the host's stalls
    cluster.py     the server, the database and the daemon processes
    run.py         executes a plan: start, steps, quiesce, stop, final state, then the checker
    model.py       the facts a history states (executions, enqueues, sightings, faults in force)
    checker.py     one function per guarantee over the model; report.py the verdict as text

Imports point one way: run > operations | faults | observer | cluster > jobs > history, plan;
report > checker > model > history, plan. The daemon side (jobs.py, cmd.py) imports history
alone, so `pgtick run` loads little of the harness.
"""
