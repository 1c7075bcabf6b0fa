"""The services a ``Kernel`` builds once and hands down (docs/architecture.md, "Layers").

``Kernel.open`` opens the store, the state database, the audit log and the model, then
builds one ``Services`` bundle; sessions (``fak.kernel.session.kernel_session``), withdrawal
(``fak.kernel.withdrawal``: ``forget``, ``quarantine`` and expiry, ``tenant_erase``, the
background threads), working sets (``fak.kernel.session.materialise``) and the forget's
replay check (``fak.kernel.withdrawal.replay_check``) take that bundle, never the façade.
Nothing here imports the modules that use it: the session registry and the replay queue
are typed by the Protocols below, so the agent kernel's imports form no cycle
(``tests/repo/test_layering.py``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import blake3

from fak.errors import Conflict
from fak.kernel.calls.authorize import Authorizers, Producers
from fak.kernel.calls.held import HeldCalls
from fak.kernel.calls.webhook import HeldCallWebhook
from fak.kernel.events import EventBus, LateOutcome
from fak.kernel.gateway.upstream import Upstreams
from fak.kernel.kv.ledger import Segment, SegmentState
from fak.kernel.kv.pic import PicRegistry
from fak.kernel.kv.prefix_cache import PrefixCache
from fak.kernel.kv.prefix_cache import namespace as prefix_namespace
from fak.kernel.kv.session import EvictMode, Session
from fak.kernel.kv.shared import SharedKV
from fak.kernel.mcp.servers import McpServers
from fak.kernel.model.scheduler import GenerationSlots, Scheduler
from fak.kernel.session.transaction import Transaction
from fak.kernel.withdrawal.replicas import Replication
from fak.keys import derive_key, tenant_salt
from fak.policy import Policy, PolicyHolder
from fak.policy.egress import CLOSED, JudgeEgress
from fak.policy.late import LateJob, LateRunner, applies
from fak.protocols import ContentStore, Gate
from fak.settings import Settings
from fak.state.store import ForgetProgress, StateStore, now_us

if TYPE_CHECKING:
    from fak.audit.log import AuditLog
    from fak.kernel.model.llama import Llama
    from fak.kernel.model.loader import LoadedModel
    from fak.kernel.model.tokenizer import ChatTokenizer


class SessionBusy(Conflict):
    """Another operation holds the session (e.g. a generation still being consumed)."""

    code = "session_busy"


class HeldSession(Protocol):
    """What withdrawal, the replay and the registry need of a kernel session
    (``fak.kernel.session.kernel_session.KernelSession``)."""

    tenant: str
    id: str
    last_used: float

    @property
    def loaded(self) -> bool: ...

    @property
    def live_session(self) -> Session | None: ...

    @property
    def kv_bytes(self) -> int: ...

    def locked(self, wait: bool = True) -> AbstractContextManager[Session]: ...

    def transaction(self, wait: bool = True, dropping: Collection[str] = ()) -> AbstractContextManager[Transaction]:
        """One audited change under the lock (``fak.kernel.session.transaction``); ``dropping``:
        a forget's refs, never read if the session is rebuilt for it."""
        ...

    def holds_any(self, refs: Collection[str]) -> bool:
        """Whether a forget of ``refs`` has something to drop here (the lock held)."""
        ...

    def held_transaction(self) -> Transaction:
        """A transaction for a caller that holds the lock already."""
        ...

    def acquire(self, wait: bool = True) -> None:
        """Take the lock without settling; raises ``SessionBusy`` when ``wait`` is False and it is held."""
        ...

    def release(self) -> None: ...

    def loaded_session(self) -> Session: ...

    def loaded_if_idle(self) -> Session | None: ...

    def persist(self, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None: ...

    def discard(self) -> None: ...

    def replace_with_replay(self, s: Session) -> Session: ...

    def evict_derived(self, refs: Collection[str]) -> DerivedEviction: ...

    def replay_of(self, segment_ids: Sequence[str]) -> str | None: ...

    def offload(self) -> bool: ...


class SessionDirectory(Protocol):
    """The registry of sessions (``fak.kernel.session.registry.SessionRegistry``)."""

    def session(self, tenant: str, id: str) -> HeldSession:  # noqa: A002 - the API's word
        """The loaded or stored session (``NotFound`` for an unknown or another tenant's id)."""
        ...

    def ids(self, tenant: str) -> list[str]:
        """Ids of the tenant's sessions, loaded or not, oldest first."""
        ...

    def delete(self, tenant: str, id: str) -> None:  # noqa: A002
        """Drop a session: its KV, its durable ledger (a tenant erase)."""
        ...

    def loaded_session_ids(self, tenant: str) -> set[str]: ...

    def kv_exists_elsewhere(self, tenant: str, ref: str, session_id: str) -> bool: ...

    def enforce_kv_budget(self, keep: HeldSession | None = None) -> None: ...


@dataclass(frozen=True)
class GatewayDrop:
    """What a withdrawal took out of one gateway session's forwarded history (docs/gateway.md)."""

    session_id: str
    segment_ids: list[str]
    fingerprint: str  # of the forwarded history after it (raw: the caller keys it for the log)


GATEWAY_MODEL_PREFIX = "upstream:"  # a gateway session's recorded ``model_id``: the upstream's name after it


class GatewayDirectory(Protocol):
    """The gateway sessions (``fak.kernel.gateway.registry.GatewaySessions``): a withdrawal takes a
    ref out of each one's forwarded history, the session registry deletes a persistent one."""

    def drop(self, tenant: str, refs: Sequence[str], state: SegmentState) -> list[GatewayDrop]: ...

    def delete(self, tenant: str, session_id: str) -> None: ...


class _NoGateways:
    def drop(self, tenant: str, refs: Sequence[str], state: SegmentState) -> list[GatewayDrop]:
        return []

    def delete(self, tenant: str, session_id: str) -> None:
        raise Conflict(f"session {session_id} is a gateway session and this kernel has no gateway")


@dataclass(frozen=True)
class DerivedEviction:
    """What evicting a session's segments derived from refs did (``HeldSession.evict_derived``)."""

    segments: list[Segment]  # the segments dropped (tool segments of the refs, generations that read them)
    prefix_nodes: list[str]  # prefix-cache nodes dropped with them
    pic_chunks: list[str]  # PIC chunks dropped with them
    fingerprint: str  # the session's KV fingerprint after the drop (raw: the caller keys it for the log)
    survivors: list[Segment]  # a copy of the live segments after it, for the independent replay


@dataclass
class SessionJob:
    """One session's part of a forget's independent replay (``fak.kernel.withdrawal.replay_check``)."""

    session_id: str
    fingerprint_after: str  # keyed per tenant, as ForgetCompleted logs it
    survivors: list[str]  # segment ids, in ledger order
    segments: list[Segment] | None = None  # the copy taken at the drop (None: resumed after a crash)
    mech: Session | None = None  # a session of the same model, tokenizer and chunking (with ``segments``)


@dataclass
class ReplayJob:
    """A forget's independent replay, queued once its erasure is done."""

    tenant: str
    request_id: str
    ref: str
    completed_index: int
    sessions: list[SessionJob]
    resumed: bool = False  # a crash may have left its ReplayVerified in the log already
    done: Future[int] = field(default_factory=Future)


class ReplayQueue(Protocol):
    """Where a forget queues its replay (``fak.kernel.withdrawal.replay_check.ReplayChecker``)."""

    def submit(self, job: ReplayJob) -> Future[int]: ...

    def wait(self, request_id: str | None = None, timeout: float | None = None) -> bool: ...


class DerivedKeys:
    """Keys derived from the master secret, each for one use, cached: tenant namespaces of the
    shared KV caches, keyed audit fingerprints, the tool-call argument key."""

    def __init__(self, master: bytes, model_id: str) -> None:
        self._master = master
        self._model_id = model_id
        self._namespaces: dict[str, bytes] = {}
        self._fp_keys: dict[str, bytes] = {}
        self._args_key: bytes | None = None
        self._producer_key: bytes | None = None

    def derive(self, label: str) -> bytes:
        """A 32-byte key for one use (HKDF, ``label`` names the use)."""
        return derive_key(self._master, label)

    def namespace(self, tenant: str) -> bytes:
        """The tenant's prefix-cache and PIC root: derived from the master secret, never from a request."""
        ns = self._namespaces.get(tenant)
        if ns is None:
            ns = self._namespaces[tenant] = prefix_namespace(tenant_salt(self._master, tenant), self._model_id)
        return ns

    def audit_fingerprint(self, tenant: str, fingerprint: str) -> str:
        """A KV fingerprint as audit events carry it: keyed per tenant, so that nobody who
        reads the log can confirm a guessed conversation by computing its KV and comparing.
        Equal fingerprints stay equal (a receipt still shows after == replay)."""
        key = self._fp_keys.get(tenant)
        if key is None:
            key = self._fp_keys[tenant] = self.derive(f"fak/audit/fingerprint:{tenant}")
        return "blake3k:" + blake3.blake3(fingerprint.encode(), key=key).hexdigest()

    def producer_mac(self, tenant: str, session_id: str, segment_id: str, ref: str | None, tool: str,
                     source: str | None, media_type: str | None = None) -> str:
        """A MAC over a tool segment's recorded producer and media type: trust and field paths
        are read from them, so whoever can write the state database but holds no key cannot
        raise a segment's trust or give it a structure (a row without a media type MACs as rows
        written before it was recorded)."""
        if self._producer_key is None:
            self._producer_key = self.derive("fak/state/segment-producer")
        fields: list[str | None] = [tenant, session_id, segment_id, ref, tool, source]
        if media_type is not None:
            fields.append(media_type)
        msg = json.dumps(fields).encode()
        return "blake3k:" + blake3.blake3(msg, key=self._producer_key).hexdigest()

    def tool_args_key(self) -> bytes:
        """The key that hashes tool-call arguments into their audited digest."""
        if self._args_key is None:
            self._args_key = self.derive("tool-call-args")
        return self._args_key


class Withdrawals:
    """What forget, quarantine and expiry share across sessions: the forget lock, the refs
    whose withdrawal a busy session has still to apply (``fak.kernel.withdrawal.quarantine``), and when
    the next expiry is due."""

    def __init__(self) -> None:
        self.forget_lock = threading.Lock()  # forgets (and their resumption) run one at a time
        self.expiry_lock = threading.Lock()  # one expiry run at a time
        self._pending: dict[str, dict[str, SegmentState]] = {}
        self._next_expiry_us: int | None = None

    def pending(self, tenant: str) -> dict[str, SegmentState]:
        """Refs whose quarantine or expiry a busy session of ``tenant`` has still to apply (a
        copy): a session settles them when it next takes its lock."""
        return dict(self._pending.get(tenant, {}))

    def defer(self, tenant: str, ref: str, state: SegmentState) -> None:
        """Record that ``ref`` is withdrawn (``state``) for sessions busy now to apply later."""
        self._pending.setdefault(tenant, {})[ref] = state

    def clear(self, tenant: str, ref: str, state: SegmentState) -> None:
        """Drop the pending withdrawal of ``ref`` if it is still ``state`` (applied everywhere,
        or admitted again after an expiry)."""
        table = self._pending.get(tenant)
        if table and table.get(ref) is state:
            table.pop(ref, None)

    def drop_tenant(self, tenant: str) -> None:
        self._pending.pop(tenant, None)

    def expiry_due(self) -> bool:
        """Whether some ref's expiry time has passed: a session runs the expiries before use."""
        nxt = self._next_expiry_us
        return nxt is not None and nxt <= now_us()

    def note_expiry(self, expires_us: int | None) -> None:
        """Bring the next expiry forward to ``expires_us`` (an admission with a lifetime)."""
        if expires_us is not None and (self._next_expiry_us is None or expires_us < self._next_expiry_us):
            self._next_expiry_us = expires_us

    def set_next_expiry(self, expires_us: int | None) -> None:
        """The next expiry as the state database has it (after a sweep over all tenants)."""
        self._next_expiry_us = expires_us


class LateDetection:
    """The late-detector runner of the active policy, None until a policy with late detectors
    loads (the façade starts and reloads it); admissions hand their results to it."""

    def __init__(self, events: EventBus, warn: Callable[[str], None]) -> None:
        self.runner: LateRunner | None = None
        self._events = events
        self._warn = warn

    def submit(self, job: LateJob, policy: Policy) -> None:
        """Hand an admitted result to the late detectors; never waits (a full queue drops the
        job, loudly: the result stays admitted, as it would without late detectors)."""
        runner = self.runner
        if runner is None or not any(applies(r, job.tool, job.trust, job.tenant) for r in policy.spec.late_detectors):
            return
        dropped = runner.stats["dropped"]
        if not runner.submit(job) and runner.stats["dropped"] > dropped:  # not: closed, or reloaded
            self._warn(f"late detection queue full: {job.ref[:24]}… of {job.tool} not checked")
            self._events.publish(LateOutcome(job.tenant, "dropped"))


@dataclass(frozen=True)
class Services:
    """Everything a session operation, a withdrawal, a working set or a replay uses."""

    settings: Settings
    lm: LoadedModel
    policies: PolicyHolder
    store: ContentStore
    state: StateStore
    audit: AuditLog  # the log itself: receipts read entries and proofs back
    prefix: PrefixCache | None  # None when the settings turn the prefix cache off
    pic: PicRegistry
    keys: DerivedKeys
    events: EventBus  # typed decisions for metrics and benches (fak.kernel.events)
    withdrawals: Withdrawals
    producers: Producers
    authorizers: Authorizers
    late: LateDetection
    sessions: SessionDirectory
    replays: ReplayQueue
    gate: Gate  # the admission gate (``fak.policy.gate``)
    holds: HeldCalls  # tool calls held for a person (CONFIRM) and remembered approvals, in the state database
    generation_slots: GenerationSlots = field(default_factory=GenerationSlots)  # generations at once, the queue beyond (429)
    engine: Scheduler | None = None  # the engine loop running the model's calls (fak.kernel.model.scheduler)
    replication: Replication | None = None  # this kernel's place among replicas (None: a single process)
    upstreams: Upstreams = field(default_factory=lambda: Upstreams({}))  # models served by forwarding (gateway)
    gateways: GatewayDirectory = field(default_factory=_NoGateways)  # the gateway sessions alive now
    mcp: McpServers | None = None  # the deployment's MCP servers (fak.kernel.mcp), None where none was built
    webhook: HeldCallWebhook | None = None  # the approvals webhook (settings approvals_webhook_url), if named

    @property
    def shared(self) -> SharedKV:
        """The prefix cache and the PIC registry behind one interface: dropping a ref (forget,
        quarantine, expiry) or a tenant's namespace is one call (``fak.kernel.kv.shared``)."""
        return SharedKV(self.prefix, self.pic)

    @property
    def model(self) -> Llama:
        return self.lm.model

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self.lm.tokenizer

    @property
    def model_id(self) -> str:
        return self.lm.model.model_id

    @property
    def tokenizer_id(self) -> str:
        return self.lm.tokenizer.digest

    @property
    def policy(self) -> Policy:
        """The active policy (hot reload swaps it in the holder)."""
        return self.policies.policy

    @property
    def judge_egress(self) -> JudgeEgress:
        """The deployment's judge allow-lists; a holder built without them allows no judge."""
        return self.policies.egress if self.policies.egress is not None else CLOSED

    @property
    def context_limit(self) -> int:
        """Tokens a session may hold: the model's context, or less if configured."""
        limit = self.lm.model.cfg.max_position_embeddings
        configured = self.settings.max_context_tokens
        return min(limit, configured) if configured else limit

    def evict_mode(self) -> EvictMode:
        """The active policy's eviction mode for a span in the middle of the cache."""
        return EvictMode.REROPE if self.policy.spec.eviction.mode == "rerope" else EvictMode.AUTO

    def tool_text(self, tenant: str, ref: str) -> str:
        """A tool result's text as it enters attention (bytes from the CAS, re-verified)."""
        return self.store.get(ref, tenant).decode("utf-8", errors="replace")
