"""Console logouts: the ``console_logouts`` rows that end a console session on every daemon
(a session is a signed cookie, stored nowhere; its logout is stored here until the cookie
would have expired).
"""

from __future__ import annotations

from pgtick.storage import sqlfile
from pgtick.storage.base import StoreBase


class ConsoleQueries(StoreBase):
    """The console's sessions aggregate: logouts."""

    def console_logout(self, nonce: str, expiry: int) -> None:
        """Record that the session ``nonce`` (its cookie expiring at ``expiry``, epoch
        seconds) was logged out; the logouts long past their expiry go."""
        with self._conn("console_logout") as conn:
            conn.execute(
                sqlfile.query("console_logout", conn.schema), {"nonce": nonce, "expiry": expiry}
            )

    def console_logged_out(self, nonce: str) -> bool:
        """Whether the session ``nonce`` was logged out, on any daemon."""
        return bool(self._all("console_logged_out", "console_logged_out", {"nonce": nonce})[0][0])
