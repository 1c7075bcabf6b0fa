"""The content-addressed store: refs in SQL, sealed blobs in a backend, one data
key per blob, forget by destroying that key and the ciphertext.

Every tenant sees only its own refs: rows are keyed by (tenant, digest), so the
same public bytes put by two tenants are two blobs under two data keys, and
forgetting one never touches the other. A tenant asking for a digest it does
not hold gets ``NotFound`` whether or not another tenant holds it.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

import blake3
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from fak.cas import crypto, db
from fak.cas.backend import BlobBackend, FileBackend, new_blob_id
from fak.cas.digest import Hasher, compute, is_keyed, parse_digest
from fak.cas.errors import (
    CasError,
    Forgotten,
    IntegrityError,
    KeyDestroyed,
    KeyMismatch,
    NotFound,
    StorageFull,
    TooLarge,
)
from fak.cas.keyring import KekProvider, KeyRing, MasterWrapper, data_key_aad
from fak.cas.models import (
    TOMBSTONE_MEDIA_TYPE,
    DestroyResult,
    KekInfo,
    Ref,
    RotationResult,
    ShredRecord,
    ShredStatus,
    TenantErasure,
    Use,
    check_media_type,
    check_taint,
    check_tenant,
    check_unit,
    size_bucket,
    stricter,
)
from fak.cas.schema import Blob, BlobUse, DataKey, LegacyDataKey, LegacyKek
from fak.db import WRITE, rowcount
from fak.faults import fault_point
from fak.keys import derive_key, load_master_secret
from fak.scrub import pg_xid, scrub
from fak.settings import StorageSettings

REWRAP_BATCH = 1000

DEFAULT_MAX_BLOB = 256 * 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _now_us() -> int:
    return time.time_ns() // 1000


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or tighten it to 0700: blobs and keys are nobody else's."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def _sqlite_path(url: str) -> Path | None:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    if parsed.database.startswith("file:"):
        return None
    return Path(parsed.database).expanduser()


def _private_sqlite_file(url: str) -> None:
    """A SQLite database file (and its -wal, -shm) is mode 0600: ``fak.db.make_engine``
    creates a new one 0600 (through SQLite, never ``os.open``: see ``fak.db``), and SQLite
    gives the WAL and shared-memory files the database file's mode; an existing wider one
    is narrowed here (``chmod`` opens nothing)."""
    path = _sqlite_path(url)
    if path is None:
        return
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except FileNotFoundError:
            pass


def _shown_url(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)


class FsckReport(BaseModel):
    """Consistency of rows against blob files (see ``CasStore.fsck``)."""

    live_refs: int
    missing: list[str]  # "tenant digest" of live refs whose blob file is absent
    wrong_size: list[str]  # live refs whose blob file has the wrong length
    orphans: list[str]  # blob ids with no row (e.g. a writer killed before its commit)
    orphans_removed: int
    temp_removed: int
    orphan_keys: list[str] = []  # data keys (key database) no row names: a put killed before its row
    orphan_keys_removed: int = 0
    # "tenant digest" of live refs whose data key is not in the key database: forgotten after the
    # restored backup of this database was taken (or a forget killed half way); they read nothing,
    # and `fak cas forget` makes them tombstones (docs/deploy.md, "Restore")
    keyless: list[str] = []


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
        key_url: str | None = None,
        backend: BlobBackend | None = None,
        encrypt: bool = True,
        max_blob_size: int = DEFAULT_MAX_BLOB,
        chunk_size: int = crypto.DEFAULT_CHUNK,
        fsync: bool = True,
        settings: StorageSettings | None = None,
    ) -> CasStore:
        """Open (creating and migrating as needed) the store. Defaults, from ``settings``
        (when not given, ``StorageSettings()``: the ``FAK_*`` environment): the data
        directory, its database URL and its master secret; tenant keys in the key
        database ``key_url`` (``cas_key_url``, else ``<data dir>/keys/cas-keys.db``),
        wrapped by ``kek_provider`` (default: the master secret). A format-1 store
        (KEKs derived from the master secret) is re-wrapped once, here."""
        conf = settings if settings is not None else StorageSettings()
        root = Path(data_dir) if data_dir is not None else conf.data_dir
        _private_dir(root)
        main_url = url or conf.database_url or f"sqlite:///{root / 'fak.db'}"
        key_url = key_url or conf.cas_key_url or f"sqlite:///{_private_dir(root / 'keys') / 'cas-keys.db'}"
        _private_sqlite_file(main_url)
        _private_sqlite_file(key_url)
        engine = db.make_engine(main_url, durable=fsync)
        db.upgrade(engine)
        key_engine = db.make_engine(key_url, durable=True)  # key destruction is always fsynced
        master = master_secret if master_secret is not None else load_master_secret(root, conf.master_secret_hex())
        keys = KeyRing(key_engine, kek_provider if kek_provider is not None else MasterWrapper(master))
        keys.create_tables()
        _private_sqlite_file(main_url)  # the -wal and -shm files exist now
        _private_sqlite_file(key_url)
        store = cls(
            engine,
            backend or FileBackend(root / "blobs", fsync=fsync),
            keys,
            encrypt=encrypt,
            max_blob_size=max_blob_size,
            chunk_size=chunk_size,
        )
        try:
            try:
                keys.ensure_check()
            except KeyMismatch:
                raise KeyMismatch(
                    "the master secret (or KEK provider) does not match this store's key database "
                    f"{_shown_url(key_url)}; set FAK_MASTER_SECRET or the data directory the store was created with"
                ) from None
            store._migrate_legacy(master)
            store._move_data_keys()
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        db.release(self.engine)  # shared with the process's other layers (fak.db)
        db.release(self.keys.engine)

    def __enter__(self) -> CasStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate_legacy(self, master: bytes) -> int:
        """One-time re-wrap of a format-1 store: its KEKs were derived from the master
        secret (so no rotation could retire them). Every data key is unwrapped with the
        derived KEK and re-wrapped under its tenant's random KEK (AAD-bound); each
        tenant keeps its derived digest key (stored wrapped like a new one), or its
        existing digests would no longer verify. Idempotent; returns keys re-wrapped."""
        with self._session() as s:
            legacy = list(s.scalars(sa.select(LegacyKek)))
            pending = s.scalar(sa.select(sa.func.count()).select_from(LegacyDataKey)
                               .where(LegacyDataKey.kek_id.is_(None)))
        if not legacy and not pending:
            return 0
        derived = {k.version: derive_key(master, "fak/cas/kek", f"v{k.version}".encode()) for k in legacy}
        for k in legacy:
            check = blake3.blake3(b"fak/cas/kek-check", key=derived[k.version]).hexdigest()[:32]
            if check != k.check_value:
                raise KeyMismatch(
                    f"cannot migrate this format-1 store: the master secret does not match its KEK v{k.version}; "
                    "open it once with the master secret it was created with (FAK_MASTER_SECRET or its data dir)"
                )
        with self._session() as s:
            tenants = set(s.scalars(sa.select(Blob.tenant).distinct())) | set(
                s.scalars(sa.select(BlobUse.tenant).distinct())
            )
        for name in sorted(tenants):
            self.keys.set_digest_key(name, derive_key(master, "fak/cas/digest-key", name.encode()))
        count = 0
        with self._writer() as s:
            rows: Sequence[tuple[LegacyDataKey, str | None]] = s.execute(  # outer join: a tenant or None
                sa.select(LegacyDataKey, Blob.tenant).outerjoin(Blob, Blob.key_id == LegacyDataKey.key_id)
                .where(LegacyDataKey.kek_id.is_(None))
            ).all()  # fmt: skip
            for key, tenant in rows:
                if tenant is None:  # a key no ref names: nothing to keep
                    s.delete(key)
                    continue
                if key.kek_version not in derived:
                    raise KeyMismatch(f"format-1 data key {key.key_id} names KEK v{key.kek_version}, which is unknown")
                dek = crypto.legacy_unwrap_key(derived[key.kek_version], key.wrapped)
                kek = self.keys.active(tenant)
                key.wrapped = crypto.wrap_key(kek.key, dek, data_key_aad(key.key_id, tenant, kek.kek_id))
                key.tenant, key.kek_id, key.kek_version = tenant, kek.kek_id, kek.version
                count += 1
            s.execute(sa.delete(LegacyKek))
            s.commit()
        return count

    def _move_data_keys(self) -> int:
        """Move the data keys a store kept in its CAS database (table ``cas_keys``, before
        issue 25) to the key database, then delete them from the CAS database and scrub it:
        from then on no copy of the CAS database made later holds a key. Idempotent (a crash
        between the two commits leaves both copies; the next open finishes). Copies of the
        CAS database made before this still hold the wraps (docs/cas.md)."""
        with self._session() as s:
            rows = [
                {c: getattr(r, c) for c in ("key_id", "tenant", "kek_id", "kek_version", "wrapped", "created_us")}
                for r in s.scalars(sa.select(LegacyDataKey).where(LegacyDataKey.kek_id.is_not(None)))
            ]
        if not rows:
            return 0
        moved = self.keys.data.import_rows(rows)
        with self._writer() as s:
            xid = pg_xid(s.connection())
            s.execute(sa.delete(LegacyDataKey).where(LegacyDataKey.key_id.in_([r["key_id"] for r in rows])))
            s.commit()
        scrub(self.engine, LegacyDataKey.__tablename__, xid)
        return moved

    # ------------------------------------------------------------------ helpers

    def _digest_key(self, tenant: str, keyed: bool) -> bytes | None:
        return self.keys.digest_key(tenant) if keyed else None

    def empty_digest(self, tenant: str, *, keyed: bool = True) -> str:
        """The digest of the empty blob for this tenant (it always exists)."""
        return compute(b"", self._digest_key(check_tenant(tenant), keyed))

    def _is_empty(self, digest: str, tenant: str) -> bool:
        if not is_keyed(digest):
            return digest == compute(b"")
        key = self.keys.digest_key(tenant, create=False)  # no key yet: no keyed digest can be its empty blob
        return key is not None and digest == compute(b"", key)

    def _empty_ref(self, digest: str, tenant: str, media_type: str = "application/octet-stream") -> Ref:
        return Ref(digest=digest, size=0, media_type=media_type, tenant=tenant, taint="trusted", created_at=_EPOCH)

    @staticmethod
    def _ref(row: Blob) -> Ref:
        return Ref(
            digest=row.digest,
            size=row.size,
            media_type=row.media_type,
            tenant=row.tenant,
            taint=row.taint,
            created_at=_dt(row.created_us),
            state=row.state,
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
        hashing = Hasher(key) if digest is None else digest  # computed on the way, or known
        writer = self.backend.new_writer(blob_id)
        size = chunks = 0
        try:
            writer.write(crypto.header(crypto.MODE_SEALED if sealer else crypto.MODE_PLAIN, self.chunk_size))
            for index, (piece, final) in enumerate(crypto.chunked(source, self.chunk_size)):
                size += len(piece)
                if size > self.max_blob_size:
                    raise TooLarge(f"blob exceeds the maximum of {self.max_blob_size} bytes")
                if isinstance(hashing, Hasher):
                    hashing.update(piece)
                writer.write(sealer.seal(index, piece, final) if sealer else bytes(piece))
                chunks = index + 1
            blob_digest = hashing.digest() if isinstance(hashing, Hasher) else hashing
            if sealer is not None:
                writer.write(sealer.commit(blob_digest, size, chunks))
            if size == 0:
                writer.abort()
            else:
                writer.commit()
        except OSError as exc:
            writer.abort()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise StorageFull("the blob store is full: nothing was stored; free space and retry") from exc
            raise
        except BaseException:
            writer.abort()
            raise
        return _Written(blob_id, dek, blob_digest, size)

    def _commit(self, w: _Written, media_type: str, tenant: str, taint: str, *, tombstone: bool = True) -> Ref:
        """Record a written blob. If the tenant already holds the digest (a concurrent
        put won), drop ours and return theirs; a forgotten ref is revived with the new blob."""
        now = _now_us()
        key_id = None
        try:
            # the wrapped key goes to the key database first (committed): a crash before the
            # row below leaves an unnamed key, never a row naming a key that does not exist
            key_id = self.keys.data.add(tenant, w.dek)[0] if w.dek is not None else None
            with self._writer() as s:
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
                revived = tombstone and rowcount(s.execute(  # a forgotten ref comes back with a fresh key
                    sa.update(Blob)
                    .where(Blob.tenant == tenant, Blob.digest == w.digest, Blob.state == "forgotten")
                    .values(**values)
                ))
                if not revived:
                    s.add(Blob(tenant=tenant, digest=w.digest, **values))
                fault_point("cas.put.before_commit")  # the blob is renamed into place, its row not committed
                s.commit()
                return self._ref(Blob(tenant=tenant, digest=w.digest, **values))
        except sa.exc.IntegrityError:
            self._drop_unused(w.blob_id, key_id)
            merged = self._merge_existing(w.digest, tenant, taint)
            if merged is None:  # pragma: no cover - needs a put/forget race
                raise CasError(f"concurrent update of {w.digest}; retry the put") from None
            return merged
        except BaseException:
            self._drop_unused(w.blob_id, key_id)
            raise

    def _drop_unused(self, blob_id: str, key_id: str | None) -> None:
        """A put that stored nothing: its blob file and its data key go."""
        self.backend.delete(blob_id)
        if key_id is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # else fsck finds the unnamed key
                self.keys.data.delete([key_id])

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
            key = self.keys.data.row(row.key_id)
            if key is None:
                self._key_gone(digest, tenant)
            dek = self._unwrap(key, tenant, digest)
        hasher = Hasher(self._digest_key(tenant, is_keyed(digest)))
        return self._read(row, dek, hasher)

    def _key_gone(self, digest: str, tenant: str) -> NoReturn:
        """A live row whose data key is not in the key database: forgotten meanwhile (the
        key goes first), a forget interrupted between its two commits, or a CAS database
        restored from a backup made before a forget. Nothing can decrypt it."""
        with self._session() as s:
            row = self._row(s, digest, tenant)
        if row is None or row.state != "live":
            raise Forgotten(f"ref {digest} was forgotten: its key and ciphertext were destroyed")
        raise KeyDestroyed(f"the data key of {digest} is not in the key database: it was destroyed (a forget, or "
                           "a CAS database restored from a backup made before one); forget the ref to finish")

    def _unwrap(self, key: DataKey, tenant: str, digest: str) -> bytes:
        if key.tenant != tenant:
            raise KeyMismatch(f"the data key of {digest} belongs to another tenant")
        return self.keys.data.unwrap(key, digest)

    def content_keys(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]:
        """The data keys of the tenant's live refs ``digests``, for sealing what was derived
        from them (``fak.state.seal``): a key derived from these dies with any one of them.
        The empty blob has none (nothing to leak) and maps to ``b""``; so does a ref stored
        unencrypted. An unknown or forgotten ref raises ``NotFound`` / ``Forgotten``."""
        check_tenant(tenant)
        wanted = sorted({parse_digest(d) for d in digests})
        out: dict[str, bytes] = {}
        names: dict[str, str] = {}
        with self._session() as s:
            for i in range(0, len(wanted), 500):
                batch = [d for d in wanted[i : i + 500] if not self._is_empty(d, tenant)]
                out.update({d: b"" for d in wanted[i : i + 500] if d not in batch})
                rows = {r.digest: r for r in s.scalars(sa.select(Blob).where(Blob.tenant == tenant,
                                                                             Blob.digest.in_(batch)))}
                for d in batch:
                    row = rows.get(d)
                    if row is None:
                        raise NotFound(f"no ref {d} for tenant {tenant!r}")
                    if row.state != "live":
                        raise Forgotten(f"ref {d} was forgotten: its key and ciphertext were destroyed")
                    if row.key_id is None:
                        out[d] = b""
                    else:
                        names[d] = row.key_id
        keys = self.keys.data.rows(sorted(names.values()))
        for d, key_id in names.items():
            key = keys.get(key_id)
            if key is None:
                self._key_gone(d, tenant)
            out[d] = self._unwrap(key, tenant, d)
        return out

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
            n = rowcount(s.execute(
                sa.delete(BlobUse).where(
                    BlobUse.tenant == tenant,
                    BlobUse.digest == digest,
                    BlobUse.unit_kind == unit_kind,
                    BlobUse.unit_id == unit_id,
                )
            ))
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
        key = self.keys.data.row(row.key_id)
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
        one transaction, leave a tombstone (size rounded up to a power of two, no media
        type), delete the ciphertext, then scrub the key row out of the database files
        (SQLite: WAL checkpoint; PostgreSQL: VACUUM). ``shred_status`` says whether the
        scrub completed; ``crypto_shredded`` is claimed only then. Forgetting a forgotten
        ref destroys nothing and retries a pending scrub."""
        digest, _ = self._resolve(digest, tenant)
        now = _now_us()
        if self._is_empty(digest, tenant):
            return ShredRecord(
                digest=digest, tenant=tenant, size=0, forgotten_at=_dt(now), key_id=None, kek_version=None,
                blob_id=None, ciphertext_deleted=False, crypto_shredded=False,
            )  # fmt: skip
        with self._session() as s:
            row = self._row(s, digest, tenant)
        if row is None:
            raise NotFound(f"no ref {digest} for tenant {tenant!r}")
        if row.state == "forgotten":
            status = self.scrub()
            return ShredRecord(
                digest=digest, tenant=tenant, size=row.size, forgotten_at=_dt(row.forgotten_us or now),
                key_id=None, kek_version=None, blob_id=None, ciphertext_deleted=False,
                crypto_shredded=False, already_forgotten=True, shred_status=status,
                wal_checkpointed=self._checkpointed(status),
            )  # fmt: skip
        # 1. the shred: the data key leaves the key database (committed), before anything
        # else, so no state this forget can crash in has a live key for a tombstone
        key_id = row.key_id
        key = self.keys.data.row(key_id) if key_id else None
        kek_version, kek_id = (key.kek_version, key.kek_id) if key else (None, None)
        _, xid = self.keys.data.delete([key_id] if key_id else [])
        fault_point("cas.forget.after_key_delete")  # key gone, the row still live (reads fail)
        # 2. the tombstone and the uses, in the CAS database
        with self._writer() as s:
            row = self._row(s, digest, tenant, lock=True)
            if row is None:  # pragma: no cover - rows are never deleted
                raise NotFound(f"no ref {digest} for tenant {tenant!r}")
            uses = self._uses(s, digest, tenant)
            blob_id, size, was_pinned = row.blob_id, row.size, row.pinned
            if row.state == "live" and row.key_id == key_id:  # not revived by a put meanwhile
                s.execute(sa.delete(BlobUse).where(BlobUse.tenant == tenant, BlobUse.digest == digest))
                s.execute(
                    sa.update(Blob)
                    .where(Blob.tenant == tenant, Blob.digest == digest)
                    .values(state="forgotten", forgotten_us=now, blob_id=None, key_id=None, pinned=False,
                            size=size_bucket(size), media_type=TOMBSTONE_MEDIA_TYPE)
                )  # fmt: skip
            else:
                blob_id, uses = None, []
            s.commit()
        fault_point("cas.forget.after_key_commit")  # key row gone, ciphertext not deleted yet
        deleted = self.backend.delete(blob_id) if blob_id else False
        # 3. the key row out of the key database's files (SQLite: WAL checkpoint; PG: VACUUM)
        status = scrub(self.keys.engine, DataKey.__tablename__, xid)
        destroyed = key_id is not None  # deleted now, or by an interrupted forget before
        return ShredRecord(
            digest=digest,
            tenant=tenant,
            size=size_bucket(size),
            forgotten_at=_dt(now),
            key_id=key_id,
            kek_version=kek_version,
            kek_id=kek_id,
            blob_id=blob_id,
            ciphertext_deleted=deleted,
            key_deleted=destroyed,
            shred_status=status,
            wal_checkpointed=self._checkpointed(status),
            crypto_shredded=destroyed and status == "destroyed",
            uses_released=uses,
            was_pinned=was_pinned,
        )

    def _checkpointed(self, status: ShredStatus) -> bool | None:
        return status == "destroyed" if self.keys.engine.dialect.name == "sqlite" else None

    def scrub(self) -> ShredStatus:
        """Complete the scrub of deleted key rows (a forget that reported a pending
        status): in the key database, SQLite WAL checkpoint, PostgreSQL VACUUM of the
        data-key table."""
        return scrub(self.keys.engine, DataKey.__tablename__)

    # ------------------------------------------------------------------ keys

    def rotate(self, tenant: str | None = None) -> RotationResult:
        """Give each tenant (or the one named) a new random KEK version, re-wrap its live
        data keys under it (in batches) and retire the old versions. Retired KEKs stay
        until ``destroy_retired``: only then does a copy made before the rotation (a
        backup, a dead tuple) stop opening what it wrapped."""
        tenants = [check_tenant(tenant)] if tenant is not None else self.keys.tenants()
        versions: dict[str, int] = {}
        retired: list[str] = []
        count = 0
        for t in tenants:
            kek = self.keys.new_kek(t) or self.keys.active(t)  # None: a concurrent rotation added one
            fault_point("cas.rotate.after_new_kek")
            count += self.keys.data.rewrap(t, kek, batch=REWRAP_BATCH)
            retired += self.keys.retire_all_but(t, kek.kek_id)
            versions[t] = kek.version
        return RotationResult(versions=versions, rewrapped=count, retired=retired)

    rotate_kek = rotate  # the format-1 name

    def destroy_retired(self, older_than: float | timedelta) -> DestroyResult:
        """Destroy every KEK retired at least ``older_than`` (seconds, or a timedelta)
        ago: after this, no copy of a data key wrapped under it opens again, whatever
        backup it is in. A data key still wrapped under it (a put that raced the
        rotation) is re-wrapped under the tenant's active KEK first."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
        if seconds < 0:
            raise CasError("older_than must be >= 0")
        infos = {i.kek_id: i for i in self.kek_versions()}
        doomed = self.keys.retired_before(_now_us() - int(seconds * 1e6))
        count = 0
        for row in doomed:
            kek = self.keys.active(row.tenant)
            count += self.keys.data.rewrap(row.tenant, kek, only_kek=row.kek_id, batch=REWRAP_BATCH)
        self.keys.destroy([r.kek_id for r in doomed])
        status = scrub(self.keys.engine, "cas_tenant_keys") if doomed else "destroyed"
        return DestroyResult(destroyed=[infos[r.kek_id] for r in doomed if r.kek_id in infos],
                             rewrapped=count, shred_status=status)  # fmt: skip

    def erase_tenant(self, tenant: str) -> TenantErasure:
        """Crypto-erase a whole tenant in one step: destroy every key it has (KEKs and
        digest key, one transaction in the key database), so no copy of its data keys
        or digests opens or can be recomputed again; then tombstone its refs, delete
        their data keys, uses and ciphertext. Idempotent (a crash in between: run again)."""
        check_tenant(tenant)
        destroyed = self.keys.erase_tenant(tenant)  # KEKs, digest key and data keys: one transaction
        key_status = scrub(self.keys.engine, "cas_tenant_keys")
        if key_status == "destroyed" and self.keys.engine.dialect.name != "sqlite":  # one checkpoint did both
            key_status = scrub(self.keys.engine, DataKey.__tablename__)
        now = _now_us()
        with self._writer() as s:
            live = list(s.execute(sa.select(Blob.digest, Blob.size, Blob.blob_id).where(
                Blob.tenant == tenant, Blob.state == "live")))  # fmt: skip
            s.execute(sa.delete(BlobUse).where(BlobUse.tenant == tenant))
            for digest, size, _ in live:
                s.execute(sa.update(Blob).where(Blob.tenant == tenant, Blob.digest == digest).values(
                    state="forgotten", forgotten_us=now, blob_id=None, key_id=None, pinned=False,
                    size=size_bucket(size), media_type=TOMBSTONE_MEDIA_TYPE))  # fmt: skip
            s.commit()
        deleted = sum(self.backend.delete(blob_id) for _, _, blob_id in live if blob_id)
        return TenantErasure(
            tenant=tenant,
            keys_destroyed=[f"{r.kind}:{r.version}:{r.kek_id}" for r in destroyed],
            refs_forgotten=len(live),
            blobs_deleted=deleted,
            shred_status=key_status,
        )

    def kek_versions(self, tenant: str | None = None) -> list[KekInfo]:
        """Every KEK version (of one tenant, or all), with the data keys wrapped under it."""
        rows = self.keys.rows(check_tenant(tenant) if tenant is not None else None)
        counts = self.keys.data.counts()
        active: dict[str, int] = {}
        for r in rows:
            if r.retired_us is None:
                active[r.tenant] = max(active.get(r.tenant, 0), r.version)
        return [
            KekInfo(tenant=r.tenant, version=r.version, kek_id=r.kek_id, active=active.get(r.tenant) == r.version,
                    created_at=_dt(r.created_us), retired_at=_dt(r.retired_us) if r.retired_us else None,
                    keys=counts.get(r.kek_id, 0))
            for r in rows
        ]  # fmt: skip

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
            named = set(s.scalars(sa.select(Blob.key_id).where(Blob.key_id.is_not(None))))
        missing, wrong = [], []
        for tenant, digest, blob_id, size, key_id, chunk in rows:
            expected = crypto.sealed_length(size, chunk) if key_id else crypto.HEADER.size + size
            actual = self.backend.size(blob_id) if blob_id is not None else None
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
        # a put commits its data key before its row: a key no row names and older than
        # ``older_than`` belongs to a put that died (the key database serves one CAS database)
        stored = self.keys.data.ids_older_than(_now_us() + 1)
        unnamed = [k for k in stored if k not in named]
        present = set(stored)  # read after the rows: a ref forgotten meanwhile shows too (forget is idempotent)
        keyless = [f"{tenant} {digest}" for tenant, digest, _, _, key_id, _ in rows if key_id and key_id not in present]
        keys_removed = 0
        if remove_orphans and unnamed:
            old = set(self.keys.data.ids_older_than(_now_us() - int(older_than * 1e6)))
            keys_removed = self.keys.data.delete([k for k in unnamed if k in old])[0]
        return FsckReport(
            live_refs=len(rows), missing=missing, wrong_size=wrong, orphans=orphans,
            orphans_removed=removed, temp_removed=temp, orphan_keys=unnamed, orphan_keys_removed=keys_removed, keyless=keyless,
        )  # fmt: skip


class _Written:
    __slots__ = ("blob_id", "dek", "digest", "size")

    def __init__(self, blob_id: str, dek: bytes | None, digest: str, size: int) -> None:
        self.blob_id, self.dek, self.digest, self.size = blob_id, dek, digest, size


