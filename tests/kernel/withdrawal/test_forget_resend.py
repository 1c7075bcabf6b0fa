"""A forgotten ref's bytes, resent, stay out (``fak.kernel.session.admission``, rule ``ref_forgotten``).

A stateless client (the OpenAI door without ``fak_session``) resends its whole history on
every request, so each tool message is admitted again. After an admin's forget the same
bytes must not come back: their keyed digest is the forgotten ref (the CAS keeps its
tombstone, never the bytes), so the admission is QUARANTINE ``ref_forgotten``, audited,
never prefilled and never stored again, unless the policy allows re-admission
(``spec.forget.readmit``). Another tenant's ref of the same bytes is its own. Through the
Kernel (tiny model) and through a real server with the ``openai`` client."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from support.kernel_facade_helpers import CLEAN, events

from fak import Kernel
from fak.cas.errors import CasError
from fak.kernel.facade import default_policy_path
from fak.kernel.kv.ledger import SegmentState
from fak.kernel.session.admission import FORGOTTEN_RULE
from fak.types import VerdictKind

SECRET = b"Booking reference QX7Y2Z for passenger Ada Lovelace, card ending 4242, seat 14C."
# the default policy's secrets rule REDACTs these two; both redact to the same bytes
KEYED = b"config: aws_access_key_id = AKIAIOSFODNN7QWERTYZ and nothing else"
KEYED_TOO = b"config: aws_access_key_id = AKIAJK2LMNOPQRSTUVWX and nothing else"


def _kernel(settings, tiny_lm, tmp_path: Path, request, edit: tuple[str, str]) -> Kernel:  # noqa: ANN001
    """A kernel under the default policy with one edit of its text."""
    text = default_policy_path().read_text()
    assert edit[0] in text
    settings.policy_path = tmp_path / "policy.yaml"
    settings.policy_path.write_text(text.replace(edit[0], edit[1], 1))
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    request.addfinalizer(k.close)
    return k


def _forgotten(k: Kernel, tenant: str = "acme", data: bytes = SECRET) -> str:
    s = k.session(tenant)
    s.append("system", "You are a travel assistant.")
    ref = s.admit("booking", data).ref
    k.forget(tenant, ref, requested_by="dpo", reason="gdpr_art17", wait_replay=True)
    return ref


def _refused(k: Kernel, s, data: bytes, ref: str) -> None:  # noqa: ANN001
    """``data`` admitted into ``s`` is QUARANTINE ref_forgotten: recorded, audited, not in the KV."""
    fp = s.fingerprint()
    a = s.admit("booking", data)
    assert (a.verdict.kind, a.verdict.rule_id, a.ref, a.admitted_ref) == (
        VerdictKind.QUARANTINE, FORGOTTEN_RULE, ref, None)
    assert not a.admitted and a.segment.state is SegmentState.QUARANTINED and a.segment.ref == ref
    assert s.fingerprint() == fp  # never prefilled
    ev = [e for e in k.audit.entries() if e.index == a.audit_index][0].event
    assert (ev.type, ev.rule_id, ev.verdict, ev.ref, ev.segment_id) == (
        "admission_verdict", FORGOTTEN_RULE, "QUARANTINE", ref, a.segment.id)


def test_resent_forgotten_bytes_are_refused_unstored_and_audited(kernel) -> None:
    k = kernel
    ref = _forgotten(k)
    # what the forget leaves is a keyed-digest tombstone and a forget row, no content
    head = k.store.head(ref, "acme")
    assert head is not None and head.state == "forgotten" and head.media_type != "text/plain"
    row = k.state.forget_covering("acme", ref)
    assert row is not None and row.ref == ref and row.state in ("replaying", "completed")
    assert SECRET.decode() not in repr({c.name: getattr(row, c.name) for c in row.__table__.columns})

    same = k.session("acme")
    same.append("system", "You are a travel assistant.")
    _refused(k, same, SECRET, ref)
    _refused(k, same, SECRET, ref)  # every resend: each one audited
    assert len([e for e in events(k, "admission_verdict") if e.rule_id == FORGOTTEN_RULE]) == 2
    # the refusal stored nothing: the ref is still a tombstone, its bytes unreadable
    assert k.store.head(ref, "acme").state == "forgotten"
    with pytest.raises(CasError):
        k.store.get(ref, "acme")
    # and the forget stands: forgetting again returns its receipt
    assert k.forget("acme", ref).request_id == row.request_id
    # other bytes are admitted as ever
    assert same.admit("flight_status", CLEAN).admitted


def test_another_tenant_resending_the_same_bytes_is_unaffected(kernel) -> None:
    k = kernel
    ref = _forgotten(k, "acme")
    g = k.session("globex")
    g.append("system", "You are a travel assistant.")
    a = g.admit("booking", SECRET)
    assert a.admitted and a.verdict.kind is VerdictKind.ALLOW and a.ref != ref  # its own keyed ref
    assert k.store.get(a.ref, "globex") == SECRET


def test_the_policy_may_allow_readmission(settings, tiny_lm, tmp_path, request) -> None:
    k = _kernel(settings, tiny_lm, tmp_path, request, ("spec:\n", "spec:\n  forget: {readmit: true}\n"))
    assert k.policy.spec.forget.readmit
    ref = _forgotten(k)
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    a = s.admit("booking", SECRET)
    assert a.admitted and a.verdict.kind is VerdictKind.ALLOW and a.ref == ref
    assert k.store.get(ref, "acme") == SECRET  # a new admission: stored again, forgettable again


def test_audit_mode_does_not_readmit_forgotten_bytes(settings, tiny_lm, tmp_path, request) -> None:
    k = _kernel(settings, tiny_lm, tmp_path, request, ("mode: enforce", "mode: audit"))
    ref = _forgotten(k)
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    _refused(k, s, SECRET, ref)  # a forget is an erasure, not a detection the audit mode relaxes


def test_a_forget_in_progress_refuses_the_bytes(kernel) -> None:
    from fak.state.schema import ForgetRow
    from fak.state.store import now_us

    k = kernel
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    ref = s.admit("booking", SECRET).ref
    k.state.start_forget(ForgetRow(tenant="acme", ref=ref, request_id="fgt_pending_resend", started_us=now_us(),
                                   state="requested", principal=None, reason=None, requested_index=None,
                                   completed_index=None, key_id=None, kek_version=None, units="[]", sessions="[]"))
    other = k.session("acme")
    other.append("system", "You are a travel assistant.")
    _refused(k, other, SECRET, ref)  # its bytes still live in the CAS, but on their way out


@pytest.mark.parametrize("which", ["original", "redacted"])
def test_either_form_of_a_redacted_result_blocks_the_bytes(kernel, which) -> None:
    k = kernel
    s = k.session("acme")
    s.append("system", "You are a deployment assistant.")
    a = s.admit("file_read", KEYED)
    assert a.verdict.kind is VerdictKind.REDACT and a.admitted_ref not in (None, a.ref)
    redacted = k.store.get(a.admitted_ref, "acme")
    k.forget("acme", a.ref if which == "original" else a.admitted_ref, wait_replay=True)

    again = k.session("acme")
    again.append("system", "You are a deployment assistant.")
    _refused(k, again, KEYED, a.ref)  # the original bytes
    _refused(k, again, redacted, a.admitted_ref)  # the redacted bytes, resent as they were shown
    # another original whose redacted form is the forgotten one: refused (stored as any refusal)
    fp = again.fingerprint()
    b = again.admit("file_read", KEYED_TOO)
    assert (b.verdict.kind, b.verdict.rule_id, b.admitted) == (VerdictKind.QUARANTINE, FORGOTTEN_RULE, False)
    assert b.ref not in (a.ref, a.admitted_ref) and again.fingerprint() == fp
    assert k.store.head(a.admitted_ref, "acme").state == "forgotten"  # not revived


def test_after_a_tenant_erase_the_tenant_starts_anew(kernel) -> None:
    k = kernel
    ref = _forgotten(k)
    k.erase_tenant("acme", confirm="acme")
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    a = s.admit("booking", SECRET)
    # the digest key died with the tenant: the same bytes are another ref no tombstone names
    assert a.ref != ref and a.admitted
    assert k.state.forget_row("acme", ref) is not None  # the receipt's row stays (no content in it)


# --- through a real server: a stateless client resends its history after the forget ---------
def test_a_stateless_client_resending_a_forgotten_result_over_http(kernel) -> None:
    from fak.api.server import serve

    messages = [
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "user", "content": "What is my booking?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "booking", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": SECRET.decode()},
        {"role": "user", "content": "Thanks."},
    ]
    with serve(kernel) as live:
        agent = openai.OpenAI(base_url=live.url + "/v1", api_key=live.key("acme", "agent"), max_retries=0,
                              timeout=60, http_client=openai.DefaultHttpxClient(trust_env=False))
        model = agent.models.list().data[0].id

        def ask() -> dict:
            r = agent.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=4)
            [adm] = r.model_extra["fak"]["admissions"]
            return adm

        first = ask()
        assert first["verdict"] == "ALLOW" and first["admitted"]
        with live.client(live.key("acme", "admin")) as admin:
            r = admin.post("/v1/forget", json={"ref": first["ref"], "reason": "gdpr_art17"})
        assert r.status_code == 200, r.text
        again = ask()
        assert (again["verdict"], again["rule_id"], again["ref"], again["admitted"]) == (
            "QUARANTINE", FORGOTTEN_RULE, first["ref"], False)
        assert again["audit_index"] > first["audit_index"]
        assert kernel.store.head(first["ref"], "acme").state == "forgotten"
