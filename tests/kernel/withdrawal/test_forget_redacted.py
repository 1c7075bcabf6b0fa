"""Forget of a REDACTed tool result erases both of its forms (issue 25.3).

A REDACT admission stores two refs: the original bytes (with the secret) and the redacted
form that entered attention. Forgetting either must erase both, with every unit derived
from either, and the receipt must name both; another tenant holding the same bytes is
untouched. Through the Kernel façade (tiny model), over HTTP (a real server), across a
restart and across a SIGKILL at each step of the forget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fak import Kernel
from fak.audit.receipt import ForgetReceipt, verify_receipt
from fak.cas.errors import CasError

# the default policy's secrets rule REDACTs it (tests/kernel/test_kernel_facade.py)
SECRET = b"config: aws_access_key_id = AKIAIOSFODNN7QWERTYZ and nothing else"


def _redacted(k: Kernel, tenant: str):  # noqa: ANN202
    """A session holding a REDACTed result and a generated turn that attended to it."""
    s = k.session(tenant)
    s.append("system", "You are a deployment assistant.")
    s.append("user", "What is in the config?")
    a = s.admit("file_read", SECRET)
    assert a.verdict.kind.value == "REDACT" and a.admitted_ref not in (None, a.ref)
    list(s.generate(max_tokens=3, min_tokens=3))
    gen = [x for x in s.ledger() if x["kind"] == "assistant"][-1]
    assert a.admitted_ref in gen["content_provenance"]
    return s, a, gen


def _erased(k: Kernel, tenant: str, *refs: str) -> None:
    for r in refs:
        assert k.store.head(r, tenant).state == "forgotten", r
        with pytest.raises(CasError):
            k.store.get(r, tenant)


@pytest.mark.parametrize("which", ["original", "redacted"])
def test_forget_either_form_erases_both(kernel, which) -> None:
    k = kernel
    s, a, gen = _redacted(k, "acme")
    other_s, other_a, _ = _redacted(k, "globex")  # the same bytes in another tenant
    other_fp = other_s.fingerprint()
    target, linked = (a.ref, a.admitted_ref) if which == "original" else (a.admitted_ref, a.ref)

    receipt = k.forget("acme", target, requested_by="dpo", reason="gdpr_art17")

    dropped = {(u.kind, u.session_id, u.id) for u in receipt.units_dropped}
    assert ("segment", s.id, a.segment.id) in dropped
    assert ("generated_segment", s.id, gen["id"]) in dropped
    _erased(k, "acme", a.ref, a.admitted_ref)
    live = [x for x in s.ledger() if x["state"] == "live"]
    assert not any({a.ref, a.admitted_ref} & ({x["ref"]} | set(x["content_provenance"]) | set(x["provenance"]))
                   for x in live)
    assert s.fingerprint() == s.replay_fingerprint()
    assert receipt.ref == target and [x.ref for x in receipt.linked_refs] == [linked]
    assert all(x.shredded_key_id for x in receipt.linked_refs)
    assert verify_receipt(receipt, k.audit.public_key())
    # forgetting the other form now returns the same forget's receipt, not a conflict
    again = k.forget("acme", linked)
    assert (again.request_id, again.log_index, again.linked_refs) == (receipt.request_id, receipt.log_index,
                                                                      receipt.linked_refs)
    # the other tenant's copies of the same bytes are untouched
    assert k.store.get(other_a.ref, "globex") == SECRET
    assert b"AKIA" not in k.store.get(other_a.admitted_ref, "globex")
    assert other_s.fingerprint() == other_fp
    assert any(x["ref"] == other_a.admitted_ref and x["state"] == "live" for x in other_s.ledger())


def _forget_after_reopen(settings, tiny_lm) -> None:  # noqa: ANN001
    """A REDACTed result stored, the kernel closed and reopened, then its redacted form forgotten:
    the link (read back from the database) erases both forms and the receipt signs it."""
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s, a, _ = _redacted(k, "acme")
        sid = s.id
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        receipt = k.forget("acme", a.admitted_ref)
        _erased(k, "acme", a.ref, a.admitted_ref)
        assert ("segment", sid, a.segment.id) in {(u.kind, u.session_id, u.id) for u in receipt.units_dropped}
        assert {u.session_id for u in receipt.units_dropped if u.kind == "segment"} == {sid}
        assert [x.ref for x in receipt.linked_refs] == [a.ref]
        assert verify_receipt(receipt, k.audit.public_key())
        assert k.forget("acme", a.ref).request_id == receipt.request_id


@pytest.mark.postgres
def test_forget_either_form_on_postgres(settings, tiny_lm, pg_url) -> None:
    """The link table, the forget's linked refs and a resume across a reopen on PostgreSQL."""
    _forget_after_reopen(settings.model_copy(update={"database_url": pg_url}), tiny_lm)


def test_receipt_linked_refs_are_signed(kernel) -> None:
    """A receipt whose linked refs were edited does not verify; nor does one that drops them."""
    k = kernel
    _, a, _ = _redacted(k, "acme")
    receipt = k.forget("acme", a.ref).model_dump(mode="json")
    assert verify_receipt(receipt, k.audit.public_key())
    for forged in ({**receipt, "linked_refs": None},
                   {**receipt, "linked_refs": [{**receipt["linked_refs"][0], "ref": "blake3k:" + "1" * 64}]}):
        check = verify_receipt(forged, k.audit.public_key())
        assert not check and "linked_refs" in check.reason
    assert ForgetReceipt.model_validate(receipt).linked_refs[0].ref == a.admitted_ref


def test_link_survives_restart(settings, tiny_lm) -> None:
    _forget_after_reopen(settings, tiny_lm)


SCRIPT = textwrap.dedent("""
    import json, sys
    from fak import Kernel, Settings
    data, model = sys.argv[1], sys.argv[2]
    k = Kernel.open(Settings(data_dir=data, model_path=model, chunk_size=16), progress=None)
    k.forget("acme", json.load(open(data + "/target.json"))["ref"], requested_by="ops", reason="crash_test")
    print("forget returned")
""")


@pytest.mark.parametrize(("point", "which"), [("forget.after_requested", "original"),
                                              ("forget.before_shred", "redacted"),
                                              ("forget.before_completed", "original")])
def test_forget_of_either_form_resumes_after_crash(settings, tiny_lm, tiny_dir, point, which) -> None:
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s, a, _ = _redacted(k, "acme")
        target = a.ref if which == "original" else a.admitted_ref
        (settings.data_dir / "target.json").write_text(json.dumps({"ref": target}))
    env = os.environ | {"FAK_FAULT_POINT": point}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(settings.data_dir), str(tiny_dir)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, run.stderr  # SIGKILL at the named point
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:  # resumes the forget
        _erased(k, "acme", a.ref, a.admitted_ref)
        receipt = k.forget("acme", target)
        assert ("segment", s.id, a.segment.id) in {(u.kind, u.session_id, u.id) for u in receipt.units_dropped}
        assert {x.ref for x in receipt.linked_refs} == {a.ref, a.admitted_ref} - {target}
        assert verify_receipt(receipt, k.audit.public_key())
        ks = k.session("acme", s.id)
        assert not {a.ref, a.admitted_ref} & set(ks.refs()) and ks.fingerprint() == ks.replay_fingerprint()


@pytest.mark.parametrize("which", ["original", "redacted"])
def test_forget_over_http_erases_both_forms(kernel, live_server, which) -> None:
    def admit(tenant: str) -> tuple[str, dict]:
        c = clients[tenant, "agent"]
        sid = c.post("/v1/sessions", json={}).json()["id"]
        assert c.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "Config?"}).status_code == 201
        r = c.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "file_read", "content": SECRET.decode()})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["verdict"] == "REDACT" and body["admitted_ref"] not in (None, body["ref"])
        return sid, body

    clients = {(t, role): live_server.client(live_server.key(t, role))
               for t in ("acme", "globex") for role in ("agent", "admin")}
    try:
        sid, adm = admit("acme")
        _, other = admit("globex")
        target, linked = ((adm["ref"], adm["admitted_ref"]) if which == "original"
                          else (adm["admitted_ref"], adm["ref"]))
        agent = clients["acme", "agent"]
        assert agent.get(f"/v1/refs/{linked}").status_code == 200
        r = clients["acme", "admin"].post("/v1/forget", json={"ref": target, "reason": "gdpr"})
        assert r.status_code == 200, r.text
        receipt = r.json()
        assert {"kind": "segment", "id": adm["segment"]["id"], "session_id": sid} in receipt["units_dropped"]
        assert [x["ref"] for x in receipt["linked_refs"]] == [linked]
        assert verify_receipt(receipt, kernel.audit.public_key())
        for ref in (target, linked):
            got = agent.get(f"/v1/refs/{ref}")
            assert got.status_code == 410 and got.json()["type"].endswith("/forgotten"), (ref, got.text)
        segs = {x["id"]: x for x in agent.get(f"/v1/sessions/{sid}").json()["segments"]}
        assert segs[adm["segment"]["id"]]["state"] == "forgotten"
        assert all(x["ref"] not in (target, linked) for x in segs.values() if x["state"] == "live")
        # repeating the forget with the other form answers the same receipt
        again = clients["acme", "admin"].post("/v1/forget", json={"ref": linked})
        assert again.status_code == 200, again.text
        same = ("request_id", "log_index", "ref", "linked_refs", "units_dropped")
        assert {f: again.json()[f] for f in same} == {f: receipt[f] for f in same}
        globex = clients["globex", "agent"]
        assert globex.get(f"/v1/refs/{other['ref']}").content == SECRET
        assert globex.get(f"/v1/refs/{other['admitted_ref']}").status_code == 200
    finally:
        for c in clients.values():
            c.close()


def test_receipt_refuses_a_completion_that_drops_a_requested_linked_ref(tmp_path) -> None:
    """The request commits to the linked refs before any effect: a completion that erases
    fewer does not verify, one that erases them does (offline, from the log alone)."""
    from fak.audit import AdmissionVerdict, AuditLog, DroppedUnit, ForgetCompleted, ForgetRequested
    from fak.audit.events import LinkedRef

    ref, redacted = "blake3k:" + "ef" * 32, "blake3k:" + "aa" * 32
    log = AuditLog.open(url=f"sqlite:///{tmp_path / 'audit.db'}", data_dir=tmp_path)
    try:
        log.append(AdmissionVerdict(tenant="acme", session_id="s1", segment_id="seg-2", tool="file_read", ref=ref,
                                    size=64, verdict="REDACT", policy_digest="sha256:" + "cd" * 32,
                                    admitted_ref=redacted))
        receipts = {}
        for name, linked in (("dropped", None), ("kept", [LinkedRef(ref=redacted, shredded_key_id="dk-2")])):
            asked = log.append(ForgetRequested(tenant="acme", request_id=f"f-{name}", ref=ref, linked_refs=[redacted]))
            done = log.append(ForgetCompleted(tenant="acme", request_id=f"f-{name}", ref=ref, requested_index=asked,
                                              units_dropped=[DroppedUnit(kind="prefix_node", id="n1")],
                                              shredded_key_id="dk-1", linked_refs=linked))
            receipts[name] = ForgetReceipt.from_log(log, done)
        bad = verify_receipt(receipts["dropped"], log.public_key())
        assert not bad and "not erased by the completion" in bad.reason
        assert verify_receipt(receipts["kept"], log.public_key())
    finally:
        log.close()
