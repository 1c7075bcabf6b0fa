"""Forget receipts: a good one verifies offline; every lie, swap or empty claim fails."""

from __future__ import annotations

import json

import pytest

from fak.audit import (
    AdmissionVerdict,
    AuditLog,
    DroppedUnit,
    ForgetCompleted,
    ForgetReceipt,
    ForgetRequested,
    PolicyLoaded,
    SessionFingerprints,
    note,
    verify_receipt,
)
from fak.audit.receipt import MIRRORED
from fak.cli import main

REF = "blake3k:" + "ef" * 32
OTHER = "blake3k:" + "aa" * 32
FP = "blake3:" + "01" * 32
FP2 = "blake3:" + "02" * 32
P = "sha256:" + "cd" * 32


@pytest.fixture
def log(tmp_path):
    lg = AuditLog.open(url=f"sqlite:///{tmp_path / 'audit.db'}", data_dir=tmp_path)
    yield lg
    lg.close()


def _admit(log, *, ref=REF, tenant="acme", verdict="ALLOW") -> int:
    return log.append(AdmissionVerdict(tenant=tenant, session_id="s1", segment_id="seg-2", tool="web.fetch",
                                       ref=ref, size=812, verdict=verdict, policy_digest=P))  # fmt: skip


def _forget(log, *, request_id="f-1", units=None, sessions=None, key="dk-7", kek=1, tenant="acme",
            requested_index=None, admit=True):  # fmt: skip
    """Log the ref's admission, a request, some noise and the completion; return the completion's index."""
    if admit:
        _admit(log, tenant=tenant)
    log.append(PolicyLoaded(policy_id="p0", policy_digest=P))
    r = log.append(ForgetRequested(request_id=request_id, ref=REF, tenant=tenant, principal="key:k1"))
    log.append(PolicyLoaded(policy_id="p1", policy_digest=P))
    units = [DroppedUnit(kind="segment", id="seg-2", session_id="s1"),
             DroppedUnit(kind="generated_segment", id="seg-5", session_id="s1"),
             DroppedUnit(kind="prefix_node", id="n77"),
             DroppedUnit(kind="pic_chunk", id="c9")] if units is None else units  # fmt: skip
    if sessions is None:
        sessions = [SessionFingerprints(session_id="s1", fingerprint_after=FP, fingerprint_replay=FP)]
    return log.append(ForgetCompleted(
        request_id=request_id, ref=REF, tenant=tenant, requested_index=r if requested_index is None else requested_index,
        units_dropped=units, sessions=sessions, shredded_key_id=key, kek_version=kek,
    ))  # fmt: skip


def test_good_receipt_verifies_from_json(log, tmp_path):
    r = ForgetReceipt.from_log(log, _forget(log))
    wire = json.loads(json.dumps(r.model_dump(mode="json")))
    check = verify_receipt(wire, log.public_key())
    assert check and check.reason == ""
    assert r.requested_inclusion_proof["treeSize"] == r.inclusion_proof["treeSize"]
    assert r.admitted_inclusion_proof["treeSize"] == r.inclusion_proof["treeSize"]
    assert r.admitted_index < r.requested_index < r.log_index == r.completed_index


TAMPERED = {
    "ref": OTHER,
    "request_id": "f-other",
    "tenant": "globex",
    "units_dropped": [],
    "sessions": [],
    "shredded_key_id": "dk-8",
    "kek_version": 2,
    "requested_index": 0,
}


def test_every_mirrored_field_is_checked():
    assert set(TAMPERED) == set(MIRRORED)


@pytest.mark.parametrize("field", sorted(TAMPERED))
def test_tampered_mirrored_field_fails(log, field):
    r = ForgetReceipt.from_log(log, _forget(log))
    bad = r.model_copy(update={field: TAMPERED[field]})
    check = verify_receipt(bad, log.public_key())
    assert not check
    assert field in check.reason


def test_tampered_event_bytes_or_proofs_fail(log):
    r = ForgetReceipt.from_log(log, _forget(log))
    key = log.public_key()
    # the logged event itself rewritten (re-canonicalised): the proof no longer leads to the root
    body = json.loads(r.event)
    body["shredded_key_id"] = "dk-8"
    rewritten = json.dumps(body, separators=(",", ":"), sort_keys=True)
    check = verify_receipt(r.model_copy(update={"event": rewritten, "shredded_key_id": "dk-8"}), key)
    assert not check and "completed event" in check.reason
    assert not verify_receipt(r.model_copy(update={"event": json.dumps(json.loads(r.event), indent=1)}), key)
    assert not verify_receipt(r.model_copy(update={"log_index": r.log_index + 1}), key)
    hashes = list(r.requested_inclusion_proof["hashes"])
    hashes[0] = "00" * 32
    check = verify_receipt(r.model_copy(update={"requested_inclusion_proof": r.requested_inclusion_proof
                                                | {"hashes": hashes}}), key)  # fmt: skip
    assert not check and "requested event" in check.reason
    # a later, genuinely signed checkpoint: the proofs do not lead to it
    log.append(PolicyLoaded(policy_id="p9", policy_digest=P))
    later = log.checkpoint().note
    check = verify_receipt(r.model_copy(update={"checkpoint": later}), key)
    assert not check and "signed checkpoint" in check.reason


def test_wrong_pubkey_fails(log):
    r = ForgetReceipt.from_log(log, _forget(log))
    other = note.Signer.generate(log.origin).verifier().vkey()
    check = verify_receipt(r, other)
    assert not check and "pinned key" in check.reason
    assert not verify_receipt(r, "not a key")


def _swap_request(log, r: ForgetReceipt, decoy_index: int) -> ForgetReceipt:
    """The receipt with its requested event replaced by another logged, proven entry."""
    entry = log.entry(decoy_index)
    proof = log.inclusion_proof(decoy_index, size=r.inclusion_proof["treeSize"]).to_json()
    proof.pop("checkpoint", None)
    return r.model_copy(update={"requested_event": entry.body.decode(), "requested_inclusion_proof": proof})


def test_request_of_another_forget_fails(log):
    decoy = log.append(ForgetRequested(request_id="f-other", ref=REF, tenant="acme"))
    r = ForgetReceipt.from_log(log, _forget(log))
    swapped = _swap_request(log, r, decoy)
    check = verify_receipt(swapped, log.public_key())
    assert not check and "request" in check.reason
    # even when the kernel logged the completion pointing at the wrong request
    i = _forget(log, request_id="f-2", requested_index=decoy)
    with pytest.raises(Exception, match="not the forget_requested"):
        ForgetReceipt.from_log(log, i)
    honest = log.entry(i)
    proof = log.inclusion_proof(i).to_json()
    cp = proof.pop("checkpoint")
    ev = honest.event
    forged = ForgetReceipt(
        ref=ev.ref, request_id=ev.request_id, tenant=ev.tenant, units_dropped=ev.units_dropped,
        sessions=ev.sessions, shredded_key_id=ev.shredded_key_id, kek_version=ev.kek_version,
        requested_index=decoy, log_index=i, event=honest.body.decode(), inclusion_proof=proof,
        requested_event=log.entry(decoy).body.decode(),
        requested_inclusion_proof={k: v for k, v in log.inclusion_proof(decoy, size=proof["treeSize"]).to_json().items()
                                   if k != "checkpoint"},
        checkpoint=cp,
    )  # fmt: skip
    check = verify_receipt(forged, log.public_key())
    assert not check and "request id" in check.reason


def test_requested_event_of_another_type_fails(log):
    r = ForgetReceipt.from_log(log, _forget(log))
    check = verify_receipt(_swap_request(log, r, 0), log.public_key())  # entry 0 is a policy_loaded
    assert not check and "not forget_requested" in check.reason


def test_unequal_session_fingerprints_fail(log):
    i = _forget(log, sessions=[
        SessionFingerprints(session_id="s1", fingerprint_after=FP, fingerprint_replay=FP),
        SessionFingerprints(session_id="s2", fingerprint_after=FP, fingerprint_replay=FP2),
    ])  # fmt: skip
    check = verify_receipt(ForgetReceipt.from_log(log, i), log.public_key())
    assert not check and "s2" in check.reason and "replay" in check.reason


def test_session_that_lost_a_segment_needs_fingerprints(log):
    i = _forget(log, sessions=[])
    check = verify_receipt(ForgetReceipt.from_log(log, i), log.public_key())
    assert not check and "s1" in check.reason and "no fingerprints" in check.reason


def test_empty_forget_is_refused(log):
    i = _forget(log, units=[], sessions=[], key=None, kek=None)
    check = verify_receipt(ForgetReceipt.from_log(log, i), log.public_key())
    assert not check and "erased nothing" in check.reason


@pytest.mark.parametrize("keep", ["units", "sessions", "key"])
def test_any_one_erasure_claim_is_enough(log, keep):
    units = [DroppedUnit(kind="prefix_node", id="n1")] if keep == "units" else []
    sessions = [SessionFingerprints(session_id="s1", fingerprint_after=FP, fingerprint_replay=FP)]
    i = _forget(log, units=units, sessions=sessions if keep == "sessions" else [],
                key="dk-1" if keep == "key" else None, kek=None)  # fmt: skip
    assert verify_receipt(ForgetReceipt.from_log(log, i), log.public_key())


def test_cli_verify_receipt(log, tmp_path, capsys):
    r = ForgetReceipt.from_log(log, _forget(log))
    good = tmp_path / "receipt.json"
    good.write_text(json.dumps(r.model_dump(mode="json")))
    keyfile = tmp_path / "log.pub"
    keyfile.write_text(log.public_key() + "\n")
    assert main(["audit", "verify-receipt", str(good), "--pubkey", log.public_key()]) == 0
    assert "receipt OK" in capsys.readouterr().out
    assert main(["audit", "verify-receipt", str(good), "--pubkey", str(keyfile)]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(r.model_copy(update={"kek_version": 9}).model_dump(mode="json")))
    assert main(["audit", "verify-receipt", str(bad), "--pubkey", str(keyfile)]) == 1
    assert "kek_version" in capsys.readouterr().err
    other = note.Signer.generate(log.origin).verifier().vkey()
    assert main(["audit", "verify-receipt", str(good), "--pubkey", other]) == 1
    assert "pinned key" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["audit", "verify-receipt", str(tmp_path / "junk.json"), "--pubkey", other]) == 1
    assert "not JSON" in capsys.readouterr().err
    assert main(["audit", "verify-receipt", str(good)]) == 1  # the key is required: no trust on first use
    assert "pinned log key is required" in capsys.readouterr().err
