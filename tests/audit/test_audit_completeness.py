"""A tenant's export proves it is complete: every event carries its tenant's gap-free sequence
number (``tseq``, assigned by the log at append, inside the hashed bytes), and the export binds
the tenant's entry count to its signed checkpoint with a statement signed by the log's key.
Removing any line, truncating the tail or keeping only the header fails, naming the missing
sequence numbers. Logs written before tseq existed still verify. Issue 25, item 7 (b)."""

from __future__ import annotations

import json
import threading

import pytest
import sqlalchemy as sa

from fak.audit import AuditError, AuditLog, PolicyLoaded, merkle, store, tenant_export, verify_export
from fak.audit.events import canonical, parse_event
from fak.audit.note import Signer
from fak.audit.tenant_export import verify_tenant_export
from fak.cli import main

P = "sha256:" + "cd" * 32


def ev(i: int, tenant: str) -> PolicyLoaded:
    return PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=tenant)


def seqs(log: AuditLog) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in log.entries():
        out.setdefault(e.event.tenant, []).append(e.event.tseq)
    return out


def gap_free(found: dict[str, list[int]]) -> bool:
    return all(v == list(range(1, len(v) + 1)) for v in found.values())


def write(lines, path) -> list[bytes]:  # noqa: ANN001
    data = b"".join(lines)
    path.write_bytes(data)
    return data.splitlines(keepends=True)


def test_tseq_is_per_tenant_gap_free_and_hashed(db_url, tmp_path):
    """Group commit from many threads, two logs (writers) on one database, a reopen: each
    tenant's sequence, and the system's (tenant ""), stays 1, 2, 3 ... with no gap."""
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        with pytest.raises(AuditError, match="assigned by the log"):
            log.append(ev(0, "t1").model_copy(update={"tseq": 5}))
        threads = [threading.Thread(target=lambda t=t: [log.append(ev(i, t)) for i in range(60)])
                   for t in ("t1", "t2", "t3", "")]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        found = seqs(log)
        assert {k: len(v) for k, v in found.items()} == {"t1": 60, "t2": 60, "t3": 60, "": 60}
        assert gap_free(found), found
        e = log.entry(5)
        assert json.loads(e.body)["tseq"] == e.event.tseq and parse_event(e.body) == e.event
        assert e.leaf_hash == merkle.hash_leaf(canonical(e.event))  # inside the hashed bytes
        with AuditLog(db_url, Signer.generate("fak.test/second")) as other:  # another writer
            for i in range(20):
                (other if i % 2 else log).append(ev(i, "t1"))
        found = seqs(log)
        assert len(found["t1"]) == 80 and gap_free(found), found["t1"]
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:  # reopened: counting resumes
        log.append(ev(1, "t2"))
        assert seqs(log)["t2"][-1] == 61 and log.alarms == 0


@pytest.fixture
def log3(tmp_path):
    with AuditLog.open(url=f"sqlite:///{tmp_path / 'fak.db'}", data_dir=tmp_path, checkpoint_every=7) as log:
        for i in range(30):
            log.append(ev(i, f"t{i % 3}"))
        yield log


def test_tenant_export_names_removed_lines(log3, tmp_path, capsys):
    log, vkey = log3, log3.public_key()
    full = write(tenant_export.tenant_export_lines(log, "t1"), tmp_path / "t1.jsonl")
    r = verify_tenant_export(tmp_path / "t1.jsonl", vkey)
    assert r.ok and r.entries == 10 and r.count == 10, r.summary()
    assert "complete" in r.summary()
    cases = {
        "one line": (full[:4] + full[5:], "missing tenant sequence 4..4"),
        "two lines": (full[:4] + full[6:], "missing tenant sequence 4..5"),
        "the tail": (full[:-1], "missing tenant sequence 10..10"),
        "header only": (full[:1], "missing tenant sequence 1..10"),
        "reordered": (full[:3] + [full[4], full[3]] + full[5:], "out of order"),
        "a repeat": (full[:4] + [full[3]] + full[4:], "out of order"),
    }
    for name, (lines, why) in cases.items():
        path = tmp_path / f"cut-{name.replace(' ', '-')}.jsonl"
        path.write_bytes(b"".join(lines))
        r = verify_tenant_export(path, vkey)
        assert not r.ok and why in r.reason, (name, r.reason)
        assert main(["audit", "verify", str(path), "--pubkey", vkey]) == 1
        assert why in capsys.readouterr().err
    assert main(["audit", "verify", str(tmp_path / "t1.jsonl"), "--pubkey", vkey]) == 0
    assert "OK: 10 entries" in capsys.readouterr().out


def test_tenant_export_statement_is_bound(log3, tmp_path):
    """The count is signed and bound to the checkpoint and the tenant: editing it, taking
    another tenant's, or dressing the export up as the old format (which proves nothing
    about completeness) fails."""
    log, vkey = log3, log3.public_key()
    full = write(tenant_export.tenant_export_lines(log, "t1"), tmp_path / "t1.jsonl")
    head = json.loads(full[0])
    other = json.loads(write(tenant_export.tenant_export_lines(log, "t2"), tmp_path / "t2.jsonl")[0])

    def check(new_head: dict, body: list[bytes], why: str) -> None:
        path = tmp_path / "edited.jsonl"
        path.write_bytes(json.dumps(new_head).encode() + b"\n" + b"".join(body))
        r = verify_tenant_export(path, vkey)
        assert not r.ok and why in r.reason, r.reason

    check(head | {"statement": other["statement"]}, full[1:], "another tenant")
    stmt = head["statement"].replace("\ncount 10\n", "\ncount 9\n")
    assert stmt != head["statement"]
    check(head | {"statement": stmt}, full[1:-1], "does not verify")
    check({k: v for k, v in head.items() if k != "statement"}, full[1:], "statement")
    check(head | {"format": "fak-tenant-audit-export/v1"}, full[1:-1], "completeness")
    log.append(ev(99, "t1"))  # a later checkpoint's statement does not fit this checkpoint
    later = json.loads(next(iter(tenant_export.tenant_export_lines(log, "t1"))))
    check(head | {"statement": later["statement"]}, full[1:], "checkpoint")


def _old_log(url: str, bodies: list[bytes]) -> None:
    """Rows exactly as a log written before tseq existed holds them."""
    engine = store.make_engine(url)
    try:
        store.migrate(engine)
        frontier, nodes = merkle.Frontier(), []
        for b in bodies:
            nodes.extend(frontier.append(merkle.hash_leaf(b)))
        rows = [(i, json.loads(b)["tenant"], "policy_loaded", 0, b) for i, b in enumerate(bodies)]
        with store.writing(engine) as conn:
            store.insert(conn, rows, nodes)
    finally:
        engine.dispose()


def test_full_export_checks_tseq(log3, tmp_path):
    """The full export verifies each tenant's numbering too: a log (signed, consistent) whose
    writer skipped a number fails at that entry."""
    path = tmp_path / "full.log"
    log3.export(path)
    r = verify_export(path, pubkey=log3.public_key())
    assert r.ok and r.entries == 30, r.summary()
    url = f"sqlite:///{tmp_path / 'skipped.db'}"
    bodies = [canonical(ev(i, "t1").model_copy(update={"tseq": seq})) for i, seq in enumerate((1, 2, 4))]
    _old_log(url, bodies)
    with AuditLog(url, Signer.generate("fak.test/skip")) as log:
        log.export(tmp_path / "skipped.log")
        r = verify_export(tmp_path / "skipped.log", pubkey=log.public_key())
    assert not r.ok and r.first_bad_index == 2 and "sequence 4, expected 3" in r.error, r.summary()


def test_old_log_without_tseq_still_verifies(tmp_path):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    old = [canonical(ev(i, f"t{i % 2}")) for i in range(6)]
    assert all(b"tseq" not in b for b in old)
    _old_log(url, old)
    signer = Signer.generate("fak.test/old")
    with AuditLog(url, signer) as log:  # a log without a signer memory: the old rows are taken as they are
        for i in range(6, 10):
            log.append(ev(i, f"t{i % 2}"))
        # counting continues after the tenant's old, unnumbered entries
        assert [e.event.tseq for e in log.entries("t0")] == [None, None, None, 4, 5]
        assert [e.event.tseq for e in log.entries("t1")] == [None, None, None, 4, 5]
        full = tmp_path / "full.log"
        log.export(full)
        assert verify_export(full, pubkey=log.public_key()).ok
        lines = write(tenant_export.tenant_export_lines(log, "t0"), tmp_path / "t0.jsonl")
        r = verify_tenant_export(tmp_path / "t0.jsonl", log.public_key())
        assert r.ok and r.entries == r.count == 5, r.summary()
        (tmp_path / "cut.jsonl").write_bytes(b"".join(lines[:2] + lines[3:]))  # an old, unnumbered entry
        r = verify_tenant_export(tmp_path / "cut.jsonl", log.public_key())
        assert not r.ok and "missing tenant sequence" in r.reason, r.reason


def test_api_export_omission_detected(live_server, tmp_path):
    """The server's GET /v1/audit/export, lines removed by whoever holds the file."""
    live = live_server
    for i in range(8):
        live.kernel.audit.append(ev(i, "acme"))
    vkey = live.kernel.audit.public_key()
    with live.client(live.key("acme", "auditor")) as c:
        r = c.get("/v1/audit/export")
    assert r.status_code == 200
    lines = r.content.splitlines(keepends=True)
    n = len(lines) - 1
    path = tmp_path / "acme.jsonl"
    path.write_bytes(b"".join(lines[:3] + lines[5:]))
    r1 = verify_tenant_export(path, vkey)
    assert not r1.ok and "missing tenant sequence 3..4" in r1.reason, r1.summary()
    path.write_bytes(lines[0])
    r2 = verify_tenant_export(path, vkey)
    assert not r2.ok and f"missing tenant sequence 1..{n}" in r2.reason, r2.summary()
    path.write_bytes(r.content)
    assert verify_tenant_export(path, vkey).ok
    assert json.loads(lines[0])["format"] == "fak-tenant-audit-export/v2"
    with sa.create_engine(live.kernel.settings.resolved_database_url).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM audit_entries WHERE tenant = 'acme'")).scalar() == n
