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
                            rule_id="pii.email", policy_digest=P, admitted_ref=D, tenant="acme"),
        ev.Eviction(session_id="s-1", segment_id="seg-3", ref=D, mode="RECOMPUTE", exact=True, tokens=12),
        ev.Materialisation(session_id="s-1", ref=D, verdict="HIT", exact=False),
        ev.ForgetRequested(request_id="f-1", ref=D, principal="key:abc"),
        ev.ForgetCompleted(request_id="f-1", ref=D, units_dropped=[ev.DroppedUnit(kind="pic_chunk", id="c9")],
                           fingerprint_after=D, fingerprint_replay=D, shredded_key_id="kek-1/dk-7"),
        ev.PolicyLoaded(policy_id="default", policy_digest=P),
        ev.KeyRotated(key_kind="audit_signing", old_key_id="a1b2c3d4", new_key_id="e5f6a7b8"),
        ev.AuthFailure(reason="unknown_key", key_fingerprint=P, route="/v1/forget"),
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


def test_none_tenant_is_system_and_non_canonical_bytes_refused():
    e = ev.PolicyLoaded(policy_id="p", policy_digest=P, tenant=None)
    assert e.tenant == ""
    raw = ev.canonical(e)
    with pytest.raises(AuditError):
        ev.parse_event(json.dumps(json.loads(raw), indent=1).encode())
    with pytest.raises(AuditError):
        ev.parse_event(b"not json")
