"""The stored log on SQLite and real PostgreSQL: gap-free group-committed appends,
append-only tables, signed checkpoints, proofs, receipts, tenants, reopen."""

from __future__ import annotations

import os
import stat
import threading

import pytest
import sqlalchemy as sa

from fak.audit import (
    AuditError,
    AuditLog,
    DroppedUnit,
    ForgetCompleted,
    ForgetReceipt,
    ForgetRequested,
    PolicyLoaded,
    SessionFingerprints,
    merkle,
    note,
    verify_receipt,
    verify_tlog_proof,
)
from fak.audit.checkpoint import open_checkpoint
from fak.audit.signing import KEY_FILE

P = "sha256:" + "cd" * 32


def ev(i: int, tenant: str = "") -> PolicyLoaded:
    return PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=tenant)


@pytest.fixture
def log(db_url, tmp_path):
    lg = AuditLog.open(url=db_url, data_dir=tmp_path, checkpoint_every=50)
    yield lg
    lg.close()


def test_append_proofs_and_checkpoints(log):
    idx = [log.append(ev(i, tenant="acme" if i % 2 else "")) for i in range(37)]
    assert idx == list(range(37))
    cp = log.checkpoint()
    verifier = note.Verifier.parse(log.public_key())
    assert open_checkpoint(cp.note, verifier, log.origin).size == 37
    mem = merkle.MemoryTree()
    for e in log.entries():
        mem.append(e.body)
    assert mem.root() == cp.root == log.root()
    for i in (0, 17, 36):
        p = log.inclusion_proof(i)
        assert p.tree_size == 37 and p.checkpoint == cp.note
        p.verify(log.entry(i).leaf_hash)
        index, tcp = verify_tlog_proof(p.to_tlog_proof(), log.public_key(), log.entry(i).body)
        assert (index, tcp.size) == (i, 37)
        with pytest.raises(AuditError):
            verify_tlog_proof(p.to_tlog_proof(), log.public_key(), log.entry((i + 1) % 37).body)
    for i in range(0, 37, 6):  # proofs at older sizes, from stored subtrees
        for n in range(i + 1, 38, 7):
            p = log.inclusion_proof(i, n)
            assert p.root_hash == mem.root(n)
            p.verify(merkle.hash_leaf(log.entry(i).body))
    for n1 in range(0, 38, 5):
        c = log.consistency_proof(n1)
        c.verify()
        assert c.root1 == mem.root(n1)
    assert [e.index for e in log.entries(tenant="acme")] == list(range(1, 37, 2))
    assert [e.index for e in log.entries(tenant="")] == list(range(0, 37, 2))
    assert [e.index for e in log.entries(start=30, stop=33)] == [30, 31, 32]
    with pytest.raises(AuditError):
        log.entry(37)
    with pytest.raises(AuditError):
        log.inclusion_proof(37)


def test_checkpoints_every_n_entries_are_consistent(log):
    for i in range(131):  # one commit each, so the every-50 rule sees each size
        log.append(ev(i))
    log.checkpoint()
    cps = log.checkpoints()
    sizes = [c.size for c in cps]
    assert sizes == sorted(sizes) and sizes[-1] == 131
    assert 50 in sizes and 100 in sizes  # the every-50 trigger fired on its own
    for a, b in zip(cps, cps[1:], strict=False):
        c = log.consistency_proof(a.size, b.size)
        assert (c.root1, c.root2) == (a.root, b.root)
        c.verify()


def test_log_tables_refuse_update_and_delete(log, db_url):
    log.append(ev(1))
    log.checkpoint()
    engine = sa.create_engine(db_url)
    try:
        for stmt in (
            "UPDATE audit_entries SET tenant = 'x'",
            "DELETE FROM audit_entries",
            "UPDATE audit_nodes SET hash = hash",
            "DELETE FROM audit_nodes",
            "UPDATE audit_checkpoints SET note = 'x'",
            "DELETE FROM audit_checkpoints",
        ):
            with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
                conn.execute(sa.text(stmt))
        if engine.dialect.name == "postgresql":
            with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
                conn.execute(sa.text("TRUNCATE audit_entries CASCADE"))
    finally:
        engine.dispose()
    assert log.size() == 1 and log.entry(0).event == log.entry(0).event


def test_concurrent_appends_are_gap_free_and_verifiable(log, tmp_path):
    got: list[list[int]] = [[] for _ in range(8)]

    def worker(k: int) -> None:
        mine = [ev(k * 10_000 + i, tenant=f"t{k}") for i in range(1250)]
        if k % 2:  # half the threads keep many appends in flight, half block on each
            futs = [log.submit(e) for e in mine]
            got[k] = [f.result() for f in futs]
        else:
            got[k] = [log.append(e) for e in mine]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = sorted(i for g in got for i in g)
    assert flat == list(range(10_000))
    for k in range(8):  # each thread's appends keep their submission order
        assert got[k] == sorted(got[k])
        assert [e.event.policy_id for e in log.entries(tenant=f"t{k}")] == [f"p{k * 10_000 + i}" for i in range(1250)]
    path = tmp_path / "export.log"
    assert log.export(path) == 10_000
    report = AuditLog.verify_export(path, pubkey=log.public_key())
    assert report.ok, report.summary()
    assert report.entries == 10_000 and report.signed_size == 10_000


def test_reopen_continues_the_same_tree(db_url, tmp_path):
    with AuditLog.open(url=db_url, data_dir=tmp_path) as a:
        for i in range(11):
            a.append(ev(i))
        first = a.checkpoint()
        key = a.public_key()
    with AuditLog.open(url=db_url, data_dir=tmp_path) as b:
        assert b.public_key() == key
        assert b.append(ev(11)) == 11
        second = b.checkpoint()
        c = b.consistency_proof(first.size, second.size)
        assert c.root1 == first.root
        c.verify()


def test_two_logs_on_one_database_share_gap_free_indexes(db_url, tmp_path):
    """Two writers (as two processes would be) serialise on the database lock."""
    with AuditLog.open(url=db_url, data_dir=tmp_path) as a, AuditLog.open(url=db_url, data_dir=tmp_path) as b:
        out = []
        for i in range(20):
            out.append((a if i % 3 else b).append(ev(i)))
        assert sorted(out) == list(range(20))
        cp_a, cp_b = a.checkpoint(), b.checkpoint()
        assert cp_a.root == cp_b.root and cp_a.size == cp_b.size == 20


def test_refuses_to_sign_an_inconsistent_checkpoint(db_url, tmp_path):
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        for i in range(5):
            log.append(ev(i))
        log.checkpoint()
        engine = sa.create_engine(db_url)
        with engine.begin() as conn:  # a forged later checkpoint the log did not sign itself
            conn.execute(sa.text("INSERT INTO audit_checkpoints (size, root, note) VALUES (8, :r, 'x')"),
                         {"r": merkle.hash_leaf(b"fork")})
        engine.dispose()
        with pytest.raises(AuditError, match="refusing to sign"):
            log.checkpoint()
        for i in range(3):
            log.append(ev(i))
        with pytest.raises(AuditError, match="inconsistent"):
            log.checkpoint()


def test_signing_key_created_0600_and_origin_checked(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path, origin="acme.test/audit") as log:
        assert log.public_key().startswith("acme.test/audit+")
    mode = stat.S_IMODE(os.stat(tmp_path / KEY_FILE).st_mode)
    assert mode == 0o600
    with pytest.raises(AuditError, match="origin"):
        AuditLog.open(url=url, data_dir=tmp_path, origin="other.test/audit")
    signer = note.Signer.generate("env.test/log")
    monkeypatch.setenv("FAK_AUDIT_SIGNING_KEY", signer.skey())
    with AuditLog.open(url=f"sqlite:///{tmp_path / 'b.db'}", data_dir=tmp_path) as log:
        assert log.public_key() == signer.verifier().vkey()
    monkeypatch.delenv("FAK_AUDIT_SIGNING_KEY")
    with pytest.raises(AuditError):
        AuditLog.open(url=url, data_dir=tmp_path, signing_key=str(tmp_path / "missing.key"))


def test_bad_events_and_urls_are_clear_errors(log, tmp_path):
    with pytest.raises(AuditError, match="not a valid audit event"):
        log.append({"type": "policy_loaded", "policy_id": "has spaces", "policy_digest": P})
    with pytest.raises(AuditError):
        log.append({"type": "nonsense"})
    assert log.size() == 0
    with pytest.raises(AuditError):
        AuditLog.open(url="nosuchdb://x", data_dir=tmp_path)


def test_forget_receipt_round_trip(log):
    d = "blake3k:" + "ef" * 32
    fp = "blake3:" + "01" * 32
    log.append(ev(0))
    log.append({"type": "admission_verdict", "tenant": "acme", "session_id": "s1", "tool": "web.fetch",
                "ref": d, "size": 5, "verdict": "ALLOW", "policy_digest": P})  # receipts need the ref admitted
    r0 = log.append(ForgetRequested(request_id="f-9", ref=d, tenant="acme", principal="key:k1"))
    log.append(ev(2))
    i = log.append(ForgetCompleted(request_id="f-9", ref=d, tenant="acme", requested_index=r0,
                                   shredded_key_id="dk-3", kek_version=1,
                                   sessions=[SessionFingerprints(session_id="s1", fingerprint_after=fp,
                                                                 fingerprint_replay=fp)],
                                   units_dropped=[DroppedUnit(kind="segment", id="s1/seg2", session_id="s1"),
                                                  DroppedUnit(kind="prefix_node", id="n77")]))
    log.append(ev(4))
    r = ForgetReceipt.from_log(log, i)
    assert (r.requested_index, r.log_index) == (r0, i)
    assert r.inclusion_proof["treeSize"] == r.requested_inclusion_proof["treeSize"]
    assert verify_receipt(r, log.public_key())
    assert verify_receipt(r.model_dump(mode="json"), log.public_key())  # as it travels in JSON
    other = note.Signer.generate(log.origin).verifier().vkey()
    assert not verify_receipt(r, other)
    lied = r.model_copy(update={"units_dropped": r.units_dropped[:1]})
    assert "units_dropped" in verify_receipt(lied, log.public_key()).reason
    moved = r.model_copy(update={"log_index": 0})
    assert not verify_receipt(moved, log.public_key())
    with pytest.raises(AuditError):
        ForgetReceipt.from_log(log, 0)
    with pytest.raises(AuditError):
        ForgetReceipt.from_log(log, r0)  # the request, not the completion


def test_newest_filters_in_the_database_and_trusts_only_the_hashed_body(log, db_url):
    """``AuditLog.newest``: a tenant's entries newest first, by type and by needles in the body;
    a row whose unhashed ``type`` column was rewritten is still found by its body's type, and a
    row filed under another tenant's column is skipped (and alarmed), never served."""
    from fak.audit import ToolCallApproval

    for i in range(30):
        log.append(ev(i, tenant="acme" if i % 3 else "evil"))
    call = ToolCallApproval(tenant="acme", session_id="sess_x", call_id="call_held_1", tool="pay",
                            args_digest=P, approved=True, decision_index=None, principal="k1")
    at = log.append(call)
    log.append(ev(99, tenant="acme"))
    newest = log.newest("acme", log.size(), 5)
    assert [e.index for e in newest] == sorted((e.index for e in newest), reverse=True) and len(newest) == 5
    assert all(e.event.tenant == "acme" for e in newest) and newest[0].index == log.size() - 1
    assert [e.index for e in log.newest("acme", log.size(), 10, ["tool_call_approval"])] == [at]
    assert [e.index for e in log.newest("acme", log.size(), 10, needles=["call_held_1"])] == [at]
    assert log.newest("acme", at, 10, ["tool_call_approval"]) == []  # before its index
    for odd in ("CALL_HELD_1", "call%held", "call_held_%", "\\", "%"):  # exact bytes: no case folding,
        assert log.newest("acme", log.size(), 10, needles=[odd]) == []  # no wildcard, no escape error
    assert log.newest("evil", log.size(), 10, ["tool_call_approval"]) == []  # another tenant's
    assert len(log.newest("acme", log.size(), 100, needles=["p2"])) == sum(1 for i in range(30) if i % 3 and "p2" in f"p{i}")
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:  # a writer without the key hides nothing by rewriting the type column
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("ALTER TABLE audit_entries DISABLE TRIGGER USER"))
        else:
            for name in conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars().all():
                conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
        conn.execute(sa.text("UPDATE audit_entries SET type = 'policy_loaded' WHERE idx = :i"), {"i": at})
        conn.execute(sa.text("UPDATE audit_entries SET tenant = 'acme' WHERE idx = 0"))  # evil's row, filed as acme's
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("ALTER TABLE audit_entries ENABLE TRIGGER USER"))
    engine.dispose()
    assert [e.index for e in log.newest("acme", log.size(), 10, ["tool_call_approval"])] == [at]
    assert 0 not in [e.index for e in log.newest("acme", log.size(), 100)]
