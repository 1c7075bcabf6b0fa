"""Audit events: one pydantic model per decision, serialised as RFC 8785 canonical JSON.

Why so strict: the log must never hold content (tool results, prompts, user
text), so that erasing content never requires rewriting the log. Every string
field is an id, a code or a digest with a tight pattern and no whitespace, and
unknown fields are refused; there is nowhere to put free text.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Literal

import rfc8785
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from fak.audit.errors import AuditError
from fak.types import TENANT_PATTERN, ClassBasis, Digest, Id, RoutingKind, Tenant, ToolEffect

MAX_INT = 2**53 - 1  # canonical JSON numbers are IEEE doubles: stay exact
MAX_ITEMS = 100_000  # longest list one event may carry

# Id (an identifier or code: no spaces, quotes or newlines, short) and Digest (OCI-style,
# e.g. blake3:<64 hex>, blake3k:<64 hex>, sha256:<64 hex>) are fak.types', shared by
# every layer. The log records system events under the empty tenant: "" or a Tenant.
SystemOrTenant = Annotated[str, StringConstraints(strict=True, pattern=rf"^(?:{TENANT_PATTERN[1:-1]})?$")]
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Event(_Strict):
    tenant: SystemOrTenant = ""  # "" is the system
    ts: Count = Field(default_factory=now_ms)  # milliseconds since the Unix epoch
    # the tenant's gap-free sequence number (1, 2, ...; the system's own under ""), assigned by
    # the log at append and hashed with the event: a tenant's export shows any omission.
    # Absent in entries logged before it existed (they still verify); callers leave it unset.
    tseq: Annotated[int, Field(strict=True, ge=1, le=MAX_INT)] | None = None

    @field_validator("tenant", mode="before")
    @classmethod
    def _system_tenant(cls, v: object) -> object:
        return "" if v is None else v


class AdmissionVerdict(_Event):
    """The policy gate's verdict on a tool result (its bytes are in the CAS, not here)."""

    type: Literal["admission_verdict"] = "admission_verdict"
    session_id: Id
    segment_id: Id | None = None
    tool: Id
    ref: Digest
    size: Count
    verdict: Literal["ALLOW", "QUARANTINE", "REDACT", "DENY"]
    rule_id: Id | None = None
    policy_digest: Digest
    admitted_ref: Digest | None = None  # REDACT: the transformed bytes' ref
    trust: Literal["untrusted", "internal", "trusted"] | None = None  # the trust level the gate applied
    audited: list[Id] = Field(default_factory=list, max_length=MAX_ITEMS)  # action: audit rules that fired
    exempted: list[Id] = Field(default_factory=list, max_length=MAX_ITEMS)  # exception ids that took findings


class Eviction(_Event):
    type: Literal["eviction"] = "eviction"
    session_id: Id
    segment_id: Id
    ref: Digest | None = None
    # FORWARD: a gateway session's span left the history fak forwards to an upstream model
    # (docs/gateway.md): the upstream recomputes without it, exact by construction
    mode: Literal["TRUNCATE", "RECOMPUTE", "REROPE", "FORWARD"]
    exact: bool
    tokens: Count
    reason: Id | None = None
    fingerprint_after: Digest | None = None


class MaterialisedPiece(_Strict):
    """One piece of a working set and how it was served."""

    ref: Digest | None = None  # the CAS ref the piece holds (None: text without a ref)
    tag: Id | None = None  # the caller's name for the piece
    verdict: Literal["HIT", "FAULT", "RECOMPUTE", "REFUSE", "ABSTAIN"]
    reason: Id  # e.g. exact, pic, not_cached, position_changed, quarantined, unknown_ref
    exact: bool | None = None  # HIT: exact or PIC-approximate
    tokens: Count  # tokens the piece contributes to the context (0 when refused)
    pic_tokens: Count | None = None  # of them, served from PIC chunks (approximate)
    source_positions: list[Count] | None = Field(None, max_length=MAX_ITEMS)  # where those chunks were computed


class Materialisation(_Event):
    """A working set materialised into a session's context, piece by piece."""

    type: Literal["materialisation"] = "materialisation"
    session_id: Id
    policy_digest: Digest
    pieces: list[MaterialisedPiece] = Field(max_length=MAX_ITEMS)
    evicted: list[Id] = Field(default_factory=list, max_length=MAX_ITEMS)  # tool segments that left (RECOMPUTE)
    budget_tokens: Count | None = None
    context_tokens: Count
    fingerprint_after: Digest


class ForgetRequested(_Event):
    type: Literal["forget_requested"] = "forget_requested"
    request_id: Id
    ref: Digest
    principal: Id | None = None
    reason: Id | None = None
    # the other refs this forget erases with ``ref`` (a REDACTed result's other form); None: none
    linked_refs: list[Digest] | None = Field(None, max_length=MAX_ITEMS)


class LinkedRef(_Strict):
    """A ref erased with the forgotten one (the other form of a REDACTed result) and its shred."""

    ref: Digest
    shredded_key_id: Id | None = None  # None: no data key was destroyed (already gone)
    kek_version: Count | None = None


class DroppedUnit(_Strict):
    """A unit dropped because it was derived from a ref: a KV unit, or a message of a gateway
    session's forwarded history (``gateway_segment``, docs/gateway.md)."""

    kind: Literal["segment", "generated_segment", "prefix_node", "pic_chunk", "gateway_segment"]
    id: Id
    session_id: Id | None = None  # segments: the session they belonged to
    # a replicated deployment's replica that held it (docs/scale-out.md); absent for one process
    replica: Id | None = Field(None, exclude_if=lambda v: v is None)


class SessionFingerprints(_Strict):
    """A session's KV fingerprint after a drop, and that of an independent replay of
    its surviving segments: equal when the drop left exactly what never-saw would.
    ``fingerprint_replay`` is None when the replay runs after the forget (``ReplayVerified``)."""

    session_id: Id
    fingerprint_after: Digest
    fingerprint_replay: Digest | None = None
    replica: Id | None = Field(None, exclude_if=lambda v: v is None)  # its replica, in a replicated deployment


class ReplicaPart(_Strict):
    """One replica's part of a forget in a replicated deployment: who applied it (the replica
    itself, or a peer standing in while it was down) and how much it dropped."""

    replica: Id
    applied_by: Id
    units: Count
    sessions: Count


class SessionReplay(_Strict):
    """An independent replay of a session's survivors, after the forget that dropped the rest:
    its fingerprint (None: a survivor was gone before a replay resumed after a crash could run)."""

    session_id: Id
    fingerprint_replay: Digest | None = None


class ReplayVerified(_Event):
    """The second half of a forget's receipt: each session's survivors replayed in a fresh
    session after the forget returned; ``verified``: every replay equals the logged
    ``fingerprint_after`` of ``ForgetCompleted`` at ``completed_index`` (false: an alarm too)."""

    type: Literal["replay_verified"] = "replay_verified"
    request_id: Id
    ref: Digest
    completed_index: Count
    sessions: list[SessionReplay] = Field(default_factory=list, max_length=MAX_ITEMS)
    verified: bool


class ForgetCompleted(_Event):
    type: Literal["forget_completed"] = "forget_completed"
    request_id: Id
    ref: Digest
    requested_index: Count  # log index of the matching ForgetRequested
    units_dropped: list[DroppedUnit] = Field(default_factory=list, max_length=MAX_ITEMS)
    sessions: list[SessionFingerprints] = Field(default_factory=list, max_length=MAX_ITEMS)
    shredded_key_id: Id | None = None  # None: no data key was destroyed (see the receipt check)
    kek_version: Count | None = None  # KEK version that had wrapped the destroyed key
    shred_status: Literal["destroyed", "pending_wal_checkpoint", "pending_vacuum"] | None = None  # CAS ShredRecord
    linked_refs: list[LinkedRef] | None = Field(None, max_length=MAX_ITEMS)  # erased with ``ref``; None: none
    replicas: list[ReplicaPart] | None = Field(None, max_length=MAX_ITEMS)  # every replica's part; None: one process


class RefQuarantined(_Event):
    """A late detection: the ref was evicted from every live session of its tenant."""

    type: Literal["ref_quarantined"] = "ref_quarantined"
    ref: Digest
    reason: Id
    principal: Id | None = None
    units: list[DroppedUnit] = Field(default_factory=list, max_length=MAX_ITEMS)


class RefExpired(_Event):
    """A ref's lifetime ended (policy expiry): evicted from every session, REFUSEd after."""

    type: Literal["ref_expired"] = "ref_expired"
    ref: Digest
    cause: Literal["seconds", "turns"]
    units: list[DroppedUnit] = Field(default_factory=list, max_length=MAX_ITEMS)


class ArgumentSourceRecord(_Strict):
    """Where an argument's value was found: a segment (and its ref) and character offsets."""

    segment: Id
    ref: Digest | None = None
    start: Count
    end: Count
    # the value lies inside a field's text of a structured result (not the field's whole value)
    inside: bool = Field(False, exclude_if=lambda v: not v)


class ToolClassRecord(_Strict):
    """How a tool no rule named was classified from its declared schema (``from_schemas``):
    its effect, its routing arguments (path: kind) and free-text arguments, what it was read
    from, and why (short lines of fak's own words, never argument values)."""

    effect: ToolEffect
    routing: dict[Id, RoutingKind] = Field(default_factory=dict, max_length=256)
    content: list[Id] = Field(default_factory=list, max_length=256)
    basis: ClassBasis
    reasons: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=32)


class ArgumentRecord(_Strict):
    """One argument's provenance in a decision: its path (an Id; the value itself is never
    logged), its origin, the routing entity kind when it is one found inside a longer value,
    and its sources (offsets, never content)."""

    path: Id
    origin: Literal["trusted", "internal", "untrusted", "generated"]
    entity: Literal["email", "url", "iban", "phone"] | None = None
    sources: list[ArgumentSourceRecord] = Field(default_factory=list, max_length=64)
    trigger: bool = False  # this argument made a firing rule fire


class AttentionRecord(_Strict):
    """The attention mass one argument's tokens put on one ref's rows: per layer and averaged."""

    arg: Id
    ref: Digest
    mean: Annotated[float, Field(ge=0.0, le=1.0)]
    per_layer: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=list, max_length=1024)


class CounterfactualRecord(_Strict):
    """The exact counterfactual: each argument's log-probability with and without the refs."""

    refs: list[Digest] = Field(max_length=MAX_ITEMS)
    logprob_with: dict[Id, float]
    logprob_without: dict[Id, float]
    acquitted: bool
    seconds: Annotated[float, Field(ge=0.0)]


class ToolCallDecision(_Event):
    """Tool-call authorization from the attention provenance (docs/design.md, Verdicts). The call's
    arguments are recorded as a keyed digest only: they may carry what the call would leak."""

    type: Literal["tool_call_decision"] = "tool_call_decision"
    session_id: Id
    tool: Id
    args_digest: Digest
    verdict: Literal["ALLOW", "CONFIRM", "DENY"]
    rule_id: Id | None = None
    offending: list[Digest] = Field(default_factory=list, max_length=MAX_ITEMS)
    attention_refs: Count  # refs in the attention provenance when the call was judged
    policy_digest: Digest
    enforced: bool = True
    would_be: Literal["ALLOW", "CONFIRM", "DENY"] | None = None  # audit mode: what enforcement would say
    audited: list[Id] = Field(default_factory=list, max_length=MAX_ITEMS)  # rules in audit mode that fired
    principal: Id | None = None  # who asked (an API key id, the SDK's local mode, the kernel's own loop)
    arguments: list[ArgumentRecord] = Field(default_factory=list, max_length=1024)  # argument provenance
    attention: list[AttentionRecord] = Field(default_factory=list, max_length=MAX_ITEMS)  # the model's evidence
    counterfactual: CounterfactualRecord | None = None
    approved_by: Count | None = None  # a remembered approval (its audit index) that allowed the call
    # the upstream model that wrote the call (a gateway session, docs/gateway.md): fak saw no
    # attention of it, so no rule was acquitted by evidence; absent for fak's own model and the SDK
    upstream: Id | None = Field(None, exclude_if=lambda v: v is None)
    # the schema-inferred class of a tool no rule named, when inferred rules decided the call
    tool_class: ToolClassRecord | None = Field(None, exclude_if=lambda v: v is None)


class ToolCallApproval(_Event):
    """A person's decision on a call the policy held (CONFIRM): who decided, which call, and the
    decision it answers (``decision_index``). Arguments as a keyed digest only, as in the decision."""

    type: Literal["tool_call_approval"] = "tool_call_approval"
    session_id: Id
    call_id: Id
    tool: Id
    args_digest: Digest
    approved: bool
    decision_index: Count | None = None
    principal: Id


class SessionRebuilt(_Event):
    """A session's KV rebuilt from its ledger (after a restart, or paged back in)."""

    type: Literal["session_rebuilt"] = "session_rebuilt"
    session_id: Id
    segments: Count
    tokens: Count
    fingerprint: Digest
    cause: Literal["restart", "offload", "model_changed"]  # model_changed: another model or weight format


class ChangeRolledBack(_Event):
    """A session change whose events were logged but whose ledger write then failed: the session
    is back at its durable ledger (rebuilt from it on next use), so the logged decisions at
    ``undoes`` never took effect. Without it the log would show an eviction or an admission the
    session does not hold."""

    type: Literal["change_rolled_back"] = "change_rolled_back"
    session_id: Id
    undoes: Annotated[list[Count], Field(min_length=1, max_length=10_000)]  # the logged indexes


# a judge's destination as the log records it: scheme://host:port (IPv6 hosts in brackets)
JudgeOrigin = Annotated[str, StringConstraints(strict=True, pattern=r"^https?://[A-Za-z0-9.\-]+:[0-9]{1,5}$|"
                                                                    r"^https?://\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$",
                                               max_length=300)]


class JudgeScope(_Strict):
    """Where one late-detector judge of a policy sends tool results, and whose: ``all_tenants``
    or exactly ``tenants`` (issue 25.6: egress is the deployment's, scope the policy's)."""

    detector_id: Id
    destination: JudgeOrigin
    all_tenants: bool = False
    tenants: list[Tenant] = Field(default_factory=list, max_length=MAX_ITEMS)


class PolicyLoaded(_Event):
    type: Literal["policy_loaded"] = "policy_loaded"
    policy_id: Id
    policy_digest: Digest
    previous_digest: Digest | None = None
    principal: Id | None = None
    judges: list[JudgeScope] | None = Field(None, max_length=MAX_ITEMS)  # the policy's judges (None: it has none)


class KeyRotated(_Event):
    type: Literal["key_rotated"] = "key_rotated"
    key_kind: Id
    old_key_id: Id | None = None
    new_key_id: Id
    principal: Id | None = None


class KeysDestroyed(_Event):
    """Keys about to be destroyed (write-ahead: logged before they are), e.g. retired CAS KEKs
    past their grace period: from then on no backup of what they wrapped opens again."""

    type: Literal["keys_destroyed"] = "keys_destroyed"
    key_kind: Id
    key_ids: list[Id] = Field(max_length=MAX_ITEMS)
    principal: Id | None = None


ApiRole = Literal["agent", "auditor", "admin", "approver"]


class KeyCreated(_Event):
    """An API key created for ``tenant`` (its id, role and expiry; never the key or its hash).
    Logged before the key's row is written: no key exists that the log does not name."""

    type: Literal["key_created"] = "key_created"
    key_id: Id
    role: ApiRole
    expires_ms: Count | None = None  # when it stops working, ms since the Unix epoch (None: never)
    principal: Id | None = None


class KeyRevoked(_Event):
    """An API key revoked (logged before the row changes): its id, tenant, role and expiry."""

    type: Literal["key_revoked"] = "key_revoked"
    key_id: Id
    role: ApiRole | None = None  # None: the row failed its MAC (then under the system tenant)
    expires_ms: Count | None = None
    principal: Id | None = None


class KeyAlarm(_Event):
    """A valid API key was presented whose database row fails its MAC (someone who can write
    the database edited its tenant, role, revocation or expiry, or wrote the row): refused
    as an unknown key. One event per key and window (``refusals``: the requests refused on
    that row since the previous alarm for it, this one included), so a flood on one edited
    row does not grow the log by an entry a request. Under the system tenant: the row's own
    tenant is not to be believed."""

    type: Literal["key_alarm"] = "key_alarm"
    key_id: Id
    # row_mac_mismatch: the row fails its MAC; revoked_in_log: the row (its MAC valid) says active
    # where the log holds its key_revoked or its tenant's tenant_erased: an earlier row put back
    kind: Literal["row_mac_mismatch", "revoked_in_log"]
    refusals: Count


AuthReason = Literal["missing_key", "unknown_key", "revoked_key", "forbidden", "expired", "signed_out"]
MAX_FINGERPRINTS = 16  # fingerprints one ``auth_failures`` entry lists (the most frequent)


class AuthFailure(_Event):
    """A request refused for its key (the first of its reason in a window: ``AuthFailures``)."""

    type: Literal["auth_failure"] = "auth_failure"
    reason: AuthReason
    key_fingerprint: Digest | None = None  # a keyed digest of the presented key, never the key
    route: Id | None = None


class AuthFailures(_Event):
    """The authentication failures of one window after the first of each reason (an
    ``auth_failure`` of its own), counted rather than logged one by one, so a flood of bogus
    keys grows the log by a bounded number of entries (issue 25.5). Logged at the window's
    end, or at shutdown. Fingerprints are HMAC-SHA256 digests under a server key of the
    presented keys' first 21 characters (``fak_<key id>_``) and of the client addresses: they
    tell one source from another without saying what it is."""

    type: Literal["auth_failures"] = "auth_failures"
    window_start_ms: Count
    window_end_ms: Count
    count: Count  # failures counted here (the first of each reason is not)
    reasons: dict[AuthReason, Count]
    key_fingerprints: list[Digest] = Field(default_factory=list, max_length=MAX_FINGERPRINTS)
    more_keys: Count = 0  # distinct key fingerprints beyond those listed (exact up to 4,096)
    client_fingerprints: list[Digest] = Field(default_factory=list, max_length=MAX_FINGERPRINTS)
    more_clients: Count = 0
    dropped: Count = 0  # first-of-reason entries the full audit queue did not take (counted here)


class TenantEraseRequested(_Event):
    """An operator asked to crypto-erase a whole tenant (written before anything is erased)."""

    type: Literal["tenant_erase_requested"] = "tenant_erase_requested"
    principal: Id | None = None
    reason: Id | None = None


class TenantErased(_Event):
    """A whole tenant crypto-erased: its sessions and KV dropped, every key it had destroyed
    (so no backup of its data keys opens again), its refs tombstoned, its API keys revoked."""

    type: Literal["tenant_erased"] = "tenant_erased"
    requested_index: Count
    sessions: Count
    refs_forgotten: Count
    keys_destroyed: list[Id] = Field(default_factory=list, max_length=MAX_ITEMS)
    api_keys_revoked: Count = 0
    shred_status: Literal["destroyed", "pending_wal_checkpoint", "pending_vacuum"]


class McpToolPin(_Strict):
    """One tool of an MCP server as pinned or as seen: its name and the digest of its name,
    description and input schema (``fak.kernel.mcp.client.McpTool.digest``)."""

    name: Id
    digest: Digest


class McpToolsApproved(_Event):
    """An operator approved an MCP server's tools as listed now (docs/mcp.md): these digests
    are pinned, and a tool whose definition differs later is withheld until approved again."""

    type: Literal["mcp_tools_approved"] = "mcp_tools_approved"
    server: Id  # the deployment's label of the server
    tools: list[McpToolPin] = Field(max_length=1000)
    principal: Id


class McpToolChange(_Strict):
    """What differs between a pinned tool and the tool listed now."""

    name: Id
    change: Literal["description", "input_schema", "description_and_input_schema", "not_pinned", "invalid_name"]
    pinned: Digest | None = None
    seen: Digest | None = None


class McpToolsChanged(_Event):
    """An MCP server lists tools that differ from what an operator pinned (a changed
    description or schema: a rug pull, or an update nobody approved; a tool never approved):
    they are withheld from the model until an operator approves them. Logged once per
    distinct listing."""

    type: Literal["mcp_tools_changed"] = "mcp_tools_changed"
    server: Id
    changes: list[McpToolChange] = Field(max_length=1000)


class McpToolCalled(_Event):
    """fak ran an MCP tool after its decision allowed it (or a person approved it): which
    server and tool, the call and its decision, and how it ended (``ok``, ``tool_error``: the
    tool reported an error, ``failed``: the server failed, timed out or answered over the
    size limit). The result, when there is one, is admitted and logged as an admission."""

    type: Literal["mcp_tool_called"] = "mcp_tool_called"
    session_id: Id
    server: Id
    tool: Id  # its governed name, mcp:<label>/<tool>, as the decision names it
    call_id: Id
    args_digest: Digest
    decision_index: Count | None = None
    outcome: Literal["ok", "tool_error", "failed"]
    via: Literal["responses", "gateway"]


class AuditAlarm(_Event):
    """The log's signer found the database disagreeing with what it remembers signing
    (outside the database), so it refuses to sign until an operator resolves it; or the
    operator's explicit resolution (``signer_reset``: the history up to ``found_size``
    accepted as the new base)."""

    type: Literal["audit_alarm"] = "audit_alarm"
    kind: Literal["history_rewritten", "signer_state_missing", "signer_state_ahead", "signer_reset",
                  "forget_replay_mismatch",  # a forget's replay differs (``request_id``)
                  "tenant_sequence_repeated",  # an entry numbered at or below its tenant's signed tail
                  "tenant_column_changed"]  # a row's tenant column is not its body's (found_size: its index)
    remembered_size: Count | None = None  # the size the signer last signed (None: no state)
    remembered_root: Digest | None = None  # its root, ``sha256:<hex>``
    found_size: Count  # entries in the database when the check ran (reset: the accepted size)
    found_root: Digest | None = None  # root recomputed from the entries at remembered_size (or found_size)
    principal: Id | None = None  # reset: who resolved it
    request_id: Id | None = None  # forget_replay_mismatch: the forget


Event = Annotated[
    AdmissionVerdict
    | Eviction
    | Materialisation
    | ForgetRequested
    | ForgetCompleted
    | ReplayVerified
    | RefQuarantined
    | RefExpired
    | ToolCallDecision
    | SessionRebuilt
    | ChangeRolledBack
    | PolicyLoaded
    | KeyRotated
    | KeysDestroyed
    | AuthFailure
    | AuthFailures
    | ToolCallApproval
    | KeyCreated
    | KeyRevoked
    | KeyAlarm
    | AuditAlarm
    | TenantEraseRequested
    | TenantErased
    | McpToolsApproved
    | McpToolsChanged
    | McpToolCalled,
    Field(discriminator="type"),
]
EVENT_TYPES = (
    AdmissionVerdict,
    Eviction,
    Materialisation,
    ForgetRequested,
    ForgetCompleted,
    ReplayVerified,
    RefQuarantined,
    RefExpired,
    ToolCallDecision,
    ToolCallApproval,
    SessionRebuilt,
    ChangeRolledBack,
    PolicyLoaded,
    KeyRotated,
    KeysDestroyed,
    AuthFailure,
    AuthFailures,
    KeyCreated,
    KeyRevoked,
    KeyAlarm,
    AuditAlarm,
    TenantEraseRequested,
    TenantErased,
    McpToolsApproved,
    McpToolsChanged,
    McpToolCalled,
)
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "event"
    return f"{where}: {err['msg']}"


def to_event(value: object) -> Event:
    """Validate a model or a dict into an event; a clear AuditError otherwise."""
    if isinstance(value, EVENT_TYPES):
        return value
    try:
        return _ADAPTER.validate_python(value)
    except ValidationError as exc:
        raise AuditError(f"not a valid audit event: {_first_error(exc)}") from None


def canonical(event: Event) -> bytes:
    """RFC 8785 canonical JSON of the event: the bytes that are hashed into the log."""
    return rfc8785.dumps(event.model_dump(mode="json", exclude_none=True))


def parse_event(raw: bytes) -> Event:
    """Parse logged bytes back into an event; refuses anything that is not canonical."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AuditError(f"logged event is not JSON: {exc}") from None
    event = to_event(obj)
    if canonical(event) != raw:
        raise AuditError("logged event is not in canonical form")
    return event
