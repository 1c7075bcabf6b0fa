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
from fak.audit.events import LinkedRef, ReplicaPart
from fak.audit.receipt import MIRRORED
from fak.audit.signing import KEY_FILE
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
    "shred_status": "pending_vacuum",
    "linked_refs": [LinkedRef(ref=OTHER, shredded_key_id="dk-9", kek_version=1)],
    "replicas": [ReplicaPart(replica="r9", applied_by="r9", units=1, sessions=0)],  # a replica it never reached
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


# --- receipts that prove: admission, request, consistency, witnesses ----------------------------------


def _manual_receipt(log, completed: int, requested: int, checkpoint_size: int | None = None) -> ForgetReceipt:
    """A receipt put together by hand around whatever the log holds at those indexes (what a
    forger with the log's signed checkpoints, but not its key, can assemble)."""
    ev = log.entry(completed).event
    proof = log.inclusion_proof(completed).to_json()
    cp = proof.pop("checkpoint")

    def bare(i: int) -> dict:
        return {k: v for k, v in log.inclusion_proof(i, size=proof["treeSize"]).to_json().items() if k != "checkpoint"}

    return ForgetReceipt(
        ref=ev.ref, request_id=ev.request_id, tenant=ev.tenant, units_dropped=ev.units_dropped,
        sessions=ev.sessions, shredded_key_id=ev.shredded_key_id, kek_version=ev.kek_version,
        requested_index=requested, log_index=completed, event=log.entry(completed).body.decode(),
        inclusion_proof=proof, requested_event=log.entry(requested).body.decode(),
        requested_inclusion_proof=bare(requested), checkpoint=cp,
    )  # fmt: skip


def test_receipt_rejects_forgery(log, tmp_path):
    key = log.public_key()
    # 1. a completion without its request: the log holds a forget_completed whose requested_index
    #    names the ref's admission; no forget_requested was ever logged
    adm = _admit(log)
    done = log.append(ForgetCompleted(request_id="f-x", ref=REF, tenant="acme", requested_index=adm,
                                      shredded_key_id="dk-1", kek_version=1))  # fmt: skip
    with pytest.raises(Exception, match="not the forget_requested"):
        ForgetReceipt.from_log(log, done)
    check = verify_receipt(_manual_receipt(log, done, adm), key)
    assert not check and "not forget_requested" in check.reason

    # 2. an unknown ref: request and completion signed into a log that never admitted it
    ghost = "blake3k:" + "99" * 32
    decoys = (_admit(log, ref=OTHER), _admit(log, ref=ghost, tenant="globex"))  # not this ref's, not this tenant's
    r = log.append(ForgetRequested(request_id="f-g", ref=ghost, tenant="acme"))
    g = log.append(ForgetCompleted(request_id="f-g", ref=ghost, tenant="acme", requested_index=r,
                                   shredded_key_id="dk-9", kek_version=1))  # fmt: skip
    receipt = ForgetReceipt.from_log(log, g)
    assert receipt.admitted_event is None
    check = verify_receipt(receipt, key)
    assert not check and "never admitted" in check.reason
    #    ... nor does another ref's admission, or the ref's admission by another tenant, stand in
    for other in decoys:
        body = log.entry(other).body.decode()
        proof = log.inclusion_proof(other, size=receipt.inclusion_proof["treeSize"]).to_json()
        proof.pop("checkpoint", None)
        swapped = receipt.model_copy(update={"admitted_index": other, "admitted_event": body,
                                             "admitted_inclusion_proof": proof})  # fmt: skip
        check = verify_receipt(swapped, key)
        assert not check and "not an admission of this ref by this tenant" in check.reason
    #    ... nor an admission logged after the request
    late = _admit(log, ref=ghost)
    i = log.append(ForgetCompleted(request_id="f-g", ref=ghost, tenant="acme", requested_index=r,
                                   shredded_key_id="dk-9", kek_version=1))  # fmt: skip
    receipt = ForgetReceipt.from_log(log, i)
    assert receipt.admitted_event is None  # the search looks before the request only
    proof = log.inclusion_proof(late, size=receipt.inclusion_proof["treeSize"]).to_json()
    proof.pop("checkpoint", None)
    check = verify_receipt(receipt.model_copy(update={
        "admitted_index": late, "admitted_event": log.entry(late).body.decode(), "admitted_inclusion_proof": proof,
    }), key)  # fmt: skip
    assert not check and "before the request" in check.reason

    # 3. a checkpoint not consistent with the auditor's last known one
    good = ForgetReceipt.from_log(log, _forget(log))
    assert verify_receipt(good, key)
    signer = note.Signer.parse((tmp_path / KEY_FILE).read_text())  # the log's own key signs a fork
    with AuditLog.open(url=f"sqlite:///{tmp_path / 'fork.db'}", data_dir=tmp_path, signing_key=signer) as fork:
        for n in range(good.inclusion_proof["treeSize"] + 2):
            fork.append(PolicyLoaded(policy_id=f"fork{n}", policy_digest=P))
        forked_cp = fork.checkpoint().note
        forked_same = fork.inclusion_proof(0, size=good.inclusion_proof["treeSize"])
    check = verify_receipt(good, key, last_checkpoint=forked_cp)
    assert not check and "consistency proof" in check.reason
    size = good.inclusion_proof["treeSize"]
    # the fork's tree at the receipt's size, signed: two roots for one size
    from fak.audit.checkpoint import sign_checkpoint

    split = sign_checkpoint(signer, log.origin, size, forked_same.root_hash).note
    check = verify_receipt(good, key, last_checkpoint=split)
    assert not check and "split view" in check.reason
    # a genuine proof from the log (to its own tree of the fork's size) does not link the receipt to the fork
    log.append(PolicyLoaded(policy_id="after1", policy_digest=P))
    log.append(PolicyLoaded(policy_id="after2", policy_digest=P))
    later_cp = log.checkpoint()
    genuine = log.consistency_proof(size, later_cp.size).to_json()
    assert later_cp.size == size + 2 and verify_receipt(good, key, last_checkpoint=later_cp.note,
                                                         consistency_proof=genuine)  # fmt: skip
    check = verify_receipt(good, key, last_checkpoint=forked_cp, consistency_proof=genuine)
    assert not check and "not consistent" in check.reason and "does not verify" in check.reason


def test_receipt_consistent_with_last_known_checkpoint(log):
    key = log.public_key()
    _fill = [log.append(PolicyLoaded(policy_id=f"q{n}", policy_digest=P)) for n in range(5)]
    seen = log.checkpoint()  # the auditor's last known checkpoint, before the forget
    i = _forget(log)
    r = ForgetReceipt.from_log(log, i, since=seen.size)
    assert r.consistency_proof["oldSize"] == seen.size
    check = verify_receipt(r, key, last_checkpoint=seen.note)
    assert check and "consistent with the last known checkpoint" in check.detail
    assert verify_receipt(json.loads(json.dumps(r.model_dump(mode="json"))), key, last_checkpoint=seen.note)
    plain = ForgetReceipt.from_log(log, i)  # no proof carried: the caller may supply one
    assert not verify_receipt(plain, key, last_checkpoint=seen.note)
    proof = log.consistency_proof(seen.size, plain.inclusion_proof["treeSize"]).to_json()
    assert verify_receipt(plain, key, last_checkpoint=seen.note, consistency_proof=proof)
    bad = dict(proof, hashes=["00" * 32, *proof["hashes"][1:]])
    assert not verify_receipt(plain, key, last_checkpoint=seen.note, consistency_proof=bad)
    # the auditor already knows a newer checkpoint: a proof from the receipt's to it
    log.append(PolicyLoaded(policy_id="q9", policy_digest=P))
    newer = log.checkpoint()
    fwd = log.consistency_proof(plain.inclusion_proof["treeSize"], newer.size).to_json()
    assert verify_receipt(plain, key, last_checkpoint=newer.note, consistency_proof=fwd)
    assert verify_receipt(plain, key, last_checkpoint=plain.checkpoint)  # the same checkpoint


def test_receipt_witness_quorum(log, tmp_path, capsys):
    from fak.audit.cosignature import CosignerKey, cosign

    key = log.public_key()
    r = ForgetReceipt.from_log(log, _forget(log))
    k1, k2 = CosignerKey.generate("w1.example"), CosignerKey.generate("w2.example")
    v1, v2 = k1.vkey(), k2.vkey()
    text, _ = note.split(r.checkpoint)
    witnessed = r.model_copy(update={"checkpoint": r.checkpoint + cosign(k1, text, 1_800_000_000)})
    assert verify_receipt(witnessed, key)  # cosignatures do not disturb the log's signature
    check = verify_receipt(witnessed, key, witnesses=[v1])
    assert check and "w1.example" in check.detail
    check = verify_receipt(witnessed, key, witnesses=[v1, v2])
    assert not check and "quorum" in check.reason and "1 of 2" in check.reason
    assert verify_receipt(witnessed, key, witnesses=[v1, v2], quorum=1)
    assert not verify_receipt(r, key, witnesses=[v1])  # not cosigned at all
    impostor = CosignerKey("w1.example", k2.key)  # w1's name, another key: its key id differs, so it is ignored
    ignored = r.model_copy(update={"checkpoint": r.checkpoint + cosign(impostor, text, 1_800_000_000)})
    assert not verify_receipt(ignored, key, witnesses=[v1])
    line = cosign(k1, text, 1_800_000_000)  # w1's own line, its signature swapped for one over another time
    other_line = cosign(k1, text, 1_800_000_001)
    blob = note.b64decode_strict(line.split(" ")[2].strip())
    forged_blob = blob[:12] + note.b64decode_strict(other_line.split(" ")[2].strip())[12:]
    forged = r.model_copy(update={"checkpoint": r.checkpoint + f"{line.split(' ')[0]} w1.example "
                                  f"{note.b64(forged_blob)}\n"})  # fmt: skip
    check = verify_receipt(forged, key, witnesses=[v1])  # w1's name and key id, a signature over another message
    assert not check and "does not verify" in check.reason
    path = tmp_path / "witnessed.json"
    path.write_text(json.dumps(witnessed.model_dump(mode="json")))
    assert main(["audit", "verify-receipt", str(path), "--pubkey", key, "--witness", v1]) == 0
    assert "witnessed by w1.example" in capsys.readouterr().out
    assert main(["audit", "verify-receipt", str(path), "--pubkey", key, "--witness", v1, "--witness", v2]) == 1
    assert "quorum" in capsys.readouterr().err
    pol = tmp_path / "policy"
    pol.write_text(f"log {key}\nwitness one {v1}\nwitness two {v2}\nquorum any\n")
    assert main(["audit", "verify-receipt", str(path), "--witness-policy", str(pol)]) == 0
    last = tmp_path / "last.cp"
    last.write_text(r.checkpoint)
    assert main(["audit", "verify-receipt", str(path), "--witness-policy", str(pol), "--last-checkpoint", str(last)]) == 0
    assert "same tree" in capsys.readouterr().out


def _deferred(log, *, request_id="f-1", replay=FP, verified=True, sessions=("s1",)):  # noqa: ANN001, ANN202
    """A forget whose replay is logged after its completion (fak.kernel.withdrawal.replay_check): (completion, replay) indexes."""
    from fak.audit import ReplayVerified
    from fak.audit.events import SessionReplay

    done = _forget(log, request_id=request_id,
                   sessions=[SessionFingerprints(session_id="s1", fingerprint_after=FP)])  # fmt: skip
    log.append(PolicyLoaded(policy_id="p2", policy_digest=P))  # the next request, meanwhile
    rv = log.append(ReplayVerified(tenant="acme", request_id=request_id, ref=REF, completed_index=done,
                                   sessions=[SessionReplay(session_id=s, fingerprint_replay=replay) for s in sessions],
                                   verified=verified))  # fmt: skip
    return done, rv


def test_receipt_completed_by_a_replay_event_verifies(log):
    done, rv = _deferred(log)
    key = log.public_key()
    pending = ForgetReceipt.from_log(log, done)  # what the forget returned
    check = verify_receipt(pending, key)
    assert check and check.replay == "pending" and pending.replay == "pending" and "pending" in check.detail
    refused = verify_receipt(pending, key, require_replay=True)
    assert not refused and "pending" in refused.reason
    full = ForgetReceipt.from_log(log, done, replay_index=rv)
    assert full.replay == "verified" and full.replay_index == rv
    wire = json.loads(json.dumps(full.model_dump(mode="json")))
    check = verify_receipt(wire, key, require_replay=True)
    assert check and check.replay == "verified", check.reason
    assert full.replay_inclusion_proof["treeSize"] == full.inclusion_proof["treeSize"] > rv  # one tree
    # the replay event rewritten, moved, taken from another forget or without its proof: refused
    body = json.loads(full.replay_event)
    body["sessions"][0]["fingerprint_replay"] = FP2
    forged = json.dumps(body, separators=(",", ":"), sort_keys=True)
    assert "replay event" in verify_receipt(full.model_copy(update={"replay_event": forged}), key).reason
    assert not verify_receipt(full.model_copy(update={"replay_index": rv + 1}), key)
    assert not verify_receipt(full.model_copy(update={"replay_inclusion_proof": None}), key)
    assert not verify_receipt(full.model_copy(update={"replay_event": None}), key)  # names a replay, has none
    other_done, other_rv = _deferred(log, request_id="f-2")
    swapped = full.model_copy(update={"replay_event": log.entry(other_rv).body.decode(), "replay_index": other_rv})
    assert "not the replay of this forget" in verify_receipt(swapped, key).reason
    with pytest.raises(Exception, match="not the replay"):
        ForgetReceipt.from_log(log, done, replay_index=other_rv)


def test_cli_verify_receipt_require_replay(log, tmp_path, capsys):
    done, rv = _deferred(log)
    pending, full = tmp_path / "pending.json", tmp_path / "full.json"
    pending.write_text(ForgetReceipt.from_log(log, done).model_dump_json())
    full.write_text(ForgetReceipt.from_log(log, done, replay_index=rv).model_dump_json())
    key = log.public_key()
    assert main(["audit", "verify-receipt", str(pending), "--pubkey", key]) == 0
    assert "replay of the survivors is pending" in capsys.readouterr().out
    assert main(["audit", "verify-receipt", str(pending), "--pubkey", key, "--require-replay"]) == 1
    assert "pending" in capsys.readouterr().err
    assert main(["audit", "verify-receipt", str(full), "--pubkey", key, "--require-replay"]) == 0


@pytest.mark.parametrize(("replay", "verified", "sessions", "why"), [
    (FP2, False, ("s1",), "differs from a replay"),  # a mismatch (the kernel alarms too)
    (None, False, ("s1",), "could not be replayed"),  # a survivor gone before a resumed replay
    (FP, True, ("s1", "s2"), "exactly the sessions"),
    (FP, True, (), "exactly the sessions"),
    (FP, False, ("s1",), "did not verify"),
])  # fmt: skip
def test_replay_event_that_does_not_prove_equality_fails(log, replay, verified, sessions, why):
    done, rv = _deferred(log, replay=replay, verified=verified, sessions=sessions)
    check = verify_receipt(ForgetReceipt.from_log(log, done, replay_index=rv), log.public_key())
    assert not check and why in check.reason
