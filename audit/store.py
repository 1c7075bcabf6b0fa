"""Log tables (SQLAlchemy 2) and their migration; the only module that speaks SQL.

Why: the log's rows are immutable. Alembic creates them (with this layer's own
version table) and installs triggers that make the database itself refuse
UPDATE and DELETE, so a bug or an operator cannot rewrite history in place.
Appends take a database-level writer lock (``BEGIN IMMEDIATE`` on SQLite,
``pg_advisory_xact_lock`` on PostgreSQL) so indexes stay gap-free even with
several processes writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from fak import db
from fak.audit.errors import AuditError
from fak.errors import InvalidInput

VERSION_TABLE = "fak_audit_alembic_version"
PG_LOCK_KEY = 0x6661_6B61_7564  # "fakaud": the advisory lock serialising writers
WRITE = db.WRITE  # execution option marking a writer transaction (SQLite: BEGIN IMMEDIATE)


class Base(DeclarativeBase):
    pass


class EntryRow(Base):
    __tablename__ = "audit_entries"
    idx: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    type: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    ts: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    body: Mapped[bytes] = mapped_column(sa.LargeBinary, nullable=False)
    __table_args__ = (sa.Index("audit_entries_tenant_idx", "tenant", "idx"),)


class NodeRow(Base):
    __tablename__ = "audit_nodes"
    node: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)


class CheckpointRow(Base):
    __tablename__ = "audit_checkpoints"
    size: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    root: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)
    note: Mapped[str] = mapped_column(sa.Text, nullable=False)


LOG_TABLES = ("audit_entries", "audit_nodes", "audit_checkpoints", "audit_cosignatures")
entries_t = EntryRow.__table__
nodes_t = NodeRow.__table__
checkpoints_t = CheckpointRow.__table__


def make_engine(url: str, *, durable: bool = True) -> Engine:
    """``fak.db.make_engine`` (WAL, ``synchronous=FULL`` when durable, writers ``BEGIN
    IMMEDIATE``), a bad URL raised as an AuditError."""
    try:
        return db.make_engine(url, durable=durable)
    except InvalidInput as exc:
        raise AuditError(str(exc)) from None


def release(engine: Engine) -> None:
    """``fak.db.release``: the engine is shared in the process; the last user disposes it."""
    db.release(engine)


def migrate(engine: Engine) -> None:
    """Apply this layer's Alembic migrations (own version table, audit_* tables)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with writing(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A writer transaction holding the database-level writer lock until commit."""
    with db.writing(engine) as conn:
        lock_writer(conn)
        yield conn


def lock_writer(conn: Connection) -> None:
    """Serialise writers across processes for the rest of this transaction (SQLite: the
    BEGIN IMMEDIATE issued on begin already holds it)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})


# Reads on the proof path are plain driver-level SQL: proofs must cost well under a
# millisecond, and the SQL expression layer alone costs ~0.1 ms per statement here.


def size(conn: Connection) -> int:
    top = conn.exec_driver_sql("SELECT max(idx) FROM audit_entries").scalar()
    return 0 if top is None else int(top) + 1


def get_nodes(conn: Connection, ids: Sequence[int]) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for i in range(0, len(ids), 500):
        part = tuple(ids[i : i + 500])
        rows = conn.exec_driver_sql(f"SELECT node, hash FROM audit_nodes WHERE node IN ({_marks(conn, len(part))})", part)
        out.update((int(n), bytes(h)) for n, h in rows)
    return out


def insert_checkpoint(conn: Connection, size: int, root: bytes, note: str) -> None:
    conn.execute(sa.insert(CheckpointRow), {"size": size, "root": root, "note": note})


def _cp_row(row: Sequence[Any] | None) -> tuple[int, bytes, str] | None:
    return None if row is None else (int(row[0]), bytes(row[1]), row[2])


def latest_checkpoint(conn: Connection) -> tuple[int, bytes, str] | None:
    return _cp_row(conn.exec_driver_sql("SELECT size, root, note FROM audit_checkpoints ORDER BY size DESC LIMIT 1").first())


def checkpoint_at_least(conn: Connection, size: int) -> tuple[int, bytes, str] | None:
    q = f"SELECT size, root, note FROM audit_checkpoints WHERE size >= {_marks(conn, 1)} ORDER BY size LIMIT 1"
    return _cp_row(conn.exec_driver_sql(q, (size,)).first())


def tenant_last(conn: Connection, tenant: str, stop: int) -> tuple[int, bytes] | None:
    """(index, body) of the tenant's latest entry below ``stop`` (one index probe)."""
    m = _marks(conn, 1)
    q = f"SELECT idx, body FROM audit_entries WHERE tenant = {m} AND idx < {m} ORDER BY idx DESC LIMIT 1"
    row = conn.exec_driver_sql(q, (tenant, stop)).first()
    return None if row is None else (int(row[0]), bytes(row[1]))


def tenant_count(conn: Connection, tenant: str, stop: int) -> int:
    """How many entries the tenant has below ``stop`` (a scan: for logs older than tseq)."""
    m = _marks(conn, 1)
    q = f"SELECT count(*) FROM audit_entries WHERE tenant = {m} AND idx < {m}"
    return int(conn.exec_driver_sql(q, (tenant, stop)).scalar() or 0)


def _marks(conn: Connection, n: int) -> str:
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    return ", ".join([mark] * n)


def insert(conn: Connection, entries: list[tuple[int, str, str, int, bytes]], nodes: list[tuple[int, bytes]]) -> None:
    """Insert (idx, tenant, type, ts, body) entries and (node, hash) nodes. The hot path of
    group commit: plain driver-level executemany, skipping per-row SQL expression work."""
    if entries:
        conn.exec_driver_sql(
            f"INSERT INTO audit_entries (idx, tenant, type, ts, body) VALUES ({_marks(conn, 5)})", entries
        )
    if nodes:
        conn.exec_driver_sql(f"INSERT INTO audit_nodes (node, hash) VALUES ({_marks(conn, 2)})", nodes)


def all_checkpoints(conn: Connection) -> Iterable[tuple[int, bytes, str]]:
    rows = conn.execute(sa.select(checkpoints_t.c.size, checkpoints_t.c.root, checkpoints_t.c.note).order_by("size"))
    return [(int(s), bytes(r), n) for s, r, n in rows]


def entry_rows(
    conn: Connection, start: int, stop: int | None, tenant: str | None, batch: int = 2000
) -> Iterable[tuple[int, bytes]]:
    """Yield (index, body) in index order, reading in batches (keyset pagination)."""
    pos = start
    while True:
        q = sa.select(entries_t.c.idx, entries_t.c.body).where(entries_t.c.idx >= pos)
        if stop is not None:
            q = q.where(entries_t.c.idx < stop)
        if tenant is not None:
            q = q.where(entries_t.c.tenant == tenant)
        rows = conn.execute(q.order_by(entries_t.c.idx).limit(batch)).all()
        for idx, body in rows:
            yield int(idx), bytes(body)
        if len(rows) < batch:
            return
        pos = int(rows[-1][0]) + 1


# ---------------------------------------------------------------- witnesses' cosignatures


class CosignatureRow(Base):
    """A witness's cosignature line on the checkpoint of ``size`` (C2SP tlog-cosignature)."""

    __tablename__ = "audit_cosignatures"
    size: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    witness: Mapped[str] = mapped_column(sa.String(256), primary_key=True)  # the witness's vkey
    line: Mapped[str] = mapped_column(sa.Text, nullable=False)


cosignatures_t = CosignatureRow.__table__


def insert_cosignature(conn: Connection, size: int, witness: str, line: str) -> None:
    conn.execute(sa.insert(CosignatureRow), {"size": size, "witness": witness, "line": line})


def cosignature_lines(conn: Connection, size: int) -> list[tuple[str, str]]:
    """(witness vkey, line) cosigning the checkpoint of ``size``, in witness order."""
    q = f"SELECT witness, line FROM audit_cosignatures WHERE size = {_marks(conn, 1)} ORDER BY witness"
    return [(w, ln) for w, ln in conn.exec_driver_sql(q, (size,))]


def all_cosignatures(conn: Connection) -> dict[int, list[str]]:
    rows = conn.execute(sa.select(cosignatures_t.c.size, cosignatures_t.c.line)
                        .order_by(cosignatures_t.c.size, cosignatures_t.c.witness))
    out: dict[int, list[str]] = {}
    for s, ln in rows:
        out.setdefault(int(s), []).append(ln)
    return out


def latest_cosigned_size(conn: Connection, witness: str) -> int | None:
    q = f"SELECT max(size) FROM audit_cosignatures WHERE witness = {_marks(conn, 1)}"
    top = conn.exec_driver_sql(q, (witness,)).scalar()
    return None if top is None else int(top)


# ---------------------------------------------------------------- entries by their body's type


def body_type_match(conn: Connection, types: Sequence[str]) -> sa.ColumnElement[bool]:
    """A WHERE clause true for entries whose body names one of ``types`` as a type
    (``"type":"<t>"``; the caller parses the body and checks its ``type``). It reads the hashed body, never the ``type`` column, which nothing hashes: a
    database writer can change the column without the signer noticing, not the body."""
    return sa.or_(*(body_contains(conn, f'"type":"{t}"') for t in types))


def body_contains(conn: Connection, needle: str) -> sa.ColumnElement[bool]:
    """A WHERE clause true exactly for entries whose hashed body holds ``needle`` (bytes as
    written, case and all: SQLite's ``instr``, PostgreSQL's ``LIKE`` with ``\\ % _`` escaped),
    so a filter costs the rows that match, whatever text a caller puts in it."""
    body = entries_t.c.body
    if conn.dialect.name == "postgresql":  # bytea LIKE bytea, the default escape character being '\'
        escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = body.op("LIKE", is_comparison=True)
        return like(sa.literal(f"%{escaped}%".encode(), sa.LargeBinary))
    return sa.func.instr(sa.cast(body, sa.Text), needle) > 0  # SQLite's blob text is the JSON itself


def tenant_rows_newest(conn: Connection, tenant: str, before: int, limit: int, types: Sequence[str] = (),
                       needles: Sequence[str] = ()) -> list[tuple[int, bytes]]:
    """(index, body) of the tenant's entries before ``before``, newest first, at most ``limit``,
    whose body names one of ``types`` (any when empty) and holds every needle
    (``body_type_match``, ``body_contains``); the caller parses and checks each body. The
    filter runs in the database over the (tenant, idx) index, so a page of a few rare events
    costs a scan in SQL, not a parse of every entry in Python."""
    q = sa.select(entries_t.c.idx, entries_t.c.body).where(entries_t.c.tenant == tenant, entries_t.c.idx < before)
    if types:
        q = q.where(body_type_match(conn, types))
    for needle in needles:
        q = q.where(body_contains(conn, needle))
    return [(int(i), bytes(b)) for i, b in conn.execute(q.order_by(entries_t.c.idx.desc()).limit(limit))]


def entries_of_types(conn: Connection, types: Sequence[str], start: int, stop: int | None = None
                     ) -> list[tuple[int, bytes]]:
    """(index, body) of the entries in [start, stop) whose body names one of ``types`` (see
    ``body_type_match``: a superset; parse each body), in index order. One scan of the range
    in the database (about 1 s per million entries, SQLite or PostgreSQL; the entries of the
    last second, a few ms)."""
    q = sa.select(entries_t.c.idx, entries_t.c.body).where(entries_t.c.idx >= start, body_type_match(conn, types))
    if stop is not None:
        q = q.where(entries_t.c.idx < stop)
    return [(int(i), bytes(b)) for i, b in conn.execute(q.order_by(entries_t.c.idx))]
