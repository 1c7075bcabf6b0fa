"""A persistent gateway session's durable ledger: the same tables as a kernel session's
(``fak_sessions``, ``fak_segments``), marked by its model (``upstream:<name>``), so a forget
finds it by the same query (``StateStore.sessions_holding``) and a tenant erase deletes it.

What a row keeps: a system or user message in the clear (as a kernel session keeps a client's
text); a tool result's envelope (its call id) in the clear and its bytes not at all (they come
back from the CAS by ref, so a forget's shred takes them from every backup); an assistant
message, which may repeat what the results live before it said, sealed under their data keys
(``fak.state.seal``), so a forget of any of them makes it unreadable in every copy of the
database. A tool segment's producer and media type are kept under the producer MAC: whoever
can write the database but holds no key cannot raise a result's trust.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fak.errors import NotFound
from fak.kernel.calls.authorize import UNKNOWN_TOOL
from fak.kernel.gateway.session import GatewaySegment, GatewaySession, notice
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.services import GATEWAY_MODEL_PREFIX, Services
from fak.policy import VerdictKind
from fak.state.schema import SegmentRow, SessionRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import StateError, now_us

__all__ = ["GATEWAY_TOKENIZER", "is_gateway", "load", "upstream_of", "write"]

MODEL_PREFIX = GATEWAY_MODEL_PREFIX  # a gateway session's ``model_id``: the upstream's name after it
GATEWAY_TOKENIZER = "gateway"  # its ``tokenizer_id``: it holds no tokens


def is_gateway(row: SessionRow) -> bool:
    return row.model_id.startswith(MODEL_PREFIX)


def upstream_of(row: SessionRow) -> str:
    return row.model_id[len(MODEL_PREFIX):]


def _producer_mac(services: Services, gs: GatewaySession, seg_id: str, ref: str | None, tool: str | None,
                  source: str | None, media_type: str | None) -> str | None:
    if tool is None:
        return None
    return services.keys.producer_mac(gs.tenant, gs.id, seg_id, ref, tool, source, media_type)


def _record(seg: GatewaySegment) -> dict[str, Any]:
    """What a row keeps of a segment's message: a tool result without its bytes."""
    message = {k: v for k, v in seg.message.items() if not (seg.kind is SegmentKind.TOOL and k == "content")}
    return {"message": message, "text": seg.match_text, "in_history": seg.in_history}


def write(services: Services, gs: GatewaySession) -> None:
    """Replace the session's rows with its ledger now."""
    tenant = gs.tenant
    head = SessionRow(tenant=tenant, id=gs.id, created_us=gs.created_us, updated_us=now_us(),
                      model_id=MODEL_PREFIX + gs.upstream, tokenizer_id=GATEWAY_TOKENIZER, chunk_size=1,
                      next_segment=gs.next_number, fingerprint=gs.fingerprint(), tokens=0, approximate=False,
                      exact_rows=0, replica=services.settings.replica)
    sealing = [x for x in gs.segments if x.live and x.kind is not SegmentKind.TOOL and x.content]
    keys = services.store.content_keys(tenant, sorted(frozenset().union(*(x.content for x in sealing)))) \
        if sealing else {}
    rows = []
    for i, seg in enumerate(gs.segments):
        record = json.dumps(_record(seg), ensure_ascii=False)
        mine = {r: keys[r] for r in seg.content} if seg in sealing else {}
        sealed = seal(mine, tenant, gs.id, seg.id, Plain([], "gateway", record)) if needs_seal(mine) else None
        keep = seg.live or seg.kind is SegmentKind.TOOL  # a tool envelope answers its call even when withheld
        rows.append(SegmentRow(
            tenant=tenant, session_id=gs.id, id=seg.id, seq=i, kind=seg.kind.value, state=seg.state.value,
            ref=seg.ref, verdict=seg.verdict.value if seg.verdict else None, rule=seg.rule, policy_digest=None,
            protected=False, chunks="[]", ntokens=0, tokens=None,
            message_role=str(seg.message.get("role", seg.kind.value))[:16] if keep else None,
            message_text=record if keep and sealed is None else None, sealed=sealed,
            attention=json.dumps(sorted(seg.attention)), content=json.dumps(sorted(seg.content)),
            expires_turn=None, tool=seg.tool, source=seg.source, media_type=seg.media_type,
            producer_mac=_producer_mac(services, gs, seg.id, seg.ref, seg.tool, seg.source, seg.media_type)))
    services.state.save_session(head, rows)


def load(services: Services, head: SessionRow, rows: list[SegmentRow]) -> GatewaySession:
    """The session the rows record; a tool result's bytes from the CAS, a sealed message opened
    with its refs' data keys."""
    if not is_gateway(head):
        raise NotFound(f"session {head.id!r} runs on fak's own model, not an upstream")
    tenant = head.tenant
    gs = GatewaySession(services, tenant, upstream_of(head), id=head.id, created_us=head.created_us,
                        persistent=True, next_number=head.next_segment)
    sealed = [r for r in rows if r.sealed is not None]
    keys = services.store.content_keys(tenant, sorted(frozenset().union(*(json.loads(r.content) for r in sealed)))) \
        if sealed else {}
    for row in rows:
        kind, state = SegmentKind(row.kind), SegmentState(row.state)
        content = frozenset(json.loads(row.content))
        if row.sealed is not None:
            plain = unseal({r: keys[r] for r in content}, tenant, head.id, row.id, row.sealed)
            record = json.loads(plain.text or "{}")
        elif row.message_text is not None:
            record = json.loads(row.message_text)
        else:
            record = {"message": {"role": row.message_role or kind.value}, "text": "", "in_history": True}
        message: dict[str, Any] = dict(record.get("message") or {})
        tool, source, media_type = _producer(services, gs, row)
        verdict = VerdictKind(row.verdict) if row.verdict is not None else None
        if kind is SegmentKind.TOOL:
            if state is SegmentState.LIVE:
                if not row.ref:
                    raise StateError(f"gateway session {head.id}: tool segment {row.id} has no ref")
                message["content"] = services.tool_text(tenant, row.ref)
            else:
                message["content"] = notice(state, verdict, row.rule)
        gs.segments.append(GatewaySegment(
            row.id, kind, message, ref=row.ref, state=state, verdict=verdict, rule=row.rule, tool=tool,
            source=source, media_type=media_type, content=content, attention=frozenset(json.loads(row.attention)),
            in_history=bool(record.get("in_history", True)), match_text=str(record.get("text") or "")))
    if gs.fingerprint() != head.fingerprint:  # as a kernel session's replay is checked against its KV's
        raise StateError(f"gateway session {head.id} rebuilt to fingerprint {gs.fingerprint()}, the ledger "
                         f"recorded {head.fingerprint}: refusing to serve it")
    return gs


def _producer(services: Services, gs: GatewaySession, row: SegmentRow) -> tuple[str | None, str | None, str | None]:
    """A tool row's producer and media type if its MAC verifies, else unknown (untrusted)."""
    if row.tool is None:
        return (UNKNOWN_TOOL, None, None) if row.kind == SegmentKind.TOOL.value else (None, None, None)
    expected = _producer_mac(services, gs, row.id, row.ref, row.tool, row.source, row.media_type)
    if row.producer_mac is None or not hmac.compare_digest(row.producer_mac, expected or ""):
        return UNKNOWN_TOOL, None, None
    return row.tool, row.source, row.media_type
