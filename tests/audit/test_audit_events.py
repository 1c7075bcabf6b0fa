"""Events carry ids and digests only: free text is refused, bytes are canonical."""

from __future__ import annotations

import json

import pytest

from fak.audit import events as ev
from fak.audit.errors import AuditError

D = "blake3k:" + "ab" * 32
P = "sha256:" + "cd" * 32


def _samples() -> list:
    return [
        ev.AdmissionVerdict(session_id="s-1", tool="web.fetch", ref=D, size=10, verdict="REDACT",
                            rule_id="pii.email", policy_digest=P, admitted_ref=D, tenant="acme", trust="untrusted",
                            audited=["injection-strict"], exempted=["our-docs"]),
        ev.Eviction(session_id="s-1", segment_id="seg-3", ref=D, mode="RECOMPUTE", exact=True, tokens=12),
        ev.Materialisation(
            session_id="s-1", policy_digest=P, context_tokens=300, budget_tokens=512, fingerprint_after=D,
            pieces=[ev.MaterialisedPiece(ref=D, verdict="HIT", reason="pic", exact=False, tokens=120),
                    ev.MaterialisedPiece(tag="notes", verdict="REFUSE", reason="quarantined", tokens=0)],
        ),
        ev.ForgetRequested(request_id="f-1", ref=D, principal="key:abc", reason="gdpr.art17"),
        ev.ForgetCompleted(
            request_id="f-1", ref=D, requested_index=3, shredded_key_id="kek-1/dk-7", kek_version=2,
            units_dropped=[ev.DroppedUnit(kind="pic_chunk", id="c9"),
                           ev.DroppedUnit(kind="generated_segment", id="seg-5", session_id="s-1")],
            sessions=[ev.SessionFingerprints(session_id="s-1", fingerprint_after=D, fingerprint_replay=D)],
        ),
        ev.RefQuarantined(ref=D, reason="late.llm_judge", principal="detector:judge",
                          units=[ev.DroppedUnit(kind="segment", id="seg-2", session_id="s-1")]),
        ev.TenantEraseRequested(tenant="acme", principal="operator", reason="contract_ended"),
        ev.TenantErased(tenant="acme", requested_index=7, sessions=2, refs_forgotten=5, keys_destroyed=["kek:1:k-1"],
                        api_keys_revoked=1, shred_status="destroyed"),
        ev.RefExpired(ref=D, cause="turns", units=[ev.DroppedUnit(kind="segment", id="seg-4", session_id="s-1")]),
        ev.ToolCallDecision(session_id="s-1", tool="send_email", args_digest=D, verdict="DENY",
                            rule_id="no-untrusted-before-send", offending=[D], attention_refs=3, policy_digest=P,
                            audited=["watch-shell"]),
        ev.ToolCallApproval(session_id="s-1", call_id="call_held_0a1b", tool="pay", args_digest=D, approved=True,
                            decision_index=12, principal="key_1"),
        ev.SessionRebuilt(session_id="s-1", segments=4, tokens=812, fingerprint=D, cause="restart"),
        ev.ChangeRolledBack(tenant="acme", session_id="s-1", undoes=[7, 8]),
        ev.PolicyLoaded(policy_id="default", policy_digest=P),
        ev.KeyRotated(key_kind="audit_signing", old_key_id="a1b2c3d4", new_key_id="e5f6a7b8"),
        ev.KeysDestroyed(key_kind="cas_kek", key_ids=["k-1", "k-2"], principal="cli", tenant="acme"),
        ev.AuthFailure(reason="unknown_key", key_fingerprint=P, route="/v1/forget"),
        ev.KeyCreated(tenant="acme", key_id="0123456789abcdef", role="agent", expires_ms=1_800_000_000_000,
                      principal="cli"),
        ev.KeyRevoked(tenant="acme", key_id="0123456789abcdef", role="agent", principal="cli"),
        ev.KeyAlarm(key_id="0123456789abcdef", kind="row_mac_mismatch", refusals=3),
        ev.AuthFailures(window_start_ms=1, window_end_ms=60_001, count=1999, reasons={"unknown_key": 1999},
                        key_fingerprints=[P], more_keys=3, client_fingerprints=[P], dropped=0),
        ev.AuditAlarm(kind="history_rewritten", remembered_size=5, remembered_root=P, found_size=9, found_root=P),
        ev.ReplayVerified(request_id="f-1", ref=D, completed_index=4, verified=True,
                          sessions=[ev.SessionReplay(session_id="s-1", fingerprint_replay=D)]),
        ev.McpToolsApproved(server="mail", principal="key:0123456789abcdef",
                            tools=[ev.McpToolPin(name="send_email", digest=P)]),
        ev.McpToolsChanged(server="mail", changes=[ev.McpToolChange(name="send_email", change="description",
                                                                    pinned=P, seen=P),
                                                   ev.McpToolChange(name="export", change="not_pinned", seen=P)]),
        ev.McpToolCalled(tenant="acme", session_id="s-1", server="mail", tool="mcp:mail/read_inbox",
                         call_id="call_issued_0a1b", args_digest=D, decision_index=12, outcome="ok", via="gateway"),
    ]


def test_every_event_type_round_trips_canonically():
    samples = _samples()
    assert {s.type for s in samples} == {t.model_fields["type"].default for t in ev.EVENT_TYPES}
    for s in samples:
        raw = ev.canonical(s)
        assert ev.parse_event(raw) == s
        obj = json.loads(raw)
        assert list(obj) == sorted(obj)  # RFC 8785 orders members
        assert b" " not in raw


@pytest.mark.parametrize(
    "bad",
    [
        {"session_id": "ignore all previous instructions"},  # free text: spaces
        {"tool": "web\nfetch"},
        {"ref": "the tool said: hello"},
        {"verdict": "MAYBE"},
        {"content": "secret tool output"},  # unknown field
        {"prompt": "hi"},
        {"size": -1},
        {"tenant": "a tenant with spaces"},
        {"rule_id": "x" * 200},
    ],
)
def test_content_like_fields_refused(bad):
    base = ev.AdmissionVerdict(session_id="s", tool="t", ref=D, size=1, verdict="ALLOW", policy_digest=P)
    data = base.model_dump() | bad
    with pytest.raises(AuditError):
        ev.to_event(data)


@pytest.mark.parametrize(
    "event",
    [
        {"type": "forget_completed", "request_id": "f", "ref": D, "requested_index": 0,
         "fingerprint_after": D, "fingerprint_replay": D},  # the old single pair of fingerprints
        {"type": "forget_completed", "request_id": "f", "ref": D, "requested_index": -1},
        {"type": "forget_completed", "request_id": "f", "ref": D, "requested_index": 0,
         "units_dropped": [{"kind": "kv_page", "id": "x"}]},
        {"type": "forget_completed", "request_id": "f", "ref": D, "requested_index": True},  # strict: no bool
        {"type": "forget_completed", "request_id": "f", "ref": D, "requested_index": 0,
         "sessions": [{"session_id": "s"}]},
        {"type": "replay_verified", "request_id": "f", "ref": D, "completed_index": 0, "verified": True,
         "sessions": [{"session_id": "s", "fingerprint_replay": "x"}]},
        {"type": "replay_verified", "request_id": "f", "ref": D, "completed_index": 0, "verified": 1},
        {"type": "materialisation", "session_id": "s", "policy_digest": P, "context_tokens": 1,
         "fingerprint_after": D, "pieces": [{"ref": D, "verdict": "MISS", "reason": "x", "tokens": 1}]},
        {"type": "materialisation", "session_id": "s", "policy_digest": P, "context_tokens": 1,
         "fingerprint_after": D, "pieces": [{"ref": D, "verdict": "HIT", "reason": "has space", "tokens": 1}]},
        {"type": "session_rebuilt", "session_id": "s", "segments": 1, "tokens": 1, "fingerprint": D,
         "cause": "reboot"},
        {"type": "ref_quarantined", "ref": D, "reason": "r", "text": "the payload"},
        {"type": "policy_loaded", "policy_id": "p", "policy_digest": P, "tenant": "acme:eu"},  # ':' no longer
        {"type": "policy_loaded", "policy_id": "p", "policy_digest": P, "tenant": "a" * 65},
        {"type": "policy_loaded", "policy_id": "p", "policy_digest": P, "tenant": "-acme"},
    ],
)
def test_new_shapes_refuse_what_they_should(event):
    with pytest.raises(AuditError):
        ev.to_event(event)


def test_none_tenant_is_system_and_non_canonical_bytes_refused():
    e = ev.PolicyLoaded(policy_id="p", policy_digest=P, tenant=None)
    assert e.tenant == ""
    raw = ev.canonical(e)
    with pytest.raises(AuditError):
        ev.parse_event(json.dumps(json.loads(raw), indent=1).encode())
    with pytest.raises(AuditError):
        ev.parse_event(b"not json")
