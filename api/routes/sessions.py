"""Sessions: create, list, read, append, admit, evict, materialise, generate (JSON or SSE)."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fak.api import models as m
from fak.api.deps import AGENT, READER, check_context, kernel
from fak.api.keys import Principal
from fak.kernel.agent_session import KernelSession
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def _session(k: Kernel, who: Principal, sid: str) -> KernelSession:
    return k.session(who.tenant, sid)  # another tenant's id: NotFound, as an unknown one


def _out(ks: KernelSession) -> m.SessionOut:
    return m.SessionOut(id=ks.id, tokens=ks.tokens, fingerprint=ks.fingerprint(),
                        segments=[m.SegmentOut(**x) for x in ks.ledger()])


@router.post("", status_code=201, response_model=m.SessionOut)
def create_session(body: m.SessionCreate | None = None, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)) -> m.SessionOut:  # noqa: B008
    return _out(k.create_session(who.tenant, body.id if body else None))


@router.get("", response_model=m.SessionList)
def list_sessions(who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> m.SessionList:  # noqa: B008
    return m.SessionList(sessions=k.sessions(who.tenant))


@router.get("/{sid}", response_model=m.SessionOut)
def get_session(sid: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> m.SessionOut:  # noqa: B008
    return _out(_session(k, who, sid))


@router.post("/{sid}/messages", status_code=201, response_model=m.SegmentOut)
def append_message(sid: str, body: m.MessageIn, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)) -> m.SegmentOut:  # noqa: B008
    ks = _session(k, who, sid)
    check_context(k, [body.content], "this message")
    return m.SegmentOut(**ks.append(body.role, body.content).summary())


@router.post("/{sid}/tool-results", status_code=201, response_model=m.AdmissionOut)
def admit_tool_result(sid: str, body: m.ToolResultIn, who: Principal = Depends(AGENT),  # noqa: B008
                      k: Kernel = Depends(kernel)) -> m.AdmissionOut:  # noqa: B008
    from fak.errors import InvalidInput

    try:
        data = body.data()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    ks = _session(k, who, sid)
    if len(data) > k.context_limit:  # a result that would enter attention must fit the context (a preview
        # of the gate's verdict: one it keeps out, QUARANTINE or DENY, is still judged and logged by admit)
        from fak.policy import GateContext, VerdictKind, gate

        v = gate(k.policy, body.tool, data, GateContext(media_type=body.media_type, source=body.source))
        if v.kind in (VerdictKind.ALLOW, VerdictKind.REDACT):
            entering = v.redacted_bytes if v.kind is VerdictKind.REDACT and v.redacted_bytes is not None else data
            check_context(k, [entering.decode("utf-8", "replace")], "this tool result")
    a = ks.admit(body.tool, data, media_type=body.media_type, tags=body.tags, source=body.source)
    return admission_out(a)


def admission_out(a) -> m.AdmissionOut:  # noqa: ANN001 - fak.kernel.agent_session.Admission
    return m.AdmissionOut(verdict=a.verdict.kind.value, enforced=a.verdict.enforced, rule_id=a.verdict.rule_id,
                          policy_digest=a.verdict.policy_digest, ref=a.ref, admitted_ref=a.admitted_ref,
                          admitted=a.admitted, segment=m.SegmentOut(**a.segment.summary()),
                          audit_index=a.audit_index)


@router.post("/{sid}/evict", response_model=m.EvictionOut)
def evict(sid: str, body: m.EvictIn, who: Principal = Depends(AGENT),  # noqa: B008
          k: Kernel = Depends(kernel)) -> m.EvictionOut:  # noqa: B008
    r = _session(k, who, sid).evict(body.segment_id, body.mode, reason=body.reason)
    return m.EvictionOut(segment_id=r.segment_id, ref=r.ref, mode=r.mode.value, exactness=r.exactness,
                         rows_removed=r.rows_removed, rows_replayed=r.rows_replayed, seconds=r.seconds,
                         fingerprint=r.fingerprint)


@router.post("/{sid}/tool-calls/authorize", response_model=m.ToolCallDecisionOut)
def authorize_tool_call(sid: str, body: m.ToolCallIn, who: Principal = Depends(AGENT),  # noqa: B008
                        k: Kernel = Depends(kernel)) -> m.ToolCallDecisionOut:  # noqa: B008
    """May the agent make this call now, given what is in attention? ALLOW, CONFIRM or DENY."""
    d = _session(k, who, sid).authorize_tool_call(body.name, body.arguments, principal=f"key:{who.key_id}")
    return decision_out(d)


def decision_out(d) -> m.ToolCallDecisionOut:  # noqa: ANN001 - fak.kernel.authorize.ToolCallDecision
    return m.ToolCallDecisionOut(tool=d.tool, verdict=d.verdict, rule_id=d.rule_id, offending=list(d.offending),
                                 attention_refs=d.attention_refs, policy_digest=d.policy_digest,
                                 enforced=d.enforced, would_be=d.would_be, audited=list(d.audited),
                                 audit_index=d.audit_index)


@router.post("/{sid}/evict-refs", response_model=m.RefsEvictedOut)
def evict_refs(sid: str, body: m.EvictRefsIn, who: Principal = Depends(AGENT),  # noqa: B008
               k: Kernel = Depends(kernel)) -> m.RefsEvictedOut:  # noqa: B008
    """The exact remedy for a DENY/CONFIRM: evict the offending refs (and the turns they caused)."""
    r = _session(k, who, sid).evict_refs(body.refs, drop_generated=body.drop_generated, reason=body.reason)
    return m.RefsEvictedOut(segment_ids=r.segment_ids, exactness=r.exactness, fingerprint=r.fingerprint,
                            audit_indexes=r.audit_indexes)


@router.post("/{sid}/materialise", response_model=m.MaterialiseOut)
def materialise(sid: str, body: dict, who: Principal = Depends(AGENT),  # noqa: B008
                k: Kernel = Depends(kernel)) -> m.MaterialiseOut:  # noqa: B008
    r = _session(k, who, sid).materialise(body)
    return m.MaterialiseOut(pieces=[m.PieceOut(**p.as_dict()) for p in r.pieces], evicted=r.evicted,
                            segments=[m.SegmentOut(**x) for x in r.ledger], context_tokens=r.context_tokens,
                            fingerprint=r.fingerprint, audit_index=r.audit_index)


class Stepper:
    """A token iterator driven from worker threads one step at a time; ``close`` waits
    for a running step, then closes it (the session rolls the partial turn back)."""

    def __init__(self, tokens: Iterator[int]) -> None:
        self._it = tokens
        self._lock = threading.Lock()
        self.done = False

    def step(self) -> int | None:
        with self._lock:
            if self.done:
                return None
            try:
                return next(self._it)
            except StopIteration:
                self.done = True
                return None

    def close(self) -> None:
        with self._lock:
            self.done = True
            self._it.close()  # type: ignore[attr-defined]


class TextDecoder:
    """Incremental detokenisation that holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer) -> None:  # noqa: ANN001
        self.tok = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        if token in self.tok.stop_token_ids:
            return ""
        self.ids.append(token)
        text = self.tok.decode(self.ids, skip_special=True)
        if text.endswith("\ufffd") or len(text) <= len(self.emitted):
            return ""
        piece, self.emitted = text[len(self.emitted):], text
        return piece


def _gen_params(body: m.GenerateIn) -> dict:
    return {"max_tokens": body.max_tokens, "min_tokens": min(body.min_tokens, body.max_tokens),
            "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}


@router.post("/{sid}/generate", response_model=m.GenerateOut,
             responses={200: {"content": {"text/event-stream": {}}}})
async def generate(sid: str, body: m.GenerateIn, request: Request, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)):  # noqa: ANN201, B008
    ks = await run_in_threadpool(_session, k, who, sid)
    if not body.stream:
        return await run_in_threadpool(_generate_all, ks, body)
    stepper = Stepper(ks.generate(**_gen_params(body)))
    first = await run_in_threadpool(stepper.step)  # errors (busy, bad params) before any 200
    return StreamingResponse(_sse(ks, stepper, first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


def _generate_all(ks: KernelSession, body: m.GenerateIn) -> m.GenerateOut:
    ids = list(ks.generate(**_gen_params(body)))
    tok = ks.kernel.tokenizer
    text = tok.decode_turn(ids)
    last = ks.ledger()[-1] if ids else None
    return m.GenerateOut(text=text, tokens=ids, segment=m.SegmentOut(**last) if last else None,
                         fingerprint=ks.fingerprint())


async def _sse(ks: KernelSession, stepper: Stepper, first: int | None) -> AsyncIterator[str]:
    decoder = TextDecoder(ks.kernel.tokenizer)
    token = first
    try:
        while token is not None:
            yield f"data: {json.dumps({'token': token, 'text': decoder.push(token)})}\n\n"
            token = await run_in_threadpool(stepper.step)
        last = await run_in_threadpool(lambda: ks.ledger()[-1])
        fp = await run_in_threadpool(ks.fingerprint)
        yield f"event: done\ndata: {json.dumps({'segment': last, 'fingerprint': fp})}\n\n"
    finally:
        if not stepper.done:  # the client went away: roll the turn back, release the session
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(stepper.close)
