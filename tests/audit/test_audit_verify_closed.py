"""The offline verifier fails closed: no pinned key, an unsigned tail, an unknown key and a
missing witness quorum are failures; a changed entry is reported at its index; witnesses'
cosignatures are real C2SP cosignature/v1 signatures checked against the policy."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from fak.audit import AuditLog, PolicyLoaded, merkle, note, verify_export
from fak.audit.cosignature import CosignerKey, cosign
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import canonical
from fak.audit.export import write_export
from fak.audit.verify import WitnessPolicy, _verify_cosignature
from fak.cli import main

P = "sha256:" + "cd" * 32
ORIGIN = "fak.test/closed"


def _open(tmp_path, name: str = "fak.db", **kw) -> AuditLog:
    d = tmp_path / name.replace(".db", "")
    d.mkdir(exist_ok=True)
    return AuditLog.open(url=f"sqlite:///{d / name}", data_dir=d, origin=ORIGIN, **kw)


def _fill(log: AuditLog, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=f"t{i % 3}"))


@pytest.fixture
def exported(tmp_path):
    with _open(tmp_path, checkpoint_every=5) as log:
        _fill(log, 20)
        path = tmp_path / "export.log"
        log.export(path)
        yield path, log


# ------------------------------------------------------------------------------------ witnesses


class Witness:
    """A witness key pair (fak.audit.cosignature, the witness's own signer)."""

    def __init__(self, name: str) -> None:
        self.signer = CosignerKey.generate(name)
        self.name, self.key, self.vkey = name, self.signer.key, self.signer.vkey()

    def cosign(self, body: str, timestamp: int) -> str:
        return cosign(self.signer, body, timestamp)


def _cosigned_note(signed: str, *lines: str) -> str:
    return signed + "".join(lines)


def _rewrite_checkpoints(path, out, fn) -> None:
    """Copy an export, passing each checkpoint note (and its size) through ``fn``."""
    res = []
    for line in path.read_bytes().split(b"\n"):
        if line.startswith(b"c "):
            signed = note.b64decode_strict(line[2:].decode()).decode()
            size = int(signed.split("\n")[1])
            line = b"c " + note.b64(fn(size, signed).encode()).encode()
        res.append(line)
    out.write_bytes(b"\n".join(res))


def _witness(signed: str, *ws: Witness, ts: int | None = None) -> str:
    text, _ = note.split(signed)
    return _cosigned_note(signed, *(w.cosign(text, ts or int(time.time())) for w in ws))


def test_cosignature_is_c2sp_cosignature_v1():
    w = Witness("witness.example/w1")
    body = f"{ORIGIN}\n3\n{note.b64(bytes(32))}\n"
    line = w.cosign(body, 1679315147)
    assert _verify_cosignature(w.vkey, body, line) == 1679315147
    raw = note.b64decode_strict(line.split(" ")[2].strip())
    assert len(raw) == 4 + 8 + 64 and int.from_bytes(raw[4:12], "big") == 1679315147
    # the signed message is "cosignature/v1\ntime <t>\n" + body, by the witness's key
    w.key.public_key().verify(raw[12:], f"cosignature/v1\ntime 1679315147\n{body}".encode())
    assert note.b64decode_strict(w.vkey.split("+", 2)[2])[0] == 0x04  # the cosignature/v1 key type
    with pytest.raises(VerificationError):
        _verify_cosignature(w.vkey, body.replace("\n3\n", "\n4\n"), line)
    with pytest.raises(VerificationError):
        _verify_cosignature(Witness("witness.example/w1").vkey, body, line)


# ------------------------------------------------------------------------------------ fails closed


def test_verify_fails_closed(exported, tmp_path, capsys):
    path, log = exported
    vkey = log.public_key()
    assert verify_export(path, pubkey=vkey).ok
    # 1. no pinned key: a failure, not a warning
    r = verify_export(path)
    assert not r.ok and "no pinned key" in r.error
    assert main(["audit", "verify", str(path)]) == 1
    assert "no pinned key" in capsys.readouterr().err
    r = verify_export(path, trust_embedded_key=True)
    assert r.ok and not r.trusted_key and "not evidence" in r.summary()
    assert main(["audit", "verify", str(path), "--trust-embedded-key"]) == 0
    out = capsys.readouterr()
    assert "WARNING" in out.err and "THE EXPORT'S OWN KEY" in out.out

    # 2. an unsigned tail: valid, correctly hashed entries after the last checkpoint
    forged = PolicyLoaded(policy_id="forged", policy_digest=P, tenant="t0")
    body = canonical(forged)
    tail = tmp_path / "tail.log"
    tail.write_bytes(path.read_bytes() + b"e 20 " + merkle.hash_leaf(body).hex().encode() + b" " + body + b"\n")
    r = verify_export(tail, pubkey=vkey)
    assert not r.ok and r.first_bad_index == 20 and "not covered by a signed checkpoint" in r.error
    assert r.bad_line == len(path.read_bytes().split(b"\n"))  # the tail's first line
    r = verify_export(tail, pubkey=vkey, allow_unsigned_tail=True)
    assert r.ok and r.unsigned_tail == 1 and r.signed_size == 20 and r.entries == 21
    assert "UNVERIFIED" in r.summary()
    assert main(["audit", "verify", str(tail), "--pubkey", vkey]) == 1
    assert "entry index 20" in capsys.readouterr().err
    assert main(["audit", "verify", str(tail), "--pubkey", vkey, "--allow-unsigned-tail"]) == 0
    capsys.readouterr()

    # 3. an unknown key: another key under the same origin, named by the export or not
    with _open(tmp_path, "other.db") as other:
        _fill(other, 20)
        other_path = tmp_path / "other.log"
        other.export(other_path)
        assert other.public_key() != vkey and other.origin == log.origin
    r = verify_export(other_path, pubkey=vkey)
    assert not r.ok and "unknown key" in r.error and r.bad_line == 1
    relabelled = tmp_path / "relabelled.log"  # header names the pinned key, checkpoints by the other one
    lines = other_path.read_bytes().split(b"\n")
    lines[0] = f"fak-audit-export/v1 {ORIGIN} {vkey}".encode()
    relabelled.write_bytes(b"\n".join(lines))
    r = verify_export(relabelled, pubkey=vkey)
    assert not r.ok and "unknown key" in r.error
    assert main(["audit", "verify", str(other_path), "--pubkey", vkey]) == 1
    assert "unknown key" in capsys.readouterr().err


def _tamper_db(log: AuditLog, index: int, recompute_nodes: bool) -> None:
    """What an operator with write access to the database alone can do: drop the append-only
    triggers, rewrite an entry, optionally recompute every stored tree node."""
    with log._engine.begin() as conn:
        for t in ("audit_entries", "audit_nodes"):
            for verb in ("update", "delete"):
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {t}_no_{verb}")
        body = bytes(conn.execute(sa.text("SELECT body FROM audit_entries WHERE idx = :i"), {"i": index}).scalar())
        new = body.replace(f'"p{index}"'.encode(), b'"px"')
        assert new != body
        conn.execute(sa.text("UPDATE audit_entries SET body = :b WHERE idx = :i"), {"b": new, "i": index})
        if recompute_nodes:
            tree = merkle.MemoryTree()
            for (b,) in conn.execute(sa.text("SELECT body FROM audit_entries ORDER BY idx")):
                tree.append(bytes(b))
            for node, h in tree.nodes.items():
                conn.execute(sa.text("UPDATE audit_nodes SET hash = :h WHERE node = :n"), {"h": h, "n": node})


def _tampered_export(tmp_path, name: str, n: int, checkpoint_every: int, index: int,  # noqa: ANN001
                     recompute_nodes: bool) -> tuple[Path, str]:
    """A log of ``n`` entries, checkpointed, then entry ``index`` rewritten in its database
    (``_tamper_db``) and exported as it stands: the export and the log's verifier key."""
    with _open(tmp_path, f"{name}.db", checkpoint_every=checkpoint_every) as log:
        _fill(log, n)
        log.checkpoint()
        vkey = log.public_key()
        _tamper_db(log, index, recompute_nodes=recompute_nodes)
        path = tmp_path / f"{name}.log"
        write_export(log, path)
    return path, vkey


def test_changed_entry_reported_at_its_index(tmp_path):
    # body rewritten in the database, stored nodes untouched: the stored leaf hash names it
    path, vkey = _tampered_export(tmp_path, "a", 30, checkpoint_every=8, index=11, recompute_nodes=False)
    r = verify_export(path, pubkey=vkey)
    assert not r.ok and r.first_bad_index == 11 and r.bad_range is None, r.summary()
    assert "entry index 11" in r.summary()

    # stored nodes recomputed too: the signed roots bound it; an earlier export pins it down
    with _open(tmp_path, "b.db", checkpoint_every=8) as log:
        _fill(log, 30)
        earlier = tmp_path / "earlier.log"
        log.export(earlier)  # the auditor verified and kept this one
        vkey = log.public_key()
        assert verify_export(earlier, pubkey=vkey).ok
        _tamper_db(log, 11, recompute_nodes=True)
        path = tmp_path / "b.log"
        write_export(log, path)
    r = verify_export(path, pubkey=vkey)
    assert not r.ok and r.bad_range == (8, 16) and "signed root" in r.error
    r = verify_export(path, pubkey=vkey, since=str(earlier))
    assert not r.ok and r.first_bad_index == 11 and r.bad_range is None and "--since export" in r.error
    assert "entry index 11" in r.summary()

    # checkpoints signed at every size: the signed roots alone name the entry
    path, vkey = _tampered_export(tmp_path, "c", 12, checkpoint_every=1, index=5, recompute_nodes=True)
    r = verify_export(path, pubkey=vkey)
    assert not r.ok and r.first_bad_index == 5 and r.bad_range is None, r.summary()


# ------------------------------------------------------------------------------------ witness quorum


def test_witness_quorum_met_and_unmet(exported, tmp_path, capsys):
    path, log = exported
    vkey = log.public_key()
    w1, w2, w3 = Witness("w1.example/w"), Witness("w2.example/w"), Witness("w3.example/w")
    now = int(time.time())
    both = tmp_path / "both.log"
    _rewrite_checkpoints(path, both, lambda size, s: _witness(s, w1, w2, ts=now - 30) if size == 20 else s)
    policy = WitnessPolicy.from_keys([w1.vkey, w2.vkey])
    assert policy.quorum == 2
    r = verify_export(both, pubkey=vkey, witnesses=policy, now=now)
    assert r.ok, r.summary()
    assert r.witnesses == {"w1.example/w": now - 30, "w2.example/w": now - 30} and r.signed_size == 20
    newest = max(now - 30, r.checkpoint_time or 0)  # the log's own timestamp line, when it writes one
    assert r.age_seconds == now - newest and "newest cosignature" in r.summary()
    # quorum unmet: one of the two cosigned; a third, unlisted witness does not count
    one = tmp_path / "one.log"
    _rewrite_checkpoints(path, one, lambda size, s: _witness(s, w1, w3) if size == 20 else s)
    r = verify_export(one, pubkey=vkey, witnesses=policy)
    assert not r.ok and "no checkpoint carries the witness quorum" in r.error and "1 of 2" in r.error
    assert verify_export(one, pubkey=vkey, witnesses=WitnessPolicy.from_keys([w1.vkey, w2.vkey], 1)).ok
    # cosigned only at size 10: the entries after it are an unwitnessed tail
    early = tmp_path / "early.log"
    _rewrite_checkpoints(path, early, lambda size, s: _witness(s, w1, w2) if size == 10 else s)
    r = verify_export(early, pubkey=vkey, witnesses=policy)
    assert not r.ok and r.first_bad_index == 10 and "signed and witnessed" in r.error
    r = verify_export(early, pubkey=vkey, witnesses=policy, allow_unsigned_tail=True)
    assert r.ok and r.signed_size == 10 and r.unsigned_tail == 10
    # a listed witness's cosignature that does not verify is a forgery: the export fails
    bad = tmp_path / "bad.log"

    def forge(size: int, s: str) -> str:
        if size != 20:
            return s
        text, _ = note.split(s)
        return s + w2.cosign(text.replace("\n20\n", "\n21\n"), now)  # signed over another body

    _rewrite_checkpoints(path, bad, forge)
    r = verify_export(bad, pubkey=vkey, witnesses=policy)
    assert not r.ok and "does not verify" in r.error
    # no witnesses at all on the export, with a policy: fails; without one: says so
    r = verify_export(path, pubkey=vkey, witnesses=policy)
    assert not r.ok and "0 of 2" in r.error
    assert "no policy given" in verify_export(path, pubkey=vkey).summary()

    # the CLI: --witness (repeatable) / --quorum, and a policy file
    assert main(["audit", "verify", str(both), "--pubkey", vkey, "--witness", w1.vkey, "--witness", w2.vkey]) == 0
    assert "2 cosigned (quorum 2)" in capsys.readouterr().out
    assert main(["audit", "verify", str(one), "--pubkey", vkey, "--witness", w1.vkey, "--witness", w2.vkey]) == 1
    assert "witness quorum" in capsys.readouterr().err
    assert main(["audit", "verify", str(one), "--pubkey", vkey, "--witness", w1.vkey, "--witness", w2.vkey,
                 "--quorum", "1"]) == 0  # fmt: skip
    capsys.readouterr()
    pol = tmp_path / "policy.txt"
    pol.write_text(f"# the auditor's policy\nlog {vkey}\nwitness A {w1.vkey}\nwitness B {w2.vkey}\n"
                   f"witness C {w3.vkey}\nquorum 2\n")  # fmt: skip
    assert main(["audit", "verify", str(both), "--policy", str(pol)]) == 0  # --policy: the former spelling; the policy pins the log key
    assert "A, B" in capsys.readouterr().out
    assert main(["audit", "verify", str(one), "--witness-policy", str(pol)]) == 0  # w1 and w3 are listed too: 2 of 3
    assert "A, C" in capsys.readouterr().out
    pol.write_text(pol.read_text().replace("quorum 2", "quorum all"))
    assert main(["audit", "verify", str(one), "--witness-policy", str(pol)]) == 1
    assert "2 of 3 listed witnesses cosigned (quorum 3)" in capsys.readouterr().err
    pol.write_text(pol.read_text().replace("quorum all", "quorum 2"))
    assert main(["audit", "verify", str(early), "--witness-policy", str(pol), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_bad_index"] == 10 and not report["ok"]
    # freshness: --max-age against the newest time known for the trusted checkpoint
    r = verify_export(both, pubkey=vkey, witnesses=policy, max_age=10, now=now + 3600)
    assert not r.ok and "--max-age" in r.error and "1.0 h" in r.error


def test_checkpoint_timestamp_line_shows_freshness(exported, tmp_path, capsys):
    """A ``timestamp <seconds>`` extension line in the signed checkpoint body (C2SP
    tlog-checkpoint extension) gives the checkpoint's age; without one, --max-age fails."""
    path, log = exported
    vkey = log.public_key()
    signer = note.Signer.parse((path.parent / "fak" / "audit_signing.key").read_text())
    stamp = 1_790_000_000

    def restamp(size: int, signed: str) -> str:
        text, _ = note.split(signed)
        lines = [ln for ln in text.split("\n") if not ln.startswith("timestamp ")]
        return note.sign("\n".join(lines[:3]) + f"\ntimestamp {stamp + size}\n", signer)

    stamped = tmp_path / "stamped.log"
    _rewrite_checkpoints(path, stamped, restamp)
    r = verify_export(stamped, pubkey=vkey, now=stamp + 20 + 90)
    assert r.ok and r.checkpoint_time == stamp + 20 and r.age_seconds == 90
    assert "2026-09-21T" in r.summary() or "checkpoint time: 20" in r.summary()
    assert verify_export(stamped, pubkey=vkey, max_age=100, now=stamp + 110).ok
    r = verify_export(stamped, pubkey=vkey, max_age=60, now=stamp + 110)
    assert not r.ok and "--max-age" in r.error
    unstamped = tmp_path / "unstamped.log"
    _rewrite_checkpoints(path, unstamped, lambda size, s: note.sign(
        "\n".join(note.split(s)[0].split("\n")[:3]) + "\n", signer))  # fmt: skip
    r = verify_export(unstamped, pubkey=vkey, max_age=10**9)
    assert not r.ok and "no timestamp" in r.error
    assert verify_export(unstamped, pubkey=vkey).ok  # tolerated when freshness is not asked for
    assert main(["audit", "verify", str(stamped), "--pubkey", vkey]) == 0
    assert "checkpoint time: 20" in capsys.readouterr().out


def test_witness_policy_text_is_checked(tmp_path):
    w1, w2 = Witness("w1.example/w"), Witness("w2.example/w")
    p = WitnessPolicy.parse(f"witness a {w1.vkey} https://w1.example\n  witness b {w2.vkey}\nquorum any\n")
    assert p.quorum == 1 and [w.name for w in p.witnesses] == ["a", "b"] and p.log_key is None
    assert WitnessPolicy.parse(f"witness a {w1.vkey}\n").quorum == 1  # default: all listed
    assert WitnessPolicy.parse("quorum none\n").quorum == 0
    for bad, why in [
        (f"witness a {w1.vkey}\nquorum 2\n", "quorum 2"),
        (f"witness a {w1.vkey}\nwitness b {w1.vkey}\n", "twice"),
        (f"witness a {w1.vkey}\ngroup g 1 a\nquorum g\n", "line 2"),
        (f"witness a {note.Signer.generate('x').verifier().vkey()}\n", "type 0x04"),
        ("quorum lots\n", "not a number"),
    ]:
        with pytest.raises(AuditError, match=why):
            WitnessPolicy.parse(bad)
    with pytest.raises(AuditError, match="--witness"):
        WitnessPolicy.from_keys(["nope+00000000+AAAA"])


def test_live_witness_export_and_receipt(tmp_path, capsys):
    """End to end: a tlog-witness on loopback cosigns the log's checkpoints; the export and a
    forget receipt carry its cosignature lines and verify under a policy that needs it."""
    from fak.audit import AdmissionVerdict, ForgetCompleted, ForgetReceipt, ForgetRequested, verify_receipt
    from fak.audit.witness import Witness as WitnessProcess
    from fak.audit.witness import WitnessEndpoint, WitnessServer

    data = tmp_path / "log"
    url = f"sqlite:///{tmp_path / 'live.db'}"
    with AuditLog.open(url=url, data_dir=data, origin=ORIGIN) as probe:
        log_vkey = probe.public_key()
    with WitnessServer(WitnessProcess(tmp_path / "witness", [log_vkey])) as server:
        wvkey = server.witness.vkey()
        other = Witness("w2.example/w").vkey  # a witness that never saw this log
        with AuditLog.open(url=url, data_dir=data, origin=ORIGIN, witnesses=[WitnessEndpoint(server.url, wvkey)]) as log:
            ref = "blake3k:" + "ab" * 32
            log.append(AdmissionVerdict(tenant="acme", session_id="s1", tool="web.fetch", ref=ref, size=3,
                                        verdict="ALLOW", policy_digest=P))  # fmt: skip
            _fill(log, 6)
            r = log.append(ForgetRequested(tenant="acme", request_id="f-1", ref=ref))
            done = log.append(ForgetCompleted(tenant="acme", request_id="f-1", ref=ref, requested_index=r,
                                              shredded_key_id="dk-1", kek_version=1))  # fmt: skip
            log.checkpoint()
            receipt = ForgetReceipt.from_log(log, done)
            export = tmp_path / "live.log"
            log.export(export)
    policy = WitnessPolicy.from_keys([wvkey])
    report = verify_export(export, pubkey=log_vkey, witnesses=policy)
    assert report.ok and report.signed_size == 9 and set(report.witnesses) == {wvkey.split("+")[0]}, report.summary()
    assert report.checkpoint_time is not None and report.age_seconds is not None and report.age_seconds < 600
    assert not verify_export(export, pubkey=log_vkey, witnesses=WitnessPolicy.from_keys([wvkey, other])).ok
    check = verify_receipt(receipt, log_vkey, witnesses=[wvkey])
    assert check, check.reason
    assert not verify_receipt(receipt, log_vkey, witnesses=[wvkey, other])
    assert main(["audit", "verify", str(export), "--pubkey", log_vkey, "--witness", wvkey, "--max-age", "600"]) == 0
    assert "1 cosigned (quorum 1)" in capsys.readouterr().out


def _tenant_export(log: AuditLog, tenant: str, path) -> None:
    """A tenant's export as the API writes it (fak.api.routes.audit.export_lines)."""
    from fak.audit.tenant_export import tenant_export_lines

    path.write_bytes(b"".join(tenant_export_lines(log, tenant)))


def test_tenant_export_fails_closed(exported, tmp_path, capsys):
    from fak.audit.tenant_export import verify_tenant_export

    path, log = exported
    vkey = log.public_key()
    tx = tmp_path / "tenant.jsonl"
    _tenant_export(log, "t1", tx)
    r = verify_tenant_export(tx, vkey)
    assert r.ok and r.entries == 7 and r.witness_quorum is None and "no policy given" in r.summary()
    assert not verify_tenant_export(tx, "").ok and "no pinned key" in verify_tenant_export(tx, "").reason
    with _open(tmp_path, "other.db") as other:
        assert "unknown key" in verify_tenant_export(tx, other.public_key()).reason
    # one event rewritten (its proof left as it was): the report names that entry's log index
    rows = tx.read_text().splitlines()
    line = json.loads(rows[3])
    line["event"] = line["event"].replace('"p', '"q', 1)
    rows[3] = json.dumps(line)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    r = verify_tenant_export(bad, vkey)
    assert not r.ok and r.bad_index == line["index"] and f"entry index {line['index']}" in r.summary()
    # a witness policy on the export's checkpoint
    w = Witness("w1.example/w")
    assert not verify_tenant_export(tx, vkey, witnesses=WitnessPolicy.from_keys([w.vkey])).ok
    head = json.loads(tx.read_text().splitlines()[0])
    head["checkpoint"] = _witness(head["checkpoint"], w)
    cosigned = tmp_path / "cosigned.jsonl"
    cosigned.write_text("\n".join([json.dumps(head), *tx.read_text().splitlines()[1:]]) + "\n")
    r = verify_tenant_export(cosigned, vkey, witnesses=WitnessPolicy.from_keys([w.vkey]))
    assert r.ok and set(r.witnesses) == {"w1.example/w"}
    assert main(["audit", "verify", str(cosigned), "--pubkey", vkey, "--witness", w.vkey]) == 0
    assert "1 cosigned (quorum 1)" in capsys.readouterr().out
    assert main(["audit", "verify", str(tx), "--pubkey", vkey, "--witness", w.vkey]) == 1
    assert "witness quorum not met" in capsys.readouterr().err


def test_operator_rewrite_fails_at_the_changed_index(tmp_path, capsys):
    """The issue's attack with database access alone: drop the triggers, edit entry 2, recompute
    the stored nodes, delete the checkpoints and cosignatures. The remembering signer refuses to
    sign; the auditor's verifier (pinned key, witness policy, the export it kept) fails at 2."""
    from fak.audit.witness import Witness as WitnessProcess
    from fak.audit.witness import WitnessEndpoint, WitnessServer

    data, url = tmp_path / "log", f"sqlite:///{tmp_path / 'rw.db'}"
    with AuditLog.open(url=url, data_dir=data, origin=ORIGIN) as probe:
        vkey = probe.public_key()
    with WitnessServer(WitnessProcess(tmp_path / "witness", [vkey])) as server:
        wvkey = server.witness.vkey()
        with AuditLog.open(url=url, data_dir=data, origin=ORIGIN,
                           witnesses=[WitnessEndpoint(server.url, wvkey)]) as log:  # fmt: skip
            _fill(log, 12)
            kept = tmp_path / "kept.log"
            log.export(kept)  # the auditor verified this one and kept it
            _tamper_db(log, 2, recompute_nodes=True)
            with log._engine.begin() as conn:
                saved = conn.exec_driver_sql("SELECT size, root, note FROM audit_checkpoints").all()
                for t in ("audit_checkpoints", "audit_cosignatures"):
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {t}_no_delete")
                    conn.exec_driver_sql(f"DELETE FROM {t}")
    policy = WitnessPolicy.from_keys([wvkey])
    assert verify_export(kept, pubkey=vkey, witnesses=policy).ok
    with AuditLog.open(url=url, data_dir=data, origin=ORIGIN) as log:
        with pytest.raises(AuditError):
            log.checkpoint()  # the signer remembers size 12 and its root: it refuses
        empty = tmp_path / "empty.log"
        write_export(log, empty)  # no checkpoint, so nothing an auditor could check
        with log._engine.begin() as conn:  # the old, genuine checkpoints put back from a backup
            for row in saved:
                conn.exec_driver_sql("INSERT INTO audit_checkpoints (size, root, note) VALUES (?, ?, ?)", tuple(row))
        rewritten = tmp_path / "rewritten.log"
        write_export(log, rewritten)  # what the operator can still hand out
    r = verify_export(empty, pubkey=vkey, witnesses=policy)
    assert not r.ok and "no signed checkpoint" in r.error
    r = verify_export(rewritten, pubkey=vkey)  # genuine signed roots: caught, within a range
    assert not r.ok and r.bad_range is not None and r.bad_range[0] <= 2 < r.bad_range[1]
    r = verify_export(rewritten, pubkey=vkey, witnesses=policy, since=str(kept))
    assert not r.ok and r.first_bad_index == 2 and r.bad_range is None, r.summary()
    assert main(["audit", "verify", str(rewritten), "--pubkey", vkey, "--witness", wvkey, "--since", str(kept)]) == 1
    assert "entry index 2" in capsys.readouterr().err
