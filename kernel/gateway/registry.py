"""The gateway sessions alive in this process, so a withdrawal reaches them (docs/gateway.md).

A gateway session lives for one request: the client's history is the conversation's state,
resent each time, and a forgotten or quarantined result in it is refused or replaced at its
next admission. While a request runs, its session is here: a forget, a quarantine or an
expiry takes the ref out of its forwarded history at once (``drop``), so a retry the request
makes next (a DENY remedy) never sends it, and the forget's receipt names the session.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from fak.kernel.gateway.session import GatewaySession
from fak.kernel.kv.ledger import SegmentState
from fak.kernel.services import GatewayDrop, Services

__all__ = ["GatewaySessions"]


class GatewaySessions:
    """The live gateway sessions by tenant; thread-safe."""

    def __init__(self) -> None:
        self._live: dict[str, dict[str, GatewaySession]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def open(self, services: Services, tenant: str, upstream: str) -> Iterator[GatewaySession]:
        """A new gateway session of ``tenant`` for ``upstream``, known here until the block ends."""
        gs = GatewaySession(services, tenant, upstream)
        with self._lock:
            self._live.setdefault(tenant, {})[gs.id] = gs
        try:
            yield gs
        finally:
            with self._lock:
                sessions = self._live.get(tenant, {})
                sessions.pop(gs.id, None)
                if not sessions:
                    self._live.pop(tenant, None)

    def live(self, tenant: str) -> list[GatewaySession]:
        with self._lock:
            return list(self._live.get(tenant, {}).values())

    def drop(self, tenant: str, refs: Sequence[str], state: SegmentState) -> list[GatewayDrop]:
        """Take every segment derived from ``refs`` out of the tenant's live gateway sessions."""
        return [d for gs in self.live(tenant) if (d := gs.drop(refs, state)) is not None]
