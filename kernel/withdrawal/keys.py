"""Key operations of the CAS, logged: rotating and destroying KEKs are decisions an auditor
must see. Rotation is logged per tenant after it (nothing is lost by it: the old version
stays until destroyed); destruction is logged before it, per tenant (write-ahead: a crash
after the event leaves keys that a repeated call destroys)."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta
from typing import TYPE_CHECKING

from fak.audit import KeyRotated, KeysDestroyed
from fak.faults import fault_point
from fak.types import as_id

if TYPE_CHECKING:
    from fak.cas.models import DestroyResult, RotationResult
    from fak.cas.store import CasStore
    from fak.protocols import AuditSink


def _active(store: CasStore, tenant: str | None) -> dict[str, str]:
    return {i.tenant: i.kek_id for i in store.kek_versions(tenant) if i.active}


def rotate(store: CasStore, audit: AuditSink, tenant: str | None = None, *,
           principal: str | None = None) -> RotationResult:
    """``CasStore.rotate`` and one ``KeyRotated`` event per tenant (old and new KEK ids)."""
    who = as_id(principal) if principal else None
    before = _active(store, tenant)
    result = store.rotate(tenant)
    fault_point("keyops.rotate.before_log")
    after = _active(store, tenant)
    for t in sorted(result.versions):
        audit.append(KeyRotated(tenant=t, key_kind="cas_kek", old_key_id=as_id(before[t]) if t in before else None,
                                new_key_id=as_id(after[t]), principal=who))
    return result


def destroy_retired(store: CasStore, audit: AuditSink, older_than: float | timedelta, *,
                    principal: str | None = None) -> DestroyResult:
    """``CasStore.destroy_retired``, each tenant's doomed KEKs logged first (``KeysDestroyed``)."""
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    cutoff = time.time() - seconds
    doomed: dict[str, list[str]] = defaultdict(list)
    for info in store.kek_versions():
        if info.retired_at is not None and info.retired_at.timestamp() <= cutoff:
            doomed[info.tenant].append(as_id(info.kek_id))
    who = as_id(principal) if principal else None
    for t in sorted(doomed):
        audit.append(KeysDestroyed(tenant=t, key_kind="cas_kek", key_ids=doomed[t], principal=who))
    return store.destroy_retired(seconds)
