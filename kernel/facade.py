"""``Kernel``: the one object a newcomer, the API, the SDK, the CLI and the demo use.

It owns the model and tokenizer, the policy (hot reload), the CAS, the audit
log, the prefix cache (namespaces derived here from the tenant and the master
secret, never passed in), the kernel state database and a registry of
sessions. ``kernel/`` keeps the mechanics (model, KV, ledger, eviction);
this module decides who may do what to which session, and records it.

    from fak import Kernel
    with Kernel.open() as k:
        s = k.session("acme")
        s.append("system", "You are a travel assistant.")
        s.admit("flight_status", b"LH123 is on time, gate B22.")
        print(s.chat("Is my flight on time?"))
"""

from __future__ import annotations

import contextlib
import importlib.resources
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fak.db import release
from fak.errors import FakError, InvalidInput, NotFound
from fak.kernel.agent_session import KernelSession
from fak.kernel.events import EventBus, LateOutcome
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.kv.pic import PicRegistry
from fak.kernel.kv.prefix_cache import PrefixCache
from fak.kernel.kv.prefix_cache import namespace as prefix_namespace
from fak.kernel.kv.session import EvictMode
from fak.keys import load_master_secret, tenant_salt
from fak.protocols import ContentStore
from fak.settings import Settings
from fak.state.store import StateStore, now_us
from fak.types import as_id, check_tenant

if TYPE_CHECKING:
    from fak.audit import AuditLog, TenantErased
    from fak.audit.receipt import ForgetReceipt
    from fak.kernel.authorize import Authorizer
    from fak.kernel.forget import ForgetState
    from fak.kernel.kv.session import Session
    from fak.kernel.model.loader import LoadedModel
    from fak.kernel.withdraw import QuarantineReport
    from fak.owner import Claim
    from fak.policy import Policy, PolicyHolder
    from fak.policy.egress import JudgeEgress
    from fak.policy.late import LateFinding, LateJob, LateRunner

Producer = tuple[str, "str | None"]  # (tool name, source URL) of an admitted ref
SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def default_policy_path() -> Path:
    """The policy shipped in the package (``policy/default.yaml``)."""
    return Path(str(importlib.resources.files("fak.policy").joinpath("default.yaml")))


def _stderr(message: str) -> None:
    print(f"[fak] {message}", file=sys.stderr, flush=True)


class Kernel:
    """Open with ``Kernel.open(settings)``; close with ``close()`` or a ``with`` block."""

    def __init__(
        self,
        settings: Settings,
        lm: LoadedModel,
        policy: PolicyHolder,
        store: ContentStore,
        audit: AuditLog,
        state: StateStore,
        master: bytes,
    ) -> None:
        self.settings = settings
        self._lm = lm
        self._policy = policy
        self.store: ContentStore = store
        self.audit = audit  # an AuditLog: the kernel also reads entries, proofs and exports
        self.state = state
        self._master = master
        self.prefix: PrefixCache | None = (
            PrefixCache(budget_bytes=settings.prefix_budget_bytes,
                        namespace_budget_bytes=settings.tenant_prefix_budget_bytes)
            if settings.prefix_cache else None
        )  # fmt: skip
        self.pic = PicRegistry(lm.model.model_id, lm.tokenizer.digest, budget_bytes=settings.pic_budget_bytes,
                               namespace_budget_bytes=settings.tenant_pic_budget_bytes)
        self._sessions: dict[tuple[str, str], KernelSession] = {}
        self._registry = threading.RLock()
        self._forget_lock = threading.Lock()
        from fak.kernel.replay import Replayer

        self.replays = Replayer(self)  # forgets' independent replays, after each forget returns
        self._namespaces: dict[str, bytes] = {}
        self.events = EventBus()  # typed decisions for metrics and benches (fak.kernel.events)
        self._closed = False
        self._owned: Claim | None = None  # this process's claim on the data directory (fak.owner)
        # refs whose quarantine or expiry a busy session has still to apply (see fak.kernel.withdraw)
        self._pending_withdrawals: dict[str, dict[str, SegmentState]] = {}
        self._producers: dict[tuple[str, str], Producer] = {}  # (tenant, ref) → (tool, source URL)
        self._authorizer: Authorizer | None = None
        self._late: LateRunner | None = None
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._expiry_lock = threading.Lock()
        self._fp_keys: dict[str, bytes] = {}
        self._next_expiry_us: int | None = None

    # --- opening and closing --------------------------------------------------
    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        *,
        model: LoadedModel | None = None,
        progress: Callable[[str], None] | None = _stderr,
    ) -> Kernel:
        """Open every part on one database (created and migrated as needed), load the
        model (``model`` reuses one already loaded), and finish any forget a crash
        interrupted. Refuses (``DataDirBusy``, naming the pid) while another process runs
        a Kernel on the same data directory."""
        from fak.owner import claim

        settings = settings or Settings.load()
        # one Kernel per data directory across processes (fak.owner says why); claimed before
        # anything is loaded, so a refusal costs nothing
        owned = claim(settings.data_dir, why="stop it first, or do this through its API")
        try:
            kernel = cls._open(settings, model, progress)
        except BaseException:
            owned.release()
            raise
        kernel._owned = owned  # noqa: SLF001 - same class: set once the claim is known to be kept
        return kernel

    @classmethod
    def _open(cls, settings: Settings, model: LoadedModel | None,
              progress: Callable[[str], None] | None) -> Kernel:
        """``open`` once the data directory is this process's."""
        from fak.audit import AuditLog
        from fak.cas import CasStore
        from fak.db import make_engine
        from fak.kernel.model.blockdot import default_weights
        from fak.kernel.model.loader import load_model
        from fak.policy import PolicyHolder

        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # keys, blobs, database: owner only
        url = settings.resolved_database_url
        master = load_master_secret(settings.data_dir, settings.master_secret_hex())
        policy = PolicyHolder(settings.policy_path or default_policy_path(), egress=settings.judge_allow_lists())
        import torch

        lm = model or load_model(settings.model_path, progress=progress, weight_format=settings.weights or default_weights(),
                                 kv_dtype=getattr(torch, settings.kv_dtype), cache_dir=settings.cache_dir)
        store = CasStore.open(settings.data_dir, url, master_secret=master, key_url=settings.cas_key_url,
                              settings=settings)
        audit = None
        try:
            audit = AuditLog.open(url, settings.data_dir, origin=settings.audit_origin,
                                  checkpoint_every=settings.audit_checkpoint_every,
                                  checkpoint_ms=settings.audit_checkpoint_ms, witnesses=settings.audit_witnesses,
                                  settings=settings)
            from fak.keys import derive_key
            from fak.state.apikeys import MAC_LABEL

            state = StateStore(make_engine(url), api_key_mac=derive_key(master, MAC_LABEL))
            state.seal_clear_segments(store)  # rows written before sealing (issue 25.2): sealed once
            kernel = cls(settings, lm, policy, store, audit, state, master)
            kernel._log_policy(None, None)
            kernel._resume_forgets(progress)
            kernel._start_late()
            kernel._start_sweeper()
        except BaseException:
            if audit is not None:
                audit.close()
            store.close()
            raise
        return kernel

    def close(self) -> None:
        if self._closed:
            return
        self.replays.close()  # the replays queued finish first (bounded; one left resumes on open)
        self._closed = True
        self._stop.set()
        if self._late is not None:
            self._late.close()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
        with self._registry:
            self._sessions.clear()
        self.audit.close()
        self.store.close()
        release(self.state.engine)
        if self._owned is not None:
            self._owned.release()

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the kernel runs ---------------------------------------------------
    @property
    def model(self):  # noqa: ANN201 - fak.kernel.model.llama.Llama
        return self._lm.model

    @property
    def tokenizer(self):  # noqa: ANN201 - fak.kernel.model.tokenizer.ChatTokenizer
        return self._lm.tokenizer

    @property
    def model_id(self) -> str:
        return self._lm.model.model_id

    @property
    def tokenizer_id(self) -> str:
        return self._lm.tokenizer.digest

    @property
    def policy(self) -> Policy:
        return self._policy.policy

    @property
    def context_limit(self) -> int:
        """Tokens a session may hold: the model's context, or less if configured."""
        limit = self._lm.model.cfg.max_position_embeddings
        configured = self.settings.max_context_tokens
        return min(limit, configured) if configured else limit

    @property
    def policy_path(self) -> Path:
        """The file or folder the policy is loaded from (``reload_policy`` reads it again)."""
        return self._policy.path

    @property
    def judge_egress(self) -> JudgeEgress:
        """The deployment's judge allow-lists (settings ``judge_egress``, ``judge_key_envs``) that
        every policy this kernel loads is checked against (validate, replace, reload); a
        holder built without them allows no judge."""
        from fak.policy.egress import CLOSED

        return self._policy.egress if self._policy.egress is not None else CLOSED

    def loaded_sessions(self, tenant: str) -> list[KernelSession]:
        """The tenant's sessions whose KV is in memory now."""
        return [ks for ks in self._loaded_sessions() if ks.tenant == tenant and ks.loaded]

    def reload_policy(self, principal: str | None = None) -> Policy:
        """Load the policy file again; a bad file raises its located error and keeps the old one."""
        before = self.policy
        error = self._policy.reload()
        if error is not None:
            raise error
        try:
            self._log_policy(before.digest, principal)
        except BaseException:
            self._policy.restore(before)  # a policy whose loading is not in the log is not enforced
            raise
        if self._late is not None or self.policy.spec.late_detectors:
            self._start_late()
        return self.policy

    def _log_policy(self, previous: str | None, principal: str | None) -> None:
        from fak.audit import PolicyLoaded

        p = self.policy
        if previous == p.digest:
            return
        self.audit.append(PolicyLoaded(policy_id=as_id(p.name), policy_digest=p.digest, previous_digest=previous,
                                       principal=as_id(principal) if principal else None,
                                       judges=_judge_scopes(p)))

    def evict_mode(self) -> EvictMode:
        """The active policy's eviction mode for a span in the middle of the cache."""
        return EvictMode.REROPE if self.policy.spec.eviction.mode == "rerope" else EvictMode.AUTO

    def derive_key(self, label: str) -> bytes:
        """A 32-byte key derived from the master secret for one use (HKDF, ``label`` names the use)."""
        from fak.keys import derive_key

        return derive_key(self._master, label)

    def namespace(self, tenant: str) -> bytes:
        """The tenant's prefix-cache root: derived from the master secret, never from a request."""
        ns = self._namespaces.get(tenant)
        if ns is None:
            ns = self._namespaces[tenant] = prefix_namespace(tenant_salt(self._master, tenant), self.model_id)
        return ns

    # --- sessions ---------------------------------------------------------------
    def session(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002 - the API's word
        """A new session of ``tenant`` (``id=None``, or an id not used yet is refused: see
        ``create``), or the existing one named ``id``. Another tenant's id answers as an
        unknown one does."""
        tenant = check_tenant(tenant)
        if id is None:
            return self.create_session(tenant)
        key = (tenant, _check_session_id(id))
        with self._registry:
            ks = self._sessions.get(key)
            if ks is None:
                found = self.state.session(tenant, id)
                if found is None:
                    raise NotFound(f"no session {id!r}")
                ks = self._sessions[key] = KernelSession(self, tenant, id, found[0].created_us, fresh=False)
            return ks

    def create_session(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002
        """A new, empty session (``id`` chosen by the caller or generated)."""
        from fak.errors import Conflict

        tenant = check_tenant(tenant)
        sid = _check_session_id(id) if id is not None else "sess_" + uuid.uuid4().hex[:20]
        with self._registry:
            if (tenant, sid) in self._sessions or self.state.session(tenant, sid) is not None:
                raise Conflict(f"session {sid!r} exists")
            if self.state.session_count(tenant) >= self.settings.max_sessions_per_tenant:
                raise Conflict(f"tenant has {self.settings.max_sessions_per_tenant} sessions, the most allowed")
            ks = self._sessions[(tenant, sid)] = KernelSession(self, tenant, sid, now_us(), fresh=True)
            return ks

    def delete_session(self, tenant: str, id: str) -> None:  # noqa: A002
        """Drop a session: its KV, its durable ledger. Its refs stay in the CAS (forget erases)."""
        tenant = check_tenant(tenant)
        ks = self.session(tenant, id)  # NotFound for unknown or another tenant's
        with self._registry, ks.locked():
            found = self.state.session(tenant, id)
            for row in found[1] if found else []:
                if row.ref and row.kind == "tool":  # the CAS's record of where the ref is used
                    with contextlib.suppress(FakError):  # a forgotten ref has no uses left
                        self.store.release_use(row.ref, tenant, "segment", f"{id}/{row.id}")
            self.state.delete_session(tenant, id)
            self._sessions.pop((tenant, id), None)
            ks.unload()

    def sessions(self, tenant: str) -> list[str]:
        """Ids of the tenant's sessions, loaded or not, oldest first."""
        return self.state.session_ids(check_tenant(tenant))

    def loaded_session_ids(self, tenant: str) -> set[str]:
        """Ids of the tenant's sessions whose KV is in memory: a withdrawal visits them even
        when their latest change is not written yet."""
        with self._registry:
            return {sid for (t, sid), ks in self._sessions.items() if t == tenant and ks.loaded}

    def _loaded_sessions(self) -> list[KernelSession]:
        with self._registry:
            return list(self._sessions.values())

    def enforce_kv_budget(self, keep: KernelSession | None = None) -> None:
        """Offload idle sessions' KV, least recently used first, until the loaded KV fits
        (a session calls it when it releases its lock, keeping itself)."""
        budget = self.settings.session_kv_budget_bytes
        if budget is None:
            return
        loaded = [ks for ks in self._loaded_sessions() if ks.loaded]
        total = sum(ks.kv_bytes for ks in loaded)
        for ks in sorted(loaded, key=lambda x: x.last_used):
            if total <= budget:
                break
            if ks is keep:
                continue
            size = ks.kv_bytes
            if ks.offload():
                total -= size

    def audit_rebuild(self, ks: KernelSession, s: Session, cause: str, fingerprint: str) -> None:
        """Log that ``ks`` was rebuilt from its durable ledger (``cause``: restart, offload...)."""
        from fak.audit import SessionRebuilt

        self.audit.append(SessionRebuilt(tenant=ks.tenant, session_id=ks.id, segments=len(s.ledger.live()),
                                         tokens=s.cache.length, fingerprint=self.audit_fingerprint(ks.tenant, fingerprint),
                                         cause=cause))

    # --- withdrawal bookkeeping (fak.kernel.forget, fak.kernel.withdraw, KernelSession) --------
    @property
    def forget_lock(self) -> threading.Lock:
        """Serialises forgets (and their resumption): fak.kernel.forget runs one at a time under it."""
        return self._forget_lock

    def pending_withdrawals(self, tenant: str) -> dict[str, SegmentState]:
        """Refs whose quarantine or expiry a busy session of ``tenant`` has still to apply (a
        copy): a session settles them when it next takes its lock."""
        return dict(self._pending_withdrawals.get(tenant, {}))

    def defer_withdrawal(self, tenant: str, ref: str, state: SegmentState) -> None:
        """Record that ``ref`` is withdrawn (``state``) for sessions busy now to apply later."""
        self._pending_withdrawals.setdefault(tenant, {})[ref] = state

    def clear_withdrawal(self, tenant: str, ref: str, state: SegmentState) -> None:
        """Drop the pending withdrawal of ``ref`` if it is still ``state`` (applied everywhere,
        or admitted again after an expiry)."""
        table = self._pending_withdrawals.get(tenant)
        if table and table.get(ref) is state:
            table.pop(ref, None)

    # --- refs ------------------------------------------------------------------
    def tool_text(self, tenant: str, ref: str) -> str:
        """A tool result's text as it enters attention (bytes from the CAS, re-verified)."""
        return self.store.get(ref, tenant).decode("utf-8", errors="replace")

    def kv_exists_elsewhere(self, tenant: str, ref: str, session_id: str) -> bool:
        """Whether KV of ``ref`` is held by another of the tenant's loaded sessions or its prefix cache."""
        for ks in self._loaded_sessions():
            mech = ks.live_session
            if ks.tenant == tenant and ks.id != session_id and mech is not None and any(
                x.ref == ref and x.kind is SegmentKind.TOOL for x in mech.ledger.live()
            ):
                return True
        if self.pic.holds_ref(self.namespace(tenant), ref):
            return True
        if self.prefix is not None:
            return any(ref in n.prov for n in self.prefix.nodes(self.namespace(tenant)))
        return False

    # --- forget and late quarantine --------------------------------------------
    def forget(
        self, tenant: str, ref: str, *, requested_by: str | None = None, reason: str | None = None,
        wait_replay: bool = False,
    ) -> ForgetReceipt:
        """Erase ``ref`` from every session, cache and store of the tenant; a signed receipt.
        It returns once the erasure is done; the independent replay of each session's
        survivors completes the receipt afterwards (``receipt.replay``: pending, then
        verified; ``forget_status`` serves it). ``wait_replay``: return the completed one."""
        from fak.kernel.forget import forget

        receipt = forget(self, tenant, ref, requested_by=requested_by, reason=reason)
        if wait_replay and receipt.replay == "pending":
            self.replays.wait(receipt.request_id)
            done = self.forget_status(tenant, receipt.request_id).receipt
            receipt = done if done is not None else receipt
        return receipt

    def forget_status(self, tenant: str, request_id: str) -> ForgetState:
        """A forget of the tenant by request id: its state, and its receipt once completed."""
        from fak.kernel.forget import status

        return status(self, tenant, request_id)

    def quarantine(
        self, tenant: str, ref: str, *, reason: str, principal: str | None = None
    ) -> QuarantineReport:
        """A late detection: evict ``ref`` from every live session of the tenant, refuse it after."""
        from fak.kernel.withdraw import quarantine

        return quarantine(self, tenant, ref, reason=reason, principal=principal)

    # --- expiry -------------------------------------------------------------------
    def expire_due(self, now_us_: int | None = None, tenant: str | None = None) -> list[QuarantineReport]:
        """Execute every expiry whose time has come: all tenants' (the sweeper, every
        ``settings.expiry_sweep_s``), or one tenant's (its sessions, before they use attention,
        so another tenant's expiries never run on its requests)."""
        from fak.kernel.withdraw import expire

        now = now_us_ if now_us_ is not None else now_us()
        reports = []
        with self._expiry_lock:
            for t, ref, _ in self.state.due_expiries(now, tenant=tenant):
                reports.append(expire(self, t, ref, cause="seconds"))
            if tenant is None:
                self._next_expiry_us = self.state.next_expiry()
        return reports

    def expiry_due(self) -> bool:
        """Whether some ref's expiry time has passed: a session runs the expiries before use."""
        nxt = self._next_expiry_us
        return nxt is not None and nxt <= now_us()

    def note_expiry(self, expires_us: int | None) -> None:
        """Bring the next expiry forward to ``expires_us`` (an admission with a lifetime)."""
        if expires_us is not None and (self._next_expiry_us is None or expires_us < self._next_expiry_us):
            self._next_expiry_us = expires_us

    def _start_sweeper(self) -> None:
        self._next_expiry_us = self.state.next_expiry()

        def sweep() -> None:
            while not self._stop.wait(self.settings.expiry_sweep_s):
                if self.expiry_due():
                    try:
                        self.expire_due()
                    except Exception as exc:  # noqa: BLE001 - retried on the next sweep; said loudly
                        _stderr(f"expiry sweep failed (retried): {type(exc).__name__}: {exc}")

        self._sweeper = threading.Thread(target=sweep, name="fak-expiry", daemon=True)
        self._sweeper.start()

    # --- late detectors -------------------------------------------------------------
    def _start_late(self) -> None:
        """(Re)build the late detectors of the active policy; a policy without any runs none."""
        rules = self.policy.spec.late_detectors
        if not rules:
            if self._late is not None:
                self._late.set_detectors([])
            return
        from fak.policy.late import LateRunner, build_detectors

        detectors = build_detectors(list(rules), self.judge_egress)
        if self._late is None:
            self._late = LateRunner(self._late_fired, self._late_failed, workers=self.settings.late_workers,
                                    queue_max=self.settings.late_queue)
        self._late.set_detectors(detectors)

    @property
    def late_runner(self) -> LateRunner | None:
        """The late-detector runner, None until a policy with late detectors loads: an
        admission builds a job only when there is one; benches read its stats."""
        return self._late

    def submit_late(self, job: LateJob) -> None:
        """Hand an admitted result to the late detectors; never waits (a full queue drops the
        job, loudly: the result stays admitted, as it would without late detectors)."""
        from fak.policy.late import applies

        if self._late is None or not any(applies(r, job.tool, job.trust, job.tenant)
                                         for r in self.policy.spec.late_detectors):
            return
        dropped = self._late.stats["dropped"]
        if not self._late.submit(job) and self._late.stats["dropped"] > dropped:  # not: closed, or reloaded
            _stderr(f"late detection queue full: {job.ref[:24]}… of {job.tool} not checked")
            self.events.publish(LateOutcome(job.tenant, "dropped"))

    def _late_fired(self, job: LateJob, finding: LateFinding) -> None:
        self.events.publish(LateOutcome(job.tenant, "fired"))
        reason = f"late:{finding.detector_id}:{finding.label}"
        try:
            self.quarantine(job.tenant, job.ref, reason=reason, principal=f"detector:{finding.detector_id}")
        except FakError as exc:  # e.g. forgotten meanwhile: nothing left to evict
            _stderr(f"late detector {finding.detector_id} fired on {job.ref[:24]}…, quarantine failed: {exc}")

    def _late_failed(self, job: LateJob, detector_id: str, exc: BaseException) -> None:
        self.events.publish(LateOutcome(job.tenant, "error"))
        _stderr(f"late detector {detector_id} failed on {job.ref[:24]}…: {type(exc).__name__}: {exc}")

    def wait_late(self, timeout: float = 30.0) -> bool:
        """Wait until every admitted result has been through the late detectors (tests, bench)."""
        return self._late is None or self._late.wait_idle(timeout)

    # --- tool-call authorization ------------------------------------------------------
    def authorizer(self) -> Authorizer:
        """The tool-call authorizer of the active policy (rebuilt when the policy changes)."""
        from fak.kernel.authorize import Authorizer

        policy = self.policy
        found = self._authorizer
        if found is None or found.policy.digest != policy.digest:
            found = self._authorizer = Authorizer(policy)
        return found

    def audit_fingerprint(self, tenant: str, fingerprint: str) -> str:
        """A KV fingerprint as audit events carry it: keyed per tenant, so that nobody who
        reads the log can confirm a guessed conversation by computing its KV and comparing.
        Equal fingerprints stay equal (a receipt still shows after == replay)."""
        import blake3

        key = self._fp_keys.get(tenant)
        if key is None:
            key = self._fp_keys[tenant] = self.derive_key(f"fak/audit/fingerprint:{tenant}")
        return "blake3k:" + blake3.blake3(fingerprint.encode(), key=key).hexdigest()

    def tool_args_key(self) -> bytes:
        """The derived key that hashes tool-call arguments into their audited digest."""
        key = getattr(self, "_args_key_bytes", None)
        if key is None:
            key = self._args_key_bytes = self.derive_key("tool-call-args")
        return key

    def producer_of(self, tenant: str, ref: str) -> Producer:
        """The tool that produced ``ref`` and the URL it came from (``?``, None if the kernel
        has no record: judged untrusted)."""
        from fak.kernel.authorize import UNKNOWN_TOOL

        key = (tenant, ref)
        found = self._producers.get(key)
        if found is None:
            meta = self.state.ref(tenant, ref)
            found = (meta.tool, meta.source) if meta is not None else (UNKNOWN_TOOL, None)
            self.note_producer(tenant, ref, found)
        return found

    def note_producer(self, tenant: str, ref: str, producer: Producer) -> None:
        """Remember which tool (and URL) produced ``ref``: authorization asks per call."""
        if len(self._producers) >= 65536:
            self._producers.clear()
        self._producers[(tenant, ref)] = producer

    def rotate_keys(self, tenant: str | None = None, *, principal: str | None = None):  # noqa: ANN201
        """New random KEK versions (one tenant or all), live data keys re-wrapped, logged."""
        from fak.kernel.keyops import rotate

        return rotate(self.store, self.audit, tenant, principal=principal)

    def destroy_retired_keys(self, older_than: float, *, principal: str | None = None):  # noqa: ANN201
        """Destroy KEKs retired at least ``older_than`` seconds ago, logged before they go."""
        from fak.kernel.keyops import destroy_retired

        return destroy_retired(self.store, self.audit, older_than, principal=principal)

    def erase_tenant(self, tenant: str, *, confirm: str, requested_by: str | None = None,
                     reason: str | None = None) -> TenantErased:
        """Crypto-erase a whole tenant: its sessions and KV, its prefix-cache namespace, every
        key it has in the CAS (so no backup of its data keys opens again), its refs' records
        and its API keys. Logged write-ahead (``TenantEraseRequested``, then ``TenantErased``);
        each step is idempotent, so a crash in between is finished by calling it again.
        ``confirm`` must repeat the tenant: this cannot be undone."""
        from fak.audit import TenantErased, TenantEraseRequested

        tenant = check_tenant(tenant)
        if confirm != tenant:
            raise InvalidInput("erasing a tenant cannot be undone: pass confirm=<the tenant's name>")
        who, why = (as_id(requested_by) if requested_by else None), (as_id(reason) if reason else None)
        with self._forget_lock:
            requested = self.audit.append(TenantEraseRequested(tenant=tenant, principal=who, reason=why))
            sessions = self.sessions(tenant)
            for sid in sessions:
                with contextlib.suppress(NotFound):
                    self.delete_session(tenant, sid)
            if self.prefix is not None:
                self.prefix.drop_namespace(self.namespace(tenant))
            self.pic.drop_namespace(self.namespace(tenant))
            self._pending_withdrawals.pop(tenant, None)
            self._producers = {key: v for key, v in self._producers.items() if key[0] != tenant}
            erasure = self.store.erase_tenant(tenant)
            revoked = self.state.erase_tenant_records(tenant)
            event = TenantErased(tenant=tenant, requested_index=requested, sessions=len(sessions),
                                 refs_forgotten=erasure.refs_forgotten,
                                 keys_destroyed=[as_id(x) for x in erasure.keys_destroyed],
                                 api_keys_revoked=revoked, shred_status=erasure.shred_status)
            self.audit.append(event)
        return event

    def _resume_forgets(self, progress: Callable[[str], None] | None) -> None:
        from fak.kernel.forget import resume

        for row in self.state.pending_forgets():
            if progress:
                progress(f"resuming the forget of {row.ref[:24]}… (request {row.request_id})")
            resume(self, row)
        from fak.kernel.replay import resume as resume_replays

        resume_replays(self)  # replays a crash interrupted: run again, in the background


def _check_session_id(value: object) -> str:
    import re

    if not isinstance(value, str) or not re.fullmatch(SESSION_ID, value):
        raise InvalidInput("a session id is 1-64 characters from letters, digits and . _ -, "
                           "starting with a letter or digit")
    return value


def _judge_scopes(policy: Policy) -> list[Any] | None:
    """Each judge of ``policy``: its destination (scheme://host:port) and the tenants whose
    tool results it may be sent, for the ``policy_loaded`` event (None: no judge)."""
    from fak.audit.events import JudgeScope
    from fak.policy.egress import origin_of

    judges = [r for r in policy.spec.late_detectors if r.kind == "judge" and r.url]
    if not judges:
        return None
    return [JudgeScope(detector_id=as_id(r.id), destination=origin_of(r.url), all_tenants=r.tenants == "all",
                       tenants=[] if r.tenants == "all" else list(r.tenants or ())) for r in judges]
