"""Withdrawing a ref from attention everywhere: late quarantine and expiry.

Both are write-ahead: the decision (``RefQuarantined`` / ``RefExpired``, naming the
segments that hold the ref) is logged first, then the ref is marked in the kernel
state (no admission or materialisation brings it back from here on: a quarantine
forever, an expiry until the bytes are admitted again), then it is evicted from
every session of the tenant and dropped from the prefix cache.

A session busy with a long operation (a generation being consumed) is not waited
for: the ref is left in the kernel's *pending* table, and the session evicts it
the next time anyone takes its lock, before doing anything else
(``KernelSession._locked``). A repeated call completes what a crash left undone.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from fak.audit import RefExpired, RefQuarantined
from fak.audit.events import DroppedUnit
from fak.errors import NotFound
from fak.kernel.events import SpanEvicted
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState
from fak.kernel.kv.session import EvictMode
from fak.kernel.services import HeldSession, Services, SessionBusy
from fak.kernel.withdrawal.forget import holders
from fak.kernel.withdrawal.records import STORED_UNITS, unit
from fak.kernel.withdrawal.replicas import SessionElsewhere
from fak.policy import tool_settings
from fak.state.schema import WithdrawalTaskRow
from fak.state.store import now_us
from fak.types import as_id, check_digest, check_tenant

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session
    from fak.policy import Policy, Verdict


@dataclass(frozen=True)
class WithdrawReport:
    """What a quarantine or an expiry did: segments evicted (or left pending in busy
    sessions), prefix nodes dropped, the eviction mode, the decision's audit index."""

    ref: str
    units: list[DroppedUnit]
    mode: str
    audit_index: int
    pending: list[str] = field(default_factory=list)  # sessions that evict it on their next use

    def unit_dicts(self) -> list[dict[str, str]]:
        """The units as the wire carries them (``fak.wire.QuarantineOut``): no key for a None
        (no ``session_id`` for a prefix node or a PIC chunk), the order of ``DroppedUnit``."""
        return [u.model_dump(exclude_none=True) for u in self.units]


QuarantineReport = WithdrawReport  # the name callers of Kernel.quarantine know


def quarantine(svc: Services, tenant: str, ref: str, *, reason: str, principal: str | None = None) -> WithdrawReport:
    """A late detection: ``ref`` leaves every session of the tenant and is refused from now on."""
    tenant, ref = check_tenant(tenant), check_digest(ref)
    head = svc.store.head(ref, tenant)
    if head is None:
        raise NotFound(f"no ref {ref}")
    who, why = (as_id(principal) if principal else None), as_id(reason)

    def log(planned: list[DroppedUnit]) -> int:
        return svc.audit.append(RefQuarantined(tenant=tenant, ref=ref, reason=why, principal=who,
                                             units=planned))

    def mark() -> None:
        if head.state != "forgotten":
            svc.store.set_taint(ref, tenant, "quarantined")
        svc.state.set_quarantined(tenant, ref, why)

    return _withdraw(svc, tenant, ref, SegmentState.QUARANTINED, log, mark)


def expire(svc: Services, tenant: str, ref: str, *, cause: str, held: HeldSession | None = None) -> WithdrawReport:
    """``ref``'s lifetime ended (``cause``: ``seconds`` or ``turns``): it leaves every session
    of the tenant; materialisation REFUSEs it until the bytes are admitted again. ``held``: a
    session whose lock the caller holds (it is evicted in place, not locked again)."""
    tenant, ref = check_tenant(tenant), check_digest(ref)
    when = now_us()

    def log(planned: list[DroppedUnit]) -> int:
        return svc.audit.append(RefExpired(tenant=tenant, ref=ref, cause=cause, units=planned))

    def mark() -> None:
        svc.state.set_expired(tenant, ref, when)

    return _withdraw(svc, tenant, ref, SegmentState.EXPIRED, log, mark, held=held)


def _victims(s: Session, ref: str) -> list[Segment]:
    return [x for x in s.ledger.live() if x.ref == ref and x.kind is SegmentKind.TOOL]


def evict_in_place(svc: Services, ks: HeldSession, s: Session, refs: dict[str, SegmentState]) -> list[DroppedUnit]:
    """Evict every live tool segment of ``refs`` from ``s`` (its lock is held) in the policy's
    mode, mark them, write the ledger; a session whose other rows still attended to one of
    ``refs`` (PIC chunks computed beside it elsewhere) is then replayed exactly. Returns
    the units evicted."""
    victims = [x for x in s.ledger.live() if x.kind is SegmentKind.TOOL and x.ref in refs]
    traced = any(r in x.provenance for x in s.ledger.live() if x.ref not in refs for r in refs)
    if not victims and not traced:
        return []
    mode = svc.evict_mode()
    units: list[DroppedUnit] = []
    with ks.held_transaction() as tx:
        tx.change()
        if mode is EvictMode.REROPE:
            for x in victims:
                report = s.evict([x.id], EvictMode.AUTO if not s.ledger.later_live(x) else mode, force=True)
                units += [unit("pic_chunk", c) for c in report.pic_chunks_dropped]
        elif victims:
            report = s.evict([x.id for x in victims], force=True)
            units += [unit("pic_chunk", c) for c in report.pic_chunks_dropped]
        for x in victims:
            x.mark(refs[cast(str, x.ref)])  # a victim is a tool segment of one of refs
        if any(r in x.provenance for x in s.ledger.live() for r in refs):
            ks.replace_with_replay(s)
        tx.commit()
    for _ in victims:
        svc.events.publish(SpanEvicted(ks.tenant, "recompute" if mode is EvictMode.AUTO else mode.value))
    return [unit("segment", x.id, ks.id) for x in victims] + units


def _withdraw(svc: Services, tenant: str, ref: str, state: SegmentState, log: Callable[[list[DroppedUnit]], int],
              mark: Callable[[], None], held: HeldSession | None = None) -> WithdrawReport:
    planned: list[DroppedUnit] = []
    for sid in holders(svc, tenant, ref):
        try:
            ks = svc.sessions.session(tenant, sid)
        except (NotFound, SessionElsewhere):
            continue
        mech = ks.live_session if ks is held else None
        if mech is None:
            mech = ks.loaded_if_idle()
            if mech is None:
                mech = ks.live_session  # busy: a snapshot of its live segments names what it will evict
        if mech is not None:
            planned += [unit("segment", x.id, sid) for x in _victims(mech, ref)]
    index = log(planned)
    mark()
    # from here on, whoever takes a holder's lock first evicts the ref (KernelSession._settle)
    svc.withdrawals.defer(tenant, ref, state)
    units: list[DroppedUnit] = []
    pending: list[str] = []
    for sid in holders(svc, tenant, ref):  # again: an admission may have landed since the plan
        try:
            ks = svc.sessions.session(tenant, sid)
        except (NotFound, SessionElsewhere):  # deleted since, or moved to a peer (its task covers it)
            continue
        if ks is held:
            units += evict_in_place(svc, ks, ks.loaded_session(), {ref: state})
            continue
        try:
            ks.acquire(wait=False)
        except SessionBusy:
            pending.append(sid)
            continue
        try:
            units += evict_in_place(svc, ks, ks.loaded_session(), {ref: state})
        finally:
            ks.release()
    if not pending:
        svc.withdrawals.clear(tenant, ref, state)
    units += [unit("gateway_segment", x, d.session_id)  # the gateway sessions running now
              for d in svc.gateways.drop(tenant, [ref], state) for x in d.segment_ids]
    dropped = svc.shared.drop_ref(svc.keys.namespace(tenant), ref)
    units += [unit("prefix_node", n) for n in dropped.prefix_nodes]
    units += [unit("pic_chunk", c) for c in dropped.pic_chunks]
    rep = svc.replication
    if rep is not None:  # every other replica evicts it too, from its own task (docs/scale-out.md)
        request = "wdr_" + uuid.uuid4().hex[:24]
        rep.publish(request, TASK_KINDS[state], tenant, [ref])
        rep.store.finish(request, rep.name, rep.name, units=STORED_UNITS.dump(units))
    mode = svc.evict_mode()
    shown = "recompute" if mode is EvictMode.AUTO else mode.value
    return WithdrawReport(ref=ref, units=units, mode=shown, audit_index=index, pending=pending)


TASK_KINDS = {SegmentState.QUARANTINED: "quarantine", SegmentState.EXPIRED: "expire"}


def apply_task(svc: Services, task: WithdrawalTaskRow, acting_for: str) -> None:
    """A replica's part of a quarantine or an expiry decided on a peer (logged and marked
    there): evict the ref from the sessions placed on ``acting_for`` (this replica, or a peer
    that is down: its sessions move here) and, here, from the prefix cache and PIC."""
    rep = svc.replication
    assert rep is not None
    state = SegmentState.QUARANTINED if task.kind == "quarantine" else SegmentState.EXPIRED
    units: list[DroppedUnit] = []
    for ref in json.loads(task.refs):
        svc.withdrawals.defer(task.tenant, ref, state)  # a busy session evicts it on its next use
        busy = False
        for sid in holders(svc, task.tenant, ref, acting_for):
            try:
                ks = svc.sessions.session(task.tenant, sid)
                ks.acquire(wait=False)
            except (NotFound, SessionElsewhere):
                continue
            except SessionBusy:
                busy = True
                continue
            try:
                units += evict_in_place(svc, ks, ks.loaded_session(), {ref: state})
            finally:
                ks.release()
        if not busy:
            svc.withdrawals.clear(task.tenant, ref, state)
        if acting_for == rep.name:  # a peer that is down lost its caches with its memory
            dropped = svc.shared.drop_ref(svc.keys.namespace(task.tenant), ref)
            units += [unit("prefix_node", n) for n in dropped.prefix_nodes]
            units += [unit("pic_chunk", c) for c in dropped.pic_chunks]
    rep.store.finish(task.request_id, task.replica, rep.name, units=STORED_UNITS.dump(units))


def expire_due(svc: Services, now: int | None = None, tenant: str | None = None) -> list[WithdrawReport]:
    """Execute every expiry whose time has come: all tenants' (the sweeper), or one tenant's
    (its sessions, before they use attention, so another tenant's expiries never run on its
    requests)."""
    now = now if now is not None else now_us()
    reports = []
    rep = svc.replication  # one replica at a time executes expiries: each is logged once
    with svc.withdrawals.expiry_lock, rep.cluster_lock("expiry") if rep is not None else contextlib.nullcontext():
        for t, ref, _ in svc.state.due_expiries(now, tenant=tenant):
            reports.append(expire(svc, t, ref, cause="seconds"))
        if tenant is None:
            svc.withdrawals.set_next_expiry(svc.state.next_expiry())
    return reports


def lifetime(policy: Policy, tool: str, verdict: Verdict, source: str | None = None) -> tuple[int | None, int | None]:
    """A ref's lifetime under ``policy``, in seconds and in model turns (None: unbounded):
    the shortest of the tool's ``expires``, the ``expires`` of every detector rule that fired
    on it, and ``retention.tool_result_ttl_s``."""
    spec = policy.spec
    limits = []
    expires = tool_settings(policy, tool, source).expires  # the tool entry the gate chose
    if expires is not None:
        limits.append(expires)
    fired = {m.rule_id for m in verdict.matches if not getattr(m, "audit", False)}  # audit rules change nothing
    limits += [r.expires for r in spec.detectors if r.id in fired and r.expires is not None]
    seconds = [e.seconds for e in limits if e.seconds is not None]
    if spec.retention.tool_result_ttl_s is not None:
        seconds.append(spec.retention.tool_result_ttl_s)
    turns = [e.turns for e in limits if e.turns is not None]
    return (min(seconds) if seconds else None), (min(turns) if turns else None)
