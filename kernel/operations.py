"""The operations of the REST API and of ``fak.sdk.local()``, written once: a validated wire
model in (``fak.wire``), a kernel call, a wire model out. The routes (``fak.api.routes``) are
thin FastAPI adapters over these functions (authentication, status codes, HTTP framing) and
the in-process client calls them directly; this module never imports ``fak.api``.

Every operation takes a ``Caller`` (``fak.kernel.session.caller``): the
tenant it acts for, the name the audit log records and the rights it holds. An operation
checks its right itself, so the in-process client, which has no API key, acts with the rights
it was given and nothing more; the API maps a key's role to rights (``fak.api.deps.caller``)
after its own logged role check. The token helpers the OpenAI door shares with ``generate``
and ``Turn`` (``Stepper``, ``timed_tokens``, ``TextDecoder``, ``check_context``) are
``fak.kernel.session.tokens``'.
See docs/architecture.md ("Layers", "Data flow")."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fak import wire as w
from fak.audit.receipt import verify_receipt as check_receipt
from fak.audit.signer_state import SignerRefused
from fak.audit.tenant_export import tenant_export_lines
from fak.cas.digest import parse_digest
from fak.cas.errors import Forgotten
from fak.errors import Forbidden, InvalidInput, NotFound
from fak.kernel.calls.records import counterfactual_out, findings_out
from fak.kernel.mcp.client import McpError
from fak.kernel.session.caller import Caller, Right, require_content
from fak.kernel.session.tokens import Stepper, TextDecoder, check_context, timed_tokens
from fak.policy import GateContext, VerdictKind, gate

if TYPE_CHECKING:
    from fak.cas.models import Ref
    from fak.kernel.calls.authorize import ToolCallDecision
    from fak.kernel.facade import Kernel
    from fak.kernel.mcp.servers import McpServers
    from fak.kernel.session.kernel_session import Admission, KernelSession

MAX_INDEX = 2**53 - 1  # audit indexes are exact in JSON numbers (and far below BIGINT and SQLite INTEGER)
MAX_LIMIT = 1000  # audit entries in one page


# --- sessions ---------------------------------------------------------------------
def session(k: Kernel, c: Caller, sid: str, right: Right = Right.AGENT) -> KernelSession:
    c.require(right)
    return k.session(c.tenant, sid)  # another tenant's id: NotFound, as an unknown one


def session_out(ks: KernelSession) -> w.SessionOut:
    """The session as last committed (``KernelSession.committed``): a read takes no lock, never
    rebuilds an offloaded KV and logs nothing, so reading every session costs database reads."""
    c = ks.committed()
    return w.SessionOut(id=c.id, tokens=c.tokens, exact_rows=c.exact_rows, fingerprint=c.fingerprint,
                        segments=[w.SegmentOut(**x) for x in c.ledger()])


def create_session(k: Kernel, c: Caller, body: w.SessionCreate | None) -> w.SessionOut:
    c.require(Right.AGENT)
    return session_out(k.create_session(c.tenant, body.id if body else None))


def list_sessions(k: Kernel, c: Caller) -> w.SessionList:
    c.require(Right.READ)
    return w.SessionList(sessions=k.sessions(c.tenant))


def get_session(k: Kernel, c: Caller, sid: str) -> w.SessionOut:
    return session_out(session(k, c, sid, Right.READ))


def append(k: Kernel, c: Caller, sid: str, body: w.MessageIn) -> w.SegmentOut:
    ks = session(k, c, sid)
    check_context(k, [body.content], "this message")
    return w.SegmentOut(**ks.append(body.role, body.content).summary())


def admit(k: Kernel, c: Caller, sid: str, body: w.ToolResultIn) -> w.AdmissionOut:
    c.require(Right.AGENT)
    try:
        data = body.data()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    ks = session(k, c, sid)
    if len(data) > k.context_limit:  # a result that would enter attention must fit the context (a preview
        # of the gate's verdict: one it keeps out, QUARANTINE or DENY, is still judged and logged by admit)
        v = gate(k.policy, body.tool, data, GateContext(media_type=body.media_type, source=body.source))
        if v.kind in (VerdictKind.ALLOW, VerdictKind.REDACT):
            entering = v.redacted_bytes if v.kind is VerdictKind.REDACT and v.redacted_bytes is not None else data
            check_context(k, [entering.decode("utf-8", "replace")], "this tool result")
    return admission_out(ks.admit(body.tool, data, media_type=body.media_type, tags=body.tags, source=body.source))


def admission_out(a: Admission) -> w.AdmissionOut:
    return w.AdmissionOut(verdict=a.verdict.kind.value, enforced=a.verdict.enforced, rule_id=a.verdict.rule_id,
                          policy_digest=a.verdict.policy_digest, ref=a.ref, admitted_ref=a.admitted_ref,
                          admitted=a.admitted, segment=w.SegmentOut(**a.segment.summary()), audit_index=a.audit_index)


def evict(k: Kernel, c: Caller, sid: str, body: w.EvictIn) -> w.EvictionOut:
    r = session(k, c, sid).evict(body.segment_id, body.mode, reason=body.reason)
    return w.EvictionOut(segment_id=r.segment_id, ref=r.ref, mode=r.mode.value, exactness=r.exactness,
                         rows_removed=r.rows_removed, rows_replayed=r.rows_replayed, seconds=r.seconds,
                         fingerprint=r.fingerprint)


def authorize_tool_call(k: Kernel, c: Caller, sid: str, body: w.ToolCallIn) -> w.ToolCallDecisionOut:
    return decision_out(session(k, c, sid).authorize_tool_call(body.name, body.arguments, principal=c.principal,
                                                               tool=body.tool))


def decision_out(d: ToolCallDecision) -> w.ToolCallDecisionOut:
    return w.ToolCallDecisionOut(tool=d.tool, verdict=d.verdict, rule_id=d.rule_id, offending=list(d.offending),
                                 attention_refs=d.attention_refs, policy_digest=d.policy_digest, enforced=d.enforced,
                                 would_be=d.would_be, audited=list(d.audited), audit_index=d.audit_index,
                                 findings=findings_out(d), counterfactual=counterfactual_out(d),
                                 approved_by=d.approved_by,
                                 tool_class=d.tool_class.as_dict() if d.tool_class is not None else None)


def evict_refs(k: Kernel, c: Caller, sid: str, body: w.EvictRefsIn) -> w.RefsEvictedOut:
    r = session(k, c, sid).evict_refs(body.refs, drop_generated=body.drop_generated, reason=body.reason)
    return w.RefsEvictedOut(segment_ids=r.segment_ids, exactness=r.exactness, fingerprint=r.fingerprint,
                            audit_indexes=r.audit_indexes)


def materialise(k: Kernel, c: Caller, sid: str, body: dict[str, Any]) -> w.MaterialiseOut:
    """``body`` is a working set as JSON; the kernel parses it (``kernel/session/materialise.py``)."""
    r = session(k, c, sid).materialise(body)
    return w.MaterialiseOut(pieces=[w.PieceOut(**p.as_dict()) for p in r.pieces], evicted=r.evicted,
                            segments=[w.SegmentOut(**x) for x in r.ledger], context_tokens=r.context_tokens,
                            fingerprint=r.fingerprint, audit_index=r.audit_index)


# --- generation -------------------------------------------------------------------
def sampling(body: w.GenerateIn) -> dict[str, Any]:
    return {"max_tokens": body.max_tokens, "min_tokens": min(body.min_tokens, body.max_tokens),
            "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}


def generate(k: Kernel, c: Caller, sid: str, body: w.GenerateIn) -> w.GenerateOut:
    ks = session(k, c, sid)
    ids = list(timed_tokens(ks.generate(**sampling(body)), k.events, ks.tenant))
    after = ks.committed()  # the turn as it was kept (no lock: the KV may be offloaded by now)
    last = after.segments[-1] if ids else None
    return w.GenerateOut(text=k.tokenizer.decode_turn(ids), tokens=ids,
                         segment=w.SegmentOut(**last.as_dict()) if last else None,
                         fingerprint=after.fingerprint)


class Turn:
    """A streamed generation as events: ``("message", {"token", "text"})`` per token, then
    ``("done", {"segment", "fingerprint"})``. The first token is taken when the turn is
    opened, so a busy session or bad parameters fail before any event; ``close`` before
    the end gives the turn up (the session rolls it back)."""

    def __init__(self, k: Kernel, ks: KernelSession, body: w.GenerateIn) -> None:
        self._ks = ks
        self._stepper = Stepper(timed_tokens(ks.generate(**sampling(body)), k.events, ks.tenant))
        self._decoder = TextDecoder(k.tokenizer)
        self._pending: int | None = self._stepper.step()
        self._first = True
        self._ended = False

    @property
    def finished(self) -> bool:
        """The model stopped (nothing to roll back on ``close``)."""
        return self._stepper.done

    def next_event(self) -> tuple[str, dict[str, Any]] | None:
        if self._ended:
            return None
        token = self._pending if self._first else self._stepper.step()
        self._first = False
        if token is not None:
            return "message", {"token": token, "text": self._decoder.push(token)}
        self._ended = True
        after = self._ks.committed()  # the turn as it was kept
        return "done", {"segment": after.ledger()[-1], "fingerprint": after.fingerprint}

    def close(self) -> None:
        self._stepper.close()


def open_turn(k: Kernel, c: Caller, sid: str, body: w.GenerateIn) -> Turn:
    return Turn(k, session(k, c, sid), body)


# --- forget and quarantine ----------------------------------------------------------
def forget(k: Kernel, c: Caller, body: w.ForgetIn) -> w.ForgetReceiptOut:
    c.require(Right.ADMIN)
    receipt = k.forget(c.tenant, body.ref, requested_by=c.principal, reason=body.reason)
    return w.ForgetReceiptOut.model_validate(receipt.model_dump(mode="json"))


def forget_status(k: Kernel, c: Caller, request_id: str) -> w.ForgetStatusOut | w.ForgetPendingOut:
    """``GET /v1/forget/{request_id}``: the receipt with its state once complete, else the state."""
    c.require(Right.AUDIT)
    st = k.forget_status(c.tenant, request_id)
    if st.receipt is None:
        return w.ForgetPendingOut(request_id=st.request_id, ref=st.ref, state=st.state)
    return w.ForgetStatusOut.model_validate(st.receipt.model_dump(mode="json")
                                           | {"state": st.state, "replay": st.receipt.replay})


def quarantine(k: Kernel, c: Caller, body: w.QuarantineIn) -> w.QuarantineOut:
    c.require(Right.AGENT)
    r = k.quarantine(c.tenant, body.ref, reason=body.reason, principal=c.principal)
    return w.QuarantineOut(ref=r.ref, units=r.unit_dicts(), mode=r.mode, audit_index=r.audit_index, pending=r.pending)


# --- refs ---------------------------------------------------------------------------
def find_ref(k: Kernel, c: Caller, digest: str) -> Ref:
    """The tenant's live ref: ``invalid_digest`` before any lookup, ``NotFound`` for a digest
    the tenant never held (or only another holds), ``Forgotten`` for one it forgot."""
    c.require(Right.READ)
    parse_digest(digest)
    ref = k.store.head(digest, c.tenant)
    if ref is None:
        raise NotFound(f"no ref {digest}")
    if ref.state != "live":
        raise Forgotten(f"ref {digest} was forgotten: its key and ciphertext were destroyed")
    return ref


HOLDERS = 200  # segments a ref's holders list at most (the console's ref page)


@dataclass(frozen=True)
class RefHolder:
    """A segment of the tenant's sessions that holds a ref (``holds``) or whose attention or
    content provenance names it, in any state."""

    session: str
    segment: str
    kind: str
    state: str
    holds: bool


def ref_holders(k: Kernel, c: Caller, digest: str, limit: int | None = None) -> tuple[list[RefHolder], bool]:
    """The first ``limit`` (default ``HOLDERS``) segments that hold ``digest`` or name it in their
    provenance, and whether there are more: one bounded query of the durable ledgers, however
    many sessions the tenant has (no session is read whole, none is loaded or locked)."""
    c.require(Right.READ)
    parse_digest(digest)
    rows, more = k.state.segments_naming(c.tenant, digest, HOLDERS if limit is None else limit)
    return [RefHolder(session=r.session_id, segment=r.id, kind=r.kind, state=r.state, holds=r.ref == digest)
            for r in rows], more


def ref_content(k: Kernel, c: Caller, ref: Ref) -> bytes:
    """The verified bytes (``NotFound``/``Forgotten`` if a forget won the race): content."""
    require_content(c)
    return k.store.get(ref.digest, c.tenant)


def ref_headers(ref: Ref) -> dict[str, str]:
    """How a ref's bytes are served: untrusted tool output, never sniffed, sandboxed."""
    return {
        "Content-Type": ref.media_type,  # as stored: no charset is claimed for the bytes
        "ETag": f'"{ref.digest}"',
        "Cache-Control": "private, max-age=31536000, immutable",  # content-addressed: never changes
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Content-Disposition": "attachment",
        "X-Fak-Taint": ref.taint,
    }


# --- audit --------------------------------------------------------------------------
@contextmanager
def verified(k: Kernel) -> Iterator[None]:
    """Refuse (AuditUnverified, 409) while the signer is in alarm, including an alarm that the
    signature asked for inside the block raises (a rewrite found out just now)."""
    k.audit.require_verified()
    try:
        yield
    except SignerRefused:
        k.audit.require_verified()
        raise


def audit_entries(k: Kernel, c: Caller, start: int, limit: int) -> w.EntriesOut:
    c.require(Right.AUDIT)
    with verified(k):
        it = k.audit.entries(c.tenant, start, None)
        try:
            rows = list(itertools.islice(it, limit + 1))
        finally:
            it.close()  # releases the read connection
    more = len(rows) > limit
    rows = rows[:limit]
    entries = [w.EntryOut(index=e.index, type=e.event.type, event=e.body.decode(), leaf_hash=e.leaf_hash.hex())
               for e in rows]
    return w.EntriesOut(entries=entries, next_start=rows[-1].index + 1 if more else None)


def audit_newest(k: Kernel, c: Caller, before: int, limit: int, types: Sequence[str] = (),
                 needles: Sequence[str] = ()) -> w.EntriesOut:
    """The caller tenant's entries before ``before``, newest first, of ``types`` (any when empty)
    and holding every one of ``needles`` (``AuditLog.newest``); ``next_start`` is None."""
    c.require(Right.AUDIT)
    with verified(k):
        rows = k.audit.newest(c.tenant, before, min(limit, MAX_LIMIT), types, needles)
    return w.EntriesOut(entries=[w.EntryOut(index=e.index, type=e.event.type, event=e.body.decode(),
                                            leaf_hash=e.leaf_hash.hex()) for e in rows], next_start=None)


def audit_checkpoint(k: Kernel, c: Caller) -> w.CheckpointOut:
    c.require(Right.AUDIT)
    with verified(k):
        cp = k.audit.checkpoint()
        return w.CheckpointOut(origin=cp.origin, size=cp.size, root_hash=cp.root.hex(), checkpoint=cp.note,
                               public_key=k.audit.public_key())


def audit_inclusion(k: Kernel, c: Caller, index: int, fmt: Literal["json", "tlog"] = "json") -> w.InclusionOut | str:
    """The proof of the caller's entry ``index``; the C2SP tlog-proof text for ``fmt="tlog"``.
    Another tenant's index answers as an index past the end."""
    c.require(Right.AUDIT)
    with verified(k):
        found = list(k.audit.entries(c.tenant, index, index + 1)) if index < k.audit.size() else []
        if not found:
            raise NotFound(f"no audit entry at index {index}")
        proof = k.audit.inclusion_proof(index)
    if fmt == "tlog":
        text: str = proof.to_tlog_proof()
        return text
    return w.InclusionOut(index=index, leaf_hash=found[0].leaf_hash.hex(), proof=proof.to_json())


def audit_consistency(k: Kernel, c: Caller, first: int, second: int | None) -> dict[str, Any]:
    c.require(Right.AUDIT)
    with verified(k):
        size = k.audit.size()
        second = size if second is None else second
        if not first <= second <= size:
            raise InvalidInput(f"need 0 <= first <= second <= {size} (the log size), got first={first}, "
                               f"second={second}")
        out: dict[str, Any] = k.audit.consistency_proof(first, second).to_json()
        return out


def audit_export(k: Kernel, c: Caller) -> Iterator[bytes]:
    """The export's lines (``fak.audit.tenant_export``): the checkpoint and the statement of
    the tenant's count are signed now, before the first byte is sent (an error here is an
    error response, not a cut stream); the entries follow lazily."""
    c.require(Right.AUDIT)
    with verified(k):
        return tenant_export_lines(k.audit, c.tenant)


def verify_receipt(k: Kernel, c: Caller, receipt: dict[str, Any]) -> w.ReceiptCheckOut:
    """Check a forget receipt with this log's key: ``ok`` false says why, it is not an error."""
    c.require(Right.READ)
    result = check_receipt(receipt, k.audit.public_key())
    return w.ReceiptCheckOut(ok=result.ok, reason=result.reason)


# --- the deployment's MCP servers and their pinned tools (operator) ------------------------
def _mcp_operator(k: Kernel, c: Caller) -> McpServers | None:
    """The servers, for an admin of the operator tenant only: which servers a deployment runs
    tools of, and which tool descriptions models may be shown, are the deployment's, not a
    tenant's (``Forbidden`` for every other caller; nobody without ``operator_tenant``)."""
    c.require(Right.ADMIN)
    if k.settings.operator_tenant is None or c.tenant != k.settings.operator_tenant:
        raise Forbidden("the MCP servers and their pinned tools are the deployment's: only admin keys of the operator "
                        "tenant (setting operator_tenant, FAK_OPERATOR_TENANT) may read or approve them")
    return k.services.mcp


def _mcp_declared(mcp: McpServers | None, label: str) -> McpServers:
    if mcp is None or label not in mcp.labels():
        declared = ", ".join(mcp.labels()) if mcp is not None else ""
        raise NotFound(f"no MCP server {label[:64]!r} is declared by this deployment (mcp_servers: "
                       f"{declared or 'none'})")
    return mcp


def mcp_server_out(mcp: McpServers, label: str) -> w.McpServerOut:
    """One server as an operator reviews it: every tool it lists now (description and schema) with
    its status against the pins, and the pins. Reading logs nothing (``ToolPins.compare``); an
    unreachable server is shown with its error."""
    server = mcp.get(label)
    pins = [w.McpPinOut(name=r.tool, digest=r.digest, approved_by=r.approved_by, audit_index=r.audit_index,
                        approved_us=r.approved_us) for r in mcp.pins.approved(label)]
    out = w.McpServerOut(label=label, source=server.source, allowed_tools=sorted(server.allowed), tools=None,
                         pins=pins)
    try:
        listed = mcp.tools(label)
    except McpError as exc:
        out.error = str(exc)
        return out
    allowed = [t for t in listed if not server.allowed or t.name in server.allowed]
    withheld = {x.name: x for x in mcp.pins.compare(label, allowed).withheld}
    tools = []
    for t in listed:
        x = withheld.get(t.name[:128])
        change: Literal["description", "input_schema", "description_and_input_schema"] | None = None
        status: w.McpToolStatus
        if server.allowed and t.name not in server.allowed:
            status = "not_allowed"
        elif x is None:
            status = "pinned"
        elif x.change == "not_pinned" or x.change == "invalid_name":
            status = x.change
        else:
            status, change = "changed", x.change
        tools.append(w.McpToolOut(name=t.name, digest=t.digest, status=status, change=change,
                                  pinned_digest=x.pinned if x is not None else None, description=t.description,
                                  input_schema=t.input_schema))
    out.tools = tools
    return out


def mcp_servers(k: Kernel, c: Caller) -> w.McpServerList:
    """``GET /v1/mcp/servers``: every declared server, its tools as listed now and its pins."""
    mcp = _mcp_operator(k, c)
    return w.McpServerList(servers=[mcp_server_out(mcp, label) for label in mcp.labels()] if mcp else [])


def mcp_approve(k: Kernel, c: Caller, label: str, body: w.McpApproveIn | None) -> w.McpApproveOut:
    """``POST /v1/mcp/servers/{label}/approve``: pin the server's tools as listed now (logged as
    ``mcp_tools_approved`` under the caller's principal before the pins are written); with
    ``expected``, only a listing of exactly those digests (409 otherwise)."""
    mcp = _mcp_declared(_mcp_operator(k, c), label)
    expected = body.expected if body is not None else None
    index, tools = mcp.approve(label, c.principal, expected)
    return w.McpApproveOut(label=label, audit_index=index,
                           tools=[w.McpPinnedTool(name=t.name, digest=t.digest) for t in tools])
