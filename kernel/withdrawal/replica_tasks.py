"""What a kernel owes the withdrawals when it opens (``Kernel.open``): in a replicated
deployment (docs/scale-out.md) it applies the withdrawal tasks written for it while it was
down, then tails the ones to come (``fak.kernel.withdrawal.replicas``), each kind by its
handler here (forget, quarantine, expiry, tenant erase, a peer's policy reload); and it
resumes the forgets a crash interrupted."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fak.errors import FakError, Unavailable
from fak.kernel.services import Services
from fak.kernel.withdrawal import forget as forgets
from fak.kernel.withdrawal import quarantine, replay_check, tenant_erase
from fak.kernel.withdrawal.replicas import WithdrawalPending
from fak.state.schema import WithdrawalTaskRow

log = logging.getLogger("fak.kernel")


def join_replicas(svc: Services, reload_policy: Callable[[str], object],
                  progress: Callable[[str], None] | None) -> None:
    """A replica applies the withdrawals written for it while it was down before it serves,
    then tails the ones to come. ``reload_policy(principal)`` loads the policy file again
    without telling the peers (the ``policy`` task is that telling)."""
    rep = svc.replication
    if rep is None:
        return
    rep.on("forget", lambda task, acting_for: forgets.apply_task(svc, task, acting_for))
    rep.on("quarantine", lambda task, acting_for: quarantine.apply_task(svc, task, acting_for))
    rep.on("expire", lambda task, acting_for: quarantine.apply_task(svc, task, acting_for))
    rep.on("erase", lambda task, acting_for: tenant_erase.apply_erase(svc, task, acting_for))
    rep.on("policy", lambda task, acting_for: apply_policy(svc, task, acting_for, reload_policy))
    moved = rep.run_pending()
    if moved and progress:
        progress(f"replica {rep.name}: applied {moved} withdrawal task(s) written while it was down")
    rep.start()


def apply_policy(svc: Services, task: WithdrawalTaskRow, acting_for: str,
                 reload_policy: Callable[[str], object]) -> None:
    """A peer replaced the deployment's policy: load the file it wrote (a replica that is
    down loads it when it opens, so a stand-in has nothing to do)."""
    rep = svc.replication
    assert rep is not None
    if acting_for == rep.name:
        try:
            reload_policy(f"replica:{task.request_id}")
        except FakError as exc:  # the file changed again since, or is broken: keep the old one, say so
            log.error("replica %s: loading the policy a peer replaced failed: %s", rep.name, exc)
    rep.store.finish(task.request_id, task.replica, rep.name)


def resume_forgets(svc: Services, progress: Callable[[str], None] | None) -> None:
    """Finish the forgets a crash interrupted, then queue again the replays it cut (in the
    background). On a replica a forget whose lock a peer holds, or whose part a peer has not
    applied yet, stays pending: resumed by the next to ask or to open. A forget that fails
    for another reason stays pending too, said loudly: one forget must not stop every start."""
    for row in svc.state.pending_forgets():
        if progress:
            progress(f"resuming the forget of {row.ref[:24]}… (request {row.request_id})")
        try:
            forgets.resume(svc, row)
        except (Unavailable, WithdrawalPending) as exc:
            if svc.replication is None:
                raise
            # a peer holds the deployment's forget lock (its forget, maybe this one) or has not
            # applied its part yet: the forget stays pending, resumed by the next to ask or open
            log.warning("replica %s: the forget %s stays pending: %s", svc.settings.replica, row.request_id, exc)
        except FakError as exc:
            _stays_pending(row.tenant, row.ref, row.request_id, exc, progress)
    replay_check.resume(svc)  # replays a crash interrupted: run again, in the background


def _stays_pending(tenant: str, ref: str, request_id: str, exc: FakError,
                   progress: Callable[[str], None] | None) -> None:
    """Report a forget the open could not finish: it stays pending (its ref refused at
    admission), retried at the next open or by the command this names."""
    message = (f"the forget of {ref} (tenant {tenant}, request {request_id}) could not be resumed and stays "
               f"pending: {exc}. The kernel starts without it; it is retried at the next start, or now with: "
               f"fak forget {ref} --tenant {tenant}")
    log.error("%s", message)
    if progress:
        progress(message)
