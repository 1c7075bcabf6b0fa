"""Forget across every session, cache and store of a tenant, with a receipt that
verifies offline; resumption after a crash between its two events; late quarantine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.kernel_facade_helpers import LOUNGE, WEATHER, events

from fak import Kernel
from fak.audit.events import parse_event
from fak.audit.receipt import verify_receipt
from fak.cas.errors import CasError
from fak.errors import FakError, NotFound
from fak.kernel.kv.ledger import SegmentKind

FAK = str(Path(sys.executable).with_name("fak"))
SECRET = b"Booking reference QX7Y2Z for passenger Ada Lovelace, card ending 4242, seat 14C."


def _holding(k: Kernel, tenant: str) -> dict[str, object]:
    """Three sessions that hold one ref: in the middle, repeated by an assistant turn, at the tail."""
    middle = k.session(tenant)
    middle.append("system", "You are a travel assistant.")
    middle.append("user", "What is my booking?")
    ref = middle.admit("booking", SECRET).ref
    middle.append("user", "And the weather?")
    middle.admit("weather", WEATHER)
    repeated = k.session(tenant)
    repeated.append("system", "You are a travel assistant.")
    repeated.append("user", "What is my booking?")
    repeated.admit("booking", SECRET)
    list(repeated.generate(max_tokens=5, min_tokens=5))  # may repeat the ref's bytes
    repeated.append("user", "Thanks.")
    tail = k.session(tenant)
    tail.append("system", "You are a travel assistant.")
    tail.admit("lounge", LOUNGE)
    tail.admit("booking", SECRET)
    return {"ref": ref, "sessions": [middle, repeated, tail]}


def _replay(k: Kernel, tenant: str, s) -> str:  # noqa: ANN001
    """An independent never-saw session: the survivors' tokens only, no prefix cache."""
    from fak.kernel.kv.session import Session

    fresh = Session(k.model, k.tokenizer, tenant=tenant, chunk_size=k.settings.chunk_size)
    for seg in s._loaded().ledger.live():
        fresh.append(seg.kind, tokens=seg.tokens, chunks=seg.chunks)
    return fresh.fingerprint()


def test_forget_is_transitive(kernel, tmp_path) -> None:
    k = kernel
    held = _holding(k, "acme")
    ref, sessions = held["ref"], held["sessions"]
    other = k.session("globex")
    other.append("system", "You are a travel assistant.")
    other.append("user", "What is my booking?")
    other_ref = other.admit("booking", SECRET).ref
    assert other_ref != ref  # keyed digests: the same bytes are another ref for another tenant
    other_fp = other.fingerprint()
    other_nodes = sorted(n.id for n in k.prefix.nodes(k.namespace("globex")))
    assert any(ref in n.prov for n in k.prefix.nodes(k.namespace("acme")))
    assistant = [x for x in sessions[1].ledger() if x["kind"] == "assistant"][0]
    assert ref in assistant["content_provenance"]

    receipt = k.forget("acme", ref, requested_by="dpo@acme", reason="gdpr_art17", wait_replay=True)
    assert receipt.replay == "verified"  # the independent replay, logged after the forget returned
    replayed = {x.session_id: x.fingerprint_replay for x in parse_event(receipt.replay_event.encode()).sessions}

    dropped = {(u.kind, u.session_id, u.id) for u in receipt.units_dropped}
    assert ("generated_segment", sessions[1].id, assistant["id"]) in dropped
    assert {sid for _, sid, _ in dropped if sid} == {s.id for s in sessions}
    assert any(kind == "prefix_node" for kind, _, _ in dropped)
    by_session = {x.session_id: x for x in receipt.sessions}
    assert receipt.shred_status == "destroyed"  # SQLite, no reader open: the WAL was checkpointed
    for s in sessions:
        live = [x for x in s.ledger() if x["state"] == "live"]
        assert all(x["ref"] != ref and ref not in x["content_provenance"] and ref not in x["provenance"]
                   for x in live)
        assert ref not in s.refs()
        fp = s.fingerprint()
        assert fp == _replay(k, "acme", s)
        keyed = k.audit_fingerprint("acme", fp)  # the log carries fingerprints keyed per tenant
        assert keyed == by_session[s.id].fingerprint_after == replayed[s.id]
        assert keyed.startswith("blake3k:") and fp not in receipt.model_dump_json()
    assert not any(ref in n.prov for n in k.prefix.nodes(k.namespace("acme")))
    # the store no longer returns the bytes; the durable ledger holds no tokens of dropped segments
    with pytest.raises(CasError):
        k.store.get(ref, "acme")
    assert k.store.head(ref, "acme").state == "forgotten"
    with k.state.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT state, tokens, message_text FROM fak_segments "
                                    "WHERE tenant = 'acme' AND (ref = :r OR content LIKE :p)"),
                            {"r": ref, "p": f"%{ref}%"}).all()
    assert rows and all(r.state == "forgotten" and r.tokens is None and r.message_text is None for r in rows)
    # the other tenant is untouched: session, cache entries, bytes
    assert other.fingerprint() == other_fp
    assert sorted(n.id for n in k.prefix.nodes(k.namespace("globex"))) == other_nodes
    assert k.store.get(other_ref, "globex") == SECRET
    # materialising the forgotten ref is refused; forgetting again returns the first receipt
    result = sessions[2].materialise({"refs": [ref]})
    assert [(p.verdict.value, p.reason) for p in result.pieces] == [("REFUSE", "forgotten")]
    assert k.forget("acme", ref) == receipt
    with pytest.raises(NotFound):
        k.forget("globex", ref)  # another tenant's ref answers as an unknown one
    # the receipt verifies offline with the pinned key, as does the whole log
    assert verify_receipt(receipt, k.audit.public_key())
    path = tmp_path / "receipt.json"
    path.write_text(receipt.model_dump_json())
    ok = subprocess.run([FAK, "audit", "verify-receipt", str(path), "--pubkey", k.audit.public_key()],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    forged = json.loads(path.read_text())
    forged["sessions"][0]["fingerprint_after"] = "blake3:" + "0" * 64
    path.write_text(json.dumps(forged))
    bad = subprocess.run([FAK, "audit", "verify-receipt", str(path), "--pubkey", k.audit.public_key()],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    types = [e.type for e in events(k)]
    assert types.count("forget_requested") == 1 and types.count("forget_completed") == 1
    assert types.count("replay_verified") == 1


SCRIPT = textwrap.dedent("""
    import json, sys
    from fak import Kernel, Settings
    data, model, tenant = sys.argv[1], sys.argv[2], sys.argv[3]
    k = Kernel.open(Settings(data_dir=data, model_path=model, chunk_size=16), progress=None)
    ref = json.load(open(data + "/ref.json"))["ref"]
    k.forget(tenant, ref, requested_by="ops", reason="crash_test")
    print("forget returned")
    k.replays.wait()  # the replay runs after the forget returned (its own fault points)
""")


@pytest.mark.parametrize("point", ["forget.after_requested", "forget.after_session", "forget.before_shred",
                                   "forget.before_completed", "forget.after_completed",
                                   "forget.before_replay", "forget.after_replay_verified"])
def test_forget_resumes_after_crash(settings, tiny_lm, tiny_dir, point) -> None:
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        held = _holding(k, "acme")
        ref = held["ref"]
        ids = [s.id for s in held["sessions"]]
        (settings.data_dir / "ref.json").write_text(json.dumps({"ref": ref}))
    env = os.environ | {"FAK_FAULT_POINT": point}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(settings.data_dir), str(tiny_dir), "acme"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, run.stderr  # SIGKILL at the named point
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:  # resumes the forget, then its replay
        assert k.replays.wait(timeout=120)
        row = k.state.forget_row("acme", ref)
        assert row.state == "completed"
        receipt = k.forget("acme", ref)
        assert receipt.request_id == row.request_id and receipt.replay == "verified"
        assert verify_receipt(receipt, k.audit.public_key(), require_replay=True)
        assert {x.session_id for x in receipt.sessions} == set(ids)
        assert sum(u.kind in ("segment", "generated_segment") for u in receipt.units_dropped) == 4
        types = [e.type for e in events(k)]
        assert types.count("forget_requested") == 1 and types.count("forget_completed") == 1
        assert types.count("replay_verified") == 1 and "audit_alarm" not in types
        for sid in ids:
            s = k.session("acme", sid)
            assert ref not in s.refs() and s.fingerprint() == s.replay_fingerprint()
        assert k.store.head(ref, "acme").state == "forgotten"


def test_late_quarantine_evicts_everywhere(kernel) -> None:
    k = kernel
    held = _holding(k, "acme")
    ref, sessions = held["ref"], held["sessions"]
    other = k.session("globex")
    other.append("system", "You are a travel assistant.")
    other_ref = other.admit("booking", SECRET).ref
    report = k.quarantine("acme", ref, reason="slow_detector", principal="classifier")
    assert {u.session_id for u in report.units if u.kind == "segment"} == {s.id for s in sessions}
    for s in sessions:
        states = {x["state"] for x in s.ledger() if x["ref"] == ref and x["kind"] == "tool"}
        assert states == {"quarantined"}
        assert ref not in s.refs() and s.fingerprint() == s.replay_fingerprint()
    # generated turns keep their content provenance: quarantine is not forget
    assistant = [x for x in sessions[1].ledger() if x["kind"] == SegmentKind.ASSISTANT.value][0]
    assert assistant["state"] == "live"
    assert not any(ref in n.prov for n in k.prefix.nodes(k.namespace("acme")))
    assert k.store.get(ref, "acme") == SECRET  # nothing shredded
    result = sessions[0].materialise({"refs": [ref]})
    assert [(p.verdict.value, p.reason) for p in result.pieces] == [("REFUSE", "quarantined")]
    (ev,) = events(k, "ref_quarantined")
    assert ev.ref == ref and ev.reason == "slow_detector" and ev.tenant == "acme"
    assert {(u.session_id, u.id) for u in ev.units} == {
        (u.session_id, u.id) for u in report.units if u.kind == "segment"}  # logged before the effect
    assert ref in other.refs() or other_ref in other.refs()
    with pytest.raises(FakError):
        k.quarantine("acme", "blake3k:" + "0" * 64, reason="x")


def test_forget_again_after_readmission_and_no_admission_during_a_forget(settings, tiny_lm, tmp_path, request) -> None:
    from fak.kernel.facade import default_policy_path
    from fak.kernel.session.kernel_session import RefBeingForgotten
    from fak.kernel.withdrawal.forget import resume
    from fak.state.schema import ForgetRow
    from fak.state.store import now_us

    # re-admitting forgotten bytes is the policy's choice (default: refused, tests/kernel/withdrawal/test_forget_resend.py)
    settings.policy_path = tmp_path / "readmit.yaml"
    settings.policy_path.write_text(default_policy_path().read_text().replace("spec:\n", "spec:\n  forget: {readmit: true}\n", 1))
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    request.addfinalizer(k.close)
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    ref = s.admit("booking", SECRET).ref
    first = k.forget("acme", ref)
    again = s.admit("booking", SECRET)  # a later fetch of the same bytes is a new admission
    assert again.ref == ref and again.admitted
    # waits for the replay: a repeat asked while it runs would gain its proof (and a larger tree)
    second = k.forget("acme", ref, wait_replay=True)
    assert second.request_id != first.request_id and second.log_index > first.log_index
    assert {u.id for u in second.units_dropped if u.kind == "segment"} == {again.segment.id}
    assert second.replay == "verified" and k.forget("acme", ref) == second  # idempotent again
    # while a forget is pending, the same bytes cannot come back in (they would outlive the shred)
    third = s.admit("booking", SECRET)
    pending = ForgetRow(tenant="acme", ref=ref, request_id="fgt_pending_test", started_us=now_us(),
                        state="requested", principal=None, reason=None, requested_index=None,
                        completed_index=None, key_id=None, kek_version=None, units="[]", sessions="[]")
    k.state.start_forget(pending)
    fp = s.fingerprint()
    with pytest.raises(RefBeingForgotten):
        s.admit("booking", SECRET)
    assert s.fingerprint() == fp
    receipt = resume(k.services, k.state.forget_row("acme", ref))
    assert receipt.request_id == "fgt_pending_test"
    assert {u.id for u in receipt.units_dropped if u.kind == "segment"} == {third.segment.id}
    assert verify_receipt(receipt, k.audit.public_key())


def test_quarantine_is_logged_before_it_acts(settings, tiny_lm) -> None:
    from fak.audit.errors import AuditError

    k = Kernel.open(settings, model=tiny_lm, progress=None)
    held = _holding(k, "acme")
    before = {s.id: (s.fingerprint(), s.ledger()) for s in held["sessions"]}
    k.audit.close()  # the decision cannot be logged: nothing may happen
    with pytest.raises(AuditError):
        k.quarantine("acme", held["ref"], reason="late")
    assert {s.id: (s.fingerprint(), s.ledger()) for s in held["sessions"]} == before
    assert not k.state.ref("acme", held["ref"]).quarantined
    k.close()


def test_forget_returns_before_its_replay_and_a_mismatch_alarms(kernel, capsys) -> None:
    from fak.kernel.withdrawal.replay_check import ReplayJob, SessionJob, run

    k = kernel
    held = _holding(k, "acme")
    ref, sessions = held["ref"], held["sessions"]
    receipt = k.forget("acme", ref)
    key = k.audit.public_key()
    # returned once the erasure is done: the receipt proves it already; its replay is pending
    assert receipt.replay == "pending" and all(s.fingerprint_replay is None for s in receipt.sessions)
    check = verify_receipt(receipt, key)
    assert check and check.replay == "pending"
    assert not verify_receipt(receipt, key, require_replay=True)
    assert k.replays.wait(receipt.request_id, timeout=120)
    done = k.forget_status("acme", receipt.request_id).receipt
    assert done.replay == "verified" and done.replay_index > done.log_index == receipt.log_index
    assert verify_receipt(done, key, require_replay=True)
    assert k.forget("acme", ref) == done  # repeating it returns the completed receipt
    # a drop that had left another state than never-saw: the replay differs from the logged
    # fingerprint, which is logged as not verified, with an alarm, and the receipt stops verifying
    s = sessions[0]
    ids = [x["id"] for x in s.ledger() if x["state"] == "live"]
    wrong = k.audit_fingerprint("acme", "blake3:" + "0" * 64)
    others = [SessionJob(x.session_id, x.fingerprint_after, [y["id"] for y in k.session("acme", x.session_id)
                                                            .ledger() if y["state"] == "live"])
              for x in receipt.sessions if x.session_id != s.id]
    index = run(k.services, ReplayJob("acme", receipt.request_id, ref, receipt.log_index,
                             [SessionJob(s.id, wrong, ids), *others]))
    assert "ALARM (forget_replay_mismatch)" in capsys.readouterr().err
    (alarm,) = events(k, "audit_alarm")
    assert alarm.kind == "forget_replay_mismatch" and alarm.request_id == receipt.request_id
    logged = k.audit.entry(index).event
    assert logged.type == "replay_verified" and not logged.verified
    from fak.audit.receipt import ForgetReceipt

    bad = ForgetReceipt.from_log(k.audit, receipt.log_index, replay_index=index)
    assert bad.replay == "mismatch" and not verify_receipt(bad, key)


def test_receipt_lookups_read_hashed_bodies_not_the_type_column(kernel) -> None:
    """A database writer who retypes the admission's and the replay's rows (the ``type``
    column, which no hash covers) changes nothing the receipt says: both are found by their
    hashed bodies."""
    k = kernel
    ref = _holding(k, "acme")["ref"]
    first = k.forget("acme", ref, wait_replay=True)
    assert first.replay == "verified"
    url = k.state.engine.url.render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:  # the attack: drop the append-only triggers, retype the rows
            for name in conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars():
                conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
            conn.execute(sa.text("UPDATE audit_entries SET type = 'policy_loaded' "
                                 "WHERE type IN ('replay_verified', 'admission_verdict')"))
    finally:
        engine.dispose()
    again = k.forget("acme", ref)
    assert again.replay == "verified" and first.admitted_index is not None and again.admitted_index == first.admitted_index
    assert verify_receipt(again, k.audit.public_key(), require_replay=True)
