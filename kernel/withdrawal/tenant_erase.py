"""Tenant erase (``Kernel.erase_tenant``): crypto-erase a whole tenant, and a replica's part
of one (the ``erase`` withdrawal task, ``fak.kernel.withdrawal.replicas``).

The tenant's sessions and KV go, its prefix-cache namespace, every key it has in the CAS
(so no backup of its data keys opens again), its refs' records and its API keys. The erase
is logged write-ahead (``TenantEraseRequested``, then ``TenantErased``) under the forget lock,
and each step is idempotent, so a crash in between is finished by calling it again. In a
replicated deployment every replica drops the tenant's sessions and caches it holds (an
``erase`` task, settled before the stores go); a replica that is down has its sessions
dropped by the peer standing in for it."""

from __future__ import annotations

import contextlib

from fak.audit import TenantErased, TenantEraseRequested
from fak.errors import InvalidInput, NotFound
from fak.kernel.services import Services
from fak.kernel.withdrawal import forget as forgets
from fak.kernel.withdrawal.replicas import SessionElsewhere
from fak.state.replicas import DONE as TASK_DONE
from fak.state.schema import WithdrawalTaskRow
from fak.types import as_id, check_tenant


def erase_tenant(svc: Services, tenant: str, *, confirm: str, requested_by: str | None = None,
                 reason: str | None = None) -> TenantErased:
    """Crypto-erase ``tenant`` (see the module notes); ``confirm`` must repeat the tenant:
    this cannot be undone."""
    tenant = check_tenant(tenant)
    if confirm != tenant:
        raise InvalidInput("erasing a tenant cannot be undone: pass confirm=<the tenant's name>")
    who, why = (as_id(requested_by) if requested_by else None), (as_id(reason) if reason else None)
    with forgets.forget_lock(svc):
        requested = svc.audit.append(TenantEraseRequested(tenant=tenant, principal=who, reason=why))
        sessions = svc.sessions.ids(tenant)
        rep = svc.replication
        if rep is None:
            for sid in sessions:
                with contextlib.suppress(NotFound):
                    svc.sessions.delete(tenant, sid)
            drop_tenant_here(svc, tenant)
        else:  # every replica drops the tenant's sessions and caches it holds, then the stores go
            request = f"era_{requested}"
            rep.publish(request, "erase", tenant, [])
            rep.settle(request, until=TASK_DONE)
        erasure = svc.store.erase_tenant(tenant)
        revoked = svc.state.erase_tenant_records(tenant)
        event = TenantErased(tenant=tenant, requested_index=requested, sessions=len(sessions),
                             refs_forgotten=erasure.refs_forgotten,
                             keys_destroyed=[as_id(x) for x in erasure.keys_destroyed],
                             api_keys_revoked=revoked, shred_status=erasure.shred_status)
        svc.audit.append(event)
    return event


def apply_erase(svc: Services, task: WithdrawalTaskRow, acting_for: str) -> None:
    """A replica's part of a tenant erase: the tenant's sessions placed on ``acting_for``
    (this replica, or a peer that is down), and here its caches, pending withdrawals and producers."""
    rep = svc.replication
    assert rep is not None
    tenant = task.tenant
    for sid in svc.state.session_ids_on(tenant, frozenset({acting_for})):
        with contextlib.suppress(NotFound, SessionElsewhere):
            svc.sessions.delete(tenant, sid)
    if acting_for == rep.name:
        drop_tenant_here(svc, tenant)
    rep.store.finish(task.request_id, task.replica, rep.name)


def drop_tenant_here(svc: Services, tenant: str) -> None:
    """What this process holds of the tenant besides its sessions: its prefix-cache namespace,
    its pending withdrawals, its producers' records."""
    svc.shared.drop_namespace(svc.keys.namespace(tenant))
    svc.withdrawals.drop_tenant(tenant)
    svc.producers.forget_tenant(tenant)
