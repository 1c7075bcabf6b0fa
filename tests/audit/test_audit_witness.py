"""Witnesses over real HTTP on loopback with real Ed25519: the C2SP tlog-witness status codes
and bodies, cosignature/v1 bytes, a witness that cosigns only checkpoints consistent with
what it remembers (across its own restart), and a log that keeps signing when a witness
is down or refuses, storing and serving the cosignatures it gets."""

from __future__ import annotations

import hashlib
import http.client
import struct
import time
from urllib.parse import urlsplit

import pytest
from support.audit import rewrite_history

from fak.audit import AuditError, AuditLog, PolicyLoaded, merkle, note
from fak.audit.checkpoint import sign_checkpoint
from fak.audit.cosignature import (
    CosignerKey,
    cosign,
    cosignatures,
    parse_witness_vkey,
    signed_message,
    split_note,
    verify_cosignature,
)
from fak.audit.errors import VerificationError
from fak.audit.witness import STATE_FILE, Witness, WitnessEndpoint, WitnessServer

P = "sha256:" + "cd" * 32


def ev(i: int) -> PolicyLoaded:
    return PolicyLoaded(policy_id=f"p{i}", policy_digest=P)


def post(url: str, body: bytes) -> tuple[int, str, str]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    try:
        conn.request("POST", u.path + "/add-checkpoint", body=body)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read().decode()
    finally:
        conn.close()


def request(old: int, proof: list[bytes], signed: str) -> bytes:
    return (f"old {old}\n" + "".join(note.b64(h) + "\n" for h in proof) + "\n" + signed).encode()


def test_cosignature_v1_bytes():
    key = CosignerKey.generate("witness.example/w1")
    vkey = key.vkey()
    name, kid, pub = parse_witness_vkey(vkey)
    raw_pub = note.b64decode_strict(vkey.split("+", 2)[2])
    assert raw_pub[0] == 0x04 and name == "witness.example/w1"
    assert kid == struct.unpack(">I", hashlib.sha256(b"witness.example/w1\n\x04" + raw_pub[1:]).digest()[:4])[0]
    body = f"example.com/behind-the-sofa\n20852163\n{note.b64(bytes(32))}\ntimestamp 1679315100\n"
    line = cosign(key, body, 1679315147)
    assert line.startswith("\u2014 witness.example/w1 ") and line.endswith("\n")
    raw = note.b64decode_strict(line.split(" ")[2].strip())
    assert len(raw) == 4 + 8 + 64 and struct.unpack(">IQ", raw[:12]) == (kid, 1679315147)
    pub.verify(raw[12:], b"cosignature/v1\ntime 1679315147\n" + body.encode())  # the spec's message
    assert signed_message(body, 1) == b"cosignature/v1\ntime 1\n" + body.encode()
    assert verify_cosignature(vkey, body, line) == 1679315147
    with pytest.raises(VerificationError):
        verify_cosignature(vkey, body.replace("20852163", "20852164"), line)
    with pytest.raises(VerificationError):
        verify_cosignature(CosignerKey.generate("witness.example/w1").vkey(), body, line)
    assert CosignerKey.parse(key.skey()).vkey() == vkey
    with pytest.raises(VerificationError):
        cosign(key, body, 0)  # the witness protocol forbids a zero timestamp


def test_witness_protocol_status_codes(tmp_path):
    log_key = note.Signer.generate("example.test/log")
    w = Witness(tmp_path / "w", [log_key.verifier().vkey()])
    tree = merkle.MemoryTree()
    for i in range(9):
        tree.append(b"e%d" % i)
    cp5 = sign_checkpoint(log_key, log_key.name, 5, tree.root(5), 1700000000).note
    cp9 = sign_checkpoint(log_key, log_key.name, 9, tree.root(9)).note
    with WitnessServer(w) as server:
        url = server.url
        assert urlsplit(url).hostname == "127.0.0.1"  # loopback by default
        assert post(url, b"garbage")[0] == 400
        other = note.Signer.generate("other.test/log")
        assert post(url, request(0, [], sign_checkpoint(other, other.name, 1, tree.root(1)).note))[0] == 404
        forged = note.Signer.generate(log_key.name)  # same name, another key: no trusted signature
        assert post(url, request(0, [], sign_checkpoint(forged, forged.name, 5, tree.root(5)).note))[0] == 403
        bad_sig = cp5.replace(cp5.split(" ")[-1], note.b64(struct.pack(">I", log_key.id) + bytes(64)) + "\n")
        assert post(url, request(0, [], bad_sig))[0] == 403
        assert post(url, request(6, [], cp5))[0] == 400  # old > size
        assert post(url, request(0, [tree.root(1)], cp5))[0] == 422  # a proof from size 0
        empty_bad = sign_checkpoint(log_key, log_key.name, 0, merkle.hash_leaf(b"")).note
        assert post(url, request(0, [], empty_bad))[0] == 422
        status, ctype, body = post(url, request(0, [], cp5))
        assert status == 200 and body.count("\n") == 1
        assert verify_cosignature(w.vkey(), split_note(cp5)[0], body) > 1700000000
        assert w.known(log_key.name) == (5, tree.root(5))
        status, ctype, body = post(url, request(0, [], cp9))  # the witness knows 5, not 0
        assert (status, ctype, body) == (409, "text/x.tlog.size", "5\n")
        wrong = tree.consistency_proof(5, 9)
        wrong[0] = bytes(32)
        assert post(url, request(5, wrong, cp9))[0] == 422
        assert post(url, request(5, tree.consistency_proof(5, 9), cp9))[0] == 200
        assert post(url, request(9, [], cp9))[0] == 200  # same size, same root: cosigned again
        fork = sign_checkpoint(log_key, log_key.name, 9, merkle.hash_leaf(b"fork")).note
        assert post(url, request(9, [], fork))[0] == 422  # same size, another root
        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        conn.request("GET", f"/{hashlib.sha256(log_key.name.encode()).hexdigest()}/checkpoint")
        r = conn.getresponse()
        served = r.read().decode()
        assert r.status == 200 and served.startswith(split_note(cp9)[0])
        assert w.vkey() in cosignatures(served, [w.vkey()])
        conn.close()
    assert w.refused >= 4


def test_witness_cosigns_only_consistent_checkpoints(db_url, tmp_path, capsys):
    data = tmp_path / "log"
    with AuditLog.open(url=db_url, data_dir=data) as probe:
        log_vkey = probe.public_key()
    server = WitnessServer(Witness(tmp_path / "witness", [log_vkey]))
    wvkey = server.witness.vkey()
    endpoint = WitnessEndpoint(server.url, wvkey)
    with AuditLog.open(url=db_url, data_dir=data, witnesses=[endpoint]) as log:
        for i in range(5):
            log.append(ev(i))
        cp5 = log.checkpoint()
        assert set(cosignatures(cp5.note, [wvkey])) == {wvkey}  # served with the cosignature line
        for i in range(5, 12):
            log.append(ev(i))
        cp12 = log.checkpoint()
        assert cosignatures(cp12.note, [wvkey])[wvkey] >= cosignatures(cp5.note, [wvkey])[wvkey]
        assert log.inclusion_proof(7).checkpoint == cp12.note  # proofs carry the witnessed note
        assert [c.note for c in log.checkpoints()][-1] == cp12.note
        assert log.latest_checkpoint().note == cp12.note
        stats = log.witness_stats[server.url]
        assert stats.cosigned == 2 and stats.failures == 0 and len(stats.latency_ms) == 2
        export = tmp_path / "export.log"
        log.export(export)
    assert server.witness.known(cp12.origin) == (12, cp12.root)

    # the witness restarts (new process, same directory): it still knows size 12
    server.close()
    server = WitnessServer(Witness(tmp_path / "witness", [log_vkey]))
    assert server.witness.known(cp12.origin) == (12, cp12.root)
    status, _, body = post(server.url, request(0, [], cp12.note))
    assert (status, body) == (409, "12\n")

    # a consistent checkpoint after the restart is cosigned (the log starts from old 0 and learns 12)
    endpoint = WitnessEndpoint(server.url, wvkey)
    with AuditLog.open(url=db_url, data_dir=data, witnesses=[endpoint]) as log:
        log._cosigner.asked.clear()
        log.append(ev(12))
        cp13 = log.checkpoint()
        assert wvkey in cosignatures(cp13.note, [wvkey])

    # the database is rewritten and an operator (or whoever holds the key) resets the signer:
    # the log signs the rewritten history, but the witness remembers and refuses it
    rewrite_history(db_url, 2, b'{"policy_digest":"' + P.encode() + b'","policy_id":"forged","tenant":"","ts":1,'
                    b'"type":"policy_loaded"}')
    capsys.readouterr()
    with AuditLog.open(url=db_url, data_dir=data, witnesses=[endpoint]) as log:
        log.reset_signer(log.size(), principal="ops:mallory")
        forged = log.checkpoint()
        assert forged.size == log.size() and forged.root != cp13.root
        assert cosignatures(forged.note, [wvkey]) == {}  # signed by the log, not witnessed
        stats = log.witness_stats[server.url]
        assert stats.failures == 1 and stats.cosigned == 0 and "422" in stats.last_error
        log.export(tmp_path / "forged.log")
    err = capsys.readouterr().err
    assert "did not cosign" in err and "refused a checkpoint" in err
    assert server.witness.known(cp12.origin) == (13, cp13.root)  # its record did not move
    server.close()

    # the honest export verifies with the witness policy (the colleague's verifier)
    from fak.audit.verify import WitnessPolicy, verify_export

    policy = WitnessPolicy.from_keys([wvkey])
    report = verify_export(export, pubkey=log_vkey, witnesses=policy)
    assert report.ok, report.summary()
    # the rewritten history, signed by the log after the reset: the log's key alone accepts it,
    # the witness policy does not, and the earlier export names the entry that changed
    forged_export = tmp_path / "forged.log"
    assert verify_export(forged_export, pubkey=log_vkey).ok
    report = verify_export(forged_export, pubkey=log_vkey, witnesses=policy)
    assert not report.ok and "quorum" in report.error, report.summary()
    report = verify_export(forged_export, pubkey=log_vkey, since=str(export))
    assert not report.ok and report.first_bad_index == 2, report.summary()


def test_a_witness_down_does_not_stop_signing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as probe:
        vkey = probe.public_key()
    witness = Witness(tmp_path / "witness", [vkey])
    server = WitnessServer(witness)
    port = urlsplit(server.url).port
    server.close()  # down
    endpoint = WitnessEndpoint.parse(f"{server.url} {witness.vkey()}")
    with AuditLog.open(url=url, data_dir=tmp_path, witnesses=[endpoint], witness_timeout=2.0) as log:
        for i in range(3):
            log.append(ev(i))
        t = time.perf_counter()
        cp = log.checkpoint()
        assert time.perf_counter() - t < 5
        assert cp.size == 3 and cosignatures(cp.note, [witness.vkey()]) == {}
        assert log.witness_stats[server.url].failures == 1
        assert "did not cosign checkpoint 3" in capsys.readouterr().err
        with WitnessServer(Witness(tmp_path / "witness", [vkey]), port=port):  # back up, same address
            again = log.checkpoint()  # same size: the missing cosignature is asked for again
            assert again.size == 3 and witness.vkey() in cosignatures(again.note, [witness.vkey()])
            log.append(ev(3))
            cp4 = log.checkpoint()
            assert witness.vkey() in cosignatures(cp4.note, [witness.vkey()])
        assert log.witness_stats[server.url].cosigned == 2
    assert (tmp_path / "witness" / STATE_FILE).exists()


def test_witness_endpoint_parsing_and_settings():
    key = CosignerKey.generate("w.test/w")
    e = WitnessEndpoint.parse(f"http://127.0.0.1:7380/ {key.vkey()}")
    assert e == WitnessEndpoint("http://127.0.0.1:7380", key.vkey())
    assert WitnessEndpoint.parse(f"{key.vkey()} http://127.0.0.1:7380") == e
    with pytest.raises(AuditError):
        WitnessEndpoint.parse("http://127.0.0.1:7380")
    with pytest.raises(VerificationError):
        WitnessEndpoint.parse("http://127.0.0.1:7380 not+a+key")
    from fak import Settings

    s = Settings(audit_witnesses=[f"http://127.0.0.1:7380 {key.vkey()}"])
    assert [WitnessEndpoint.parse(x) for x in s.audit_witnesses] == [e]


def test_fak_witness_serve_is_a_separate_process(tmp_path):
    """``fak witness serve`` as its own process (as deployed): the log gets its cosignature."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path / "log") as probe:
        vkey = probe.public_key()
    cmd = [sys.executable, "-m", "fak.cli", "witness", "serve", "--dir", str(tmp_path / "w"), "--log", vkey,
           "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        words = proc.stdout.readline().split()  # witness <vkey> listening on <url>
        assert words[0] == "witness" and words[2:4] == ["listening", "on"]
        wvkey, wurl = words[1], words[4]
        assert urlsplit(wurl).hostname == "127.0.0.1"
        with AuditLog.open(url=url, data_dir=tmp_path / "log", witnesses=[f"{wurl} {wvkey}"]) as log:
            log.append(ev(0))
            cp = log.checkpoint()
            assert wvkey in cosignatures(cp.note, [wvkey])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    out = subprocess.run([sys.executable, "-m", "fak.cli", "witness", "pubkey", "--dir", str(tmp_path / "w")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == wvkey


def _witnessed(tmp_path, url):  # noqa: ANN001, ANN202
    with AuditLog.open(url=url, data_dir=tmp_path / "log") as probe:
        vkey = probe.public_key()
    server = WitnessServer(Witness(tmp_path / "witness", [vkey]))
    return server, WitnessEndpoint(server.url, server.witness.vkey())


def test_every_signed_checkpoint_is_covered_by_a_cosigned_one(tmp_path):
    """Checkpoints signed faster than the witness answers: not each is cosigned (only the newest
    is sent), but each is covered by a stored cosigned one, and the log measures how soon."""
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    server, endpoint = _witnessed(tmp_path, url)
    with AuditLog.open(url=url, data_dir=tmp_path / "log", witnesses=[endpoint], checkpoint_every=5) as log:
        for start in range(0, 400, 5):  # a checkpoint per group: signed faster than the witness answers
            for f in [log.submit(ev(i)) for i in range(start, start + 5)]:
                f.result()
        last = log.checkpoint()
        stats = log.witness_stats[server.url]
        cps = log.checkpoints()
        assert last.size == 400 and stats.covered_size == 400 and not stats.uncovered
        cosigned = [c.size for c in cps if cosignatures(c.note, [endpoint.vkey])]
        assert len(cosigned) < len(cps)  # coalesced: not every checkpoint carries a line ...
        lag = [min(s for s in cosigned if s >= c.size) - c.size for c in cps]  # ... each is covered
        assert len(stats.cover_lag_ms) == len(cps) and max(stats.cover_lag_ms) < 10_000
        assert sorted(stats.cover_lag_entries) == sorted(lag)
    server.close()


def test_close_and_reopen_leave_no_entry_outside_a_cosigned_checkpoint(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    server, endpoint = _witnessed(tmp_path, url)
    # no timer, no size trigger: only close signs the tail, and it waits for the witness
    with AuditLog.open(url=url, data_dir=tmp_path / "log", witnesses=[endpoint],
                       checkpoint_every=10_000, checkpoint_ms=600_000) as log:
        for i in range(7):
            log.append(ev(i))
    with AuditLog.open(url=url, data_dir=tmp_path / "log") as log:
        cp = log.latest_checkpoint()
        assert cp is not None and cp.size == 7 and endpoint.vkey in cosignatures(cp.note, [endpoint.vkey])
        log.append(ev(7))
        assert log.checkpoint().size == 8  # signed while no witness was configured
    # reopened with the witness: the newest checkpoint, never cosigned, is sent without a new append
    with AuditLog.open(url=url, data_dir=tmp_path / "log", witnesses=[endpoint], checkpoint_ms=600_000) as log:
        stats = log.witness_stats[server.url]
        deadline = time.monotonic() + 10
        while stats.covered_size < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stats.covered_size == 8 and not stats.uncovered
        assert endpoint.vkey in cosignatures(log.latest_checkpoint().note, [endpoint.vkey])
    server.close()
