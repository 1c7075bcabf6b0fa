"""The ``tenant`` column of the audit entries is not hashed: a database writer (no keys) who
changes it on a tenant's latest rows must not make that tenant's export omit them and still
verify. The statement's count is the signer's own (kept outside the database, from the
entries' hashed bodies), and a row whose body is another tenant's is never served as the
column's. Issue 25, item 7 (the gap left by the tenant column)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from fak.audit import AuditError, AuditLog, PolicyLoaded, tenant_export
from fak.audit.signer_state import STATE_FILE, read_state
from fak.audit.tenant_export import verify_tenant_export
from fak.cli import main

P = "sha256:" + "cd" * 32


def ev(i: int, tenant: str) -> PolicyLoaded:
    return PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=tenant)


def move_rows(url: str, indexes: list[int], to: str) -> None:
    """The attack, with write access to the database alone: drop (SQLite) or disable
    (PostgreSQL) the append-only triggers and change the rows' ``tenant`` column (the bodies,
    the tree and the checkpoints stay as they are, so everything signed still verifies)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("ALTER TABLE audit_entries DISABLE TRIGGER USER"))
            else:
                names = conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars().all()
                for name in names:
                    conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
            for i in indexes:
                conn.execute(sa.text("UPDATE audit_entries SET tenant = :t WHERE idx = :i"), {"t": to, "i": i})
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("ALTER TABLE audit_entries ENABLE TRIGGER USER"))
    finally:
        engine.dispose()


def export_and_verify(log: AuditLog, tenant: str, path) -> tuple[object, list[dict]]:  # noqa: ANN001
    data = b"".join(tenant_export.tenant_export_lines(log, tenant))
    path.write_bytes(data)
    lines = [json.loads(x) for x in data.splitlines()]
    return verify_tenant_export(path, log.public_key()), lines


def test_moved_latest_rows_fail_the_tenants_export(db_url, tmp_path, capsys):
    with AuditLog.open(url=db_url, data_dir=tmp_path, checkpoint_every=5) as log:
        for i in range(30):
            log.append(ev(i, f"t{i % 3}"))
        r, _ = export_and_verify(log, "t1", tmp_path / "before.jsonl")
        assert r.ok and r.entries == r.count == 10, r.summary()
        t1 = [e.index for e in log.entries("t1")]
        move_rows(db_url, t1[-2:], "t2")  # the tenant's latest two rows now look like t2's
        r, lines = export_and_verify(log, "t1", tmp_path / "t1.jsonl")
        assert not r.ok and "missing tenant sequence 9..10" in r.reason, r.summary()
        assert lines[0]["count"] == 10 and lines[0]["latest_index"] == t1[-1]  # the signer's tail, not the column's
        assert main(["audit", "verify", str(tmp_path / "t1.jsonl"), "--pubkey", log.public_key()]) == 1
        assert "missing tenant sequence 9..10" in capsys.readouterr().err
        # the moved rows are not served as t2's (they are t1's events), and t2's export still verifies
        assert all(e.event.tenant == "t2" for e in log.entries("t2"))
        r2, lines2 = export_and_verify(log, "t2", tmp_path / "t2.jsonl")
        assert r2.ok and r2.entries == 10, r2.summary()
        assert all(json.loads(x["event"])["tenant"] == "t2" for x in lines2[1:])
        # the next entry of t1 is not numbered from the column: the gap stays visible
        log.append(ev(99, "t1"))
        r, _ = export_and_verify(log, "t1", tmp_path / "t1-later.jsonl")
        assert not r.ok and "missing tenant sequence 9..10" in r.reason, r.summary()


def test_rows_moved_before_they_are_signed(db_url, tmp_path):
    """The rows are moved before any checkpoint covers them: the signer reads their bodies
    when it signs, so the statement still counts them."""
    with AuditLog.open(url=db_url, data_dir=tmp_path, checkpoint_every=10_000, checkpoint_ms=600_000) as log:
        idx = [log.append(ev(i, "acme")) for i in range(6)]
        move_rows(db_url, idx[-3:], "elsewhere")
        r, lines = export_and_verify(log, "acme", tmp_path / "acme.jsonl")
        assert not r.ok and "missing tenant sequence 4..6" in r.reason, r.summary()
        assert lines[0]["count"] == 6


def test_signer_state_without_tails_is_rebuilt_once(tmp_path, capsys):
    """A signer state file written before the tails existed: they are rebuilt from the
    entries' bodies on open (and written back), never from the column."""
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        idx = [log.append(ev(i, f"t{i % 2}")) for i in range(12)]
        log.checkpoint()
    path = tmp_path / STATE_FILE
    old = json.loads(path.read_text())
    assert old["tails"] == {"t0": [6, idx[-2]], "t1": [6, idx[-1]]}
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "tails"}))  # the old format
    move_rows(url, [idx[-1]], "t0")
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        assert "rebuilt" in capsys.readouterr().err
        assert read_state(path).tails == {"t0": (6, idx[-2]), "t1": (6, idx[-1])}
        r, _ = export_and_verify(log, "t1", tmp_path / "t1.jsonl")
        assert not r.ok and "missing tenant sequence 6..6" in r.reason, r.summary()
        assert log.alarms == 0


def test_api_export_and_entries_of_moved_rows(live_server, tmp_path):
    """Over the real HTTP API: acme's latest rows moved to globex's column. acme's export
    fails naming them; globex's entries and export do not carry acme's events."""
    live = live_server
    audit = live.kernel.audit
    acme, globex = live.key("acme", "auditor"), live.key("globex", "auditor")  # their creation is logged first
    idx = [audit.append(ev(i, "acme")) for i in range(5)]
    for i in range(3):
        audit.append(ev(i, "globex"))
    audit.checkpoint()
    vkey = audit.public_key()
    move_rows(live.kernel.settings.resolved_database_url, idx[-2:], "globex")
    with live.client(acme) as c:
        r = c.get("/v1/audit/export")
    assert r.status_code == 200
    path = tmp_path / "acme.jsonl"
    path.write_bytes(r.content)
    rep = verify_tenant_export(path, vkey)
    n = json.loads(r.content.splitlines()[0])["count"]
    assert not rep.ok and f"missing tenant sequence {n - 1}..{n}" in rep.reason, rep.summary()
    with live.client(globex) as c:
        got = c.get("/v1/audit/entries").json()
        assert got["entries"] and all(json.loads(e["event"])["tenant"] == "globex" for e in got["entries"]), got
        assert c.get(f"/v1/audit/inclusion/{idx[-1]}").status_code == 404
        r = c.get("/v1/audit/export")
    path.write_bytes(r.content)
    assert verify_tenant_export(path, vkey).ok


def test_writer_numbering_from_the_column_is_refused(tmp_path):
    """After the move, a reopened writer numbers from the signer's tail (not the column's); a
    writer without the signer's memory numbers from the column and repeats a number: the
    signer refuses that entry (alarm tenant_sequence_repeated) instead of signing a tail that
    would hide the moved rows again."""
    from fak.audit.note import Signer

    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        idx = [log.append(ev(i, "acme")) for i in range(5)]
        log.checkpoint()
    move_rows(url, idx[-2:], "other")
    with AuditLog.open(url=url, data_dir=tmp_path) as log:  # cold: the column says 3, the signer 5
        assert log.append(ev(5, "acme")) == 5
        assert [e.event.tseq for e in log.entries("acme")] == [1, 2, 3, 6]
        with AuditLog(url, Signer.generate("fak.test/other")) as plain:  # counts by the column: 7 is next
            plain.append(ev(6, "acme"))
        log.append(ev(7, "acme"))
        log.checkpoint()
    move_rows(url, [7], "other")  # the signed latest one (sequence 8) moved away too
    with AuditLog(url, Signer.generate("fak.test/other2")) as plain:  # the column says 7: numbers it 8 again
        plain.append(ev(8, "acme"))
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        with pytest.raises(AuditError, match="entry 8 of tenant 'acme' carries sequence 8"):
            log.checkpoint()
        assert log.alarm is not None and log.alarm.kind == "tenant_sequence_repeated"
        assert [e.event.kind for e in log.entries("") if e.event.type == "audit_alarm"] == ["tenant_sequence_repeated"]


def test_moved_row_is_alarmed_when_a_page_stops_early(db_url, tmp_path):
    """A page of entries (islice, then close(), as the entries route and the export read them)
    that skipped a moved row still raises its alarm, although the iteration ended early."""
    import itertools

    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        for i in range(6):
            log.append(ev(i, f"t{i % 2 + 1}"))  # t1 at 0, 2, 4; t2 at 1, 3, 5
        move_rows(db_url, [0], "t2")
        it = log.entries("t2")
        page = list(itertools.islice(it, 1))
        it.close()
        assert [e.index for e in page] == [1]
        assert log.alarms == 1
        log.checkpoint()
        assert [e.event.kind for e in log.entries("") if e.event.type == "audit_alarm"] == ["tenant_column_changed"]
