"""Engine set-up and programmatic Alembic upgrade. SQLite runs in WAL mode with
``secure_delete`` on, so rows removed by forget (wrapped keys) are overwritten
with zeros in the database file rather than left in free pages."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine

from fak.cas.errors import CasError

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(url: str, *, durable: bool = True) -> Engine:
    """``durable=False`` lets SQLite skip the commit fsync (WAL stays consistent; a power
    loss may roll back the last commits, a process crash loses nothing)."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise CasError(f"invalid database URL {url!r}: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(parsed, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            cur.execute("PRAGMA secure_delete=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return sa.create_engine(parsed, pool_pre_ping=True)


def upgrade(engine: Engine) -> None:
    """Bring the CAS tables to the newest revision (no-op when already there)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    except sa.exc.OperationalError as exc:
        raise CasError(f"cannot open the CAS database {engine.url!r}: {exc.orig}") from exc
