"""Pushing deleted rows (the CAS's keys, the kernel state's clear segments) out of the
database files, and saying when it could not. Shared ground beside ``fak.db``: the CAS and
the kernel state (``fak.state``) both scrub.

Deleting a row is not erasure on either backend:

- SQLite (``secure_delete=ON``) zeroes the deleted row in the database file, but the
  WAL still holds the page as it was before the delete until a checkpoint copies it
  back and the WAL is truncated. ``PRAGMA wal_checkpoint(TRUNCATE)`` cannot finish
  while any reader holds a snapshot that needs those frames: it returns busy=1, and
  the caller must report the scrub as pending instead of claiming it.
- PostgreSQL keeps the deleted tuple (a dead tuple) in the heap until a VACUUM prunes
  it, and a VACUUM cannot prune it while an older snapshot (a long transaction, a
  replication slot) may still see it. VACUUM cannot run in a transaction: it runs on
  an autocommit connection here. Pruning removes the tuple from the page's items;
  the freed bytes inside the page and the WAL segments are not zeroed by PostgreSQL
  (docs/cas.md: they open nothing once the KEK that wrapped them is destroyed).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fak.db import AUTOCOMMIT, BUSY_TIMEOUT_S

ShredStatus = Literal["destroyed", "pending_wal_checkpoint", "pending_vacuum"]
CHECKPOINT_WAIT_MS = 250  # how long a forget waits for readers before reporting "pending"


def pg_xid(conn: Connection) -> int | None:
    """The current transaction's 32-bit xid on PostgreSQL (to compare with horizons)."""
    if conn.dialect.name != "postgresql":
        return None
    return int(conn.execute(sa.text("SELECT mod(txid_current(), 4294967296)")).scalar_one())


def scrub(engine: Engine, table: str, xid: int | None = None) -> ShredStatus:
    """Make rows deleted from ``table`` (in the transaction ``xid`` on PostgreSQL)
    unreadable in the database files; the status says whether that was achieved."""
    if engine.dialect.name == "sqlite":
        return "destroyed" if checkpoint(engine) else "pending_wal_checkpoint"
    if engine.dialect.name == "postgresql":
        return "destroyed" if vacuum(engine, table, xid) else "pending_vacuum"
    return "pending_vacuum"  # pragma: no cover - no other backend is supported


def checkpoint(engine: Engine, wait_ms: int = CHECKPOINT_WAIT_MS) -> bool:
    """``wal_checkpoint(TRUNCATE)`` outside any transaction, waiting at most ``wait_ms``
    for readers; True only when it completed (busy=0) and the WAL is empty."""
    conn = engine.connect().execution_options(**{AUTOCOMMIT: True})
    try:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(wait_ms)}")
        try:
            busy, log, done = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
        except sa.exc.OperationalError:  # the database is locked by a writer
            return False
        return busy == 0 and log in (0, -1) and done in (0, -1)
    finally:
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.exec_driver_sql(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        conn.close()


def vacuum(engine: Engine, table: str, xid: int | None) -> bool:
    """VACUUM ``table`` on an autocommit connection (index cleanup left to autovacuum,
    so a forget costs the changed pages, not the whole index). True when it ran and no
    snapshot older than ``xid`` could have kept the deleted tuple alive."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            conn.exec_driver_sql(f'VACUUM (INDEX_CLEANUP OFF, TRUNCATE OFF) "{table}"')
        except sa.exc.DBAPIError:
            return False
        if xid is None:
            return True
        # a backend (or slot, or prepared transaction) whose xmin is not newer than the
        # delete may still see the tuple: VACUUM had to keep it
        older: int = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "        AND datname = current_database() AND backend_xmin IS NOT NULL AND age(backend_xmin) >= age(CAST(:x AS text)::xid))"
                " + (SELECT count(*) FROM pg_replication_slots WHERE (xmin IS NOT NULL AND age(xmin) >= "
                "        age(CAST(:x AS text)::xid)))"
                " + (SELECT count(*) FROM pg_prepared_xacts WHERE age(transaction) >= age(CAST(:x AS text)::xid))"
            ),
            {"x": str(xid)},
        ).scalar_one()
        return older == 0
