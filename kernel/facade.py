"""``Kernel``: the one object a newcomer, the API, the SDK, the CLI and the demo use.

``Kernel.open`` opens the model and tokenizer, the policy (hot reload), the CAS, the
audit log and the kernel state database, builds the services every operation takes
(``fak.kernel.services.Services``: shared KV caches, derived keys and tenant namespaces,
events, withdrawal bookkeeping, the session registry, the replay queue) and hands them
down: sessions, withdrawal, working sets and the replay never see the façade. What is
left here is the wiring: the lifecycle (open, resume, close), policy reload, and the calls
adapters make, each handed to the part that does it. Tenant erase is
``fak.kernel.withdrawal.tenant_erase``; the replica's withdrawal tasks and the forgets a
crash interrupted, ``fak.kernel.withdrawal.replica_tasks``; the expiry sweeper and the late
detectors (the background threads), ``fak.kernel.withdrawal.background``.

    from fak import Kernel
    with Kernel.open() as k:
        s = k.session("acme")
        s.append("system", "You are a travel assistant.")
        s.admit("flight_status", b"LH123 is on time, gate B22.")
        print(s.chat("Is my flight on time?"))
"""

from __future__ import annotations

import importlib.resources
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from fak.audit import PolicyLoaded, TenantErased
from fak.audit.events import JudgeScope
from fak.audit.log import AuditLog
from fak.audit.receipt import ForgetReceipt
from fak.cas import CasStore
from fak.cas.models import DestroyResult, RotationResult
from fak.db import make_engine, release
from fak.kernel.calls.authorize import Authorizer, Authorizers, Producer, Producers
from fak.kernel.calls.held import HeldCalls
from fak.kernel.calls.webhook import HeldCallWebhook, WebhookConfig
from fak.kernel.events import ApprovalNotified, EventBus
from fak.kernel.gateway.registry import GatewaySessions
from fak.kernel.gateway.upstream import Upstreams
from fak.kernel.kv.pic import PicRegistry
from fak.kernel.kv.prefill import default_chunks
from fak.kernel.kv.prefix_cache import PrefixCache
from fak.kernel.kv.prefix_tree import call_keys
from fak.kernel.mcp.servers import McpServers
from fak.kernel.model import device as devices
from fak.kernel.model.blockdot import default_weights
from fak.kernel.model.llama import Llama
from fak.kernel.model.loader import LoadedModel, load_model
from fak.kernel.model.scheduler import GenerationSlots, Scheduler, SchedulerLimits, TenantFigures
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.services import DerivedKeys, LateDetection, Services, Withdrawals
from fak.kernel.session.kernel_session import KernelSession
from fak.kernel.session.options import pic_binding, prefix_binding
from fak.kernel.session.registry import SessionRegistry
from fak.kernel.withdrawal import background, quarantine, tenant_erase
from fak.kernel.withdrawal import forget as forgets
from fak.kernel.withdrawal import keys as keyops
from fak.kernel.withdrawal import replica_tasks as tasks
from fak.kernel.withdrawal.forget import ForgetState
from fak.kernel.withdrawal.quarantine import QuarantineReport
from fak.kernel.withdrawal.replay_check import ReplayChecker
from fak.kernel.withdrawal.replicas import Replication
from fak.keys import derive_key, load_master_secret
from fak.owner import Claim, claim
from fak.policy import Policy, PolicyHolder, gate
from fak.policy.egress import JudgeEgress, origin_of
from fak.policy.late import LateRunner
from fak.settings import Settings, SettingsError
from fak.state.apikeys import MAC_LABEL
from fak.state.store import StateStore, now_us
from fak.types import as_id, check_tenant

__all__ = ["Kernel", "Producer", "default_policy_path"]


def default_policy_path() -> Path:
    """The policy shipped in the package (``policy/default.yaml``)."""
    return Path(str(importlib.resources.files("fak.policy").joinpath("default.yaml")))


def _stderr(message: str) -> None:
    print(f"[fak] {message}", file=sys.stderr, flush=True)


def build_services(settings: Settings, lm: LoadedModel, policies: PolicyHolder, store: CasStore, audit: AuditLog,
                   state: StateStore, master: bytes, replication: Replication | None = None,
                   ) -> tuple[Services, SessionRegistry, ReplayChecker]:
    """The services of one Kernel, wired: the session registry and the replay queue are part
    of the bundle and use it, so both are bound to it once it exists."""
    upstreams = Upstreams.from_settings(settings)  # first: an unset key variable fails before any thread starts
    hook = WebhookConfig.from_settings(settings)  # and a webhook outside the egress allow-list, or unsigned
    events = EventBus()
    webhook = HeldCallWebhook(hook, lambda tenant, outcome: events.publish(ApprovalNotified(tenant, outcome))) \
        if hook is not None else None
    registry = SessionRegistry()
    gateways = GatewaySessions()
    replays = ReplayChecker()  # forgets' independent replays, after each forget returns
    keys = DerivedKeys(master, lm.model.model_id)
    svc = Services(
        settings=settings, lm=lm, policies=policies, store=store, state=state, audit=audit,
        prefix=PrefixCache(budget_bytes=settings.prefix_budget_bytes,
                           namespace_budget_bytes=settings.tenant_prefix_budget_bytes) if settings.prefix_cache else None,
        pic=PicRegistry(lm.model.model_id, lm.tokenizer.digest, budget_bytes=settings.pic_budget_bytes,
                        namespace_budget_bytes=settings.tenant_pic_budget_bytes),
        keys=keys, events=events, withdrawals=Withdrawals(),
        producers=Producers(state), authorizers=Authorizers(), late=LateDetection(events, _stderr),
        sessions=registry, replays=replays, gate=gate,
        holds=HeldCalls(state, store, keys, ttl_s=settings.approval_ttl_s,
                        on_hold=webhook.notify if webhook is not None else None),
        generation_slots=GenerationSlots(total=settings.max_generating, per_tenant=settings.max_generating_per_tenant,
                                         queue=settings.generation_queue, wait_s=settings.generation_queue_wait_s),
        engine=_engine(settings, lm), replication=replication,
        upstreams=upstreams, gateways=gateways,
        mcp=McpServers.from_settings(settings, state, audit, keys.derive("fak/mcp/pins")),
        webhook=webhook,
    )  # fmt: skip
    registry.bind(svc)
    gateways.bind(svc)
    replays.bind(svc)
    return svc, registry, replays


def check_replicated(settings: Settings, replicas: int | None = None) -> None:
    """A replica shares its governance plane with its peers (docs/scale-out.md): both databases
    must be PostgreSQL, which several processes and machines can write; SQLite cannot. Checked
    by each replica's ``Kernel.open`` (``replicas`` None) and by ``fak serve --replicas N``
    before it starts any, N = 1 included: even one replica is a named replica in its own
    process beside the router, and its ``Kernel.open`` would refuse SQLite after Ray started."""
    who = f"replica {settings.replica!r}" if replicas is None else f"--replicas {replicas}"
    if replicas is not None and replicas < 1:
        raise SettingsError(f"{who}: a deployment has at least 1 replica")
    for name, url in (("database_url", settings.database_url), ("cas_key_url", settings.cas_key_url)):
        if url is None or not url.startswith("postgresql"):
            shown = "unset (SQLite in the data directory)" if url is None else "not PostgreSQL"
            raise SettingsError(f"{who}: setting {name} is {shown}; a replicated deployment shares its state on "
                                f"PostgreSQL (FAK_{name.upper()}=postgresql+psycopg://host/fak) and refuses SQLite")


def _engine(settings: Settings, lm: LoadedModel) -> Scheduler | None:
    """The engine loop for this kernel's model, unless batching is off or another kernel
    sharing the model runs one already (it serves this kernel's calls too)."""
    if not settings.batching or lm.model.router is not None:
        return None
    limits = SchedulerLimits(max_batch=settings.batch_max_rows, prefill_wait_s=settings.batch_prefill_wait_s)
    return Scheduler(lm.model, limits).start()


class Kernel:
    """Open with ``Kernel.open(settings)``; close with ``close()`` or a ``with`` block."""

    def __init__(self, services: Services, registry: SessionRegistry, replays: ReplayChecker) -> None:
        self.services = services
        self.registry = registry
        self.replays = replays  # forgets' independent replays, after each forget returns
        self.settings = services.settings
        self.store = services.store
        self.audit = services.audit  # an AuditLog: the kernel also reads entries, proofs and exports
        self.state = services.state
        self.prefix = services.prefix
        self.pic = services.pic
        self.events = services.events  # typed decisions for metrics and benches (fak.kernel.events)
        self._closed = False
        # when this kernel opened: work recorded as running before it (a response in progress)
        # was cut by the end of the process that owned the data directory then
        self.opened_us = now_us()
        self._owned: Claim | None = None  # this process's claim on the data directory (fak.owner)
        self._sweeper = background.ExpirySweeper(services, _stderr)

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
        settings = settings or Settings.load()
        # one Kernel per data directory across processes (fak.owner says why); claimed before
        # anything is loaded, so a refusal costs nothing
        if settings.replica is not None:
            check_replicated(settings)  # before anything is claimed or loaded
        owned = claim(settings.data_dir, why="stop it first, or do this through its API",
                      shared=settings.replica is not None)
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
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # keys, blobs, database: owner only
        url = settings.resolved_database_url
        master = load_master_secret(settings.data_dir, settings.master_secret_hex())
        policy = PolicyHolder(settings.policy_path or default_policy_path(), egress=settings.judge_allow_lists())
        device = devices.resolve(settings.device)  # FAK_DEVICE=cuda without CUDA: refused here, naming the setting
        # unset weights: the CPU's serving default; on a GPU float32 (the faster formats are CPU code)
        weights = settings.weights or (default_weights() if device.type == "cpu" else "float32")
        lm = model or load_model(settings.model_path, device=device, progress=progress, weight_format=weights,
                                 kv_dtype=getattr(torch, settings.kv_dtype), cache_dir=settings.cache_dir)
        if lm.model.device != device:
            raise devices.DeviceError(f"setting {devices.DEVICE_SETTING} is {settings.device!r} but the model "
                                      f"passed to Kernel.open runs on {lm.model.device}")
        store = CasStore.open(settings.data_dir, url, master_secret=master, key_url=settings.cas_key_url,
                              settings=settings)
        audit = None
        replication: Replication | None = None
        try:
            audit = AuditLog.open(url, settings.data_dir, origin=settings.audit_origin,
                                  checkpoint_every=settings.audit_checkpoint_every,
                                  checkpoint_ms=settings.audit_checkpoint_ms, witnesses=settings.audit_witnesses,
                                  settings=settings)
            state = StateStore(make_engine(url), api_key_mac=derive_key(master, MAC_LABEL))
            state.seal_clear_segments(store)  # rows written before sealing (issue 25.2): sealed once
            kernel = None
            if settings.replica is not None:  # waits while a previous process of this replica exits
                replication = Replication(state.engine, settings.replica,
                                          scope=derive_key(master, "fak replica locks").hex()[:16],
                                          mac_key=derive_key(master, "fak/state/withdrawal-report"))
                replication.join()
            kernel = cls(*build_services(settings, lm, policy, store, audit, state, master, replication))
            kernel._log_policy(None, None)
            tasks.join_replicas(kernel.services, kernel._reload_from_peer, progress)
            tasks.resume_forgets(kernel.services, progress)
            background.start_late(kernel.services, _stderr)
            kernel._sweeper.start()
        except BaseException:
            if kernel is not None and kernel.services.engine is not None:
                kernel.services.engine.close()
            if kernel is not None and kernel.services.webhook is not None:
                kernel.services.webhook.close()
            if replication is not None:
                replication.close()
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
        if self.services.engine is not None:
            self.services.engine.close()  # calls queued finish; later ones run on their own threads
        self._sweeper.stop()
        runner = self.services.late.runner
        if runner is not None:
            runner.close()
        self._sweeper.join(timeout=5)
        if self.services.replication is not None:
            self.services.replication.close()
        self.registry.clear()
        self.services.upstreams.close()
        if self.services.mcp is not None:
            self.services.mcp.close()
        if self.services.webhook is not None:
            self.services.webhook.close()
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
    def model(self) -> Llama:
        return self.services.model

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self.services.tokenizer

    @property
    def model_id(self) -> str:
        return self.services.model_id

    @property
    def gateway_sessions(self) -> GatewaySessions:
        """The gateway sessions running now (docs/gateway.md): the door opens each request's here."""
        found = self.services.gateways
        if not isinstance(found, GatewaySessions):
            raise TypeError("this kernel's services were built without a gateway registry")
        return found

    @property
    def policy(self) -> Policy:
        return self.services.policy

    @property
    def context_limit(self) -> int:
        """Tokens a session may hold: the model's context, or less if configured."""
        return self.services.context_limit

    @property
    def policy_path(self) -> Path:
        """The file or folder the policy is loaded from (``reload_policy`` reads it again)."""
        return self.services.policies.path

    @property
    def judge_egress(self) -> JudgeEgress:
        """The deployment's judge allow-lists (settings ``judge_egress``, ``judge_key_envs``) that
        every policy this kernel loads is checked against (validate, replace, reload); a
        holder built without them allows no judge."""
        return self.services.judge_egress

    def reload_policy(self, principal: str | None = None, *, peers: bool = True) -> Policy:
        """Load the policy file again; a bad file raises its located error and keeps the old one.
        In a replicated deployment (one policy file on the shared volume) every other replica
        loads it too, from a task (``peers=False``: this is that task)."""
        policy = self._reload_policy(principal)
        rep = self.services.replication
        if rep is not None and peers:
            request = "pol_" + uuid.uuid4().hex[:24]
            rep.publish(request, "policy", "", [])
            rep.store.finish(request, rep.name, rep.name)
        return policy

    def _reload_policy(self, principal: str | None) -> Policy:
        holder = self.services.policies
        before = self.policy
        error = holder.reload()
        if error is not None:
            raise error
        try:
            self._log_policy(before.digest, principal)
        except BaseException:
            holder.restore(before)  # a policy whose loading is not in the log is not enforced
            raise
        if self.services.late.runner is not None or self.policy.spec.late_detectors:
            background.start_late(self.services, _stderr)
        return self.policy

    def _reload_from_peer(self, principal: str) -> None:
        """A peer replica replaced the policy (its ``policy`` task): load it, telling no one."""
        self.reload_policy(principal=principal, peers=False)

    def _log_policy(self, previous: str | None, principal: str | None) -> None:
        p = self.policy
        if previous == p.digest:
            return
        self.audit.append(PolicyLoaded(policy_id=as_id(p.name), policy_digest=p.digest, previous_digest=previous,
                                       principal=as_id(principal) if principal else None,
                                       judges=_judge_scopes(p)))

    def derive_key(self, label: str) -> bytes:
        """A 32-byte key derived from the master secret for one use (HKDF, ``label`` names the use)."""
        return self.services.keys.derive(label)

    def namespace(self, tenant: str) -> bytes:
        """The tenant's prefix-cache root: derived from the master secret, never from a request."""
        return self.services.keys.namespace(tenant)

    def audit_fingerprint(self, tenant: str, fingerprint: str) -> str:
        """A KV fingerprint as audit events carry it: keyed per tenant (``DerivedKeys``)."""
        return self.services.keys.audit_fingerprint(tenant, fingerprint)

    # --- sessions ---------------------------------------------------------------
    def session(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002 - the API's word
        """A new session of ``tenant`` (``id=None``, or an id not used yet is refused: see
        ``create``), or the existing one named ``id``. Another tenant's id answers as an
        unknown one does."""
        return self.registry.session(tenant, id)

    def create_session(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002
        """A new, empty session (``id`` chosen by the caller or generated)."""
        return self.registry.create(tenant, id)

    def delete_session(self, tenant: str, id: str) -> None:  # noqa: A002
        """Drop a session: its KV, its durable ledger. Its refs stay in the CAS (forget erases)."""
        self.registry.delete(tenant, id)

    def sessions(self, tenant: str) -> list[str]:
        """Ids of the tenant's sessions, loaded or not, oldest first."""
        return self.registry.ids(tenant)

    def loaded_sessions(self, tenant: str) -> list[KernelSession]:
        """The tenant's sessions whose KV is in memory now."""
        return self.registry.loaded(tenant)

    # --- replicas (docs/scale-out.md) -------------------------------------------
    @property
    def replica(self) -> str | None:
        """This kernel's replica name in a replicated deployment (None: a single process)."""
        return self.settings.replica

    def placement_of(self, tenant: str, session_id: str) -> str | None:
        """The replica the tenant's session lives on (this kernel's name for a single process);
        None when the tenant has no such session."""
        exists, owner = self.state.placement(check_tenant(tenant), session_id)
        return (owner or self.replica or "") if exists else None

    def prefix_hit_tokens(self, tenant: str, messages: list[dict[str, str]]) -> int:
        """Tokens of ``messages`` (rendered as a new session would hold them) that this kernel's
        prefix cache holds for the tenant now: what a router places new sessions by. Reads only
        the tenant's own namespace; pins nothing."""
        tenant = check_tenant(tenant)
        binding = prefix_binding(self.services, tenant)
        if binding is None or not messages:
            return 0
        pic, vocab = pic_binding(self.services, tenant), self.model.cfg.vocab_size
        tokens: list[int] = []
        starts: list[int] = []
        history: list[dict[str, str]] = []
        for m in messages:
            message = {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            ids = self.tokenizer.encode_message(history, message)
            for n in default_chunks(ids, self.settings.chunk_size, pic, vocab):  # the calls a session would make
                starts.append(len(tokens))
                tokens += ids[:n]
                ids = ids[n:]
            history.append(message)
        return binding.cache.peek(binding.namespace, call_keys(tokens, starts))

    def replica_load(self) -> int:
        """Loaded sessions and running generations: the router's tie-breaker."""
        return len(self.registry.loaded()) + self.services.generation_slots.running()

    # --- forget and late quarantine --------------------------------------------
    def engine_figures(self, tenant: str) -> TenantFigures:
        """The tenant's view of the engine loop and the generation queue (``fak.kernel.model.scheduler``):
        its waiting calls and requests, rows and tokens per step; nothing of other tenants' work."""
        engine = self.services.engine
        slots = self.services.generation_slots
        if engine is not None:
            return engine.figures(tenant, slots)
        return TenantFigures.idle(slots.queued(tenant), slots.active(tenant), slots.rejected(tenant))

    def forget(
        self, tenant: str, ref: str, *, requested_by: str | None = None, reason: str | None = None,
        wait_replay: bool = False,
    ) -> ForgetReceipt:
        """Erase ``ref`` from every session, cache and store of the tenant; a signed receipt.
        It returns once the erasure is done; the independent replay of each session's
        survivors completes the receipt afterwards (``receipt.replay``: pending, then
        verified; ``forget_status`` serves it). ``wait_replay``: return the completed one."""
        receipt = forgets.forget(self.services, tenant, ref, requested_by=requested_by, reason=reason)
        if wait_replay and receipt.replay == "pending":
            self.replays.wait(receipt.request_id)
            done = self.forget_status(tenant, receipt.request_id).receipt
            receipt = done if done is not None else receipt
        return receipt

    def forget_status(self, tenant: str, request_id: str) -> ForgetState:
        """A forget of the tenant by request id: its state, and its receipt once completed."""
        return forgets.status(self.services, tenant, request_id)

    def quarantine(
        self, tenant: str, ref: str, *, reason: str, principal: str | None = None
    ) -> QuarantineReport:
        """A late detection: evict ``ref`` from every live session of the tenant, refuse it after."""
        return quarantine.quarantine(self.services, tenant, ref, reason=reason, principal=principal)

    # --- expiry -------------------------------------------------------------------
    def expire_due(self, now_us_: int | None = None, tenant: str | None = None) -> list[QuarantineReport]:
        """Execute every expiry whose time has come: all tenants' (the sweeper, every
        ``settings.expiry_sweep_s``), or one tenant's (``fak.kernel.withdrawal.quarantine.expire_due``)."""
        return quarantine.expire_due(self.services, now_us_, tenant)

    # --- late detectors -------------------------------------------------------------
    @property
    def late_runner(self) -> LateRunner | None:
        """The late-detector runner, None until a policy with late detectors loads: an
        admission builds a job only when there is one; benches read its stats."""
        return self.services.late.runner

    def wait_late(self, timeout: float = 30.0) -> bool:
        """Wait until every admitted result has been through the late detectors (tests, bench)."""
        runner = self.services.late.runner
        return runner is None or runner.wait_idle(timeout)

    # --- tool-call authorization ------------------------------------------------------
    def authorizer(self) -> Authorizer:
        """The tool-call authorizer of the active policy (rebuilt when the policy changes)."""
        return self.services.authorizers.current(self.policy)

    def producer_of(self, tenant: str, ref: str) -> Producer:
        """The tool that produced ``ref`` and the URL it came from (``?``, None if the kernel
        has no record: judged untrusted)."""
        return self.services.producers.of(tenant, ref)

    # --- keys and tenants ---------------------------------------------------------------
    def rotate_keys(self, tenant: str | None = None, *, principal: str | None = None) -> RotationResult:
        """New random KEK versions (one tenant or all), live data keys re-wrapped, logged."""
        return keyops.rotate(cast(CasStore, self.store), self.audit, tenant, principal=principal)

    def destroy_retired_keys(self, older_than: float, *, principal: str | None = None) -> DestroyResult:
        """Destroy KEKs retired at least ``older_than`` seconds ago, logged before they go."""
        return keyops.destroy_retired(cast(CasStore, self.store), self.audit, older_than, principal=principal)

    def erase_tenant(self, tenant: str, *, confirm: str, requested_by: str | None = None,
                     reason: str | None = None) -> TenantErased:
        """Crypto-erase a whole tenant: its sessions and KV, its prefix-cache namespace, every
        key it has in the CAS (so no backup of its data keys opens again), its refs' records
        and its API keys. Logged write-ahead (``TenantEraseRequested``, then ``TenantErased``);
        each step is idempotent, so a crash in between is finished by calling it again.
        ``confirm`` must repeat the tenant: this cannot be undone. Done by
        ``fak.kernel.withdrawal.tenant_erase``."""
        return tenant_erase.erase_tenant(self.services, tenant, confirm=confirm, requested_by=requested_by,
                                         reason=reason)


def _judge_scopes(policy: Policy) -> list[Any] | None:
    """Each judge of ``policy``: its destination (scheme://host:port) and the tenants whose
    tool results it may be sent, for the ``policy_loaded`` event (None: no judge)."""
    judges = [r for r in policy.spec.late_detectors if r.kind == "judge" and r.url]
    if not judges:
        return None
    return [JudgeScope(detector_id=as_id(r.id), destination=origin_of(r.url or ""), all_tenants=r.tenants == "all",
                       tenants=[] if r.tenants == "all" else list(r.tenants or ())) for r in judges]
