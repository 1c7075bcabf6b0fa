"""Erasure that survives backups of the main database (issue 25, item 2).

A copy of the main database taken before a forget must not keep what the forget erased:
not the ref's bytes, not the text or token ids of a turn generated (or quoted) while the
ref was in attention, and nothing in it may decrypt once the forget completed, with the
master secret and the key database as they are after the forget."""

from __future__ import annotations

import json
import shutil
import sqlite3
from array import array
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.kernel_facade_helpers import WEATHER

from fak.cas import CasStore, KeyDestroyed
from fak.errors import FakError

SECRET = b"Booking reference QX7Y2Z for passenger Ada Lovelace, card ending 4242, seat 14C."


def _packed(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()


def _needles(texts: list[bytes], token_runs: list[list[int]]) -> list[bytes]:
    """What must not be in the copy: each text (and a distinctive slice of it) and each run
    of token ids, packed as int32 (the ledger's encoding) and as a JSON list."""
    out: list[bytes] = []
    for t in texts:
        out += [t, t[:24], t[-24:]] if len(t) >= 24 else [t]
    for run in token_runs:
        out += [_packed(run), json.dumps(run)[1:-1].encode(), ",".join(map(str, run)).encode()]
    return [n for n in out if len(n) >= 6]


def _values(path: Path) -> list[bytes]:
    """Every value of every row of every table of a SQLite file, as bytes."""
    out: list[bytes] = []
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for t in tables:
            for row in con.execute(f'SELECT * FROM "{t}"'):
                for v in row:
                    if isinstance(v, bytes):
                        out.append(v)
                    elif v is not None:
                        out.append(str(v).encode())
    finally:
        con.close()
    return out


def test_backup_taken_before_forget_reveals_nothing(kernel, settings, tmp_path) -> None:
    k = kernel
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    s.append("user", "What is my booking?")
    ref = s.admit("booking", SECRET).ref
    s.admit("weather", WEATHER)
    generated = list(s.generate(max_tokens=12, min_tokens=12))  # produced while the ref was in attention
    quote = "Your booking: " + SECRET.decode()
    s.append("assistant", quote)  # a turn quoting the ref (a client resending its history)
    s.append("user", "Thanks.")
    assistants = [x for x in s.ledger() if x["kind"] == "assistant"]
    assert len(assistants) == 2 and all(ref in x["content_provenance"] for x in assistants)
    tok = k.tokenizer
    mech = s._loaded()
    texts = [SECRET, quote.encode()]
    runs = [tok.encode(SECRET.decode()), generated]
    for x in assistants:
        seg = mech.ledger.get(x["id"])
        runs.append(seg.tokens[4:-2])  # without the turn's opener and closing, shared by every turn
        message = mech.message(seg.id)
        assert message is not None
        text = message["content"].encode()
        if len(text.strip()) >= 8:
            texts.append(text.strip())
    needles = _needles(texts, runs)

    main = Path(settings.data_dir) / "fak.db"
    copy = tmp_path / "backup" / "fak.db"
    copy.parent.mkdir()
    src, dst = sqlite3.connect(main), sqlite3.connect(copy)
    src.backup(dst)  # SQLite's online backup: a consistent copy, the WAL included
    src.close()
    dst.close()
    shutil.copytree(Path(settings.data_dir) / "blobs", tmp_path / "backup" / "blobs")  # the blobs, backed up too

    receipt = k.forget("acme", ref, requested_by="dpo@acme", reason="gdpr_art17")
    kinds = {u.kind for u in receipt.units_dropped}
    assert "generated_segment" in kinds and receipt.shred_status == "destroyed"
    k.close()

    # 1. no plaintext and no token ids of the ref or of the generated text, in any value or byte
    raw = copy.read_bytes()
    values = _values(copy)
    for needle in needles:
        assert needle not in raw, f"the backup's file holds {needle[:40]!r}"
        assert not any(needle in v for v in values), f"a row of the backup holds {needle[:40]!r}"

    # 2. nothing in it decrypts with the master secret and the key database after the forget
    from fak.state.seal import open_segment

    restored = tmp_path / "restored"
    shutil.copytree(tmp_path / "backup", restored)
    shutil.copytree(Path(settings.data_dir) / "keys", restored / "keys")
    shutil.copy2(Path(settings.data_dir) / "master.key", restored / "master.key")
    store = CasStore.open(restored, f"sqlite:///{restored / 'fak.db'}")
    try:
        with pytest.raises(FakError):  # KeyDestroyed now; the bytes themselves before issue 25
            store.get(ref, "acme")
        engine = sa.create_engine(f"sqlite:///{restored / 'fak.db'}")
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT * FROM fak_segments WHERE kind = 'assistant'")).mappings().all()
        engine.dispose()
        assert len(rows) == 2
        for row in rows:
            assert row["tokens"] is None and row["message_text"] is None  # sealed, not in the clear
            with pytest.raises(KeyDestroyed):  # the ref's data key is gone: no key derives
                open_segment(store, dict(row))
    finally:
        store.close()


def test_generated_segments_survive_a_restart_sealed(kernel, settings, tiny_lm) -> None:
    """Sealing is transparent: a restarted kernel rebuilds the session bit-exact from sealed
    rows; a forget of a ref admitted after a turn leaves that turn readable, a forget of a
    ref it derives from drops it."""
    from fak import Kernel

    k = kernel
    s = k.create_session("acme", "sealed")
    s.append("user", "What is my booking?")
    ref = s.admit("booking", SECRET).ref
    list(s.generate(max_tokens=6, min_tokens=6))
    s.append("assistant", "Quoted: " + SECRET.decode())
    later = s.admit("weather", WEATHER).ref  # admitted after both turns: they do not derive from it
    fp = s.fingerprint()
    k.close()
    k2 = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        again = k2.session("acme", "sealed")
        assert again.fingerprint() == fp
        k2.forget("acme", later)
        k2.close()
        k2 = Kernel.open(settings, model=tiny_lm, progress=None)
        again = k2.session("acme", "sealed")
        live = [x for x in again.ledger() if x["kind"] == "assistant" and x["state"] == "live"]
        assert len(live) == 2  # still decrypted and replayed after the restart
        assert again.fingerprint() == again.replay_fingerprint()
        k2.forget("acme", ref)
        assert [x for x in again.ledger() if x["kind"] == "assistant" and x["state"] == "live"] == []
    finally:
        k2.close()


def test_a_store_written_before_sealing_is_sealed_on_open(kernel, settings, tiny_lm) -> None:
    """Rows a pre-issue-25 kernel wrote in the clear (tokens and text of a turn derived from
    a ref) and data keys it kept in the main database are moved out on the next open."""
    from fak import Kernel
    from fak.cas.schema import DataKey, LegacyDataKey
    from fak.state.seal import open_segment
    from fak.state.store import pack_tokens

    k = kernel
    s = k.create_session("acme", "old")
    s.append("user", "What is my booking?")
    s.admit("booking", SECRET)
    quote = "Quoted from an old kernel: " + SECRET.decode()
    s.append("assistant", quote)
    fp = s.fingerprint()
    url = f"sqlite:///{Path(settings.data_dir) / 'fak.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # what the old code stored: plaintext tokens and text
        row = conn.execute(sa.text("SELECT * FROM fak_segments WHERE kind = 'assistant'")).mappings().one()
        plain = open_segment(k.store, dict(row))
        conn.execute(sa.text("UPDATE fak_segments SET sealed = NULL, tokens = :t, message_role = :r, message_text = :m "
                             "WHERE id = :id"), {"t": pack_tokens(plain.tokens), "r": plain.role, "m": plain.text,
                                                 "id": row["id"]})  # fmt: skip
    with k.store.keys.engine.connect() as conn:  # and its data keys, in the main database
        keys = [dict(r._mapping) for r in conn.execute(sa.select(DataKey))]
    with engine.begin() as conn:
        conn.execute(sa.insert(LegacyDataKey), keys)
    with k.store.keys.engine.begin() as conn:
        conn.execute(sa.delete(DataKey))
    engine.dispose()
    k.close()
    main = Path(settings.data_dir) / "fak.db"

    def raw() -> bytes:
        wal = Path(str(main) + "-wal")
        return main.read_bytes() + (wal.read_bytes() if wal.exists() else b"")

    assert quote.encode() in raw() and any(key["wrapped"] in raw() for key in keys)

    k2 = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        raw = raw()
        assert quote.encode() not in raw and SECRET not in raw
        assert not any(key["wrapped"] in raw for key in keys)  # moved to the key database, scrubbed here
        with k2.store.keys.engine.connect() as conn:
            assert conn.scalar(sa.select(sa.func.count()).select_from(DataKey)) == len(keys)
        assert k2.session("acme", "old").fingerprint() == fp
    finally:
        k2.close()


@pytest.mark.postgres
def test_postgres_copy_taken_before_forget_reveals_nothing(pg_url, tmp_path, tiny_dir, tiny_lm) -> None:
    """The same on PostgreSQL: every row of every table of the main database, read in one
    transaction before the forget (what a dump holds), holds no plaintext and no token ids,
    and names no data key that still exists afterwards."""
    from fak import Kernel, Settings
    from fak.state.seal import open_segment

    settings = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, database_url=pg_url)
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s = k.session("acme")
        s.append("user", "What is my booking?")
        ref = s.admit("booking", SECRET).ref
        generated = list(s.generate(max_tokens=8, min_tokens=8))
        quote = "Your booking: " + SECRET.decode()
        s.append("assistant", quote)
        needles = _needles([SECRET, quote.encode()], [k.tokenizer.encode(quote), generated])
        engine = sa.create_engine(pg_url)
        with engine.connect() as conn, conn.begin():
            tables = sa.inspect(conn).get_table_names()
            dump = {t: [dict(r._mapping) for r in conn.execute(sa.text(f'SELECT * FROM "{t}"'))] for t in tables}
        engine.dispose()
        k.forget("acme", ref)
        values = [v if isinstance(v, bytes) else str(v).encode() for rows in dump.values() for r in rows
                  for v in r.values() if v is not None]  # fmt: skip
        for needle in needles:
            assert not any(needle in v for v in values), f"the copy holds {needle[:40]!r}"
        key_ids = [r["key_id"] for r in dump["cas_blobs"] if r["digest"] == ref]
        assert key_ids and all(k.store.keys.data.row(x) is None for x in key_ids)  # its key is gone
        assert dump.get("cas_keys", []) == []  # no data key was ever in the main database
        sealed = [r for r in dump["fak_segments"] if r["kind"] == "assistant"]
        assert len(sealed) == 2 and all(r["sealed"] and r["tokens"] is None for r in sealed)
        for row in sealed:
            with pytest.raises(FakError):
                open_segment(k.store, row)


def test_sealing_clear_rows_reads_the_keys_once_per_tenant(kernel, settings) -> None:
    """The open-time migration of clear rows reads a tenant's data keys once, not once per row."""
    from fak.state.seal import open_segment
    from fak.state.store import pack_tokens

    k = kernel
    s = k.create_session("acme", "many")
    s.append("user", "What is my booking?")
    s.admit("booking", SECRET)
    for i in range(3):
        s.append("assistant", f"turn {i}")
    engine = sa.create_engine(f"sqlite:///{Path(settings.data_dir) / 'fak.db'}")
    with engine.begin() as conn:
        rows = conn.execute(sa.text("SELECT * FROM fak_segments WHERE kind = 'assistant'")).mappings().all()
        assert len(rows) == 3
        for row in rows:
            plain = open_segment(k.store, dict(row))
            conn.execute(sa.text("UPDATE fak_segments SET sealed = NULL, tokens = :t, message_role = :r, "
                                 "message_text = :m WHERE id = :id"),
                         {"t": pack_tokens(plain.tokens), "r": plain.role, "m": plain.text, "id": row["id"]})
    engine.dispose()
    calls = []

    class Counting:
        def content_keys(self, tenant, digests):
            calls.append(tenant)
            return k.store.content_keys(tenant, digests)

    assert k.state.seal_clear_segments(Counting()) == (3, 0)
    assert calls == ["acme"]
