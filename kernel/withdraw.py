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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fak.errors import NotFound
from fak.kernel.agent_session import SessionBusy
from fak.kernel.events import SpanEvicted
from fak.kernel.forget import _holders, _unit
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.kv.session import EvictMode
from fak.state.store import now_us
from fak.types import as_id, check_digest, check_tenant

if TYPE_CHECKING:
    from fak.kernel.agent_session import KernelSession
    from fak.kernel.facade import Kernel
    from fak.kernel.kv.session import Session
    from fak.policy import Policy, Verdict


@dataclass(frozen=True)
class WithdrawReport:
    """What a quarantine or an expiry did: segments evicted (or left pending in busy
    sessions), prefix nodes dropped, the eviction mode, the decision's audit index."""

    ref: str
    units: list[dict[str, str]]
    mode: str
    audit_index: int
    pending: list[str] = field(default_factory=list)  # sessions that evict it on their next use


QuarantineReport = WithdrawReport  # the name callers of Kernel.quarantine know


def quarantine(k: Kernel, tenant: str, ref: str, *, reason: str, principal: str | None = None) -> WithdrawReport:
    """A late detection: ``ref`` leaves every session of the tenant and is refused from now on."""
    from fak.audit import RefQuarantined

    tenant, ref = check_tenant(tenant), check_digest(ref)
    head = k.store.head(ref, tenant)
    if head is None:
        raise NotFound(f"no ref {ref}")
    who, why = (as_id(principal) if principal else None), as_id(reason)

    def log(planned: list[dict[str, str]]) -> int:
        return k.audit.append(RefQuarantined(tenant=tenant, ref=ref, reason=why, principal=who, units=planned))

    def mark() -> None:
        if head.state != "forgotten":
            k.store.set_taint(ref, tenant, "quarantined")
        k.state.set_quarantined(tenant, ref, why)

    return _withdraw(k, tenant, ref, SegmentState.QUARANTINED, log, mark)


def expire(k: Kernel, tenant: str, ref: str, *, cause: str, held: KernelSession | None = None) -> WithdrawReport:
    """``ref``'s lifetime ended (``cause``: ``seconds`` or ``turns``): it leaves every session
    of the tenant; materialisation REFUSEs it until the bytes are admitted again. ``held``: a
    session whose lock the caller holds (it is evicted in place, not locked again)."""
    from fak.audit import RefExpired

    tenant, ref = check_tenant(tenant), check_digest(ref)
    when = now_us()

    def log(planned: list[dict[str, str]]) -> int:
        return k.audit.append(RefExpired(tenant=tenant, ref=ref, cause=cause, units=planned))

    def mark() -> None:
        k.state.set_expired(tenant, ref, when)

    return _withdraw(k, tenant, ref, SegmentState.EXPIRED, log, mark, held=held)


def _victims(s: Session, ref: str) -> list:
    return [x for x in s.ledger.live() if x.ref == ref and x.kind is SegmentKind.TOOL]


def evict_in_place(k: Kernel, ks: KernelSession, s: Session, refs: dict[str, SegmentState]) -> list[dict[str, str]]:
    """Evict every live tool segment of ``refs`` from ``s`` (its lock is held) in the policy's
    mode, mark them, write the ledger; a session whose other rows still attended to one of
    ``refs`` (PIC chunks computed beside it elsewhere) is then replayed exactly. Returns
    the units evicted."""
    victims = [x for x in s.ledger.live() if x.kind is SegmentKind.TOOL and x.ref in refs]
    traced = any(r in x.provenance for x in s.ledger.live() if x.ref not in refs for r in refs)
    if not victims and not traced:
        return []
    mode = k.evict_mode()
    units: list[dict[str, str]] = []
    try:
        if mode is EvictMode.REROPE:
            for x in victims:
                report = s.evict([x.id], EvictMode.AUTO if not s.ledger.later_live(x) else mode, force=True)
                units += [_unit("pic_chunk", c) for c in report.pic_chunks_dropped]
        elif victims:
            report = s.evict([x.id for x in victims], force=True)
            units += [_unit("pic_chunk", c) for c in report.pic_chunks_dropped]
        for x in victims:
            x.mark(refs[x.ref])
        if any(r in x.provenance for x in s.ledger.live() for r in refs):
            ks.replace_with_replay(s)
        ks.persist()
    except BaseException:
        ks.discard()
        raise
    for _ in victims:
        k.events.publish(SpanEvicted(ks.tenant, "recompute" if mode is EvictMode.AUTO else mode.value))
    return [_unit("segment", x.id, ks.id) for x in victims] + units


def _withdraw(k: Kernel, tenant: str, ref: str, state: SegmentState, log, mark,
              held: KernelSession | None = None) -> WithdrawReport:
    planned: list[dict[str, str]] = []
    holders = _holders(k, tenant, ref)
    for sid in holders:
        ks = k.session(tenant, sid)
        mech = ks.live_session if ks is held else None
        if mech is None:
            mech = ks.loaded_if_idle()
            if mech is None:
                mech = ks.live_session  # busy: a snapshot of its live segments names what it will evict
        if mech is not None:
            planned += [_unit("segment", x.id, sid) for x in _victims(mech, ref)]
    index = log(planned)
    mark()
    # from here on, whoever takes a holder's lock first evicts the ref (KernelSession._settle)
    k.defer_withdrawal(tenant, ref, state)
    units: list[dict[str, str]] = []
    pending: list[str] = []
    for sid in _holders(k, tenant, ref):  # again: an admission may have landed since the plan
        ks = k.session(tenant, sid)
        if ks is held:
            units += evict_in_place(k, ks, ks.loaded_session(), {ref: state})
            continue
        try:
            ks.acquire(wait=False)
        except SessionBusy:
            pending.append(sid)
            continue
        try:
            units += evict_in_place(k, ks, ks.loaded_session(), {ref: state})
        finally:
            ks.release()
    if not pending:
        k.clear_withdrawal(tenant, ref, state)
    if k.prefix is not None:
        units += [_unit("prefix_node", n) for n in k.prefix.drop_ref(k.namespace(tenant), ref)]
    units += [_unit("pic_chunk", c) for c in k.pic.drop_ref(k.namespace(tenant), ref)]
    mode = k.evict_mode()
    shown = "recompute" if mode is EvictMode.AUTO else mode.value
    return WithdrawReport(ref=ref, units=units, mode=shown, audit_index=index, pending=pending)


def lifetime(policy: Policy, tool: str, verdict: Verdict, source: str | None = None) -> tuple[int | None, int | None]:
    """A ref's lifetime under ``policy``, in seconds and in model turns (None: unbounded):
    the shortest of the tool's ``expires``, the ``expires`` of every detector rule that fired
    on it, and ``retention.tool_result_ttl_s``."""
    from fak.policy import tool_settings

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
