"""The `migrate` fault: a rolling upgrade from the previous release under traffic.

A run whose plan draws it starts on the previous release: its schema (migrated by that
release's own `pgtick migrate`), its daemons, and its operator CLI. At the step, this
version's `pgtick migrate` runs while clients enqueue and the old daemons claim and finish
against the schema changing under them; then the daemons are restarted one slot at a time on
this version (docs/operations: Rolling deploy), and every later start and CLI call is this
version's. The checker then expects the usual guarantees across it, no enqueue refused but for
the documented retryable errors (``enqueue_refused``), and the migration applied.

The previous release is a commit of this repository (there is no tagged release yet): the one
before migrations 0017-0022, whose code is read with `git archive` into the run's directory.
Move it forward at each release (docs/release.md). Without git or that commit the run fails
with a line that says so; it is never skipped.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.torture.findings import Finding
from tests.torture.history import FAIL
from tests.torture.model import Model

REPO_DIR = Path(__file__).resolve().parents[2]
# The previous release: schema 0016 (before the partial type index, trace context, audit log,
# partition locks without waiting, job-type controls and schedules owned per service).
PREVIOUS_RELEASE = "749b34a1a9b4b7567a59f85038bfd4ac45f8b34e"
MIGRATE_TRIES = 10  # `pgtick migrate` again after a failure (the server restarted under it)
MIGRATE_TIMEOUT_SECONDS = 300.0
# Enqueue errors an application is documented to retry (docs/enqueueing.md): a serialization
# failure or deadlock of its own transaction, and the connection lost (a session ended, the
# server restarting). Anything else is a refusal the upgrade (or a fault) must not cause.
RETRYABLE_SQLSTATES = ("40001", "40P01", "57P01", "57P02", "57P03", "25P02")
RETRYABLE_ERRORS = ("OperationalError", "ConnectionTimeout", "SerializationFailure")


def previous_code(into: Path) -> Path:
    """The previous release's ``daemon`` folder, written under ``into``; its path (for
    PYTHONPATH). Raises RuntimeError naming what is missing."""
    target = into / "previous-release"
    if (target / "daemon" / "pgtick").is_dir():
        return target / "daemon"
    git = shutil.which("git")
    if git is None:
        raise RuntimeError("the migrate fault needs git (package git) to read the previous release")
    done = subprocess.run(
        [git, "-C", str(REPO_DIR), "archive", "--format=tar", PREVIOUS_RELEASE, "daemon"],
        capture_output=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the migrate fault needs commit {PREVIOUS_RELEASE[:12]} (the previous release) in "
            f"this clone's history (a shallow clone? `git fetch --unshallow`): "
            f"{done.stderr.decode(errors='replace').strip()[:200]}"
        )
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target / "daemon"


def enqueue_refused(model: Model) -> list[Finding]:
    """Invariant 4's other half: an application's enqueue is refused only for an error it is
    documented to retry, whatever the faults and the migration did meanwhile."""
    out = []
    for enq in model.enqueues:
        e = enq.end
        if e is None or e.type != FAIL or e.get("outcome") != "error":
            continue
        state, error = e.get("sqlstate"), e.get("error")
        if state in RETRYABLE_SQLSTATES or (state or "").startswith("08"):
            continue
        if state is None and error in RETRYABLE_ERRORS:
            continue
        out.append(
            Finding(
                "enqueue-refused",
                f"client {enq.process}",
                f"enqueue refused: {error} {state or ''} {e.get('message', '')}".strip(),
                (enq.invoke, e),
            )
        )
    return out


def migrated(model: Model) -> list[Finding]:
    """A drawn migrate ends with this version's schema in place."""
    out = []
    for e in model.operations:
        if e.f == "migrate" and e.type == FAIL:
            out.append(Finding("migrated", "schema", "`pgtick migrate` failed under traffic", (e,)))
        if e.f == "upgrade" and e.type == FAIL:
            out.append(Finding("migrated", "daemons", "the rolling restart did not finish", (e,)))
    return out
