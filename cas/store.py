"""The content-addressed store: refs in SQL, sealed blobs in a backend, one data
key per blob, forget by destroying that key and the ciphertext.

Every tenant sees only its own refs: rows are keyed by (tenant, digest), so the
same public bytes put by two tenants are two blobs under two data keys, and
forgetting one never touches the other. A tenant asking for a digest it does
not hold gets ``NotFound`` whether or not another tenant holds it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from fak import config
from fak.cas import crypto, db
from fak.cas.backend import BlobBackend, FileBackend, new_blob_id
from fak.cas.digest import Hasher, compute, is_keyed, parse_digest
from fak.cas.errors import CasError, Forgotten, IntegrityError, KeyMismatch, NotFound, TooLarge
from fak.cas.keyring import KekProvider, KeyRing
from fak.cas.models import (
    Ref,
    ShredRecord,
    Use,
    check_media_type,
    check_taint,
    check_tenant,
    check_unit,
    stricter,
)
from fak.cas.schema import Blob, BlobUse, DataKey, Kek
from fak.db import AUTOCOMMIT, WRITE
from fak.keys import load_master_secret

DEFAULT_MAX_BLOB = 256 * 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _now_us() -> int:
    return time.time_ns() // 1000


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


class FsckReport(BaseModel):
    """Consistency of rows against blob files (see ``CasStore.fsck``)."""

    live_refs: int
    missing: list[str]  # "tenant digest" of live refs whose blob file is absent
    wrong_size: list[str]  # live refs whose blob file has the wrong length
    orphans: list[str]  # blob ids with no row (e.g. a writer killed before its commit)
    orphans_removed: int
    temp_removed: int


class CasStore:
    """Open with ``CasStore.open()``; thread-safe for independent calls (one engine)."""

    def __init__(
        self,
        engine: Engine,
        backend: BlobBackend,
        keyring: KeyRing,
        *,
        encrypt: bool = True,
        max_blob_size: int = DEFAULT_MAX_BLOB,
        chunk_size: int = crypto.DEFAULT_CHUNK,
    ) -> None:
        if max_blob_size < 0 or chunk_size <= 0:
            raise CasError("max_blob_size must be >= 0 and chunk_size > 0")
        self.engine = engine
        self.backend = backend
        self.keys = keyring
        self.encrypt = encrypt
        self.max_blob_size = max_blob_size
        self.chunk_size = chunk_size
        # readers: a deferred transaction (a WAL snapshot on SQLite); writers: the write
        # lock from the first statement (BEGIN IMMEDIATE), so a read-then-write never fails
        # half way because another writer committed in between (fak.db)
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)
        self._dialect = engine.dialect.name

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        data_dir: Path | str | None = None,
        url: str | None = None,
        *,
        master_secret: bytes | None = None,
        kek_provider: KekProvider | None = None,
        backend: BlobBackend | None = None,
        encrypt: bool = True,
        max_blob_size: int = DEFAULT_MAX_BLOB,
        chunk_size: int = crypto.DEFAULT_CHUNK,
        fsync: bool = True,
    ) -> CasStore:
        """Open (creating and migrating as needed) the store. Defaults: the fak data
        directory, its database URL and its master secret."""
        root = Path(data_dir) if data_dir is not None else config.data_dir()
        root.mkdir(parents=True, exist_ok=True)
        engine = db.make_engine(url or config.database_url(root), durable=fsync)
        db.upgrade(engine)
        master = master_secret if master_secret is not None else load_master_secret(root)
        store = cls(
            engine,
            backend or FileBackend(root / "blobs", fsync=fsync),
            KeyRing(master, kek_provider),
            encrypt=encrypt,
            max_blob_size=max_blob_size,
            chunk_size=chunk_size,
        )
        store._ensure_kek()
        return store

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> CasStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_kek(self) -> None:
        with self._writer() as s:
            active = s.scalars(sa.select(Kek).where(Kek.retired_us.is_(None)).order_by(Kek.version.desc())).first()
            if active is None:
                s.add(Kek(version=1, check_value=self.keys.check_value(1), created_us=_now_us()))
                try:
                    s.commit()
                except sa.exc.IntegrityError:  # another process created it first
                    s.rollback()
                return
            if active.check_value != self.keys.check_value(active.version):
                raise KeyMismatch(
                    f"the master secret does not match this store (KEK v{active.version} check failed); "
                    "set FAK_MASTER_SECRET or the data directory the store was created with"
                )

    def _active_kek(self, s: Session) -> int:
        version = s.scalar(sa.select(sa.func.max(Kek.version)).where(Kek.retired_us.is_(None)))
        if version is None:
            raise CasError("the CAS has no active key-encryption key")
        return version

    # ------------------------------------------------------------------ helpers

    def _digest_key(self, tenant: str, keyed: bool) -> bytes | None:
        return self.keys.digest_key(tenant) if keyed else None

    def empty_digest(self, tenant: str, *, keyed: bool = True) -> str:
        """The digest of the empty blob for this tenant (it always exists)."""
        return compute(b"", self._digest_key(check_tenant(tenant), keyed))

    def _is_empty(self, digest: str, tenant: str) -> bool:
        return digest == self.empty_digest(tenant, keyed=is_keyed(digest))

    def _empty_ref(self, digest: str, tenant: str, media_type: str = "application/octet-stream") -> Ref:
        return Ref(digest=digest, size=0, media_type=media_type, tenant=tenant, taint="trusted", created_at=_EPOCH)

    @staticmethod
    def _ref(row: Blob) -> Ref:
        return Ref(
            digest=row.digest,
            size=row.size,
            media_type=row.media_type,
            tenant=row.tenant,
            taint=row.taint,  # type: ignore[arg-type]
            created_at=_dt(row.created_us),
            state=row.state,  # type: ignore[arg-type]
            pinned=row.pinned,
        )

    def _resolve(self, ref_or_digest: Ref | str, tenant: str) -> tuple[str, int | None]:
        check_tenant(tenant)
        if isinstance(ref_or_digest, Ref):
            if ref_or_digest.tenant != tenant:  # same answer as an unknown digest: no oracle
                raise NotFound(f"no ref {ref_or_digest.digest} for tenant {tenant!r}")
            return ref_or_digest.digest, ref_or_digest.size
        return parse_digest(ref_or_digest), None

    def _row(self, s: Session, digest: str, tenant: str, *, lock: bool = False) -> Blob | None:
        q = sa.select(Blob).where(Blob.tenant == tenant, Blob.digest == digest)
        if lock:
            q = q.with_for_update()
        return s.scalars(q).first()

    def _live_row(self, s: Session, digest: str, tenant: str, *, lock: bool = False) -> Blob:
        row = self._row(s, digest, tenant, lock=lock)
        if row is None:
            raise NotFound(f"no ref {digest} for tenant {tenant!r}")
        if row.state != "live":
            raise Forgotten(f"ref {digest} was forgotten: its key and ciphertext were destroyed")
        return row

    # ------------------------------------------------------------------ put

    def digest_of(self, data: bytes | bytearray | memoryview, tenant: str, *, keyed: bool = True) -> str:
        """The ref ``put`` would give these bytes, without storing them."""
        check_tenant(tenant)
        return compute(data, self._digest_key(tenant, keyed))

    def put(
        self,
        data: bytes | bytearray | memoryview,
        media_type: str,
        tenant: str,
        *,
        keyed: bool = True,
        taint: str = "untrusted",
    ) -> Ref:
        """Store ``data`` and return its ref. Idempotent: the same bytes for the same
        tenant give the same ref and no second blob (taint only ever gets stricter)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CasError(f"put takes bytes, got {type(data).__name__}; use put_stream for files")
        check_tenant(tenant)
        check_media_type(media_type)
        check_taint(taint)
        if len(data) > self.max_blob_size:
            raise TooLarge(f"blob of {len(data)} bytes exceeds the maximum of {self.max_blob_size} bytes")
        digest = compute(data, self._digest_key(tenant, keyed))
        if len(data) == 0:
            return self._empty_ref(digest, tenant, media_type)
        with self._session() as s:
            row = self._row(s, digest, tenant)
        if row is not None and row.state == "live":
            if stricter(row.taint, taint) == row.taint:
                return self._ref(row)
            merged = self._merge_existing(digest, tenant, taint)
            if merged is not None:
                return merged
        written = self._write(data, digest, self._digest_key(tenant, keyed))
        return self._commit(written, media_type, tenant, taint, tombstone=row is not None)

    def put_stream(
        self,
        source: crypto.Source,
        media_type: str,
        tenant: str,
        *,
        keyed: bool = True,
        taint: str = "untrusted",
    ) -> Ref:
        """Store a stream (a binary file or an iterable of bytes) in chunks, never
        holding more than two chunks in memory."""
        check_tenant(tenant)
        check_media_type(media_type)
        check_taint(taint)
        written = self._write(source, None, self._digest_key(tenant, keyed))
        if written.size == 0:
            return self._empty_ref(written.digest, tenant, media_type)
        return self._commit(written, media_type, tenant, taint)

    def _merge_existing(self, digest: str, tenant: str, taint: str) -> Ref | None:
        """Tighten a live ref's taint to at least ``taint`` (never loosen it) and return
        the ref; None if the tenant holds no live ref for the digest (forgotten meanwhile)."""
        with self._writer() as s:
            row = self._row(s, digest, tenant, lock=True)
            if row is None or row.state != "live":
                return None
            new = stricter(row.taint, taint)
            if new != row.taint:
                s.execute(sa.update(Blob).where(Blob.tenant == tenant, Blob.digest == digest).values(taint=new))
                s.commit()
                row.taint = new
            return self._ref(row)

    def _write(self, source: crypto.Source, digest: str | None, key: bytes | None) -> _Written:
        """Seal ``source`` into a new blob file. When ``digest`` is None it is computed
        on the way; the commit tag (written last) binds the ciphertext to it."""
        blob_id = new_blob_id()
        dek = crypto.new_data_key() if self.encrypt else None
        sealer = crypto.Sealer(dek, bytes.fromhex(blob_id)) if dek else None
        hasher = Hasher(key) if digest is None else None
        writer = self.backend.new_writer(blob_id)
        size = chunks = 0
        try:
            writer.write(crypto.header(crypto.MODE_SEALED if sealer else crypto.MODE_PLAIN, self.chunk_size))
            for index, (piece, final) in enumerate(crypto.chunked(source, self.chunk_size)):
                size += len(piece)
                if size > self.max_blob_size:
                    raise TooLarge(f"blob exceeds the maximum of {self.max_blob_size} bytes")
                if hasher is not None:
                    hasher.update(piece)
                writer.write(sealer.seal(index, piece, final) if sealer else bytes(piece))
                chunks = index + 1
            digest = digest if hasher is None else hasher.digest()
            if sealer is not None:
                writer.write(sealer.commit(digest, size, chunks))
            if size == 0:
                writer.abort()
            else:
                writer.commit()
        except BaseException:
            writer.abort()
            raise
        return _Written(blob_id, dek, digest, size)

    def _commit(self, w: _Written, media_type: str, tenant: str, taint: str, *, tombstone: bool = True) -> Ref:
        """Record a written blob. If the tenant already holds the digest (a concurrent
        put won), drop ours and return theirs; a forgotten ref is revived with the new blob."""
        now = _now_us()
        try:
            with self._writer() as s:
                key_id = None
                if w.dek is not None:
                    kek_version = self._active_kek(s)
                    key_id = new_blob_id()
                    s.add(
                        DataKey(
                            key_id=key_id,
                            kek_version=kek_version,
                            wrapped=crypto.wrap_key(self.keys.kek(kek_version), w.dek),
                            created_us=now,
                        )
                    )
                values = dict(
                    size=w.size,
                    media_type=media_type,
                    taint=taint,
                    state="live",
                    pinned=False,
                    created_us=now,
                    forgotten_us=None,
                    blob_id=w.blob_id,
                    key_id=key_id,
                    chunk_size=self.chunk_size,
                )
                revived = tombstone and s.execute(  # a forgotten ref comes back with a fresh key
                    sa.update(Blob)
                    .where(Blob.tenant == tenant, Blob.digest == w.digest, Blob.state == "forgotten")
                    .values(**values)
                ).rowcount
                if not revived:
                    s.add(Blob(tenant=tenant, digest=w.digest, **values))
                s.commit()
                return self._ref(Blob(tenant=tenant, digest=w.digest, **values))
        except sa.exc.IntegrityError:
            self.backend.delete(w.blob_id)
            merged = self._merge_existing(w.digest, tenant, taint)
            if merged is None:  # pragma: no cover - needs a put/forget race
                raise CasError(f"concurrent update of {w.digest}; retry the put") from None
            return merged
        except BaseException:
            self.backend.delete(w.blob_id)
            raise

    # ------------------------------------------------------------------ read

    def head(self, digest: str, tenant: str) -> Ref | None:
        """The ref (``state`` says live or forgotten), or None if this tenant never held it."""
        digest, _ = self._resolve(digest, tenant)
        if self._is_empty(digest, tenant):
            return self._empty_ref(digest, tenant)
        with self._session() as s:
            row = self._row(s, digest, tenant)
            return self._ref(row) if row is not None else None

    def missing(self, digests: Iterable[str], tenant: str) -> list[str]:
        """The digests this tenant cannot read (unknown or forgotten), in input order."""
        check_tenant(tenant)
        wanted = [parse_digest(d) for d in digests]
        todo = sorted({d for d in wanted if not self._is_empty(d, tenant)})
        present: set[str] = set()
        with self._session() as s:
            for i in range(0, len(todo), 500):
                batch = todo[i : i + 500]
                present.update(
                    s.scalars(
                        sa.select(Blob.digest).where(
                            Blob.tenant == tenant, Blob.state == "live", Blob.digest.in_(batch)
                        )
                    )
                )
        return [d for d in wanted if d in todo and d not in present]

    def get(self, ref_or_digest: Ref | str, tenant: str) -> bytes:
        """The verified bytes: hash, size and every authentication tag are checked
        before anything is returned."""
        return b"".join(self.get_stream(ref_or_digest, tenant))

    def get_stream(self, ref_or_digest: Ref | str, tenant: str) -> Iterator[bytes]:
        """Chunks of the blob, each authenticated (AES-GCM) before it is yielded; the
        digest and size are checked at the end (``IntegrityError`` raised from the last
        ``next``). Lookup errors (NotFound, Forgotten) are raised at call time."""
        digest, size = self._resolve(ref_or_digest, tenant)
        if self._is_empty(digest, tenant):
            if size not in (None, 0):
                raise IntegrityError(f"ref {digest} has size {size}, but it is the empty blob")
            return iter([b""])
        with self._session() as s:
            row = self._live_row(s, digest, tenant)
            if size is not None and size != row.size:
                raise IntegrityError(f"ref {digest} claims {size} bytes but the store holds {row.size}")
            dek = None
            if row.key_id is not None:
                key = s.get(DataKey, row.key_id)
                if key is None:
                    raise IntegrityError(f"the data key of {digest} is missing")
                dek = crypto.unwrap_key(self.keys.kek(key.kek_version), key.wrapped)
        hasher = Hasher(self._digest_key(tenant, is_keyed(digest)))
        return self._read(row, dek, hasher)

    def _read(self, row: Blob, dek: bytes | None, hasher: Hasher) -> Iterator[bytes]:
        assert row.blob_id is not None
        chunk = row.chunk_size
        expected = crypto.sealed_length(row.size, chunk) if dek else crypto.HEADER.size + row.size
        actual = self.backend.size(row.blob_id)
        if actual is not None and actual != expected:
            raise IntegrityError(f"stored blob of {row.digest} has {actual} bytes, expected {expected}")
        with self.backend.open(row.blob_id) as fh:
            mode, stored_chunk = crypto.parse_header(fh.read(crypto.HEADER.size))
            if mode != (crypto.MODE_SEALED if dek else crypto.MODE_PLAIN) or stored_chunk != chunk:
                raise IntegrityError(f"stored blob of {row.digest} has an unexpected header")
            n = crypto.chunk_count(row.size, chunk)
            sealer = crypto.Sealer(dek, bytes.fromhex(row.blob_id)) if dek else None
            remaining = row.size
            for index in range(n):
                want = min(chunk, remaining)
                remaining -= want
                raw = fh.read(want + (crypto.TAG if sealer else 0))
                piece = sealer.open(index, raw, index == n - 1) if sealer else raw
                if len(piece) != want:
                    raise IntegrityError(f"stored blob of {row.digest} is truncated")
                hasher.update(piece)
                if index == n - 1:  # verify everything before the last piece leaves
                    if sealer is not None:
                        sealer.verify_commit(fh.read(crypto.TAG), row.digest, row.size, n)
                    if hasher.digest() != row.digest:
                        raise IntegrityError(f"stored blob does not match its digest {row.digest}")
                    if fh.read(1):
                        raise IntegrityError(f"stored blob of {row.digest} has trailing bytes")
                yield piece

    def list_refs(self, tenant: str, *, include_forgotten: bool = False) -> list[Ref]:
        check_tenant(tenant)
        q = sa.select(Blob).where(Blob.tenant == tenant).order_by(Blob.created_us, Blob.digest)
        if not include_forgotten:
            q = q.where(Blob.state == "live")
        with self._session() as s:
            return [self._ref(r) for r in s.scalars(q)]

    def tenants(self) -> list[str]:
        with self._session() as s:
            return list(s.scalars(sa.select(Blob.tenant).distinct().order_by(Blob.tenant)))

    # ------------------------------------------------------------------ marks

    def _set(self, digest: str, tenant: str, **values: object) -> Ref:
        digest, _ = self._resolve(digest, tenant)
        if self._is_empty(digest, tenant):
            return self._empty_ref(digest, tenant)
        with self._writer() as s:
            row = self._live_row(s, digest, tenant, lock=True)
            s.execute(sa.update(Blob).where(Blob.tenant == tenant, Blob.digest == digest).values(**values))
            s.commit()
            for k, v in values.items():
                setattr(row, k, v)
            return self._ref(row)

    def pin(self, digest: str, tenant: str) -> Ref:
        """Mark a ref to be kept by any future retention sweep (forget still erases it)."""
        return self._set(digest, tenant, pinned=True)

    def unpin(self, digest: str, tenant: str) -> Ref:
        return self._set(digest, tenant, pinned=False)

    def set_taint(self, digest: str, tenant: str, taint: str) -> Ref:
        """Set a ref's taint explicitly (e.g. the gate quarantined it)."""
        return self._set(digest, tenant, taint=check_taint(taint))

    # ------------------------------------------------------------------ uses

    def record_use(self, digest: str, tenant: str, unit_kind: str, unit_id: str) -> Use:
        """Record that a KV unit references this ref (idempotent)."""
        digest, _ = self._resolve(digest, tenant)
        check_unit(unit_kind, unit_id)
        now = _now_us()
        with self._writer() as s:
            if not self._is_empty(digest, tenant):
                self._live_row(s, digest, tenant, lock=True)
            existing = s.get(BlobUse, (tenant, digest, unit_kind, unit_id))
            if existing is not None:
                return Use(unit_kind=unit_kind, unit_id=unit_id, recorded_at=_dt(existing.recorded_us))
            s.add(BlobUse(tenant=tenant, digest=digest, unit_kind=unit_kind, unit_id=unit_id, recorded_us=now))
            try:
                s.commit()
            except sa.exc.IntegrityError:  # recorded concurrently: same outcome
                s.rollback()
        return Use(unit_kind=unit_kind, unit_id=unit_id, recorded_at=_dt(now))

    def release_use(self, digest: str, tenant: str, unit_kind: str, unit_id: str) -> bool:
        """Forget that a KV unit references this ref; True if it did."""
        digest, _ = self._resolve(digest, tenant)
        check_unit(unit_kind, unit_id)
        with self._writer() as s:
            n = s.execute(
                sa.delete(BlobUse).where(
                    BlobUse.tenant == tenant,
                    BlobUse.digest == digest,
                    BlobUse.unit_kind == unit_kind,
                    BlobUse.unit_id == unit_id,
                )
            ).rowcount
            s.commit()
        return bool(n)

    def key_info(self, digest: str, tenant: str) -> tuple[str | None, int | None]:
        """The id of the data key that encrypts a live ref and the KEK version wrapping it
        ((None, None) for an unknown, forgotten or unencrypted ref): recorded before a
        forget so a receipt can name what was destroyed even if the forget is resumed."""
        digest, _ = self._resolve(digest, tenant)
        with self._session() as s:
            row = self._row(s, digest, tenant)
            if row is None or row.key_id is None:
                return None, None
            key = s.get(DataKey, row.key_id)
            return row.key_id, key.kek_version if key is not None else None

    def where_used(self, digest: str, tenant: str) -> list[Use]:
        """The KV units that reference this ref (empty once it is forgotten)."""
        digest, _ = self._resolve(digest, tenant)
        with self._session() as s:
            if not self._is_empty(digest, tenant) and self._row(s, digest, tenant) is None:
                raise NotFound(f"no ref {digest} for tenant {tenant!r}")
            return self._uses(s, digest, tenant)

    @staticmethod
    def _uses(s: Session, digest: str, tenant: str) -> list[Use]:
        q = (
            sa.select(BlobUse)
            .where(BlobUse.tenant == tenant, BlobUse.digest == digest)
            .order_by(BlobUse.unit_kind, BlobUse.unit_id)
        )
        return [Use(unit_kind=u.unit_kind, unit_id=u.unit_id, recorded_at=_dt(u.recorded_us)) for u in s.scalars(q)]

    # ------------------------------------------------------------------ forget

    def forget(self, digest: str, tenant: str) -> ShredRecord:
        """Erase a ref: delete its wrapped data key (the crypto-shred) and its uses in
        one transaction, leave a tombstone, then delete the ciphertext. On SQLite the
        deleted key bytes are zeroed in the file (secure_delete) and the WAL is
        truncated. Forgetting a forgotten ref returns a record with nothing destroyed."""
        digest, _ = self._resolve(digest, tenant)
        now = _now_us()
        if self._is_empty(digest, tenant):
            return ShredRecord(
                digest=digest, tenant=tenant, size=0, forgotten_at=_dt(now), key_id=None, kek_version=None,
                blob_id=None, ciphertext_deleted=False, crypto_shredded=False,
            )  # fmt: skip
        with self._writer() as s:
            row = self._row(s, digest, tenant, lock=True)
            if row is None:
                raise NotFound(f"no ref {digest} for tenant {tenant!r}")
            if row.state == "forgotten":
                return ShredRecord(
                    digest=digest, tenant=tenant, size=row.size, forgotten_at=_dt(row.forgotten_us or now),
                    key_id=None, kek_version=None, blob_id=None, ciphertext_deleted=False,
                    crypto_shredded=False, already_forgotten=True,
                )  # fmt: skip
            uses = self._uses(s, digest, tenant)
            key = s.get(DataKey, row.key_id) if row.key_id else None
            kek_version = key.kek_version if key else None
            blob_id, key_id, size, was_pinned = row.blob_id, row.key_id, row.size, row.pinned
            if key is not None:
                s.delete(key)
            s.execute(sa.delete(BlobUse).where(BlobUse.tenant == tenant, BlobUse.digest == digest))
            s.execute(
                sa.update(Blob)
                .where(Blob.tenant == tenant, Blob.digest == digest)
                .values(state="forgotten", forgotten_us=now, blob_id=None, key_id=None, pinned=False)
            )
            s.commit()
        deleted = self.backend.delete(blob_id) if blob_id else False
        self._scrub()
        return ShredRecord(
            digest=digest,
            tenant=tenant,
            size=size,
            forgotten_at=_dt(now),
            key_id=key_id,
            kek_version=kek_version,
            blob_id=blob_id,
            ciphertext_deleted=deleted,
            crypto_shredded=key is not None,
            uses_released=uses,
            was_pinned=was_pinned,
        )

    def _scrub(self) -> None:
        """Push deleted-key pages out of the SQLite WAL (best effort: a busy reader
        can delay it; the next forget or checkpoint completes it)."""
        if self._dialect == "sqlite":  # outside any transaction, or it cannot reset the WAL
            scrub = self.engine.execution_options(**{AUTOCOMMIT: True})
            with scrub.connect() as conn, contextlib.suppress(sa.exc.OperationalError):
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    # ------------------------------------------------------------------ keys

    def rotate_kek(self) -> tuple[int, int]:
        """Make a new KEK version active and re-wrap every live data key under it, in
        one transaction. Returns (new version, keys re-wrapped)."""
        with self._writer() as s:
            old = self._active_kek(s)
            new = old + 1
            now = _now_us()
            s.add(Kek(version=new, check_value=self.keys.check_value(new), created_us=now))
            s.flush()
            count = 0
            for key in s.scalars(sa.select(DataKey).where(DataKey.kek_version != new).with_for_update()):
                dek = crypto.unwrap_key(self.keys.kek(key.kek_version), key.wrapped)
                key.wrapped = crypto.wrap_key(self.keys.kek(new), dek)
                key.kek_version = new
                count += 1
            s.execute(sa.update(Kek).where(Kek.version != new, Kek.retired_us.is_(None)).values(retired_us=now))
            try:
                s.commit()
            except sa.exc.IntegrityError as exc:
                raise CasError("another KEK rotation ran at the same time; retry") from exc
        self._scrub()
        return new, count

    def kek_versions(self) -> list[tuple[int, bool, int]]:
        """(version, active, keys wrapped under it) for every KEK version."""
        with self._session() as s:
            counts = dict(
                s.execute(sa.select(DataKey.kek_version, sa.func.count()).group_by(DataKey.kek_version)).all()
            )
            return [
                (k.version, k.retired_us is None, counts.get(k.version, 0))
                for k in s.scalars(sa.select(Kek).order_by(Kek.version))
            ]

    # ------------------------------------------------------------------ maintenance

    def fsck(self, *, remove_orphans: bool = False, older_than: float = 3600.0) -> FsckReport:
        """Check that every live ref has a blob file of the right length; list blob
        files with no row (left by writers killed before their commit: ciphertext
        whose key was never stored). Optionally remove orphans and temp files older
        than ``older_than`` seconds."""
        with self._session() as s:
            rows = list(s.execute(sa.select(Blob.tenant, Blob.digest, Blob.blob_id, Blob.size, Blob.key_id,
                                            Blob.chunk_size).where(Blob.state == "live")))  # fmt: skip
            known = set(s.scalars(sa.select(Blob.blob_id).where(Blob.blob_id.is_not(None))))
        missing, wrong = [], []
        for tenant, digest, blob_id, size, key_id, chunk in rows:
            expected = crypto.sealed_length(size, chunk) if key_id else crypto.HEADER.size + size
            actual = self.backend.size(blob_id)
            if actual is None:
                missing.append(f"{tenant} {digest}")
            elif actual != expected:
                wrong.append(f"{tenant} {digest}")
        orphans = [b for b in self.backend.ids() if b not in known]
        removed = temp = 0
        if remove_orphans:
            cutoff = time.time() - older_than
            for blob_id in orphans:
                path = getattr(self.backend, "path", None)
                if path is not None and path(blob_id).stat().st_mtime >= cutoff:
                    continue
                removed += self.backend.delete(blob_id)
            temp = self.backend.sweep_temp(older_than)
        return FsckReport(
            live_refs=len(rows), missing=missing, wrong_size=wrong, orphans=orphans,
            orphans_removed=removed, temp_removed=temp,
        )  # fmt: skip


class _Written:
    __slots__ = ("blob_id", "dek", "digest", "size")

    def __init__(self, blob_id: str, dek: bytes | None, digest: str, size: int) -> None:
        self.blob_id, self.dek, self.digest, self.size = blob_id, dek, digest, size


