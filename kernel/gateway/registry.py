"""The gateway sessions of this kernel: those running now, which a withdrawal reaches at once,
and the persistent ones (``fak_session``), kept in the durable ledger between requests
(``fak.kernel.gateway.ledger``), which a withdrawal loads, drops from and writes back.

A request-scoped session (no ``fak_session``) lives for one request: the client's history is
the conversation's state, resent each time, and a forgotten or quarantined result in it is
refused or replaced at its next admission. While any session is in use it is here: a forget,
a quarantine or an expiry takes the ref out of its forwarded history at once (``drop``), so
no later request it makes (a DENY remedy's retry, the next turn) sends it, and the forget's
receipt names the session. A persistent session is used by one request at a time (its lock;
``SessionBusy`` after ``lock_timeout_s``) and written back when the request ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from fak.errors import Conflict, NotFound
from fak.kernel.gateway import ledger
from fak.kernel.gateway.session import GatewaySession
from fak.kernel.kv.ledger import SegmentState
from fak.kernel.services import GatewayDrop, Services, SessionBusy

__all__ = ["GatewaySessions"]


class GatewaySessions:
    """The gateway sessions by tenant; thread-safe. ``bind`` once before the first use."""

    def __init__(self) -> None:
        self._live: dict[str, dict[str, GatewaySession]] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self._svc: Services | None = None

    def bind(self, svc: Services) -> None:
        self._svc = svc

    @property
    def _services(self) -> Services:
        if self._svc is None:
            raise RuntimeError("GatewaySessions used before bind()")
        return self._svc

    # --- use -----------------------------------------------------------------------------
    @contextmanager
    def open(self, tenant: str, upstream: str, session_id: str | None = None) -> Iterator[GatewaySession]:
        """A gateway session of ``tenant`` for ``upstream`` until the block ends: a new one for
        this request, or the persistent ``session_id`` (created on first use, written back at
        the end however the block ends: what was admitted and logged stays, as in a kernel
        session)."""
        if session_id is None:
            with self._registered(GatewaySession(self._services, tenant, upstream)) as gs:
                yield gs
            return
        with self._held(tenant, session_id):
            gs = self._stored(tenant, session_id, upstream)
            with self._registered(gs):
                try:
                    yield gs
                finally:
                    ledger.write(self._services, gs)

    @contextmanager
    def _registered(self, gs: GatewaySession) -> Iterator[GatewaySession]:
        with self._lock:
            self._live.setdefault(gs.tenant, {})[gs.id] = gs
        try:
            yield gs
        finally:
            with self._lock:
                sessions = self._live.get(gs.tenant, {})
                if sessions.get(gs.id) is gs:
                    sessions.pop(gs.id)
                if not sessions:
                    self._live.pop(gs.tenant, None)

    @contextmanager
    def _held(self, tenant: str, session_id: str) -> Iterator[None]:
        with self._lock:
            lock = self._locks.setdefault((tenant, session_id), threading.Lock())
        if not lock.acquire(timeout=self._services.settings.lock_timeout_s):
            raise SessionBusy(f"session {session_id} is busy (another request uses it)")
        try:
            yield
        finally:
            lock.release()

    def _stored(self, tenant: str, session_id: str, upstream: str) -> GatewaySession:
        svc = self._services
        found = svc.state.session(tenant, session_id)
        if found is None:
            if svc.state.session_count(tenant) >= svc.settings.max_sessions_per_tenant:
                raise Conflict(f"tenant has {svc.settings.max_sessions_per_tenant} sessions, the most allowed")
            gs = GatewaySession(svc, tenant, upstream, id=session_id, persistent=True)
            ledger.write(svc, gs)
            return gs
        head, rows = found
        if not ledger.is_gateway(head):
            raise Conflict(f"session {session_id} runs on fak's own model: continue it with that model, or start "
                           f"a new session for {upstream!r}")
        if ledger.upstream_of(head) != upstream:
            raise Conflict(f"session {session_id} was opened for the upstream {ledger.upstream_of(head)!r}, not "
                           f"{upstream!r}: a session's history is one model's")
        return ledger.load(svc, head, rows)

    def snapshot(self, tenant: str, session_id: str) -> GatewaySession | None:
        """A persistent gateway session as its rows last recorded it (a read: no lock), None if
        there is none of that id."""
        found = self._services.state.session(tenant, session_id)
        if found is None or not ledger.is_gateway(found[0]):
            return None
        return ledger.load(self._services, *found)

    def live(self, tenant: str) -> list[GatewaySession]:
        with self._lock:
            return list(self._live.get(tenant, {}).values())

    # --- withdrawal --------------------------------------------------------------------------
    def drop(self, tenant: str, refs: Sequence[str], state: SegmentState) -> list[GatewayDrop]:
        """Take every segment derived from ``refs`` out of the tenant's gateway sessions: those
        in use now (their request writes them back), then the stored ones holding one."""
        svc = self._services
        live = self.live(tenant)
        out = [d for gs in live if (d := gs.drop(refs, state)) is not None]
        busy = {gs.id for gs in live}
        stored = sorted({sid for r in refs for sid in svc.state.sessions_holding(tenant, r)} - busy)
        for sid in stored:
            with self._held(tenant, sid):
                found = svc.state.session(tenant, sid)
                if found is None or not ledger.is_gateway(found[0]):
                    continue  # deleted since, or a kernel session (the session registry's)
                gs = ledger.load(svc, *found)
                dropped = gs.drop(refs, state)
                if dropped is not None:
                    ledger.write(svc, gs)
                    out.append(dropped)
        return out

    def delete(self, tenant: str, session_id: str) -> None:
        """Delete a persistent gateway session: its rows (its refs stay in the CAS: forget erases)."""
        svc = self._services
        with self._held(tenant, session_id):
            found = svc.state.session(tenant, session_id)
            if found is None or not ledger.is_gateway(found[0]):
                raise NotFound(f"no gateway session {session_id!r}")
            svc.state.delete_session(tenant, session_id)  # its admissions recorded no KV unit in the CAS
