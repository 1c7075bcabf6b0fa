"""The audited transaction: the one way a kernel session changes (docs/architecture.md,
"The audited transaction").

Every change of a session follows one rule: under the session's lock, with pending
withdrawals settled, validate the audit event, change the in-memory session, append the
event, write the ledger. If anything fails once the change has begun, the in-memory
session is discarded and rebuilt from the durable ledger on next use (bit-exact: the
replay makes the same prefill calls), and the error propagates. Written by hand in each
operation, the rollback is one ``except`` a new operation can forget; here it is the
exit of a ``with`` block::

    with ks.transaction() as tx:          # lock, load, settle pending withdrawals
        seg = tx.session.ledger.get(id)   # reads and validation: a failure changes nothing
        event = Eviction(...)             # the audit event, validated before any change
        s = tx.change()                   # from here, any failure rolls back
        report = s.evict([id])
        tx.audit(event)
        tx.commit(fingerprint=report.fingerprint)

Events are appended before the ledger is written (a decision is logged before it counts); if
the write then fails, the rollback logs ``ChangeRolledBack`` naming them, so the log never shows
a decision the session does not hold.

A block that changed the session and leaves without ``commit`` is a bug: the transaction
rolls back and raises ``TransactionError``. ``commit`` alone (no ``change``) covers a
change the session makes and undoes itself when it fails (a generated turn is kept only
once its iterator is exhausted): then only a failed write rolls back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from fak.audit.events import ChangeRolledBack

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session
    from fak.state.store import ForgetProgress

log = logging.getLogger(__name__)



class TransactionError(RuntimeError):
    """A transaction used out of order (a programming error, never a client's)."""


class Ledgered(Protocol):
    """What a transaction needs of a kernel session (``fak.kernel.session.kernel_session.KernelSession``)."""

    tenant: str
    id: str

    def loaded_session(self) -> Session:
        """The in-memory session (rebuilt from the durable ledger if offloaded)."""
        ...

    def persist(self, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None:
        """Write the ledger (with the forget's progress row, in one database transaction)."""
        ...

    def discard(self) -> None:
        """Drop the in-memory session; the next use rebuilds it from the durable ledger."""
        ...


class Transaction:
    """One audited change of one session; the caller holds the session's lock. Get one from
    ``KernelSession.transaction()`` (takes the lock) or ``held_transaction()`` (lock held)."""

    def __init__(self, ks: Ledgered, audit: Callable[[Any], int]) -> None:
        self._ks = ks
        self._audit = audit
        self._changed = False
        self._committed = False
        self._logged: list[int] = []  # what this change appended to the audit log

    @property
    def session(self) -> Session:
        """The in-memory session as it is now (an exact replay may have replaced it)."""
        return self._ks.loaded_session()

    def change(self) -> Session:
        """Say that the in-memory session is about to change; from here until ``commit``, a
        failure discards it. Returns it."""
        self._open("change")
        self._changed = True
        return self._ks.loaded_session()

    def audit(self, event: Any) -> int:
        """Append ``event`` (validated when it was built) to the audit log; its index."""
        self._open("audit")
        if not self._changed:
            raise TransactionError("an event is appended after the change it records (call change() first)")
        index = self._audit(event)
        self._logged.append(index)
        return index

    def commit(self, *, fingerprint: str | None = None, forget: ForgetProgress | None = None) -> None:
        """Write the ledger; a failure rolls back. ``fingerprint``: the KV's, when just computed
        (hashing the KV again is the costliest part of a write); ``forget``: the forget's
        progress, written in the same database transaction."""
        self._open("commit")
        self._changed = True  # a failed write leaves memory ahead of the ledger
        self._ks.persist(forget, fingerprint)
        self._committed = True

    def _open(self, what: str) -> None:
        if self._committed:
            raise TransactionError(f"{what} after commit")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._changed or self._committed:
            return
        self._ks.discard()  # the durable ledger is the state: the next use rebuilds from it
        if self._logged:
            self._undo_logged()
        if exc is None:
            raise TransactionError("the session was changed and the transaction left without commit: rolled back")

    def _undo_logged(self) -> None:
        """Log that the decisions this change logged did not take effect. Best effort: the
        change's own error propagates either way (a log that cannot append fails loudly on
        its own, and a verifier sees the missing event as an eviction the ledger never held)."""
        try:
            self._audit(ChangeRolledBack(tenant=self._ks.tenant, session_id=self._ks.id, undoes=self._logged))
        except Exception:  # noqa: BLE001 - the original failure is the one to raise
            log.exception("could not log the rollback of audit entries %s", self._logged)
