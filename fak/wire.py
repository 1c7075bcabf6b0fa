"""The wire models: request and response bodies of the REST API (pydantic), shared by the
server (``fak.api``, which declares them on its routes and in its OpenAPI document) and the
SDK (``fak.sdk``, which sends and parses them). Ids and digests are the shared ``fak.types``
grammar, sizes are bounded, unknown fields are refused.

Import-light on purpose: pydantic and ``fak.types`` only, so that the HTTP client loads no
part of the server, the database or the kernel (``tests/sdk/test_sdk_imports.py``)."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fak.types import Digest, Id

MAX_TEXT = 1 << 20  # characters of one message
MAX_TOOL_BYTES = 8 << 20  # a tool result as sent (the policy's max_bytes decides what enters)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionCreate(Strict):
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="default: generated")


class SegmentOut(BaseModel):
    id: str
    kind: str
    ref: str | None
    start: int | None
    length: int
    state: str
    verdict: str | None
    rule: str | None
    provenance: list[str]
    content_provenance: list[str]
    protected: bool


class SessionOut(BaseModel):
    id: str
    tokens: int
    # leading KV rows bit-exact to an exact run; rows after them are approximate (PIC, REROPE);
    # None from a server older than the field
    exact_rows: int | None = None
    fingerprint: str
    segments: list[SegmentOut]


class SessionList(BaseModel):
    sessions: list[str]


class MessageIn(Strict):
    role: Literal["system", "user"]
    content: str = Field(max_length=MAX_TEXT)


class ToolResultIn(Strict):
    tool: str = Field(min_length=1, max_length=128)
    content: str | None = Field(None, description="the result as text (UTF-8)")
    content_b64: str | None = Field(None, description="the result as base64 bytes (any bytes)")
    media_type: str = "text/plain"
    tags: list[Id] = Field(default_factory=list, max_length=64)
    source: str | None = Field(None, max_length=2048, description="the URL the result came from (policy rules, "
                               "exceptions and trust may depend on its host)")

    @model_validator(mode="after")
    def _one(self) -> ToolResultIn:
        if (self.content is None) == (self.content_b64 is None):
            raise ValueError("give exactly one of content or content_b64")
        return self

    def data(self) -> bytes:
        if self.content is not None:
            raw = self.content.encode("utf-8", "surrogatepass")
        else:
            try:
                raw = base64.b64decode(self.content_b64 or "", validate=True)
            except ValueError:
                raise ValueError("content_b64 is not base64") from None
        if len(raw) > MAX_TOOL_BYTES:
            raise ValueError(f"a tool result is at most {MAX_TOOL_BYTES} bytes")
        return raw


class MatchOut(BaseModel):
    detector: str
    rule_id: str
    score: float


class AdmissionOut(BaseModel):
    verdict: Literal["ALLOW", "QUARANTINE", "REDACT", "DENY"]
    enforced: bool
    rule_id: str
    policy_digest: str
    ref: str
    admitted_ref: str | None
    admitted: bool
    segment: SegmentOut
    audit_index: int


class EvictIn(Strict):
    segment_id: Id
    mode: Literal["auto", "write_time", "recompute", "rerope"] | None = None
    reason: Id = "manual"


class EvictionOut(BaseModel):
    segment_id: str
    ref: str | None
    mode: str
    exactness: str
    rows_removed: int
    rows_replayed: int
    seconds: float
    fingerprint: str


class ToolCallIn(Strict):
    """A tool call the agent is about to make (whoever's model produced it)."""

    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] | str | None = Field(
        None, description="the call's arguments (an object, or a JSON string as OpenAI sends it); logged as a "
                          "keyed digest only")
    tool: dict[str, Any] | None = Field(
        None, description="the tool's definition (an OpenAI tool, a bare function or an MCP tool): with the "
                          "policy's from_schemas, a tool no rule names is classified from its schema")


class ValueSourceOut(BaseModel):
    """Where an argument's value was found: a segment (and its ref), characters [start, end) of
    its text, the field of a structured result holding it, and the trust of that text."""

    segment: str
    ref: str | None
    start: int
    end: int
    field: str | None
    trust: str
    inside: bool = False  # the value lies inside the field's text, not the field's whole value


class ArgumentFindingOut(BaseModel):
    """An argument that made a rule fire: why a person is asked (CONFIRM) or the call refused."""

    argument: str = Field(description="the argument's path (recipients.0); with entity, a value found inside it")
    entity: Literal["email", "url", "iban", "phone"] | None
    origin: Literal["trusted", "internal", "untrusted", "generated"]
    sources: list[ValueSourceOut]


class CounterfactualOut(BaseModel):
    """Each argument's log-probability with the offending refs in context and evicted exactly."""

    refs: list[str]
    logprob_with: dict[str, float]
    logprob_without: dict[str, float]
    acquitted: bool
    seconds: float


class ToolCallDecisionOut(BaseModel):
    tool: str
    verdict: Literal["ALLOW", "CONFIRM", "DENY"]
    rule_id: str | None = Field(description="the deciding rule; 'unlisted' when no rule fired and unlisted is "
                                            "not ALLOW; null when nothing fired and the call is allowed")
    findings: list[ArgumentFindingOut] = Field(default_factory=list,
                                               description="the arguments that made a rule fire, with their sources")
    counterfactual: CounterfactualOut | None = None
    approved_by: int | None = Field(None, description="a remembered approval (audit index) that allowed the call")
    offending: list[str] = Field(description="refs in attention that made a rule fire: evict them to remedy")
    attention_refs: int
    policy_digest: str
    enforced: bool
    would_be: Literal["ALLOW", "CONFIRM", "DENY"] | None
    audited: list[str]
    audit_index: int
    tool_class: dict[str, Any] | None = Field(
        None, description="how the tool was classified from its schema when the policy's from_schemas decided "
                          "it: effect, routing arguments, content arguments, basis, reasons")


class EvictRefsIn(Strict):
    refs: list[Digest] = Field(min_length=1, max_length=4096)
    drop_generated: bool = Field(True, description="also drop assistant turns produced while a ref was in attention")
    reason: Id = "tool_call"


class RefsEvictedOut(BaseModel):
    segment_ids: list[str]
    exactness: str
    fingerprint: str
    audit_indexes: list[int]


class GenerateIn(Strict):
    max_tokens: int = Field(128, ge=0, le=4096)
    min_tokens: int = Field(0, ge=0, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False


class GenerateOut(BaseModel):
    text: str
    tokens: list[int]
    segment: SegmentOut | None
    fingerprint: str


class PieceOut(BaseModel):
    selector: str
    ref: str | None
    verdict: Literal["HIT", "FAULT", "RECOMPUTE", "REFUSE", "ABSTAIN"]
    reason: str
    exact: bool | None
    tokens: int
    segment_id: str | None
    pic_tokens: int = 0
    source_positions: list[int] = []


class MaterialiseOut(BaseModel):
    pieces: list[PieceOut]
    evicted: list[str]
    segments: list[SegmentOut]
    context_tokens: int
    fingerprint: str
    audit_index: int


class ForgetIn(Strict):
    ref: Digest
    reason: Id | None = None


class DroppedUnitOut(BaseModel):
    """A KV unit a forget dropped (``fak.audit.events.DroppedUnit``)."""

    kind: str  # segment | generated_segment | prefix_node | pic_chunk
    id: str
    session_id: str | None = None  # segments: the session they belonged to
    replica: str | None = Field(None, exclude_if=lambda v: v is None)  # a replicated deployment's replica


class SessionFingerprintsOut(BaseModel):
    """A session's KV fingerprint after a forget's drop (``fak.audit.events.SessionFingerprints``)."""

    session_id: str
    fingerprint_after: str
    fingerprint_replay: str | None = None  # inline in older receipts; else in ``replay_event``
    replica: str | None = Field(None, exclude_if=lambda v: v is None)


class LinkedRefOut(BaseModel):
    """A ref erased with the forgotten one and its shredded key (``fak.audit.events.LinkedRef``)."""

    ref: str
    shredded_key_id: str | None = None
    kek_version: int | None = None


class ReplicaPartOut(BaseModel):
    """One replica's part of a forget (``fak.audit.events.ReplicaPart``)."""

    replica: str
    applied_by: str
    units: int
    sessions: int


class ForgetReceiptOut(BaseModel):
    """``POST /v1/forget``: the signed receipt, field for field ``fak.audit.receipt.ForgetReceipt``
    as JSON (the SDK reads it into that class, which verifies it offline)."""

    ref: str
    request_id: str
    tenant: str = ""
    units_dropped: list[DroppedUnitOut]
    sessions: list[SessionFingerprintsOut]
    shredded_key_id: str | None
    kek_version: int | None
    requested_index: int  # log index of ForgetRequested
    log_index: int  # log index of ForgetCompleted
    event: str  # canonical JSON of the logged ForgetCompleted
    inclusion_proof: dict[str, Any]
    requested_event: str
    requested_inclusion_proof: dict[str, Any]
    checkpoint: str  # the signed note the proofs lead to
    admitted_index: int | None = None
    admitted_event: str | None = None
    admitted_inclusion_proof: dict[str, Any] | None = None
    consistency_proof: dict[str, Any] | None = None
    shred_status: str | None = None
    linked_refs: list[LinkedRefOut] | None = None
    replicas: list[ReplicaPartOut] | None = Field(None, exclude_if=lambda v: v is None)  # None: one process
    replay_index: int | None = None  # the independent replay's ReplayVerified: None while it is pending
    replay_event: str | None = None
    replay_inclusion_proof: dict[str, Any] | None = None


class ForgetStatusOut(ForgetReceiptOut):
    """``GET /v1/forget/{request_id}`` once the erasure is done: the receipt as it stands, its state
    and where its replay is (``verified``, ``mismatch``, ``pending``, ``none``, ``inline``)."""

    state: str  # completed
    replay: str


class ForgetPendingOut(Strict):
    """``GET /v1/forget/{request_id}`` before the erasure is done (a crash left it ``requested``)."""

    request_id: str
    ref: str
    state: str


class QuarantineIn(Strict):
    ref: Digest
    reason: Id


class QuarantineOut(BaseModel):
    ref: str
    units: list[dict[str, str]]
    mode: str
    audit_index: int
    pending: list[str] = Field(default_factory=list,
                               description="sessions busy at the time: they evict the ref before their next use")


# --- audit -------------------------------------------------------------------------
class EntryOut(BaseModel):
    index: int
    type: str
    event: str  # the canonical JSON (RFC 8785) that was hashed: leaf hash = SHA-256(0x00 || event)
    leaf_hash: str  # hex


class EntriesOut(BaseModel):
    entries: list[EntryOut]
    next_start: int | None  # pass as ``start`` for the next page; None at the end of the log


class CheckpointOut(BaseModel):
    origin: str
    size: int
    root_hash: str  # hex
    checkpoint: str  # the C2SP signed note (tlog-checkpoint body + Ed25519 signature lines)
    public_key: str  # the verifier key ``<origin>+<key id>+<base64>`` to pin


class InclusionOut(BaseModel):
    index: int
    leaf_hash: str
    proof: dict[str, Any]  # Rekor-like JSON: logIndex, treeSize, rootHash, hashes (hex), checkpoint (signed note)


class ReceiptCheckOut(BaseModel):
    ok: bool
    reason: str


# --- the deployment's MCP servers and their pinned tools (operator): /v1/mcp/servers ------------
McpToolStatus = Literal["pinned", "changed", "not_pinned", "not_allowed", "invalid_name"]


class McpToolOut(BaseModel):
    """A tool as the server lists it now, and how it stands against the pins: ``pinned`` (offered
    to models), ``changed`` (pinned, but its description or schema differs now: withheld until
    approved again; ``change`` says what), ``not_pinned`` (never approved: withheld),
    ``not_allowed`` (outside the server's ``allowed_tools``: never offered), ``invalid_name``."""

    name: str
    digest: str  # sha256 over the canonical JSON of name, description and input schema: what a pin holds
    status: McpToolStatus
    change: Literal["description", "input_schema", "description_and_input_schema"] | None = None
    pinned_digest: str | None = None  # the digest approved, when it differs from ``digest``
    description: str
    input_schema: dict[str, Any]


class McpPinOut(BaseModel):
    """A pinned tool: its approved digest, who approved it and the approval's audit entry."""

    name: str
    digest: str
    approved_by: str
    audit_index: int
    approved_us: int  # microseconds since the epoch


class McpServerOut(BaseModel):
    label: str
    source: str  # its URL, or stdio:<program>
    allowed_tools: list[str]  # empty: every tool it lists
    tools: list[McpToolOut] | None  # None: the server could not be listed now (``error`` says why)
    error: str | None = None
    pins: list[McpPinOut]


class McpServerList(BaseModel):
    servers: list[McpServerOut]


class McpApproveIn(Strict):
    expected: list[Digest] | None = Field(None, max_length=1000, description=(
        "the digests of the tools the operator reviewed (GET /v1/mcp/servers): the approval pins the listing only "
        "when it is exactly these (409 otherwise: the server changed since); omitted, the listing as it is now"))


class McpPinnedTool(BaseModel):
    name: str
    digest: str


class McpApproveOut(BaseModel):
    label: str
    audit_index: int  # the mcp_tools_approved entry
    tools: list[McpPinnedTool]


# --- the OpenAI-compatible chat: POST /v1/chat/completions, GET /v1/models --------------------
# OpenAI's wire format, not fak's: a request allows fields fak does not know (clients send them;
# ``fak.kernel.openai.chat`` reports them as ignored). The class names are the OpenAPI schema's.
CHAT_MAX_TOKENS = 4096  # max_completion_tokens (and max_tokens, min_tokens) of one request
CHAT_MAX_MESSAGES = 4096  # messages of one request
CHAT_MAX_CHOICES = 8  # n
HELD_PREFIX = "call_held_"  # the id of a tool call fak held for a person (CONFIRM): clients tell them apart
SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # the id grammar of POST /v1/sessions


class Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields fak does not know


class FunctionCall(Lenient):
    name: str = Field(max_length=256)
    arguments: str | dict[str, Any] = Field("", description="JSON text, as OpenAI sends it")


class ToolCall(Lenient):
    id: str | None = Field(None, max_length=256)
    type: str = "function"
    function: FunctionCall | None = None
    custom: dict[str, Any] | None = None


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = Field(None, description="a string or a list of text parts")
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=256)
    tool_call_id: str | None = Field(None, max_length=256)
    function_call: FunctionCall | None = None


class StreamOptions(Lenient):
    include_usage: bool | None = None


class ChatCompletionRequest(Lenient):
    model: str = Field(max_length=256, description="any name; responses name the kernel's model")
    messages: list[ChatMessage] = Field(min_length=1, max_length=CHAT_MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=CHAT_MAX_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=CHAT_MAX_TOKENS, description="older name of max_completion_tokens")
    min_tokens: int | None = Field(None, ge=0, le=CHAT_MAX_TOKENS, description="extension (as vLLM's)")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: int | None = Field(None, ge=1, le=CHAT_MAX_CHOICES, description="sibling answers from one prefilled prompt")
    stop: str | list[str] | None = Field(None, description="up to 4 strings that end the answer")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100]")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    response_format: dict[str, Any] | None = Field(None, description="text, json_object or json_schema")
    modalities: list[str] | None = Field(None, description="only ['text']")
    tools: list[dict[str, Any]] | None = Field(None, max_length=128, description="function tools")
    tool_choice: str | dict[str, Any] | None = Field(None, description="auto, none, required or a named function")
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = Field(None, max_length=128, description="legacy form of tools")
    function_call: str | dict[str, Any] | None = Field(None, description="legacy form of tool_choice")
    user: str | None = Field(None, max_length=256, description="recorded as the end user; does not pick a session")
    metadata: dict[str, str] | None = Field(None, description="accepted; returned in the fak field")
    store: bool | None = None
    fak_session: str | None = Field(None, pattern=SESSION_ID,
                                    description="extension: a persistent session holding the history")
    fak_held_calls: Literal["withhold", "return"] | None = Field(
        None, description="extension: CONFIRM calls left out of tool_calls (withhold, the default) or returned "
                          "marked held (return: for clients that ask a person before running them)")


class AdmissionInfo(BaseModel):
    message_index: int
    tool: str
    tool_call_id: str | None
    verdict: Literal["ALLOW", "QUARANTINE", "REDACT", "DENY"]
    rule_id: str
    ref: str
    admitted_ref: str | None
    admitted: bool
    segment_id: str | None
    audit_index: int | None
    matched: str | None = Field(None, description="the MCP tool (mcp:<label>/<tool>) whose result this session holds "
                                "first-hand with these very bytes (the MCP gateway admitted it): matched by digest, "
                                "not admitted again")


class CallVerdictInfo(BaseModel):
    """fak's verdict on one tool call the model wrote (``fak.tool_calls``)."""

    id: str
    name: str
    verdict: Literal["ALLOW", "CONFIRM", "DENY"]
    rule_id: str | None
    offending: list[str]
    enforced: bool
    returned: bool = Field(description="in message.tool_calls (callable, or held with fak_held_calls=return)")
    held: bool = Field(description="waiting for a person: POST /v1/tool-calls/{id}/approve or /reject")
    audit_index: int | None
    findings: list[ArgumentFindingOut] = Field(default_factory=list,
                                               description="the arguments that made a rule fire, with their sources")
    approved_by: int | None = None
    choice: int = 0
    upstream: str | None = Field(None, description="the upstream model that wrote the call (docs/gateway.md): fak "
                                 "saw none of its attention, so no rule was acquitted by evidence and no "
                                 "counterfactual ran")
    closed_to_fit: bool = Field(False, description="fak's grammar narrowed the call's last tokens to close it "
                                "within max_tokens (or the context left): an argument may be cut short")


class RemedyInfo(BaseModel):
    """What the door did about a DENYed call: the refs evicted (exactly) and the turn asked again,
    or a refusal."""

    action: Literal["evict_and_retry", "refuse"]
    tool: str
    rule_id: str | None
    evicted_refs: list[str]
    evicted_segments: list[str]
    exactness: str | None
    fingerprint: str | None
    choice: int = 0


class McpWithheldInfo(BaseModel):
    server_label: str
    name: str
    change: str


class FakInfo(BaseModel):
    session_id: str
    ephemeral: bool
    fingerprint: str | None
    admissions: list[AdmissionInfo]
    ignored: list[str]
    tool_calls: list[CallVerdictInfo] = []
    remedies: list[RemedyInfo] = []
    tools_ref: str | None = None
    metadata: dict[str, str] | None = None
    content_withheld: bool = Field(False, description="generated text, call arguments and instructions left out: "
                                                      "the caller's role reads decisions, not content (an auditor)")
    upstream: str | None = Field(None, description="the upstream this answer was forwarded to (a gateway session, "
                                                   "docs/gateway.md); None: fak's own model")
    mcp_withheld: list[McpWithheldInfo] = Field(default_factory=list, description="MCP tools listed by a server and "
                                                "kept from the model: changed since an operator pinned them, never "
                                                "pinned, or named so the log cannot carry it (docs/mcp.md)")


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage
    fak: FakInfo


class ToolCallApprovalOut(BaseModel):
    """A held call after a person's decision: the call to run (approved) or not (rejected)."""

    id: str
    state: Literal["approved", "rejected"]
    session_id: str
    tool_call: ToolCallOut
    decided_by: str
    audit_index: int | None


class HeldCallOut(BaseModel):
    """A tool call fak held for a person (CONFIRM), as an approver sees it: what it would do,
    why it was held, who produced it and what became of it."""

    id: str = Field(description="the held call's id (call_held_...): approve or reject it by this id")
    state: Literal["pending", "approved", "rejected"]
    session_id: str
    tool_call: ToolCallOut = Field(description="the call; its arguments are 'null' once the content it was "
                                               "written from was forgotten (it can then only be rejected)")
    rule_id: str | None
    offending: list[str] = Field(description="the refs in attention that made the rule fire")
    findings: list[ArgumentFindingOut] = Field(description="the arguments that made a rule fire, and their sources")
    decision_audit_index: int | None
    produced_by: str | None = Field(description="the principal whose request produced it: it may not approve it")
    created: int = Field(description="Unix seconds")
    decided_by: str | None = None
    audit_index: int | None = Field(None, description="the approval's or rejection's audit index")


class HeldCallList(BaseModel):
    object: Literal["list"] = "list"
    data: list[HeldCallOut]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fak"
    fak_runs: bool = Field(True, description="fak runs this model itself (its KV: exact eviction, attention "
                                             "evidence); false: an upstream fak governs as a gateway (docs/gateway.md)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
