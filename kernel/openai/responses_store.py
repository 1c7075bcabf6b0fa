"""The Responses door's chain records (the notes of ``fak.kernel.openai.responses``, "Chains
and sessions" and "Persistence"): a request's chain resolved from its
``previous_response_id``, a response claimed as in progress, kept (sealed when its session
held tool content), abandoned when it did not complete, read back (``GET``) and deleted
(``DELETE``: a tombstone) in ``fak_responses``."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

from fak import wire_responses as wr
from fak.errors import Conflict, FakError, NotFound
from fak.kernel.gateway.session import GatewaySession
from fak.kernel.kv.ledger import SegmentState, SegmentView
from fak.kernel.openai.responses_output import withheld
from fak.kernel.openai.responses_request import Chain, Plan
from fak.kernel.session.caller import Caller, Right, reads_content
from fak.state.schema import ResponseRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import now_us

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.kernel.session.kernel_session import KernelSession

KEPT = ("completed", "incomplete", "failed")  # the states of a stored response (GET, follow-ups)


def _chain_session(k: Kernel, tenant: str, sid: str) -> KernelSession | GatewaySession:
    """A chain's session: a kernel session, or a gateway session (a chain of an upstream model,
    docs/gateway.md, read as its rows last recorded it)."""
    try:
        return k.session(tenant, sid)
    except NotFound:
        gs = k.gateway_sessions.snapshot(tenant, sid)
        if gs is None:
            raise
        return gs


def _views(s: KernelSession | GatewaySession) -> list[SegmentView]:
    return s.views() if isinstance(s, GatewaySession) else s.segments()


def resolve_chain(k: Kernel, c: Caller, body: wr.ResponseCreateRequest, hexid: str, store: bool) -> Chain:
    prev = body.previous_response_id
    if prev is None:
        return Chain("resp-" + hexid if store else None, True, None, body.instructions)
    row = k.state.response(c.tenant, prev)
    if row is None or row.state not in (*KEPT, "in_progress"):
        raise NotFound(f"no stored response {prev[:80]!r}")
    if row.state == "in_progress" and row.created_us < k.opened_us:
        # cut by the end of the process that ran it (one process owns the data directory): the
        # session holds what its ledger committed, so the chain continues from it as failed
        k.state.update_response(c.tenant, prev, "failed")
        row = k.state.response(c.tenant, prev) or row
    if row.state == "in_progress":
        raise Conflict(f"response {prev} is still in progress: continue from it once it has completed")
    follower = k.state.response_follower(c.tenant, prev)
    if follower is not None:
        raise Conflict(f"response {prev} is not the latest of its chain: {follower} follows it, and the chain's "
                       f"session {row.session_id} already holds that later turn (fak keeps one linear session per "
                       "chain); continue from the latest response, or start a new chain")
    instructions = row.instructions
    if body.instructions is not None and body.instructions != instructions:
        raise Conflict(f"instructions differ from those of the chain of {prev}: its session already holds them; "
                       "send the same instructions or none, or start a new chain")
    try:
        fingerprint = _chain_session(k, c.tenant, row.session_id).fingerprint()
    except NotFound:
        raise NotFound(f"the session {row.session_id} of response {prev}'s chain was deleted") from None
    return Chain(row.session_id, False, prev, instructions, fingerprint, _calls(k, c, row))


def _calls(k: Kernel, c: Caller, row: ResponseRow) -> dict[str, str]:
    """Call id -> name of a response's function calls (none if its body no longer opens, or it
    has none: a response cut by a crash)."""
    if row.body is None and row.sealed is None:
        return {}
    try:
        previous = opened(k, c, row)
    except FakError:  # forgotten content: its calls' outputs are admitted under the name "tool"
        return {}
    return {o.call_id: o.name for o in previous.output if isinstance(o, wr.FunctionCallItem)}


def claim(k: Kernel, c: Caller, p: Plan) -> None:
    """Record the response as in progress (a follow-up claims its predecessor: one wins a race)."""
    if p.claimed:
        assert p.chain.session_id is not None
        k.state.claim_response(ResponseRow(tenant=c.tenant, id=p.response_id, session_id=p.chain.session_id,
                                           previous_id=p.chain.previous, created_us=now_us(),
                                           state="in_progress", instructions=p.chain.instructions))


def finish(k: Kernel, c: Caller, p: Plan, response: wr.ResponseObject, provenance: frozenset[str]) -> None:
    """Keep the response (its body only with ``store``): sealed under the data keys of the
    refs live in its session and of ``provenance``, the content provenance of every attempt
    whose text the body keeps (a streamed body keeps a denied attempt's text, whose turn and
    refs the session evicted), else in the clear. A ref among them forgotten meanwhile fails
    it (``Forgotten``): the body is never kept readable past the forget of what it may quote."""
    if not p.claimed:
        return
    sid = p.chain.session_id
    assert sid is not None
    if not p.store:
        k.state.update_response(c.tenant, p.response_id, "unstored")
        return
    body = response.model_dump_json()
    views = _views(_chain_session(k, c.tenant, sid))
    refs = sorted({r for v in views if v.state is SegmentState.LIVE for r in v.content_provenance} | provenance)
    keys = k.store.content_keys(c.tenant, refs) if refs else {}
    if needs_seal(keys):
        sealed = seal(keys, c.tenant, sid, p.response_id, Plain([], "response", body))
        k.state.update_response(c.tenant, p.response_id, response.status, sealed=sealed, content=json.dumps(refs))
    else:
        k.state.update_response(c.tenant, p.response_id, response.status, body=body)


def abandon(k: Kernel, c: Caller, p: Plan, exc: BaseException | None) -> None:
    """A response that did not complete: undo its claim when it left no trace (a new chain's
    session is deleted), else keep it as ``failed`` (its input is in the session)."""
    if not p.claimed:
        return  # an ephemeral session: the chat turn deleted it
    sid = p.chain.session_id
    assert sid is not None
    if p.chain.new:
        with contextlib.suppress(NotFound):
            k.delete_session(c.tenant, sid)
        k.state.drop_response(c.tenant, p.response_id)
        return
    try:
        unchanged = _chain_session(k, c.tenant, sid).fingerprint() == p.chain.fingerprint
    except NotFound:
        unchanged = True
    if unchanged:
        k.state.drop_response(c.tenant, p.response_id)
        return
    code = exc.code if isinstance(exc, FakError) else ("client_disconnected" if exc is None else "server_error")
    message = str(exc)[:500] if exc is not None else "the client went away before the response completed"
    failed = p.response("failed", [], error=wr.ResponseError(code=code, message=message))
    if p.store:  # no output: nothing derived from tool content, kept in the clear
        k.state.update_response(c.tenant, p.response_id, "failed", body=failed.model_dump_json())
    else:
        k.state.update_response(c.tenant, p.response_id, "unstored")


def get(k: Kernel, c: Caller, response_id: str) -> wr.ResponseObject:
    """A stored response of the caller's tenant; a sealed one opens with the current data
    keys of its refs (``Forgotten``, 410, once one of them was forgotten). A caller that does
    not read content (``fak.kernel.session.caller.reads_content``: an auditor) gets it ``withheld``."""
    c.require(Right.READ)
    row = k.state.response(c.tenant, response_id)
    if row is None or row.state not in KEPT:
        raise NotFound(f"no stored response {response_id[:80]!r}")
    response = opened(k, c, row)
    return response if reads_content(c) else withheld(response)


def opened(k: Kernel, c: Caller, row: ResponseRow) -> wr.ResponseObject:
    if row.sealed is not None:
        keys = k.store.content_keys(c.tenant, json.loads(row.content or "[]"))
        text = unseal(keys, c.tenant, row.session_id, row.id, row.sealed).text or ""
    elif row.body is None:  # cut by the end of the process that ran it: what is known of it
        return wr.ResponseObject(
            id=row.id, created_at=row.created_us // 1_000_000, status="failed", model=k.model_id, output=[],
            usage=None, previous_response_id=row.previous_id, instructions=row.instructions, tools=[],
            tool_choice="auto", parallel_tool_calls=True, text={"format": {"type": "text"}}, temperature=None,
            top_p=None, max_output_tokens=None, metadata={}, store=True,
            error=wr.ResponseError(code="server_error", message="the server stopped while this response ran; its "
                                   "session holds what was committed, and the chain continues from it"))
    else:
        text = row.body
    return wr.ResponseObject.model_validate_json(text)


def delete(k: Kernel, c: Caller, response_id: str) -> wr.ResponseDeleted:
    """Delete a stored response (a tombstone stays: the chain remains linear); the chain's
    session goes with its last response."""
    c.require(Right.AGENT)
    row = k.state.response(c.tenant, response_id)
    if row is None or row.state not in KEPT:
        raise NotFound(f"no stored response {response_id[:80]!r}")
    k.state.update_response(c.tenant, response_id, "deleted")
    if k.state.live_responses(c.tenant, row.session_id) == 0:
        with contextlib.suppress(NotFound):
            k.delete_session(c.tenant, row.session_id)
    return wr.ResponseDeleted(id=response_id)
