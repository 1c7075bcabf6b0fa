"""``admit``: a tool result's path into attention (DESIGN.md, data flow).

bytes → ``cas.put`` (keyed ref) → ``policy.gate`` → verdict → audit event, then

- ``ALLOW``: the text is appended as a tool segment carrying the ref;
- ``REDACT``: the redacted bytes are stored as their own ref and appended; the
  original stays in the CAS under its own ref;
- ``QUARANTINE``: recorded in the ledger, never prefilled (== never saw it);
- ``DENY``: nothing enters; recorded in the ledger.

In audit-only policy mode the gate's ``enforced`` is false and the bytes are
admitted; the event still records what the policy would have done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fak.kernel.ledger import Segment, SegmentKind
from fak.kernel.session import EvictionReport, EvictMode, Session


@dataclass(frozen=True)
class Admission:
    verdict: Any  # fak.policy.Verdict
    ref: Any  # fak.cas.Ref of the original bytes
    admitted_ref: str | None  # the ref whose bytes entered attention, if any
    segment: Segment
    audit_index: int | None


def admit(
    session: Session,
    tool: str,
    data: bytes,
    *,
    store: Any,  # fak.cas.CasStore
    policy: Any,  # fak.policy.Policy
    audit: Any | None = None,  # fak.audit.AuditLog
    media_type: str = "text/plain",
) -> Admission:
    from fak.audit import AdmissionVerdict
    from fak.policy import GateContext, VerdictKind, gate

    tenant = session.tenant
    ref = store.put(data, media_type, tenant)
    verdict = gate(policy, tool, data, GateContext(media_type=media_type, tenant=tenant, session=session.id, ref=ref.digest))
    kind = verdict.kind if verdict.enforced else VerdictKind.ALLOW
    admitted_ref: str | None = None
    if kind in (VerdictKind.ALLOW, VerdictKind.REDACT):
        body = data
        admitted_ref = ref.digest
        if kind is VerdictKind.REDACT and verdict.redacted_bytes is not None:
            body = verdict.redacted_bytes
            admitted_ref = store.put(body, media_type, tenant).digest
        segment = session.append(
            SegmentKind.TOOL,
            body.decode("utf-8", errors="replace"),
            ref=admitted_ref,
            verdict=verdict.kind.value,
            rule=verdict.rule_id,
        )
        store.record_use(admitted_ref, tenant, "segment", f"{session.id}/{segment.id}")
    else:
        store.set_taint(ref.digest, tenant, "quarantined")
        segment = session.record_quarantined(
            SegmentKind.TOOL, ref=ref.digest, verdict=verdict.kind.value, rule=verdict.rule_id
        )
    index = None
    if audit is not None:
        index = audit.append(
            AdmissionVerdict(
                tenant=tenant,
                session_id=session.id,
                segment_id=segment.id,
                tool=_ident(tool),
                ref=ref.digest,
                size=len(data),
                verdict=verdict.kind.value,
                rule_id=_ident(verdict.rule_id),
                policy_digest=verdict.policy_digest,
                admitted_ref=admitted_ref if admitted_ref != ref.digest else None,
            )
        )
    return Admission(verdict, ref, admitted_ref, segment, index)


def evict_and_record(
    session: Session,
    segment_id: str,
    mode: EvictMode | str = EvictMode.AUTO,
    *,
    audit: Any | None = None,
    reason: str | None = None,
) -> tuple[EvictionReport, int | None]:
    """Evict a live segment and log the eviction (ids and fingerprint only)."""
    from fak.audit import Eviction

    report = session.evict(segment_id, mode)
    index = None
    if audit is not None:
        index = audit.append(
            Eviction(
                tenant=session.tenant,
                session_id=session.id,
                segment_id=segment_id,
                ref=report.ref,
                mode="TRUNCATE" if report.mode is EvictMode.WRITE_TIME else report.mode.name,
                exact=report.exactness == "bit-exact",
                tokens=report.rows_removed,
                reason=reason,
                fingerprint_after=report.fingerprint,
            )
        )
    return report, index


def _ident(value: str) -> str:
    """Audit ids allow a restricted alphabet; map anything else to '_'."""
    return "".join(c if c.isalnum() or c in "._:@/+=-" else "_" for c in value)[:128] or "_"
