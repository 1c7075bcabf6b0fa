"""One database engine factory for every layer that keeps rows (CAS, audit log, ...).

SQLite (the default, one ``fak.db`` shared by the layers):

- WAL journal, so readers never block the writer and the writer never blocks readers;
- ``synchronous=FULL`` when ``durable`` (every commit fsyncs the WAL: an acknowledged
  write survives a power loss), ``NORMAL`` otherwise (a process crash still loses
  nothing; a power loss may roll back the last commits);
- ``secure_delete``: deleted rows (a forgotten ref's wrapped key) are overwritten with
  zeros in the file instead of lingering in free pages;
- ``foreign_keys`` enforced, a 60 s busy timeout;
- fak issues ``BEGIN`` itself (the driver's implicit transactions are off). A
  transaction opened with the execution option ``WRITE`` starts with ``BEGIN
  IMMEDIATE``: it takes SQLite's single write lock up front (waiting up to the busy
  timeout), so a read-then-write transaction can never fail half way because another
  writer committed since its read. Every other transaction is a deferred ``BEGIN``
  (a WAL read snapshot). The execution option ``AUTOCOMMIT`` opts out (for pragmas
  such as ``wal_checkpoint`` that must run outside a transaction); SQLAlchemy's own
  ``isolation_level="AUTOCOMMIT"`` must not be used (returning such a connection to
  the pool turns the driver's implicit transactions back on). Use ``writing(engine)``
  or ``engine.execution_options(**{WRITE: True})`` for writers.

PostgreSQL (or any other URL): the driver's own transactions, ``pool_pre_ping`` so a
restarted server costs one reconnect instead of an error; ``WRITE`` is ignored (a layer
that must serialise writers takes its own lock, e.g. the audit log's advisory lock).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, CursorResult, Engine, Result

from fak.errors import InvalidInput

WRITE = "fak_write"  # execution option: this transaction writes (SQLite: BEGIN IMMEDIATE)
AUTOCOMMIT = "fak_autocommit"  # execution option: no transaction at all (SQLite)
BUSY_TIMEOUT_S = 60


def make_engine(url: str, *, durable: bool = True) -> Engine:
    """The process's engine for ``url`` with fak's settings (see the module docstring),
    shared by every layer that asks for the same database and durability: one engine, one
    pool per database per process. Pair each call with ``release(engine)``. A bad URL or a
    missing driver raises ``InvalidInput``."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise InvalidInput(f"invalid database URL {_safe(url)}: {exc}") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    path = _sqlite_file(parsed.database) if sqlite else None
    with _shared_lock:
        if path is not None:
            _create_private(path)
        key: _Key = (parsed.render_as_string(hide_password=False) if path is None else f"sqlite:{path}?{parsed.query}",
               durable, _identity(path))
        shared = _shared.get(key)
        if shared is None:
            shared = _Shared(_new_engine(url, parsed, durable, sqlite, pooled=path is not None or not sqlite), key)
            _shared[key] = shared
            _by_engine[id(shared.engine)] = shared
        shared.users += 1
        return shared.engine


def release(engine: Engine) -> None:
    """One user of a ``make_engine`` engine is done with it; the last one disposes it (its
    pooled connections closed) and the next ``make_engine`` makes a new one. An engine
    ``make_engine`` did not return is disposed at once. Disposing a shared engine directly
    is harmless too (SQLAlchemy opens a new pool), only wasteful."""
    with _shared_lock:
        shared = _by_engine.get(id(engine))
        if shared is None or shared.engine is not engine:
            engine.dispose()
            return
        shared.users -= 1
        if shared.users > 0:
            return
        del _shared[shared.key], _by_engine[id(engine)]
    engine.dispose()


# (database, durable, file identity): one engine per database per process
_Key = tuple[str, bool, tuple[int, int] | None]


class _Shared:
    def __init__(self, engine: Engine, key: _Key) -> None:
        self.engine, self.key, self.users = engine, key, 0


_shared: dict[_Key, _Shared] = {}  # (database, durable, file identity) -> the process's engine
_by_engine: dict[int, _Shared] = {}
_shared_lock = threading.Lock()
POOL_SIZE, MAX_OVERFLOW = 15, 30  # one pool serves the CAS, the audit log and the state store together


def _new_engine(url: str, parsed: sa.engine.URL, durable: bool, sqlite: bool, pooled: bool) -> Engine:
    pool = {"pool_size": POOL_SIZE, "max_overflow": MAX_OVERFLOW} if pooled else {}  # not for :memory:
    try:
        if not sqlite:
            return sa.create_engine(parsed, pool_pre_ping=True, **pool)
        engine = sa.create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_S}, **pool)
    except (sa.exc.ArgumentError, ImportError) as exc:  # NoSuchModuleError is an ArgumentError
        raise InvalidInput(f"cannot use database URL {_safe(url)}: {exc}") from None
    _sqlite_hooks(engine, durable)
    return engine


def _safe(url: str) -> str:
    """The URL for a message, password hidden and length cut."""
    try:
        shown = sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        shown = url
    return repr(shown if len(shown) <= 120 else shown[:117] + "...")


def _sqlite_file(database: str | None) -> Path | None:
    """The absolute path of a SQLite database file (None: in memory or a ``file:`` URI)."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(os.path.abspath(Path(database).expanduser()))


def _identity(path: Path | None) -> tuple[int, int] | None:
    """The file's device and inode (a file replaced under the same name gets a new engine)."""
    if path is None:
        return None
    st = path.stat()
    return st.st_dev, st.st_ino


def _create_private(path: Path) -> None:
    """Create the database's folder (0700) and, if it is new, the database itself (0600)
    through SQLite, under a umask that grants nobody else anything, so it never exists with
    the process umask's wider mode; SQLite gives its -wal and -shm files the database
    file's mode. The file is never opened except through SQLite: closing a descriptor
    opened any other way drops every POSIX lock this process holds on the file, and
    another process's SQLite then believes it is the last user and deletes the WAL that
    this process still writes into (issue 25.1)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists():
        return
    old = os.umask(0o077)  # process-wide, but only ever narrowed, for the one call below
    try:
        sqlite3.connect(path).close()  # creates the empty file (a valid empty database)
    except sqlite3.Error as exc:
        raise InvalidInput(f"cannot create the SQLite database {str(path)!r}: {exc}") from None
    finally:
        os.umask(old)


def _sqlite_hooks(engine: Engine, durable: bool) -> None:
    sync = "FULL" if durable else "NORMAL"

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        dbapi_conn.isolation_level = None  # no implicit transactions: BEGIN comes from _begin
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={sync}")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA secure_delete=ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(AUTOCOMMIT):
            return  # each statement commits on its own
        # writers take the write lock up front; readers stay deferred (a WAL snapshot)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITE) else "BEGIN")


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched. ``Session.execute`` is typed to return a ``Result``;
    for those statements it is a ``CursorResult``, the result that counts them."""
    return cast("CursorResult[Any]", result).rowcount


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A writer transaction (SQLite: holding the write lock from its first statement),
    committed when the block ends without an exception."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{WRITE: True})
        with conn.begin():
            yield conn


def upgrade(engine: Engine, script_location: Path, attributes: Mapping[str, object] | None = None) -> None:
    """Bring one layer's tables to its newest Alembic revision (no-op when there), in one
    writer transaction so two processes opening a new database do not race. Each layer
    keeps its own script folder and version table, so the layers share one database.
    ``attributes``: what a layer's migrations need that is not in the database (a key)."""
    from alembic import command  # slow to import: only when a database is migrated
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.attributes.update(attributes or {})
    with writing(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def run_env(metadata: sa.MetaData, version_table: str) -> None:
    """The body of a layer's Alembic ``env.py``: migrate on the connection ``upgrade`` hands over."""
    from alembic import context  # only inside an Alembic run

    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=version_table,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


__all__ = ["AUTOCOMMIT", "BUSY_TIMEOUT_S", "WRITE", "make_engine", "release", "rowcount", "run_env", "upgrade",
           "writing"]


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock named by ``name``, held on a connection of its
    own until ``release`` (or until the holder dies: the server ends the connection and drops
    the lock, SIGKILL included). It is how replicas of one deployment tell a running peer from
    one that is down (docs/scale-out.md), across machines, with no clock involved."""

    def __init__(self, engine: Engine, name: str) -> None:
        if engine.dialect.name != "postgresql":
            raise InvalidInput("advisory locks need PostgreSQL")
        self._engine, self.name = engine, name
        self._key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
        self._conn: Connection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; whether it is now held here."""
        if self._conn is not None:
            return True
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = bool(conn.exec_driver_sql("SELECT pg_try_advisory_lock(%(k)s)", {"k": self._key}).scalar())
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def acquire(self, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Wait up to ``timeout_s`` for the lock; whether it is held."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%(k)s)", {"k": self._key})
        finally:
            conn.close()
