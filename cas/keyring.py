"""Tenant keys of the CAS: random, destroyable, kept in a key database of their own.

Every tenant has
- KEK versions (``kind="kek"``): random AES-256 keys that wrap the tenant's data keys.
  ``rotate`` adds a version; the old one is retired, and destroyed by
  ``destroy_retired`` after a grace period: from then on no copy of a wrapped data key
  made before the rotation (a backup, a dead tuple, a WAL segment) opens again;
- one digest key (``kind="digest"``): keys the tenant's ``blake3k`` digests, random
  (not derived from the tenant's name), destroyed with the tenant.

Each key is wrapped by a ``KekProvider`` (default: AES-256-GCM under a key derived from
the master secret; a KMS adapter fits the same two methods) with the key's kind, id,
tenant and version as associated data, so a wrapped key moved to another row opens
nothing. The rows live in the *key database* (default ``<data dir>/keys/cas-keys.db``),
not in the CAS database: a key in the same database as the data it wraps would be in
every backup of that data, and destroying it in the live database would erase nothing.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from fak.cas import crypto
from fak.cas.errors import CasError, KeyDestroyed
from fak.cas.schema import DataKey, KeyBase, TenantKey
from fak.db import WRITE, rowcount, writing
from fak.faults import fault_point
from fak.keys import derive_key
from fak.scrub import pg_xid

KEK, DIGEST, CHECK = "kek", "digest", "check"
CHECK_TENANT = "*"  # outside the tenant grammar: no tenant can own or erase it


@runtime_checkable
class KekProvider(Protocol):
    """The root of trust that wraps tenant keys (the master secret by default). A KMS
    adapter implements ``wrap``/``unwrap`` with ``aad`` as its encryption context;
    ``unwrap`` raises (e.g. ``KeyMismatch``) when the wrap does not open."""

    def wrap(self, key: bytes, aad: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes, aad: bytes) -> bytes: ...


class MasterWrapper:
    """AES-256-GCM wrap under ``derive_key(master, "fak/cas/tenant-key-wrap")``."""

    def __init__(self, master: bytes) -> None:
        self._kek = derive_key(master, "fak/cas/tenant-key-wrap")

    def wrap(self, key: bytes, aad: bytes) -> bytes:
        return crypto.wrap_key(self._kek, key, aad)

    def unwrap(self, wrapped: bytes, aad: bytes) -> bytes:
        return crypto.unwrap_key(self._kek, wrapped, aad)


@dataclass(frozen=True)
class Kek:
    """An unwrapped KEK version of one tenant (lives in memory only)."""

    kek_id: str
    tenant: str
    version: int
    key: bytes


_T = TenantKey.__table__
_ACTIVE = (
    sa.select(_T.c.kek_id, _T.c.version)
    .where(_T.c.tenant == sa.bindparam("tenant"), _T.c.kind == KEK, _T.c.retired_us.is_(None))
    .order_by(_T.c.version.desc())
    .limit(1)
)


def _now_us() -> int:
    return time.time_ns() // 1000


def key_aad(kind: str, kek_id: str, tenant: str, version: int) -> bytes:
    return b"\x00".join((b"fak/cas/tenant-key", kind.encode(), kek_id.encode(), tenant.encode(), b"%d" % version))


def data_key_aad(key_id: str, tenant: str, kek_id: str) -> bytes:
    """What a data-key wrap binds: its own id, its tenant and the KEK that wraps it."""
    return b"\x00".join((b"fak/cas/data-key", key_id.encode(), tenant.encode(), kek_id.encode()))


class KeyRing:
    """Tenant keys in the key database. Unwrapped keys are cached in this process by
    their random id (a destroyed key is dropped from this process's cache at once;
    other processes keep theirs until they close)."""

    def __init__(self, engine: Engine, provider: KekProvider) -> None:
        if not isinstance(provider, KekProvider):
            raise CasError(
                "kek_provider must wrap and unwrap tenant keys (methods wrap(key, aad) and unwrap(wrapped, aad)); "
                "a callable returning a KEK per version is the format-1 interface, see docs/cas.md"
            )
        self.engine = engine
        self._provider = provider
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)
        self._keys: dict[str, bytes] = {}  # kek_id -> unwrapped key
        self._digest: dict[str, bytes] = {}  # tenant -> digest key
        self.data = DataKeys(self)

    def create_tables(self) -> None:
        with writing(self.engine) as conn:
            KeyBase.metadata.create_all(conn)

    # ------------------------------------------------------------------ reading

    def _unwrap(self, row: TenantKey) -> bytes:
        key = self._provider.unwrap(row.wrapped, key_aad(row.kind, row.kek_id, row.tenant, row.version))
        if len(key) != 32:
            raise CasError(f"tenant key {row.kek_id} does not unwrap to 32 bytes")
        return key

    def ensure_check(self) -> None:
        """Unwrap the key database's check key (created on first open), so a wrong master
        secret or provider fails at open with ``KeyMismatch``, not at the first read."""
        with self._session() as s:
            row = s.scalars(sa.select(TenantKey).where(TenantKey.kind == CHECK)).first()
        if row is None:
            self._insert(CHECK_TENANT, CHECK, secrets.token_bytes(32), version=0)
            return
        self._unwrap(row)

    def kek(self, kek_id: str) -> bytes | None:
        """The KEK with this id, or None once it was destroyed."""
        key = self._keys.get(kek_id)
        if key is None:
            with self._session() as s:
                row = s.get(TenantKey, kek_id)
            if row is None or row.kind != KEK:
                return None
            key = self._keys[kek_id] = self._unwrap(row)
        return key

    def active(self, tenant: str) -> Kek:
        """The tenant's newest unretired KEK, created (version 1, or after the last
        destroyed one) when it has none."""
        for _ in range(3):
            # read on every put (Core, no ORM session: ~4x cheaper), never cached: another
            # process may have rotated, destroyed or erased since
            with self.engine.connect() as conn:
                row = conn.execute(_ACTIVE, {"tenant": tenant}).first()
            if row is not None:
                key = self._keys.get(row.kek_id)
                if key is None:
                    with self._session() as s:
                        full = s.get(TenantKey, row.kek_id)
                    if full is None:
                        continue  # destroyed meanwhile
                    key = self._keys[row.kek_id] = self._unwrap(full)
                return Kek(row.kek_id, tenant, row.version, key)
            self._check_digest_key_alive(tenant)
            self.new_kek(tenant)
        raise CasError(f"cannot create a KEK for tenant {tenant!r}")  # pragma: no cover - lost three races

    def _check_digest_key_alive(self, tenant: str) -> None:
        """A tenant without a KEK is new or was erased. If this process still holds a
        digest key for it that is gone from the key database (erased by another process),
        the digest being stored was computed with a destroyed key: refuse, forget it."""
        if tenant not in self._digest:
            return
        with self._session() as s:
            alive = s.scalar(sa.select(sa.func.count()).select_from(TenantKey)
                             .where(TenantKey.tenant == tenant, TenantKey.kind == DIGEST))  # fmt: skip
        if not alive:
            self._digest.pop(tenant, None)
            raise CasError(f"tenant {tenant!r} was erased while this put ran (its digest key is gone); retry the put")

    def new_kek(self, tenant: str) -> Kek | None:
        """Add a KEK version to the tenant (None if a concurrent writer added one first)."""
        return self._insert(tenant, KEK, secrets.token_bytes(32))

    def _insert(self, tenant: str, kind: str, key: bytes, version: int | None = None) -> Kek | None:
        kek_id = secrets.token_hex(16)
        with self._writer() as s:
            if version is None:
                last = s.scalar(
                    sa.select(sa.func.max(TenantKey.version)).where(TenantKey.tenant == tenant, TenantKey.kind == kind)
                )
                version = (last or 0) + 1
            s.add(TenantKey(kek_id=kek_id, tenant=tenant, kind=kind, version=version,
                            wrapped=self._provider.wrap(key, key_aad(kind, kek_id, tenant, version)),
                            created_us=_now_us()))  # fmt: skip
            fault_point(f"cas.keyring.before_commit.{kind}")
            try:
                s.commit()
            except sa.exc.IntegrityError:
                s.rollback()
                return None
        self._keys[kek_id] = key
        return Kek(kek_id, tenant, version, key)

    def digest_key(self, tenant: str, *, create: bool = True) -> bytes | None:
        """The tenant's random digest key (None if it has none and ``create`` is off)."""
        key = self._digest.get(tenant)
        if key is not None:
            return key
        for _ in range(3):
            with self._session() as s:
                row = s.scalars(sa.select(TenantKey).where(TenantKey.tenant == tenant, TenantKey.kind == DIGEST)).first()
            if row is not None:
                key = self._digest[tenant] = self._unwrap(row)
                return key
            if not create:
                return None
            self.set_digest_key(tenant, secrets.token_bytes(32))
        raise CasError(f"cannot create a digest key for tenant {tenant!r}")  # pragma: no cover

    def set_digest_key(self, tenant: str, key: bytes) -> bool:
        """Store a digest key for a tenant that has none (False if it has one already)."""
        return self._insert(tenant, DIGEST, key, version=0) is not None

    def rows(self, tenant: str | None = None) -> list[TenantKey]:
        q = sa.select(TenantKey).where(TenantKey.kind == KEK).order_by(TenantKey.tenant, TenantKey.version)
        if tenant is not None:
            q = q.where(TenantKey.tenant == tenant)
        with self._session() as s:
            return list(s.scalars(q))

    def tenants(self) -> list[str]:
        """Tenants that have a KEK."""
        with self._session() as s:
            return list(s.scalars(
                sa.select(TenantKey.tenant).where(TenantKey.kind == KEK).distinct().order_by(TenantKey.tenant)))

    # ------------------------------------------------------------------ retiring, destroying

    def retire_all_but(self, tenant: str, keep: str) -> list[str]:
        """Retire every unretired KEK of the tenant except ``keep``; their ids."""
        with self._writer() as s:
            ids = list(s.scalars(sa.select(TenantKey.kek_id).where(
                TenantKey.tenant == tenant, TenantKey.kind == KEK, TenantKey.retired_us.is_(None),
                TenantKey.kek_id != keep)))  # fmt: skip
            if ids:
                s.execute(sa.update(TenantKey).where(TenantKey.kek_id.in_(ids)).values(retired_us=_now_us()))
                s.commit()
        return ids

    def retired_before(self, cutoff_us: int) -> list[TenantKey]:
        with self._session() as s:
            return list(s.scalars(sa.select(TenantKey).where(
                TenantKey.kind == KEK, TenantKey.retired_us.is_not(None), TenantKey.retired_us <= cutoff_us
            ).order_by(TenantKey.tenant, TenantKey.version)))  # fmt: skip

    def destroy(self, kek_ids: list[str]) -> int:
        """Delete these key rows (the destruction) and forget them in this process."""
        if not kek_ids:
            return 0
        with self._writer() as s:
            n = rowcount(s.execute(sa.delete(TenantKey).where(TenantKey.kek_id.in_(kek_ids))))
            s.commit()
        for kek_id in kek_ids:
            self._keys.pop(kek_id, None)
        return n

    def erase_tenant(self, tenant: str) -> list[TenantKey]:
        """Destroy every key of the tenant (KEKs, digest key, data keys) in one transaction."""
        with self._writer() as s:
            rows = list(s.scalars(sa.select(TenantKey).where(TenantKey.tenant == tenant)))
            s.execute(sa.delete(TenantKey).where(TenantKey.tenant == tenant))
            s.execute(sa.delete(DataKey).where(DataKey.tenant == tenant))
            s.commit()
        for row in rows:
            self._keys.pop(row.kek_id, None)
        self._digest.pop(tenant, None)
        return rows


# ---------------------------------------------------------------------- data keys
# A blob's data key lives here, beside the KEK that wraps it, and never in the CAS database:
# deleting its row (forget) then leaves no copy of the CAS database able to open the blob or
# anything sealed under a key derived from it (fak.state.seal), whenever that copy was made.


class DataKeys:
    """The data keys of the key database (table ``cas_data_keys``), one per blob."""

    def __init__(self, ring: KeyRing) -> None:
        self.ring = ring
        self.engine = ring.engine
        self._session = sessionmaker(ring.engine, expire_on_commit=False)
        self._writer = sessionmaker(ring.engine.execution_options(**{WRITE: True}), expire_on_commit=False)

    def add(self, tenant: str, dek: bytes) -> tuple[str, Kek]:
        """Wrap a new blob's data key under the tenant's active KEK and store it (committed,
        fsynced) before any row of the CAS database names it; its key id and KEK. A writer
        killed after this and before the blob's row leaves an unnamed key (``orphans``)."""
        kek = self.ring.active(tenant)
        key_id = secrets.token_hex(16)
        with self._writer() as s:
            s.add(DataKey(key_id=key_id, tenant=tenant, kek_id=kek.kek_id, kek_version=kek.version,
                          wrapped=crypto.wrap_key(kek.key, dek, data_key_aad(key_id, tenant, kek.kek_id)),
                          created_us=_now_us()))  # fmt: skip
            s.commit()
        return key_id, kek

    def row(self, key_id: str) -> DataKey | None:
        with self._session() as s:
            return s.get(DataKey, key_id)

    def rows(self, key_ids: list[str]) -> dict[str, DataKey]:
        out: dict[str, DataKey] = {}
        with self._session() as s:
            for i in range(0, len(key_ids), 500):
                out.update({r.key_id: r for r in s.scalars(sa.select(DataKey).where(
                    DataKey.key_id.in_(key_ids[i : i + 500])))})  # fmt: skip
        return out

    def unwrap(self, row: DataKey, what: str) -> bytes:
        """The data key in ``row`` (``KeyDestroyed`` once the KEK that wrapped it is gone)."""
        kek = self.ring.kek(row.kek_id)
        if kek is None:
            raise KeyDestroyed(
                f"the KEK that wrapped the data key of {what} was destroyed (rotation and destroy_retired, or "
                "erase_tenant): it cannot be decrypted any more (e.g. a key database restored from an old backup)"
            )
        return crypto.unwrap_key(kek, row.wrapped, data_key_aad(row.key_id, row.tenant, row.kek_id))

    def delete(self, key_ids: list[str]) -> tuple[int, int | None]:
        """Delete these keys (the crypto-shred) in one transaction; (rows deleted, the
        transaction's PostgreSQL xid for the scrub's horizon check)."""
        if not key_ids:
            return 0, None
        with self._writer() as s:
            xid = pg_xid(s.connection())
            n = rowcount(s.execute(sa.delete(DataKey).where(DataKey.key_id.in_(key_ids))))
            s.commit()
        return n or 0, xid

    def import_rows(self, rows: list[dict[str, object]]) -> int:
        """Insert data keys moved from the CAS database (rows already here are kept: the
        move is idempotent); the number inserted."""
        if not rows:
            return 0
        with self._writer() as s:
            have = set(s.scalars(sa.select(DataKey.key_id).where(DataKey.key_id.in_([r["key_id"] for r in rows]))))
            fresh = [DataKey(**r) for r in rows if r["key_id"] not in have]
            s.add_all(fresh)
            s.commit()
        return len(fresh)

    def rewrap(self, tenant: str, kek: Kek, *, only_kek: str | None = None, batch: int = 1000) -> int:
        """Re-wrap the tenant's data keys under ``kek``: those under any other KEK, or only
        those under ``only_kek``; committing every ``batch`` keys (each batch leaves every
        key readable)."""
        count = 0
        while True:
            with self._writer() as s:
                q = sa.select(DataKey).where(DataKey.tenant == tenant)
                q = q.where(DataKey.kek_id == only_kek) if only_kek is not None else q.where(DataKey.kek_id != kek.kek_id)
                rows = list(s.scalars(q.limit(batch).with_for_update()))
                for key in rows:
                    dek = self.unwrap(key, f"data key {key.key_id}")
                    key.wrapped = crypto.wrap_key(kek.key, dek, data_key_aad(key.key_id, tenant, kek.kek_id))
                    key.kek_id, key.kek_version = kek.kek_id, kek.version
                s.commit()
            fault_point("cas.rotate.after_batch")
            count += len(rows)
            if len(rows) < batch:
                return count

    def counts(self) -> dict[str, int]:
        """Data keys per KEK id."""
        with self._session() as s:
            return dict(s.execute(sa.select(DataKey.kek_id, sa.func.count()).group_by(DataKey.kek_id)).all())

    def ids_older_than(self, cutoff_us: int) -> list[str]:
        with self._session() as s:
            return list(s.scalars(sa.select(DataKey.key_id).where(DataKey.created_us < cutoff_us)))
