"""The registry of a Kernel's sessions: which are loaded, finding or creating one, deleting
one, and the KV budget over the loaded ones (docs/architecture.md, "Layers").

Withdrawal, working sets and the replay see it through ``fak.kernel.services.SessionDirectory``;
the façade owns it. It is bound to the ``Services`` it hands each session once those are
built (the bundle holds the registry, so the registry cannot be given them before).
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid

from fak.errors import Conflict, FakError, InvalidInput, NotFound
from fak.kernel.kv.ledger import SegmentKind
from fak.kernel.services import GATEWAY_MODEL_PREFIX, HeldSession, Services
from fak.kernel.session.kernel_session import KernelSession
from fak.kernel.withdrawal.replicas import SessionElsewhere
from fak.state.store import now_us
from fak.types import check_tenant

SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def check_session_id(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(SESSION_ID, value):
        raise InvalidInput("a session id is 1-64 characters from letters, digits and . _ -, "
                           "starting with a letter or digit")
    return value


class SessionRegistry:
    """Sessions by (tenant, id); thread-safe. ``bind`` once before the first use."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], KernelSession] = {}
        self._lock = threading.RLock()
        self._svc: Services | None = None

    def bind(self, svc: Services) -> None:
        """Give the registry the services its sessions are built with."""
        self._svc = svc

    @property
    def _services(self) -> Services:
        if self._svc is None:
            raise RuntimeError("SessionRegistry used before bind()")
        return self._svc

    def session(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002 - the API's word
        """A new session of ``tenant`` (``id=None``), or the existing one named ``id``.
        Another tenant's id answers as an unknown one does."""
        tenant = check_tenant(tenant)
        if id is None:
            return self.create(tenant)
        key = (tenant, check_session_id(id))
        with self._lock:
            ks = self._sessions.get(key)
            if ks is not None:
                return ks
        found = self._services.state.session(tenant, id)
        if found is None:
            raise NotFound(f"no session {id!r}")
        if found[0].model_id.startswith(GATEWAY_MODEL_PREFIX):
            raise NotFound(f"session {id!r} is a gateway session of the upstream "
                           f"{found[0].model_id[len(GATEWAY_MODEL_PREFIX):]!r}: it is used through the chat door "
                           "(docs/gateway.md)")
        self._check_placement(tenant, id, found[0].replica)  # outside the lock: it may apply a peer's tasks
        with self._lock:
            ks = self._sessions.get(key)
            if ks is None:
                ks = self._sessions[key] = KernelSession(self._services, tenant, id, found[0].created_us, fresh=False)
            return ks

    def _check_placement(self, tenant: str, sid: str, owner: str | None) -> None:
        """In a replicated deployment a session lives on one replica (docs/scale-out.md): one
        placed on a peer that runs is refused (``SessionElsewhere``, naming it); one placed on a
        peer that is down (or unplaced) moves here and is rebuilt from its ledger on first use."""
        rep = self._services.replication
        if rep is None or owner == rep.name:
            return
        state = self._services.state
        if owner is None:
            if state.move_session(tenant, sid, None, rep.name):
                return
        elif rep.take(owner, lambda: state.move_session(tenant, sid, owner, rep.name)):
            return
        exists, now = state.placement(tenant, sid)
        if not exists:
            raise NotFound(f"no session {sid!r}")
        if now != rep.name:
            raise SessionElsewhere(sid, now or "")

    def create(self, tenant: str, id: str | None = None) -> KernelSession:  # noqa: A002
        """A new, empty session (``id`` chosen by the caller or generated)."""
        svc = self._services
        tenant = check_tenant(tenant)
        sid = check_session_id(id) if id is not None else "sess_" + uuid.uuid4().hex[:20]
        with self._lock:
            if (tenant, sid) in self._sessions or svc.state.session(tenant, sid) is not None:
                raise Conflict(f"session {sid!r} exists")
            if svc.state.session_count(tenant) >= svc.settings.max_sessions_per_tenant:
                raise Conflict(f"tenant has {svc.settings.max_sessions_per_tenant} sessions, the most allowed")
            ks = self._sessions[(tenant, sid)] = KernelSession(svc, tenant, sid, now_us(), fresh=True)
            return ks

    def delete(self, tenant: str, id: str) -> None:  # noqa: A002
        """Drop a session: its KV, its durable ledger. Its refs stay in the CAS (forget erases)."""
        svc = self._services
        tenant = check_tenant(tenant)
        stored = svc.state.session(tenant, check_session_id(id))
        if stored is not None and stored[0].model_id.startswith(GATEWAY_MODEL_PREFIX):
            svc.gateways.delete(tenant, id)
            return
        ks = self.session(tenant, id)  # NotFound for unknown or another tenant's
        with self._lock, ks.held():  # not rebuilt: a session whose refs were erased since is deleted too
            found = svc.state.session(tenant, id)
            for row in found[1] if found else []:
                if row.ref and row.kind == "tool":  # the CAS's record of where the ref is used
                    with contextlib.suppress(FakError):  # a forgotten ref has no uses left
                        svc.store.release_use(row.ref, tenant, "segment", f"{id}/{row.id}")
            svc.state.delete_session(tenant, id)
            self._sessions.pop((tenant, id), None)
            ks.unload()

    def ids(self, tenant: str) -> list[str]:
        """Ids of the tenant's sessions, loaded or not, oldest first."""
        return self._services.state.session_ids(check_tenant(tenant))

    def loaded_session_ids(self, tenant: str) -> set[str]:
        """Ids of the tenant's sessions whose KV is in memory: a withdrawal visits them even
        when their latest change is not written yet."""
        with self._lock:
            return {sid for (t, sid), ks in self._sessions.items() if t == tenant and ks.loaded}

    def loaded(self, tenant: str | None = None) -> list[KernelSession]:
        """The sessions whose KV is in memory now (of ``tenant``, or all)."""
        return [ks for ks in self._all() if ks.loaded and (tenant is None or ks.tenant == tenant)]

    def _all(self) -> list[KernelSession]:
        with self._lock:
            return list(self._sessions.values())

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()

    def enforce_kv_budget(self, keep: HeldSession | None = None) -> None:
        """Offload idle sessions' KV, least recently used first, until the loaded KV fits
        (a session calls it when it releases its lock, keeping itself)."""
        budget = self._services.settings.session_kv_budget_bytes
        if budget is None:
            return
        loaded = self.loaded()
        total = sum(ks.kv_bytes for ks in loaded)
        for ks in sorted(loaded, key=lambda x: x.last_used):
            if total <= budget:
                break
            if ks is keep:
                continue
            size = ks.kv_bytes
            if ks.offload():
                total -= size

    def kv_exists_elsewhere(self, tenant: str, ref: str, session_id: str) -> bool:
        """Whether KV of ``ref`` is held by another of the tenant's loaded sessions or its prefix cache."""
        svc = self._services
        for ks in self._all():
            mech = ks.live_session
            if ks.tenant == tenant and ks.id != session_id and mech is not None and any(
                x.ref == ref and x.kind is SegmentKind.TOOL for x in mech.ledger.live()
            ):
                return True
        return svc.shared.holds_ref(svc.keys.namespace(tenant), ref)
