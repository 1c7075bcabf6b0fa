"""The CAS store against real SQLite and real PostgreSQL (the ``db_url`` fixture)."""

from __future__ import annotations

import io
import os
import secrets

import pytest
import sqlalchemy as sa
from support.at_rest import raw_bytes_under

from fak.cas import (
    CasError,
    CasStore,
    Forgotten,
    IntegrityError,
    InvalidDigest,
    InvalidInput,
    KeyMismatch,
    NotFound,
    TooLarge,
)
from fak.cas.schema import DataKey
from fak.settings import StorageSettings

CHUNK = 1024  # small chunks so a few KiB exercise multi-chunk streams


@pytest.fixture
def store(db_url):
    s = CasStore.open(StorageSettings().data_dir, db_url, chunk_size=CHUNK)
    yield s
    s.close()


def _blob_files(store: CasStore) -> list[str]:
    return list(store.backend.ids())


def _flip_byte(store: CasStore, digest: str, tenant: str, offset: int) -> None:
    with store._session() as s:
        row = store._row(s, digest, tenant)
    path = store.backend.path(row.blob_id)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("size", [1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 7])
def test_round_trip(store, size):
    data = secrets.token_bytes(size)
    ref = store.put(data, "application/octet-stream", "acme")
    assert ref.size == size and ref.tenant == "acme" and ref.state == "live"
    assert ref.digest.startswith("blake3k:")
    assert store.get(ref, "acme") == data
    assert store.get(ref.digest, "acme") == data
    assert store.head(ref.digest, "acme") == ref


def test_public_digest_round_trip(store):
    ref = store.put(b"public content", "text/plain", "acme", keyed=False, taint="trusted")
    assert ref.digest.startswith("blake3:") and ref.taint == "trusted"
    assert store.get(ref, "acme") == b"public content"


def test_put_is_idempotent_and_stores_one_blob(store):
    data = b"tool result " * 500
    first = store.put(data, "text/plain", "acme")
    again = store.put(bytearray(data), "text/plain", "acme")
    streamed = store.put_stream(io.BytesIO(data), "text/plain", "acme")
    assert first == again == streamed
    assert len(_blob_files(store)) == 1
    assert len(store.list_refs("acme")) == 1


def test_reput_only_makes_taint_stricter(store):
    ref = store.put(b"x" * 10, "text/plain", "acme", taint="trusted")
    assert store.put(b"x" * 10, "text/plain", "acme", taint="quarantined").taint == "quarantined"
    assert store.put(b"x" * 10, "text/plain", "acme", taint="trusted").taint == "quarantined"
    assert store.set_taint(ref.digest, "acme", "trusted").taint == "trusted"


def test_empty_blob_always_exists(store):
    empty = store.empty_digest("acme")
    assert store.head(empty, "acme").size == 0
    assert store.get(empty, "acme") == b""
    assert store.missing([empty], "acme") == []
    assert store.put(b"", "text/plain", "acme").digest == empty
    assert store.put_stream(iter([]), "text/plain", "acme").digest == empty
    assert _blob_files(store) == []


# ---------------------------------------------------------------- tenants


def test_keyed_digests_separate_tenants(store):
    data = b"the same bytes for two tenants"
    a = store.put(data, "text/plain", "acme")
    b = store.put(data, "text/plain", "globex")
    assert a.digest != b.digest
    for ref, other in ((a, "globex"), (b, "acme")):
        with pytest.raises(NotFound):
            store.get(ref.digest, other)
        with pytest.raises(NotFound):
            store.get(ref, other)  # a ref object of another tenant is refused the same way
        assert store.head(ref.digest, other) is None
        assert store.missing([ref.digest], other) == [ref.digest]


def test_public_digest_same_bytes_two_tenants_are_independent(store):
    a = store.put(b"shared page", "text/html", "acme", keyed=False)
    b = store.put(b"shared page", "text/html", "globex", keyed=False)
    assert a.digest == b.digest
    store.forget(a.digest, "acme")
    assert store.get(b, "globex") == b"shared page"


def test_no_existence_oracle_across_tenants(store):
    ref = store.put(b"secret of acme", "text/plain", "acme", keyed=False)
    store.forget(ref.digest, "acme")
    unknown = "blake3:" + "0" * 64
    errors = []
    for digest in (ref.digest, unknown):
        with pytest.raises(NotFound) as info:
            store.get(digest, "globex")
        errors.append(str(info.value).replace(digest, "<d>"))
    assert errors[0] == errors[1]
    with pytest.raises(NotFound):
        store.forget(ref.digest, "globex")
    with pytest.raises(NotFound):
        store.where_used(ref.digest, "globex")


# ---------------------------------------------------------------- integrity


@pytest.mark.parametrize("where", ["header", "first chunk", "last chunk", "commit tag"])
def test_corruption_is_detected(store, where):
    data = secrets.token_bytes(3 * CHUNK + 100)
    ref = store.put(data, "application/octet-stream", "acme")
    offset = {"header": 3, "first chunk": 20, "last chunk": -40, "commit tag": -3}[where]
    _flip_byte(store, ref.digest, "acme", offset)
    with pytest.raises(IntegrityError):
        store.get(ref, "acme")


def test_corruption_detected_without_encryption(db_url):
    store = CasStore.open(StorageSettings().data_dir, db_url, encrypt=False, chunk_size=CHUNK)
    ref = store.put(b"plain bytes " * 300, "text/plain", "acme")
    assert store.get(ref, "acme") == b"plain bytes " * 300
    _flip_byte(store, ref.digest, "acme", -1)
    with pytest.raises(IntegrityError, match="does not match its digest"):
        store.get(ref, "acme")
    store.close()


def test_truncated_and_swapped_blobs_are_detected(store):
    a = store.put(secrets.token_bytes(2 * CHUNK), "application/octet-stream", "acme")
    b = store.put(secrets.token_bytes(2 * CHUNK), "application/octet-stream", "acme")
    with store._session() as s:
        pa, pb = (store.backend.path(store._row(s, r.digest, "acme").blob_id) for r in (a, b))
    raw_a, raw_b = pa.read_bytes(), pb.read_bytes()
    pb.write_bytes(raw_a)  # same length, other blob's ciphertext
    with pytest.raises(IntegrityError):
        store.get(b, "acme")
    pa.write_bytes(raw_a[:-20])
    with pytest.raises(IntegrityError):
        store.get(a, "acme")
    # reorder chunks inside one blob
    h = 12
    c0, c1 = raw_b[h : h + CHUNK + 16], raw_b[h + CHUNK + 16 : h + 2 * (CHUNK + 16)]
    pb.write_bytes(raw_b[:h] + c1 + c0 + raw_b[h + 2 * (CHUNK + 16) :])
    with pytest.raises(IntegrityError):
        store.get(b, "acme")


def test_wrong_size_in_ref_is_refused(store):
    ref = store.put(b"12345", "text/plain", "acme")
    with pytest.raises(IntegrityError, match="claims"):
        store.get(ref.model_copy(update={"size": 4}), "acme")


def test_stream_round_trip_and_chunks(store):
    data = secrets.token_bytes(7 * CHUNK + 3)
    pieces = [data[i : i + 333] for i in range(0, len(data), 333)]
    ref = store.put_stream(iter(pieces), "application/octet-stream", "acme")
    assert ref == store.put(data, "application/octet-stream", "acme")
    chunks = list(store.get_stream(ref, "acme"))
    assert b"".join(chunks) == data
    assert max(len(c) for c in chunks) == CHUNK


def test_stream_verifies_before_last_chunk(store):
    ref = store.put(secrets.token_bytes(4 * CHUNK), "application/octet-stream", "acme")
    _flip_byte(store, ref.digest, "acme", -30)  # inside the last chunk
    stream = store.get_stream(ref, "acme")
    got = [next(stream) for _ in range(3)]  # the three intact chunks authenticate
    assert len(got) == 3
    with pytest.raises(IntegrityError):
        next(stream)


# ---------------------------------------------------------------- limits and input


def test_too_large_is_clear_and_leaves_nothing(db_url):
    store = CasStore.open(StorageSettings().data_dir, db_url, max_blob_size=3 * CHUNK, chunk_size=CHUNK)
    with pytest.raises(TooLarge, match="maximum"):
        store.put(b"x" * (3 * CHUNK + 1), "text/plain", "acme")
    with pytest.raises(TooLarge):
        store.put_stream(io.BytesIO(b"y" * (10 * CHUNK)), "text/plain", "acme")
    assert store.put(b"x" * (3 * CHUNK), "text/plain", "acme").size == 3 * CHUNK
    assert len(_blob_files(store)) == 1
    assert list(store.backend.tmp_dir.iterdir()) == []
    store.close()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.put(b"x", "text plain", "acme"), InvalidInput),
        (lambda s: s.put(b"x", "text/plain", ""), InvalidInput),
        (lambda s: s.put(b"x", "text/plain", "acme", taint="dirty"), InvalidInput),
        (lambda s: s.put("text", "text/plain", "acme"), CasError),
        (lambda s: s.get("blake3k:nothex", "acme"), InvalidDigest),
        (lambda s: s.get("blake3k:" + "0" * 64, "acme"), NotFound),
        (lambda s: s.missing(["sha1:abc"], "acme"), InvalidDigest),
        (lambda s: s.record_use("blake3k:" + "0" * 64, "acme", "segment", "s/1"), NotFound),
    ],
)
def test_bad_input_is_a_clear_fak_error(store, call, error):
    with pytest.raises(error):
        call(store)


def test_missing_lists_unknown_and_forgotten_in_order(store):
    a = store.put(b"a" * 10, "text/plain", "acme")
    b = store.put(b"b" * 10, "text/plain", "acme")
    store.forget(b.digest, "acme")
    unknown = "blake3k:" + "1" * 64
    assert store.missing([unknown, a.digest, b.digest], "acme") == [unknown, b.digest]


def test_pin_and_unpin(store):
    ref = store.put(b"keep me", "text/plain", "acme")
    assert store.pin(ref.digest, "acme").pinned
    assert store.head(ref.digest, "acme").pinned
    assert not store.unpin(ref.digest, "acme").pinned


def test_where_used(store):
    ref = store.put(b"used by kv units", "text/plain", "acme")
    store.record_use(ref.digest, "acme", "segment", "sess-1/4")
    store.record_use(ref.digest, "acme", "prefix_node", "n-17")
    store.record_use(ref.digest, "acme", "segment", "sess-1/4")  # idempotent
    units = [(u.unit_kind, u.unit_id) for u in store.where_used(ref.digest, "acme")]
    assert units == [("prefix_node", "n-17"), ("segment", "sess-1/4")]
    assert store.release_use(ref.digest, "acme", "prefix_node", "n-17")
    assert not store.release_use(ref.digest, "acme", "prefix_node", "n-17")
    assert [u.unit_id for u in store.where_used(ref.digest, "acme")] == ["sess-1/4"]


# ---------------------------------------------------------------- forget


def test_forget_destroys_key_and_ciphertext(store, db_url, tmp_path):
    marker = b"FAK-MARKER-" + secrets.token_hex(12).encode()
    data = marker * 50
    ref = store.put(data, "text/plain", "acme")
    store.record_use(ref.digest, "acme", "segment", "s/1")
    store.pin(ref.digest, "acme")
    with store._session() as s:
        row = store._row(s, ref.digest, "acme")
        key_id, blob_id = row.key_id, row.blob_id
    wrapped = store.keys.data.row(key_id).wrapped
    roots = (StorageSettings().data_dir, tmp_path)
    assert marker not in raw_bytes_under(*roots)  # encrypted at rest
    if db_url.startswith("sqlite"):
        assert wrapped in raw_bytes_under(*roots)  # the scan does find key material in the db files

    record = store.forget(ref.digest, "acme")
    assert record.key_id == key_id and record.blob_id == blob_id
    assert record.key_deleted and record.ciphertext_deleted and record.was_pinned
    # SQLite: nobody else reads this file; PostgreSQL: the shared test database may hold an
    # older snapshot (another suite), and then the store must say so rather than claim it
    assert record.crypto_shredded == (record.shred_status == "destroyed")
    if db_url.startswith("sqlite"):
        assert record.shred_status == "destroyed" and record.wal_checkpointed
    assert [(u.unit_kind, u.unit_id) for u in record.uses_released] == [("segment", "s/1")]
    assert wrapped.hex() not in record.model_dump_json()

    with pytest.raises(Forgotten, match="forgotten"):
        store.get(ref, "acme")
    with pytest.raises(Forgotten):
        store.pin(ref.digest, "acme")
    assert store.head(ref.digest, "acme").state == "forgotten"
    assert store.where_used(ref.digest, "acme") == []
    assert store.backend.size(blob_id) is None
    assert store.keys.data.row(key_id) is None
    raw = raw_bytes_under(*roots)
    assert marker not in raw
    if db_url.startswith("sqlite"):
        assert wrapped not in raw  # secure_delete + WAL truncate: the key bytes are gone from the files
    again = store.forget(ref.digest, "acme")
    assert again.already_forgotten and not again.crypto_shredded


def test_forget_plaintext_scan_on_unencrypted_store(db_url, tmp_path):
    """Without encryption the scan finds the marker, so the scan itself can fail;
    after forget the file is gone and the marker with it."""
    store = CasStore.open(StorageSettings().data_dir, db_url, encrypt=False)
    marker = b"FAK-PLAIN-" + secrets.token_hex(12).encode()
    ref = store.put(marker * 20, "text/plain", "acme")
    roots = (StorageSettings().data_dir, tmp_path)
    assert marker in raw_bytes_under(*roots)
    record = store.forget(ref.digest, "acme")
    assert record.ciphertext_deleted and not record.crypto_shredded and record.key_id is None
    assert marker not in raw_bytes_under(*roots)
    store.close()


def test_put_after_forget_revives_with_a_fresh_key(store):
    ref = store.put(b"comes back", "text/plain", "acme")
    first = store.forget(ref.digest, "acme")
    again = store.put(b"comes back", "text/plain", "acme")
    assert again.digest == ref.digest and again.state == "live"
    assert store.get(again, "acme") == b"comes back"
    assert store.forget(ref.digest, "acme").key_id != first.key_id


# ---------------------------------------------------------------- keys


def test_kek_rotation_keeps_every_live_blob_readable(store):
    blobs = {store.put(secrets.token_bytes(n), "application/octet-stream", t): t
             for n, t in ((10, "acme"), (3000, "acme"), (500, "globex"))}  # fmt: skip
    contents = {ref.digest: store.get(ref, t) for ref, t in blobs.items()}
    gone = store.put(b"forgotten before rotation", "text/plain", "acme")
    store.forget(gone.digest, "acme")
    with store.keys.engine.connect() as conn:  # data keys live in the key database
        before = {k.key_id: k.wrapped for k in conn.execute(sa.select(DataKey))}
    first = store.rotate()
    assert first.versions == {"acme": 2, "globex": 2} and first.rewrapped == len(blobs)
    assert store.rotate("acme").versions == {"acme": 3}
    with store.keys.engine.connect() as conn:
        after = {k.key_id: (k.wrapped, k.kek_version, k.tenant) for k in conn.execute(sa.select(DataKey))}
    assert after.keys() == before.keys()
    assert all(w != before[k] and v == (3 if t == "acme" else 2) for k, (w, v, t) in after.items())
    assert [(i.tenant, i.version, i.active) for i in store.kek_versions()] == [
        ("acme", 1, False), ("acme", 2, False), ("acme", 3, True), ("globex", 1, False), ("globex", 2, True)]
    assert [i.keys for i in store.kek_versions("acme")] == [0, 0, 2]
    for ref, t in blobs.items():
        assert store.get(ref, t) == contents[ref.digest]
    new = store.put(b"after rotation", "text/plain", "acme")
    assert store.get(new, "acme") == b"after rotation"


def test_wrong_master_secret_is_refused(db_url):
    CasStore.open(StorageSettings().data_dir, db_url, master_secret=b"\x01" * 32).close()
    with pytest.raises(KeyMismatch, match="master secret"):
        CasStore.open(StorageSettings().data_dir, db_url, master_secret=b"\x02" * 32)


def test_reopen_reads_back(db_url):
    store = CasStore.open(StorageSettings().data_dir, db_url)
    ref = store.put(b"durable", "text/plain", "acme")
    store.close()
    reopened = CasStore.open(StorageSettings().data_dir, db_url)
    assert reopened.get(ref, "acme") == b"durable"
    reopened.close()


def test_fsck_reports_and_removes_orphans(store):
    ref = store.put(b"kept", "text/plain", "acme")
    w = store.backend.new_writer("f" * 32)
    w.write(b"ciphertext of a writer killed before its commit")
    w.commit()
    report = store.fsck()
    assert report.live_refs == 1 and report.orphans == ["f" * 32] and not report.missing
    assert store.fsck(remove_orphans=True, older_than=3600).orphans_removed == 0  # too young
    assert store.fsck(remove_orphans=True, older_than=0).orphans_removed == 1
    with store._session() as s:
        os.unlink(store.backend.path(store._row(s, ref.digest, "acme").blob_id))
    assert store.fsck().missing == [f"acme {ref.digest}"]
