"""Erasure that survives backups, dead tuples and open readers (issue 16, items 4 and 6).

- a backup of the CAS database and blobs taken before a forget stops decrypting the
  forgotten blob once its KEK was rotated out and destroyed (and all of a tenant after
  ``erase_tenant``), with the current master secret at hand;
- on PostgreSQL no wrapped key is left in any heap tuple after forget (pageinspect);
- on SQLite a reader holding a snapshot stops the WAL checkpoint, and the record says
  so instead of claiming the key was shredded;
- wraps are bound to their key id and tenant; tombstones keep a size bucket only;
  files and directories are private; the master secret file's mode is checked.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.at_rest import raw_bytes_under

from fak.cas import CasStore, KeyDestroyed, KeyMismatch
from fak.cas.crypto import legacy_wrap_key
from fak.cas.keyring import DIGEST
from fak.cas.schema import Blob, DataKey, LegacyDataKey, LegacyKek, TenantKey
from fak.errors import FakError
from fak.keys import derive_key, load_master_secret
from fak.settings import StorageSettings

MASTER = bytes(range(32))


def _open(data: Path, url: str, keys: Path, **kw) -> CasStore:
    return CasStore.open(data, url, master_secret=MASTER, key_url=f"sqlite:///{keys}", chunk_size=1024, **kw)


def _key_of(store: CasStore, ref, tenant: str = "acme") -> DataKey:  # noqa: ANN001
    """The data key row of a live ref (in the key database)."""
    with store._session() as s:
        key_id = store._row(s, ref.digest, tenant).key_id
    return store.keys.data.row(key_id)


def _set_key(store: CasStore, key_id: str, **values) -> None:  # noqa: ANN003
    with store.keys.engine.begin() as conn:
        conn.execute(sa.update(DataKey).where(DataKey.key_id == key_id).values(**values))


# ------------------------------------------------------------- backends


def _private_pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database of its own: the VACUUM horizon is per database, so
    other suites' open transactions in ``test`` cannot keep our dead tuples alive (the
    store would rightly report ``pending_vacuum``)."""
    from support.pg import pg_scratch, pg_server_url

    name = f"fak_erase_{secrets.token_hex(6)}"
    with pg_scratch(f'CREATE DATABASE "{name}"', f'DROP DATABASE "{name}" WITH (FORCE)'):
        yield pg_server_url(name)


@pytest.fixture
def pg_db() -> Iterator[str]:
    yield from _private_pg_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> Iterator[str]:
    """Both backends; PostgreSQL in a database of its own (see ``_private_pg_database``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fak.db'}"
    else:
        yield from _private_pg_database()


# ------------------------------------------------------------- backups (SQLite and PostgreSQL)

CAS_TABLES = ("cas_blobs", "cas_keys", "cas_uses", "cas_kek")


class Backup:
    """A backup of the CAS database (every CAS table, read in one transaction) and of its
    blob files: what an operator's nightly backup holds. The key database is not in it
    (docs/cas.md: it is backed up, if at all, on its own schedule)."""

    def __init__(self, store: CasStore, blobs: Path, dest: Path) -> None:
        store.scrub()
        with store.engine.connect() as conn:
            self.rows = {t: [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT * FROM {t}"))] for t in CAS_TABLES}
        self.blobs = dest / "blobs"
        shutil.copytree(blobs, self.blobs)

    def restore(self, store: CasStore, blobs: Path) -> None:
        meta = sa.MetaData()
        meta.reflect(store.engine, only=CAS_TABLES)
        with store.engine.begin() as conn:
            for t in CAS_TABLES:
                conn.execute(meta.tables[t].delete())
                if self.rows[t]:
                    conn.execute(meta.tables[t].insert(), self.rows[t])
        shutil.rmtree(blobs)
        shutil.copytree(self.blobs, blobs)


def test_backup_cannot_decrypt_forgotten_at_once(db_url, tmp_path):
    """Data keys live in the key database (issue 25.2): a CAS backup made before a forget
    opens nothing of the forgotten ref as soon as the forget completed, no rotation needed;
    it still opens the refs that are live, through any rotation."""
    data, keys = tmp_path / "data", tmp_path / "vault" / "cas-keys.db"
    store = _open(data, db_url, keys)
    secret = b"FORGET-ME " + secrets.token_bytes(3000)
    gone = store.put(secret, "text/plain", "acme")
    kept = store.put(b"kept " * 300, "text/plain", "acme")
    other = store.put(b"another tenant " * 100, "text/plain", "globex")
    backup = Backup(store, data / "blobs", tmp_path / "backup")
    assert all(not v for v in backup.rows["cas_keys"])  # the CAS database holds no data key
    key_db_before = tmp_path / "key-db-copy"  # only for the limit checked at the end
    with sqlite3.connect(keys) as src, sqlite3.connect(key_db_before) as dst:
        src.backup(dst)  # a consistent copy (the WAL included)

    record = store.forget(gone.digest, "acme")
    assert record.crypto_shredded and record.shred_status == "destroyed" and record.kek_version == 1
    assert record.key_deleted and record.ciphertext_deleted

    # restore the backup (database and blobs) at once, with the current master secret and key database
    backup.restore(store, data / "blobs")
    with pytest.raises(KeyDestroyed, match="not in the key database"):
        store.get(gone, "acme")
    assert store.get(kept, "acme") == b"kept " * 300  # the backup restores what is live
    store.forget(gone.digest, "acme")  # the restored row is finished off: a tombstone again
    assert store.head(gone.digest, "acme").state == "forgotten"

    rotated = store.rotate()
    assert rotated.versions == {"acme": 2, "globex": 2} and rotated.rewrapped == 2
    assert store.destroy_retired(older_than=3600).destroyed == []  # inside the grace period: nothing
    destroyed = store.destroy_retired(older_than=0)
    assert sorted((i.tenant, i.version) for i in destroyed.destroyed) == [("acme", 1), ("globex", 1)]
    assert destroyed.shred_status == "destroyed"
    store.close()

    store = _open(data, db_url, keys)
    backup.restore(store, data / "blobs")
    with pytest.raises(KeyDestroyed):
        store.get(gone, "acme")
    # a rotation re-wraps the keys where they live: a CAS backup stays restorable for live refs
    assert store.get(kept, "acme") == b"kept " * 300 and store.get(other, "globex") == b"another tenant " * 100
    store.close()

    # the documented limit: a copy of the key database made before the forget, with the master
    # secret (and the CAS backup and blobs), is the forgotten data key itself: keep no such copy
    old = CasStore.open(data, db_url, master_secret=MASTER, key_url=f"sqlite:///{key_db_before}", chunk_size=1024)
    backup.restore(old, data / "blobs")
    assert old.get(gone, "acme") == secret and old.get(other, "globex") == b"another tenant " * 100
    old.close()


def test_backup_cannot_decrypt_an_erased_tenant(db_url, tmp_path):
    data, keys = tmp_path / "data", tmp_path / "vault" / "cas-keys.db"
    store = _open(data, db_url, keys)
    refs = [store.put(secrets.token_bytes(n), "application/octet-stream", "acme") for n in (10, 2000, 5000)]
    store.record_use(refs[0].digest, "acme", "segment", "s/1")
    other = store.put(b"globex keeps this", "text/plain", "globex")
    backup = Backup(store, data / "blobs", tmp_path / "backup")

    erased = store.erase_tenant("acme")
    assert erased.refs_forgotten == 3 and erased.blobs_deleted == 3 and erased.shred_status == "destroyed"
    assert sorted(k.split(":")[0] for k in erased.keys_destroyed) == ["digest", "kek"]
    assert all(store.head(r.digest, "acme").state == "forgotten" for r in refs)
    assert store.kek_versions("acme") == []
    with store.keys.engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(DataKey).where(DataKey.tenant == "acme")) == 0
    # the tenant's digest key went with it: the same bytes no longer give the same digest
    assert store.digest_of(b"globex keeps this", "acme") != store.digest_of(b"globex keeps this", "globex")
    store.close()

    store = _open(data, db_url, keys)
    backup.restore(store, data / "blobs")
    for ref in refs:
        with pytest.raises(KeyDestroyed):
            store.get(ref, "acme")
    assert store.get(other, "globex") == b"globex keeps this"  # one tenant's erasure touches no other
    assert store.erase_tenant("acme").refs_forgotten == 3  # idempotent: cleans a restored copy too
    store.close()


def test_destroy_retired_rewraps_a_straggler_first(tmp_path):
    """A put that read the active KEK before a rotation and committed after it is wrapped
    under the retired KEK: destroying that KEK must not take the blob with it."""
    store = _open(tmp_path / "data", f"sqlite:///{tmp_path / 'fak.db'}", tmp_path / "keys.db")
    store.put(b"first", "text/plain", "acme")
    old = store.keys.active("acme")
    store.rotate()
    late = store.put(b"late put", "text/plain", "acme")
    row = _key_of(store, late)  # rewind the late key to the old KEK, as the race would have left it
    dek = store._unwrap(row, "acme", late.digest)
    from fak.cas import crypto
    from fak.cas.keyring import data_key_aad

    _set_key(store, row.key_id, wrapped=crypto.wrap_key(old.key, dek, data_key_aad(row.key_id, "acme", old.kek_id)),
             kek_id=old.kek_id, kek_version=old.version)
    result = store.destroy_retired(0)
    assert result.rewrapped == 1 and [i.version for i in result.destroyed] == [1]
    assert store.get(late, "acme") == b"late put"
    store.close()


# ------------------------------------------------------------- PostgreSQL: dead tuples


def _heap_tuples(engine: sa.Engine, table: str) -> list[bytes]:
    """Every tuple's data in every page of ``table``, read with pageinspect."""
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pageinspect"))
        conn.commit()
        pages = conn.execute(sa.text(f"SELECT pg_relation_size('{table}') / current_setting('block_size')::int")).scalar()
        out = []
        for n in range(pages):
            out += [bytes(r[0]) for r in conn.execute(sa.text(
                f"SELECT t_data FROM heap_page_items(get_raw_page('{table}', {n})) WHERE t_data IS NOT NULL"))]  # fmt: skip
        return out


def _raw_pages(engine: sa.Engine, table: str) -> bytes:
    with engine.connect() as conn:
        pages = conn.execute(sa.text(f"SELECT pg_relation_size('{table}') / current_setting('block_size')::int")).scalar()
        return b"".join(bytes(conn.execute(sa.text(f"SELECT get_raw_page('{table}', {n})")).scalar())
                        for n in range(pages))  # fmt: skip


@pytest.fixture
def pg_key_db() -> Iterator[str]:
    """A second private PostgreSQL database: the key database (FAK_CAS_KEY_URL) on PostgreSQL."""
    yield from _private_pg_database()


def _open_pg(tmp_path: Path, url: str, key_url: str) -> CasStore:
    return CasStore.open(tmp_path / "data", url, master_secret=MASTER, key_url=key_url, chunk_size=1024)


@pytest.mark.postgres
def test_forget_leaves_no_wrapped_key_on_postgres(pg_db, pg_key_db, tmp_path):
    store = _open_pg(tmp_path, pg_db, pg_key_db)
    refs = [store.put(secrets.token_bytes(100 + i), "application/octet-stream", "acme") for i in range(20)]
    target = refs[7]
    wrapped = _key_of(store, target).wrapped
    assert any(wrapped in t for t in _heap_tuples(store.keys.engine, "cas_data_keys"))  # the scan sees a live key
    assert not any(wrapped in t for t in _heap_tuples(store.engine, "cas_keys"))  # and none in the CAS database

    record = store.forget(target.digest, "acme")
    assert record.key_deleted and record.shred_status == "destroyed" and record.crypto_shredded
    assert not any(wrapped in t for t in _heap_tuples(store.keys.engine, "cas_data_keys")), "wrap left in a tuple"
    assert all(store.get(r, "acme") for r in refs if r != target)

    # PostgreSQL does not zero the freed bytes inside the page: what may linger there (and in
    # WAL segments) is a wrap under KEK v1, which opens nothing once v1 is destroyed
    lingering = wrapped in _raw_pages(store.keys.engine, "cas_data_keys")
    store.rotate()
    store.destroy_retired(0)
    assert store.keys.kek(record.kek_id) is None
    print(f"freed page bytes still held the wrapped key: {lingering}")
    store.close()


@pytest.mark.postgres
def test_forget_with_an_open_snapshot_on_postgres_reports_pending(pg_db, pg_key_db, tmp_path):
    store = _open_pg(tmp_path, pg_db, pg_key_db)
    ref = store.put(b"seen by a long transaction " * 10, "text/plain", "acme")
    wrapped = _key_of(store, ref).wrapped
    reader = sa.create_engine(pg_key_db)
    with reader.connect() as conn:
        conn.execute(sa.text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(sa.text("SELECT count(*) FROM cas_data_keys")).scalar()  # takes the snapshot
        record = store.forget(ref.digest, "acme")
        assert record.key_deleted and record.shred_status == "pending_vacuum" and not record.crypto_shredded
        assert any(wrapped in t for t in _heap_tuples(store.keys.engine, "cas_data_keys"))  # what the status warns of
        conn.rollback()
    reader.dispose()
    assert store.scrub() == "destroyed"
    assert not any(wrapped in t for t in _heap_tuples(store.keys.engine, "cas_data_keys"))
    again = store.forget(ref.digest, "acme")  # a repeated forget retries the scrub
    assert again.already_forgotten and again.shred_status == "destroyed"
    store.close()


# ------------------------------------------------------------- SQLite: an open reader


def test_sqlite_forget_with_an_open_reader_reports_pending_checkpoint(tmp_path):
    keys = tmp_path / "keys.db"
    store = _open(tmp_path / "data", f"sqlite:///{tmp_path / 'fak.db'}", keys)
    ref = store.put(b"read by someone else " * 40, "text/plain", "acme")
    wrapped = _key_of(store, ref).wrapped
    reader = sqlite3.connect(keys, isolation_level=None)  # the data key lives in the key database
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM cas_data_keys").fetchone()  # holds a WAL snapshot
    t0 = time.monotonic()
    record = store.forget(ref.digest, "acme")
    assert time.monotonic() - t0 < 10  # waits briefly for the reader, not the 60 s busy timeout
    assert record.key_deleted and record.ciphertext_deleted
    assert record.shred_status == "pending_wal_checkpoint" and record.wal_checkpointed is False
    assert not record.crypto_shredded  # not claimed while the WAL may still hold the key
    assert wrapped in (tmp_path / "keys.db-wal").read_bytes()  # exactly what the status warns of
    reader.execute("COMMIT")
    reader.close()
    assert store.scrub() == "destroyed"
    assert wrapped not in raw_bytes_under(tmp_path)
    store.close()


def test_sqlite_forget_without_readers_is_destroyed(tmp_path):
    store = _open(tmp_path / "data", f"sqlite:///{tmp_path / 'fak.db'}", tmp_path / "keys.db")
    ref = store.put(b"nobody reads this " * 40, "text/plain", "acme")
    record = store.forget(ref.digest, "acme")
    assert record.shred_status == "destroyed" and record.wal_checkpointed and record.crypto_shredded
    store.close()


# ------------------------------------------------------------- wrap binding


def test_a_wrapped_data_key_moved_to_another_key_id_or_tenant_does_not_unwrap(db_url, tmp_path):
    data, keys = tmp_path / "data", tmp_path / "keys.db"
    store = _open(data, db_url, keys)
    a1 = store.put(b"acme one " * 50, "text/plain", "acme")
    a2 = store.put(b"acme two " * 50, "text/plain", "acme")
    g1 = store.put(b"globex one " * 50, "text/plain", "globex")

    k1, k2 = _key_of(store, a1), _key_of(store, a2)  # swap two wrapped keys of one tenant (same KEK)
    _set_key(store, k1.key_id, wrapped=k2.wrapped)
    _set_key(store, k2.key_id, wrapped=k1.wrapped)
    for ref in (a1, a2):
        with pytest.raises(KeyMismatch, match="moved"):
            store.get(ref, "acme")
    kg = _key_of(store, g1, "globex")  # put acme's key (and its KEK reference) in globex's row
    _set_key(store, kg.key_id, wrapped=k1.wrapped, kek_id=k1.kek_id)
    with pytest.raises(KeyMismatch):
        store.get(g1, "globex")
    store.close()


def test_a_wrapped_kek_moved_to_another_tenant_does_not_unwrap(tmp_path):
    data, keys = tmp_path / "data", tmp_path / "keys.db"
    store = _open(data, f"sqlite:///{tmp_path / 'fak.db'}", keys)
    store.put(b"acme", "text/plain", "acme")
    g = store.put(b"globex", "text/plain", "globex")
    store.close()
    engine = sa.create_engine(f"sqlite:///{keys}")
    with engine.begin() as conn:
        acme = conn.execute(sa.select(TenantKey.wrapped).where(TenantKey.tenant == "acme", TenantKey.kind == "kek")).scalar()
        conn.execute(sa.update(TenantKey).where(TenantKey.tenant == "globex", TenantKey.kind == "kek").values(wrapped=acme))
    engine.dispose()
    store = _open(data, f"sqlite:///{tmp_path / 'fak.db'}", keys)
    with pytest.raises(KeyMismatch):
        store.get(g, "globex")
    store.close()


def test_digest_keys_are_random_per_tenant_not_derived_from_the_name(tmp_path):
    a = _open(tmp_path / "a", f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "a-keys.db")
    b = _open(tmp_path / "b", f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "b-keys.db")
    # same master secret, same tenant, two key databases: two different digest keys
    assert a.digest_of(b"same bytes", "acme") != b.digest_of(b"same bytes", "acme")
    assert a.keys.digest_key("acme") != derive_key(MASTER, "fak/cas/digest-key", b"acme")
    a.close()
    b.close()


# ------------------------------------------------------------- less for a guesser


def test_tombstone_keeps_a_size_bucket_and_no_media_type(db_url, tmp_path):
    store = _open(tmp_path / "data", db_url, tmp_path / "keys.db")
    ref = store.put(b"x" * 1500, "application/json", "acme")
    record = store.forget(ref.digest, "acme")
    assert record.size == 2048
    head = store.head(ref.digest, "acme")
    assert (head.state, head.size, head.media_type) == ("forgotten", 2048, "application/octet-stream")
    with store._session() as s:
        row = store._row(s, ref.digest, "acme")
        assert (row.size, row.media_type) == (2048, "application/octet-stream")
    again = store.put(b"x" * 1500, "application/json", "acme")  # revived: exact again
    assert (again.size, again.media_type) == (1500, "application/json")
    store.close()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_files_and_directories_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        data = tmp_path / "data"
        store = CasStore.open(data, chunk_size=1024)  # the default layout: data dir database and key dir
        ref = store.put(b"private " * 100, "text/plain", "acme")
        store.forget(store.put(b"gone", "text/plain", "acme").digest, "acme")
        with store._session() as s:
            blob = store.backend.path(store._row(s, ref.digest, "acme").blob_id)
        assert _mode(blob) == 0o600
        for d in (data, data / "blobs", data / "blobs" / "tmp", blob.parent, blob.parent.parent, data / "keys"):
            assert _mode(d) == 0o700, d
        db_files = [p for p in list(data.glob("*.db*")) + list((data / "keys").glob("*.db*"))]
        assert {p.name for p in db_files} >= {"fak.db", "cas-keys.db"}
        for p in db_files:
            assert _mode(p) == 0o600, p
        assert _mode(data / "master.key") == 0o600
        store.close()
    finally:
        os.umask(old)


def test_master_secret_file_mode_and_owner_are_checked(tmp_path):
    load_master_secret(tmp_path)
    path = tmp_path / "master.key"
    path.chmod(0o644)
    with pytest.raises(FakError, match=r"group or others \(mode 0644\); run: chmod 600"):
        load_master_secret(tmp_path)
    with pytest.raises(FakError, match="chmod 600"):
        CasStore.open(tmp_path)
    path.chmod(0o600)
    assert len(load_master_secret(tmp_path)) == 32
    if os.geteuid() == 0:  # only root can give the file away
        os.chown(path, 4242, -1)
        with pytest.raises(FakError, match="owned by uid 4242"):
            load_master_secret(tmp_path)


# ------------------------------------------------------------- migration from format 1


def _make_format1(store: CasStore) -> None:
    """Turn a store into what format 1 wrote: RFC 3394 wraps under KEKs derived from the
    master secret, a check value, no key database rows."""
    import blake3

    kek = derive_key(MASTER, "fak/cas/kek", b"v1")
    with store.keys.engine.connect() as conn:
        keys = list(conn.execute(sa.select(DataKey)))
    with store._writer() as s:
        for key in keys:  # format 1 kept its data keys in the CAS database
            dek = store._unwrap(key, key.tenant, key.key_id)
            s.add(LegacyDataKey(key_id=key.key_id, wrapped=legacy_wrap_key(kek, dek), kek_version=1, kek_id=None,
                                tenant=None, created_us=key.created_us))  # fmt: skip
        s.add(LegacyKek(version=1, check_value=blake3.blake3(b"fak/cas/kek-check", key=kek).hexdigest()[:32],
                        created_us=1))  # fmt: skip
        s.commit()


def test_format1_store_is_rewrapped_once_on_open(db_url, tmp_path):
    data, keys = tmp_path / "data", tmp_path / "keys.db"
    store = _open(data, db_url, keys)
    for t in ("acme", "globex"):  # format 1 keyed digests with a key derived from the tenant's name
        store.keys.set_digest_key(t, derive_key(MASTER, "fak/cas/digest-key", t.encode()))
    refs = {store.put(secrets.token_bytes(n), "application/octet-stream", t): t
            for n, t in ((50, "acme"), (3000, "acme"), (700, "globex"))}  # fmt: skip
    contents = {r.digest: store.get(r, t) for r, t in refs.items()}
    _make_format1(store)
    store.close()
    keys.unlink()  # format 1 had no key database

    with pytest.raises(KeyMismatch, match="format-1"):
        CasStore.open(data, db_url, master_secret=b"\x07" * 32, key_url=f"sqlite:///{tmp_path / 'k2.db'}")
    store = _open(data, db_url, keys)
    for r, t in refs.items():
        assert store.get(r, t) == contents[r.digest]
        assert store.digest_of(contents[r.digest], t) == r.digest  # existing digests stay valid
    with store._session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LegacyKek)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(LegacyDataKey)) == 0  # moved to the key database
    with store.keys.engine.connect() as conn:
        assert len(list(conn.execute(sa.select(DataKey).where(DataKey.kek_id.is_not(None))))) == 3
    with store.keys._session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TenantKey).where(TenantKey.kind == DIGEST)) == 2
    assert store._migrate_legacy(MASTER) == 0  # once
    store.rotate()
    store.destroy_retired(0)
    assert all(store.get(r, t) == contents[r.digest] for r, t in refs.items())
    store.close()


def test_wrong_provider_interface_is_a_clear_error(tmp_path):
    from fak.cas.errors import CasError

    with pytest.raises(CasError, match="format-1 interface"):
        _open(tmp_path / "d", f"sqlite:///{tmp_path / 'f.db'}", tmp_path / "k.db", kek_provider=lambda v: b"k" * 32)


def test_default_store_keeps_keys_out_of_the_cas_database(tmp_path):
    store = CasStore.open(StorageSettings().data_dir)
    store.put(b"x", "text/plain", "acme")
    names = set(sa.inspect(store.engine).get_table_names())
    assert "cas_tenant_keys" not in names and "cas_data_keys" not in names
    assert {"cas_tenant_keys", "cas_data_keys"} <= set(sa.inspect(store.keys.engine).get_table_names())
    with store._session() as s:  # the table where data keys lived before issue 25 stays empty
        assert s.scalar(sa.select(sa.func.count()).select_from(LegacyDataKey)) == 0
    assert Path(store.keys.engine.url.database).parent == StorageSettings().data_dir / "keys"
    with store._session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Blob)) == 1
    store.close()


def test_erasure_by_another_process_is_not_undone_by_its_cached_digest_key(tmp_path):
    url, keys = f"sqlite:///{tmp_path / 'fak.db'}", tmp_path / "keys.db"
    a, b = _open(tmp_path / "data", url, keys), _open(tmp_path / "data", url, keys)
    old = b.put(b"before", "text/plain", "acme")  # b caches acme's digest key and KEK
    a.erase_tenant("acme")
    from fak.cas.errors import CasError

    with pytest.raises(CasError, match="erased while this put ran"):
        b.put(b"after", "text/plain", "acme")
    new = b.put(b"after", "text/plain", "acme")  # the retry uses the tenant's new keys
    assert a.get(new, "acme") == b"after" and a.digest_of(b"before", "acme") != old.digest
    a.close()
    b.close()


class _Kms:
    """A stand-in for a KMS: its own key, the AAD as encryption context."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead, self.calls = AESGCM(key), 0

    def wrap(self, key: bytes, aad: bytes) -> bytes:
        self.calls += 1
        nonce = secrets.token_bytes(12)
        return nonce + self._aead.encrypt(nonce, key, aad)

    def unwrap(self, wrapped: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        self.calls += 1
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], aad)
        except InvalidTag:
            raise KeyMismatch("the KMS key does not open this tenant key") from None


def test_kek_provider_wraps_tenant_keys(tmp_path):
    url, keys = f"sqlite:///{tmp_path / 'fak.db'}", tmp_path / "keys.db"
    kms_key = secrets.token_bytes(32)
    kms = _Kms(kms_key)
    store = _open(tmp_path / "data", url, keys, kek_provider=kms)
    ref = store.put(b"under the KMS", "text/plain", "acme")
    assert kms.calls >= 3  # check key, digest key, KEK
    store.close()
    store = _open(tmp_path / "data", url, keys, kek_provider=_Kms(kms_key))
    assert store.get(ref, "acme") == b"under the KMS"
    store.close()
    with pytest.raises(KeyMismatch, match="KEK provider"):
        _open(tmp_path / "data", url, keys, kek_provider=_Kms(secrets.token_bytes(32)))
    with pytest.raises(KeyMismatch):  # nor does the master secret open what the KMS wrapped
        _open(tmp_path / "data", url, keys)
