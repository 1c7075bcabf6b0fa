"""SQLAlchemy 2 models of the CAS metadata (``Base``: the CAS database; ``KeyBase``: the key
database). Content never lands in either: only digests, sizes, ids, and in the key
database wrapped (encrypted) keys. Times are integer
microseconds since the Unix epoch (UTC), identical on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class LegacyKek(Base):
    """Format-1 KEK versions (derived from the master secret; only a check value stored).
    Read once by the migration on open (``KeyRing.migrate_legacy``), then emptied."""

    __tablename__ = "cas_kek"
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    check_value: Mapped[str] = mapped_column(String(64))
    created_us: Mapped[int] = mapped_column(BigInteger)
    retired_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class LegacyDataKey(Base):
    """Where data keys lived up to issue 25 (``cas_keys``, in the CAS database). Opening a
    store moves every row to the key database (``DataKey``) and empties this table: a key
    kept next to what it opens is in every backup of it. Read only by that move and by the
    format-1 migration that runs before it."""

    __tablename__ = "cas_keys"
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kek_version: Mapped[int] = mapped_column(Integer, index=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary(64))
    created_us: Mapped[int] = mapped_column(BigInteger)
    tenant: Mapped[str | None] = mapped_column(String(128), nullable=True)  # None: format-1 row
    kek_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)


class Blob(Base):
    """A ref of one tenant: live (has a blob file and a key) or forgotten (tombstone)."""

    __tablename__ = "cas_blobs"
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(255))
    taint: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    created_us: Mapped[int] = mapped_column(BigInteger)
    forgotten_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    blob_id: Mapped[str | None] = mapped_column(String(32), nullable=True, unique=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    chunk_size: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_cas_blobs_tenant_state", "tenant", "state"),)


class BlobUse(Base):
    """A KV unit (kernel-recorded) that references a ref: answers ``where_used``."""

    __tablename__ = "cas_uses"
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    unit_kind: Mapped[str] = mapped_column(String(64), primary_key=True)
    unit_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    recorded_us: Mapped[int] = mapped_column(BigInteger)


class KeyBase(DeclarativeBase):
    """The key database: KEKs and digest keys, kept apart from the CAS database so a
    backup of the CAS database (and blobs) holds no key able to open what it wraps."""


class TenantKey(KeyBase):
    """A random per-tenant key, wrapped by the master secret (or a ``KekProvider``) with
    AES-GCM, AAD = kind, key id, tenant and version. ``kind`` is ``kek`` (wraps the
    tenant's data keys; versions rotate) or ``digest`` (keys the tenant's ``blake3k``
    digests; version 0). Deleting the row destroys the key."""

    __tablename__ = "cas_tenant_keys"
    kek_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(8))
    version: Mapped[int] = mapped_column(Integer)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary(64))
    created_us: Mapped[int] = mapped_column(BigInteger)
    retired_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (UniqueConstraint("tenant", "kind", "version", name="uq_cas_tenant_keys_version"),)


class DataKey(KeyBase):
    """One blob's AES-256 data key, wrapped (AES-GCM, AAD = key id, tenant, KEK id) by one
    KEK of its tenant, in the key database: no backup of the CAS database holds it, so a
    forget (which deletes this row) leaves nothing there that opens the blob, nor the
    ledger rows sealed under keys derived from it (``fak.state.seal``). A narrow table of
    its own, so a forget deletes and (on PostgreSQL) vacuums only key rows."""

    __tablename__ = "cas_data_keys"
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    kek_id: Mapped[str] = mapped_column(String(32), index=True)
    kek_version: Mapped[int] = mapped_column(Integer)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary(64))
    created_us: Mapped[int] = mapped_column(BigInteger)
