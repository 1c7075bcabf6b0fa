"""Materialisation: make a session's tool context a named working set, with a
verdict and a reason for every piece (docs/design.md, Verdicts).

A working set names refs, or tags (``tag:NAME``, ``tool:NAME``) that select the
tenant's refs in admission order, minus ``exclude``, under a token budget. After
``materialise`` the session's live tool segments are exactly the placed pieces;
system, user and assistant segments stay where they are. Pieces already live
keep their place; the rest are appended in working-set order.

Per piece:

- ``HIT``: KV served without computing it: the piece was live and nothing before
  it changed (``live``), or the tenant's prefix cache held it (``prefix_cache``): exact;
  or the tenant's PIC registry served chunks of it (``pic``, where the policy allows
  approximate reuse): ``exact: false``, with the chunks' source positions.
- ``FAULT`` (``paged_in``): no KV anywhere; the bytes are read from the CAS and prefilled.
- ``RECOMPUTE``: KV exists but is invalid here: an earlier span was evicted
  (``upstream_evicted``), it sits elsewhere (``position_changed``: another session
  or prefix-cache entry of the tenant, or an earlier place in this session), or it
  was admitted under another policy version and was re-gated (``policy_drift``).
- ``REFUSE``: ``quarantined``, ``forgotten``, ``expired`` (its lifetime ended: the tool's or a
  fired rule's ``expires``, or ``retention.tool_result_ttl_s``; until admitted again), ``policy_refused`` (the active policy's gate
  does not allow it now), ``over_budget``.
- ``ABSTAIN``: ``unknown_ref`` (no such ref for this tenant: another tenant's ref
  answers the same, so the table is no existence oracle), ``unknown_tag``,
  ``model_mismatch`` / ``tokenizer_mismatch`` (the working set was planned for
  another model or tokenizer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fak.audit import Materialisation
from fak.errors import InvalidInput
from fak.kernel.calls.authorize import UNKNOWN_TOOL, Producer
from fak.kernel.events import SpanEvicted
from fak.kernel.kv.ledger import Segment, SegmentKind
from fak.kernel.services import Services
from fak.kernel.session.admission import base_media_type
from fak.policy import GateContext, VerdictKind
from fak.types import check_digest, check_id

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session

MAX_PIECES = 4096


class PieceVerdict(StrEnum):
    HIT = "HIT"
    FAULT = "FAULT"
    RECOMPUTE = "RECOMPUTE"
    REFUSE = "REFUSE"
    ABSTAIN = "ABSTAIN"


class WorkingSet(BaseModel):
    """What a session's tool context should hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    refs: list[str] = Field(default_factory=list, max_length=MAX_PIECES,
                            description="ref digests, or tag:NAME / tool:NAME selectors, in order")
    exclude: list[str] = Field(default_factory=list, max_length=MAX_PIECES, description="refs or selectors left out")
    budget_tokens: int | None = Field(None, ge=0, le=2**31 - 1,  # an audit event carries it: RFC 8785 ints < 2^53
                                      description="tokens the placed pieces may take together")
    model_id: str | None = Field(None, description="the model the set was planned for (ABSTAIN if another)")
    tokenizer_id: str | None = Field(None, description="the tokenizer the set was planned for")

    @field_validator("refs", "exclude")
    @classmethod
    def _selectors(cls, items: list[str]) -> list[str]:
        for item in items:
            if item.startswith(("tag:", "tool:")):
                check_id(item)
            else:
                check_digest(item)
        return items


@dataclass(frozen=True)
class Piece:
    selector: str  # as named in the working set
    ref: str | None
    verdict: PieceVerdict
    reason: str
    exact: bool | None = None  # for pieces placed in context
    tokens: int = 0
    segment_id: str | None = None
    pic_tokens: int = 0  # served from PIC chunks (approximate)
    source_positions: tuple[int, ...] = ()  # where those chunks were computed

    def as_dict(self) -> dict[str, object]:
        return {"selector": self.selector, "ref": self.ref, "verdict": self.verdict.value, "reason": self.reason,
                "exact": self.exact, "tokens": self.tokens, "segment_id": self.segment_id,
                "pic_tokens": self.pic_tokens, "source_positions": list(self.source_positions)}


@dataclass(frozen=True)
class MaterialiseResult:
    pieces: list[Piece]
    evicted: list[str]  # segment ids of tool segments that left the context
    ledger: list[dict[str, object]]
    context_tokens: int
    fingerprint: str
    audit_index: int
    seconds: float

    def verdicts(self) -> dict[str, str]:
        return {p.selector if p.ref is None else p.ref: p.verdict.value for p in self.pieces}


def _expand(svc: Services, tenant: str, items: list[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for item in items:
        if item.startswith(("tag:", "tool:")):
            tag = item[4:] if item.startswith("tag:") else item
            digests = svc.state.refs_tagged(tenant, tag)
            out += [(item, d) for d in digests] or [(item, None)]
        else:
            out.append((item, item))
    return out


def materialise(svc: Services, tenant: str, session_id: str, s: Session, ws: WorkingSet,
                audit: Callable[[Materialisation], int]) -> MaterialiseResult:
    """The caller holds the session lock in a transaction (``KernelSession.transaction``): a
    failure rolls ``s`` back to the durable ledger; ``audit`` is the transaction's (``tx.audit``)."""
    t0 = time.perf_counter()
    policy = svc.policy
    excluded = {d for _, d in _expand(svc, tenant, ws.exclude) if d}
    pieces: dict[int, Piece] = {}
    keep: dict[int, Segment] = {}  # index → live segment kept in place
    # index → (ref, text, drifted, producer, media type) to append
    place: dict[int, tuple[str, str, bool, Producer, str | None]] = {}
    seen: set[str] = set()
    order: list[tuple[str, str | None]] = []
    for sel, d in _expand(svc, tenant, ws.refs):
        if d is not None and (d in excluded or d in seen):
            continue
        if d is not None:
            seen.add(d)
        order.append((sel, d))
    if len(order) > MAX_PIECES:
        raise InvalidInput(f"a working set resolves to at most {MAX_PIECES} pieces, not {len(order)}")
    mismatch = None
    if ws.model_id is not None and ws.model_id != svc.model_id:
        mismatch = "model_mismatch"
    elif ws.tokenizer_id is not None and ws.tokenizer_id != svc.tokenizer_id:
        mismatch = "tokenizer_mismatch"
    live_tools = {x.ref: x for x in s.ledger.live() if x.kind is SegmentKind.TOOL and x.ref}
    ttl = policy.spec.retention.tool_result_ttl_s
    now_us = time.time_ns() // 1000
    for i, (sel, d) in enumerate(order):
        def verdict(v: PieceVerdict, reason: str, i: int = i, sel: str = sel, d: str | None = d) -> None:
            pieces[i] = Piece(sel, d, v, reason)

        if mismatch:
            verdict(PieceVerdict.ABSTAIN, mismatch)
            continue
        if d is None:
            verdict(PieceVerdict.ABSTAIN, "unknown_tag")
            continue
        head = svc.store.head(d, tenant)
        if head is None:
            verdict(PieceVerdict.ABSTAIN, "unknown_ref")
            continue
        meta = svc.state.ref(tenant, d)
        if head.state == "forgotten":
            verdict(PieceVerdict.REFUSE, "forgotten")
        elif head.taint == "quarantined" or (meta is not None and meta.quarantined):
            verdict(PieceVerdict.REFUSE, "quarantined")
        elif meta is not None and (meta.expired_us is not None
                                   or (meta.expires_us is not None and meta.expires_us <= now_us)
                                   or (ttl is not None and now_us - meta.admitted_us > ttl * 1_000_000)):
            verdict(PieceVerdict.REFUSE, "expired")
        else:
            seg = live_tools.get(d)
            admitted_under = seg.policy_digest if seg is not None else (meta.policy_digest if meta else None)
            drifted = admitted_under != policy.digest
            if seg is not None and not drifted:
                keep[i] = seg
                continue
            data = svc.store.get(d, tenant)
            if drifted:
                v = svc.gate(policy, meta.tool if meta else "unknown", data,
                           GateContext(media_type=head.media_type, tenant=tenant, session=session_id, ref=d))
                if v.enforced and v.kind is not VerdictKind.ALLOW:
                    verdict(PieceVerdict.REFUSE, "policy_refused")
                    continue
            producer: Producer = (meta.tool, meta.source) if meta is not None else (UNKNOWN_TOOL, None)
            place[i] = (d, data.decode("utf-8", errors="replace"), drifted, producer, base_media_type(head.media_type))
    # budget: kept pieces first claim their tokens in order, then placed ones as they are rendered
    budget = ws.budget_tokens
    used = 0
    for i in sorted(keep):
        seg = keep[i]
        if budget is not None and used + seg.length > budget:
            del keep[i]
            pieces[i] = Piece(order[i][0], seg.ref, PieceVerdict.REFUSE, "over_budget")
        else:
            used += seg.length
    kept_ids = {id(x) for x in keep.values()}
    leaving = [x for x in live_tools.values() if id(x) not in kept_ids]
    first_gone = min((x.start for x in leaving), default=None)
    earlier_places = {x.ref for x in s.ledger.segments if not x.live and x.kind is SegmentKind.TOOL}
    if leaving:
        s.evict([x.id for x in leaving], force=True)
    for i, seg in keep.items():
        moved = first_gone is not None and seg.start >= first_gone
        exact = not s.reroped and (s.pic_row is None or seg.end <= s.pic_row)
        pieces[i] = Piece(order[i][0], seg.ref, PieceVerdict.RECOMPUTE if moved else PieceVerdict.HIT,
                          "upstream_evicted" if moved else "live", exact, seg.length, seg.id)
    tok = svc.tokenizer
    for i in sorted(place):
        d, text, drifted, producer, media_type = place[i]
        message = {"role": "tool", "content": text}
        history = s.live_messages()
        ids = tok.encode_message(history, message)
        if budget is not None and used + len(ids) > budget:
            pieces[i] = Piece(order[i][0], d, PieceVerdict.REFUSE, "over_budget")
            continue
        before = s.prefix_hit_tokens
        existed = d in earlier_places or svc.sessions.kv_exists_elsewhere(tenant, d, session_id)  # before this append inserts it
        seg = s.append(SegmentKind.TOOL, tokens=ids, message=message, ref=d, verdict="ALLOW",
                       rule="materialise", policy_digest=policy.digest)
        # placed by digest: its producer is the ref's record (the gate above judged it so); an
        # earlier segment of these bytes in this session keeps its own, and the least trusted counts
        seg.tool, seg.source = producer
        seg.media_type = media_type  # as the CAS stored the bytes
        used += seg.length
        svc.store.record_use(d, tenant, "segment", f"{session_id}/{seg.id}")
        served = s.last_pic
        if served:  # chunks from the PIC registry: a hit, never an exact one
            pic_tokens = sum(x.tokens - x.recomputed for x in served)
            pieces[i] = Piece(order[i][0], d, PieceVerdict.HIT, "pic", False, seg.length, seg.id, pic_tokens,
                              tuple(x.source_position for x in served))
            continue
        placed: PieceVerdict
        if s.prefix_hit_tokens - before == seg.length:
            placed, reason = PieceVerdict.HIT, "prefix_cache"
        elif drifted:
            placed, reason = PieceVerdict.RECOMPUTE, "policy_drift"
        elif existed:
            placed, reason = PieceVerdict.RECOMPUTE, "position_changed"
        else:
            placed, reason = PieceVerdict.FAULT, "paged_in"
        pieces[i] = Piece(order[i][0], d, placed, reason, True, seg.length, seg.id)
    table = [pieces[i] for i in range(len(order))]
    fingerprint = s.fingerprint()
    index = audit(Materialisation(
        tenant=tenant, session_id=session_id, policy_digest=policy.digest, budget_tokens=budget,
        context_tokens=s.cache.length, fingerprint_after=svc.keys.audit_fingerprint(tenant, fingerprint),
        evicted=[x.id for x in leaving],
        pieces=[{"ref": p.ref, "tag": p.selector if p.ref is None or p.selector != p.ref else None,
                 "verdict": p.verdict.value, "reason": p.reason, "exact": p.exact, "tokens": p.tokens,
                 "pic_tokens": p.pic_tokens or None, "source_positions": list(p.source_positions) or None}
                for p in table],
    ))  # fmt: skip  one event for the whole decision: it is logged whole or not at all
    for _ in leaving:
        svc.events.publish(SpanEvicted(tenant, "recompute"))
    return MaterialiseResult(
        pieces=table, evicted=[x.id for x in leaving], ledger=[x.summary() for x in s.ledger.segments],
        context_tokens=s.cache.length, fingerprint=fingerprint, audit_index=index,
        seconds=time.perf_counter() - t0,
    )  # fmt: skip
