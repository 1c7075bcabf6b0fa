"""The CAS's database: the engine comes from the one factory (``fak.db``: SQLite in
WAL mode with ``secure_delete`` on, so rows removed by forget, i.e. wrapped keys,
are overwritten with zeros in the database file rather than left in free pages),
and a programmatic Alembic upgrade."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fak import db, errors
from fak.cas.errors import CasError, InvalidInput

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(url: str, *, durable: bool = True) -> Engine:
    """``fak.db.make_engine``, a bad URL raised as the CAS's ``InvalidInput``."""
    try:
        return db.make_engine(url, durable=durable)
    except errors.InvalidInput as exc:
        raise InvalidInput(str(exc)) from None


def release(engine: Engine) -> None:
    """``fak.db.release``: the engine is shared in the process; the last user disposes it."""
    db.release(engine)


def upgrade(engine: Engine) -> None:
    """Bring the CAS tables to the newest revision (no-op when already there)."""
    try:
        db.upgrade(engine, MIGRATIONS)
    except sa.exc.OperationalError as exc:
        raise CasError(f"cannot open the CAS database {engine.url!r}: {exc.orig}") from exc
