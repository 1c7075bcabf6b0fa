"""SQLAlchemy 2 models of the kernel state. Times are integer microseconds since the Unix epoch."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class SessionRow(Base):
    __tablename__ = "fak_sessions"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    updated_us: Mapped[int] = mapped_column(BigInteger)
    model_id: Mapped[str] = mapped_column(String(512))
    tokenizer_id: Mapped[str] = mapped_column(String(80))
    chunk_size: Mapped[int] = mapped_column(Integer)
    next_segment: Mapped[int] = mapped_column(Integer)
    fingerprint: Mapped[str] = mapped_column(String(80))
    tokens: Mapped[int] = mapped_column(Integer)
    approximate: Mapped[bool] = mapped_column(Boolean, default=False)  # REROPE was used: no exact rebuild
    # leading KV rows an exact run computes (PIC or REROPE make the rest approximate), so a read
    # answers from the row without the KV; None: written before it was recorded (state_0012)
    exact_rows: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    # the replica the session lives on (docs/scale-out.md); None: a single-process kernel's
    replica: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)

    __table_args__ = (Index("ix_fak_sessions_replica", "replica", "tenant"),)


class SegmentRow(Base):
    __tablename__ = "fak_segments"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    ref: Mapped[str | None] = mapped_column(String(80), nullable=True)
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    rule: Mapped[str | None] = mapped_column(String(128), nullable=True)
    policy_digest: Mapped[str | None] = mapped_column(String(80), nullable=True)
    protected: Mapped[bool] = mapped_column(Boolean)
    chunks: Mapped[str] = mapped_column(Text)  # JSON list of prefill call sizes
    ntokens: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # int32 LE; None for tool segments
    message_role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    message_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    # a segment derived from tool content keeps its tokens, role and text here only, sealed
    # under a key derived from its refs' data keys (fak.state.seal); the three above stay NULL
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    attention: Mapped[str] = mapped_column(Text)  # JSON list of refs
    content: Mapped[str] = mapped_column(Text)  # JSON list of refs
    expires_turn: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the session turn it expires at
    # a tool segment's producer at admission (its trust is the segment's, not the bytes')
    tool: Mapped[str | None] = mapped_column(String(128), nullable=True)
    source: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    producer_mac: Mapped[str | None] = mapped_column(String(80), nullable=True)  # keyed: see DerivedKeys
    # the media type it was admitted with (its structure's declaration), under the same MAC
    media_type: Mapped[str | None] = mapped_column(String(128), nullable=True)

    __table_args__ = (Index("ix_fak_segments_ref", "tenant", "ref"),)


class RefRow(Base):
    """What the kernel knows of a ref beyond the CAS: who admitted it and how, its tags."""

    __tablename__ = "fak_refs"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    tool: Mapped[str] = mapped_column(String(128))
    tags: Mapped[str] = mapped_column(Text)  # JSON list
    admitted_us: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)  # admission order, for tag selection
    verdict: Mapped[str] = mapped_column(String(16))
    policy_digest: Mapped[str] = mapped_column(String(80))
    quarantined: Mapped[bool] = mapped_column(Boolean, default=False)
    quarantine_reason: Mapped[str | None] = mapped_column(String(128), nullable=True)
    expires_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)  # lifetime's end
    expired_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # when its expiry was executed
    source: Mapped[str | None] = mapped_column(String(2048), nullable=True)  # the URL it came from, if given


class ForgetRow(Base):
    """Progress of one forget: written before any effect, completed after ``ForgetCompleted``.
    A ref re-admitted after its forget can be forgotten again: one row per request."""

    __tablename__ = "fak_forgets"
    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    ref: Mapped[str] = mapped_column(String(80))
    started_us: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))  # requested | replaying (fak.kernel.withdrawal.replay_check) | completed
    principal: Mapped[str | None] = mapped_column(String(128), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(128), nullable=True)
    requested_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    kek_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    units: Mapped[str] = mapped_column(Text)  # JSON list of dropped units so far
    sessions: Mapped[str] = mapped_column(Text)  # JSON list of per-session fingerprints so far
    # JSON list of the other refs this forget erases (the other form of a REDACTed result)
    linked: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)

    __table_args__ = (Index("ix_fak_forgets_ref", "tenant", "ref"),)


class RefLinkRow(Base):
    """A REDACT admission's two refs: ``derived`` (the redacted bytes) was computed by the
    kernel's gate from ``original``. Written before the derived bytes are stored; never
    written from a client's input. A forget of either erases both."""

    __tablename__ = "fak_ref_links"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    original: Mapped[str] = mapped_column(String(80), primary_key=True)
    derived: Mapped[str] = mapped_column(String(80), primary_key=True)
    created_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_fak_ref_links_derived", "tenant", "derived"),)


class ReplicaRow(Base):
    """A replica that joined a replicated deployment: a withdrawal must reach every one."""

    __tablename__ = "fak_replicas"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    joined_us: Mapped[int] = mapped_column(BigInteger)  # first start
    started_us: Mapped[int] = mapped_column(BigInteger)  # latest start
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))


class WithdrawalTaskRow(Base):
    """One replica's part of one withdrawal (forget, quarantine, expiry, tenant erase):
    pending until the replica (or one standing in for it while it is down) has dropped
    every unit it holds; ``units`` and ``sessions`` are its report, written with each
    session it changed."""

    __tablename__ = "fak_withdrawal_tasks"
    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    replica: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # forget | quarantine | expire | erase
    tenant: Mapped[str] = mapped_column(String(64))
    refs: Mapped[str] = mapped_column(Text)  # JSON list
    state: Mapped[str] = mapped_column(String(16))  # pending | done
    units: Mapped[str] = mapped_column(Text)  # JSON list of dropped units
    sessions: Mapped[str] = mapped_column(Text)  # JSON list of per-session fingerprints
    applied_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    done_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    mac: Mapped[str | None] = mapped_column(String(80), nullable=True)  # keyed: fak.state.replicas.report_mac

    __table_args__ = (Index("ix_fak_withdrawal_tasks_pending", "replica", "state"),)


class ApiKeyRow(Base):
    """An API key: only its id and a keyed hash are stored; the key itself is shown once. ``mac``
    binds id, tenant, role, hash, revocation and expiry under a key outside the database."""

    __tablename__ = "fak_api_keys"
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    revoked_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # refused from then on
    mac: Mapped[str | None] = mapped_column(String(80), nullable=True)  # fak.state.apikeys.row_mac


class ResponseRow(Base):
    """A response of the OpenAI Responses door (``fak.kernel.openai.responses``): its chain's
    session and the response it follows. The unique (tenant, previous_id) index makes the
    chain linear: a response is followed at most once (its session holds the later turns).
    ``state``: in_progress (claimed, generating), completed, incomplete, failed (``body`` or
    ``sealed`` set), unstored (``store: false``) or deleted (a tombstone: the chain stays linear)."""

    __tablename__ = "fak_responses"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64))
    previous_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    instructions: Mapped[str | None] = mapped_column(Text, nullable=True)  # the chain's (client text)
    body: Mapped[str | None] = mapped_column(Text, nullable=True)  # the Response object (JSON), in the clear
    # a response generated while tool content was live in its session is kept here only, sealed
    # (fak.state.seal) under the data keys of the refs in ``content``: a forget of any makes it unreadable
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    content: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list of refs

    __table_args__ = (Index("ux_fak_responses_previous", "tenant", "previous_id", unique=True),
                      Index("ix_fak_responses_session", "tenant", "session_id"))


class ConsoleLogoutRow(Base):
    """A console session signed out before its cookie expired (``fak.api.console.auth.Logouts``):
    its cookie is refused on every replica and after a restart until ``expires_us`` (the
    cookie's own expiry), then the row is pruned. Only a random id: no key, no tenant data."""

    __tablename__ = "fak_console_logouts"
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_fak_console_logouts_expires", "expires_us"),)


class HeldCallRow(Base):
    """A tool call the policy held for a person (CONFIRM, ``fak.kernel.calls.held``), shared by
    every replica and kept across restarts. ``form``: a keyed digest of the tool and its
    canonical arguments (a result sent under another id is matched by it). The arguments and
    the findings shown to the person are ``sealed`` under the data keys of the refs in
    ``content`` (in attention when the call was written), or in the clear in ``plain`` when
    none carries a key; ``mac`` binds every column under a key derived from the master secret:
    a row that fails it is read as absent (its result refused, no decision taken on it)."""

    __tablename__ = "fak_held_calls"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(128))
    form: Mapped[str] = mapped_column(String(80))
    args_digest: Mapped[str] = mapped_column(String(80))  # as the audit events carry it
    plain: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON {arguments, findings}
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    content: Mapped[str] = mapped_column(Text)  # JSON list of refs
    rule_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    offending: Mapped[str] = mapped_column(Text)  # JSON list of refs
    decision_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    producer: Mapped[str | None] = mapped_column(String(256), nullable=True)  # the principal whose request wrote it
    approval_key: Mapped[str | None] = mapped_column(String(80), nullable=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))  # pending | approved | rejected
    deciding: Mapped[str | None] = mapped_column(String(16), nullable=True)  # a decision claimed, not yet logged
    decided_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    approval_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # when fak ran the approved call itself (an MCP tool, docs/mcp.md): it runs once (state_0013)
    executed_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    mac: Mapped[str] = mapped_column(String(80))

    __table_args__ = (Index("ix_fak_held_calls_form", "tenant", "form"),
                      Index("ix_fak_held_calls_created", "tenant", "state", "created_us"))


class ToolApprovalRow(Base):
    """A remembered approval (``tool_calls.remember_approvals``): in session ``session_id`` the
    held call ``key`` names (tool, arguments, the rule and the provenance it was approved with)
    is allowed until ``expires_us``, naming the approval's audit index. MAC'd as held calls are."""

    __tablename__ = "fak_tool_approvals"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(64))
    approval_index: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)
    expires_us: Mapped[int] = mapped_column(BigInteger)
    mac: Mapped[str] = mapped_column(String(80))


class McpPinRow(Base):
    """A tool of an MCP server the deployment declares, as an operator approved it
    (``fak.kernel.mcp.pins``): the digest of its name, description and input schema (and of the
    description and the schema apart, so a change can be named), and the audit entry of the
    approval. ``mac`` binds every column under a key derived from the master secret: a row that
    fails it is read as unpinned (the tool is withheld), so writing the database pins nothing."""

    __tablename__ = "fak_mcp_pins"
    label: Mapped[str] = mapped_column(String(64), primary_key=True)
    tool: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80))
    description_digest: Mapped[str] = mapped_column(String(80))
    schema_digest: Mapped[str] = mapped_column(String(80))
    approved_by: Mapped[str] = mapped_column(String(256))
    audit_index: Mapped[int] = mapped_column(BigInteger)
    approved_us: Mapped[int] = mapped_column(BigInteger)
    mac: Mapped[str] = mapped_column(String(80))
