"""Forget and late quarantine across every session of a tenant (docs/design.md, Forget).

Forget, in this order, each step durable before the next:

1. a ``fak_forgets`` row (the data key id is read now, before it is destroyed);
2. ``ForgetRequested`` in the audit log;
3. per session holding the ref (its own ref, content or attention provenance):
   evict every segment derived from it (tool segments of the ref and generated
   segments produced while it was live), RECOMPUTE the survivors, copy them for
   the independent replay that runs after the forget returns (``fak.kernel.withdrawal.replay_check``: it
   completes the receipt with ``ReplayVerified``; unequal raises an audit alarm), and
   write the ledger together with the forget's progress in one transaction;
4. drop the tenant's prefix-cache nodes that attended to the ref;
5. shred the CAS data key and ciphertext;
6. ``ForgetCompleted`` (units, per-session fingerprints, key id and KEK version, both
   indexes, the linked refs and their keys), then the receipt (``ForgetReceipt.from_log``): the ref's admission, the
   request and the completion, each with its inclusion proof against one signed
   checkpoint carrying whatever witness cosignatures it has.

A REDACTed result has two refs, the original and the redacted form (linked at admission,
``fak_ref_links``): a forget of either erases both, steps 3 to 5 for each, and both
events name the other (``linked_refs``; the row keeps them and their key ids, so a resumed
forget erases the same). Forgetting the other form afterwards returns the same receipt.

A crash anywhere leaves the row ``requested``; ``Kernel.open`` resumes it, and the
steps above are idempotent. Forgetting a forgotten ref returns the first receipt.

What stays is content-free: the CAS tombstone (the ref's keyed digest, a size bucket) and
the row. An admission reads them (``fak.kernel.session.admission.forgotten``): the same bytes sent
again, during the forget or after it, are refused unstored (QUARANTINE ``ref_forgotten``)
unless the policy allows re-admission (``spec.forget.readmit``); then they are a new
admission, and a forget of them is a new forget.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from fak.audit import ForgetCompleted, ForgetRequested
from fak.audit.events import DroppedUnit, ReplicaPart
from fak.audit.receipt import ForgetReceipt, find_replay
from fak.errors import Conflict, NotFound
from fak.faults import fault_point  # crash tests: SIGKILL at a named point ($FAK_FAULT_POINT)
from fak.kernel.events import ForgetDone
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.services import Services
from fak.kernel.withdrawal import records, replay_check
from fak.kernel.withdrawal.records import (
    STORED_LINKED,
    STORED_SESSIONS,
    STORED_UNITS,
    LinkedForm,
    SessionDrop,
    UnitKind,
)
from fak.kernel.withdrawal.replicas import SessionElsewhere
from fak.state.replicas import DROPPED, PENDING
from fak.state.schema import ForgetRow, WithdrawalTaskRow
from fak.state.store import ForgetProgress, now_us
from fak.types import as_id, check_digest, check_tenant


def forget(
    svc: Services, tenant: str, ref: str, *, requested_by: str | None = None, reason: str | None = None
) -> ForgetReceipt:
    tenant, ref = check_tenant(tenant), check_digest(ref)
    principal = as_id(requested_by) if requested_by else None
    why = as_id(reason) if reason else None
    with forget_lock(svc):
        row = svc.state.forget_covering(tenant, ref)  # of this ref, or of one linked to it
        head = svc.store.head(ref, tenant)
        if row is not None and row.state in replay_check.DONE:
            if head is None or head.state == "forgotten":
                return receipt_of(svc, row)
            row = None  # the same bytes were admitted again since: this is a new forget
        if row is None:
            if head is None:
                raise NotFound(f"no ref {ref}")
            if head.state == "forgotten":
                raise Conflict(f"ref {ref} was erased outside the kernel (fak cas forget): no receipt can "
                               "account for the sessions that held it")
            request_id = "fgt_" + uuid.uuid4().hex[:24]
            linked = _linked(svc, tenant, ref, [])
            key_id, kek_version = svc.store.key_info(ref, tenant)
            row = ForgetRow(tenant=tenant, ref=ref, request_id=request_id, started_us=now_us(), state="requested",
                            principal=principal,
                            reason=why, requested_index=None, completed_index=None, key_id=key_id,
                            kek_version=kek_version, units=STORED_UNITS.dump([]), sessions=STORED_SESSIONS.dump([]),
                            linked=STORED_LINKED.dump(linked) if linked else None)  # fmt: skip
            # the event the run logs, built (and so validated) before the row is written: a row
            # whose request cannot be logged would stay pending for ever
            requested = _requested(row, linked)
            svc.state.start_forget(row)
            return _run(svc, row, requested)
        return _run(svc, row)


def resume(svc: Services, row: ForgetRow) -> ForgetReceipt | None:
    """Finish a forget a crash interrupted; None when it is not pending any more (another
    replica of a replicated deployment finished it while this one waited for the lock)."""
    with forget_lock(svc):
        now = svc.state.forget_by_request(row.tenant, row.request_id)
        if now is None or now.state != "requested":
            return None
        return _run(svc, now)


@contextlib.contextmanager
def forget_lock(svc: Services) -> Iterator[None]:
    """One forget (or tenant erase) at a time: in this process, and across the replicas of a
    replicated deployment."""
    with svc.withdrawals.forget_lock:
        if svc.replication is None:
            yield
            return
        with svc.replication.cluster_lock("forget"):
            yield


def _requested(row: ForgetRow, linked: list[LinkedForm]) -> ForgetRequested:
    return ForgetRequested(tenant=row.tenant, request_id=row.request_id, ref=row.ref, principal=row.principal,
                           reason=row.reason, linked_refs=[x.ref for x in linked] or None)


def _run(svc: Services, row: ForgetRow, requested: ForgetRequested | None = None) -> ForgetReceipt:
    """Steps 2 to 6 of the forget of ``row`` (``requested``: its event, built when the row was)."""
    started = time.monotonic()
    tenant, ref = row.tenant, row.ref
    resumed = row.requested_index is not None  # ForgetRequested is in the log: this run continues a forget
    known = STORED_LINKED.load(row.linked)
    linked = _linked(svc, tenant, ref, known)  # a link recorded since the request joins it
    if linked != known:
        row.linked = STORED_LINKED.dump(linked)
        svc.state.update_forget(row.request_id, linked=row.linked)
        requested = None  # the event names the joined link too
    refs = [ref] + [x.ref for x in linked]
    if row.requested_index is None:
        row.requested_index = svc.audit.append(requested or _requested(row, linked))
        svc.state.update_forget(row.request_id, requested_index=row.requested_index)
    fault_point("forget.after_requested")
    rep = svc.replication
    parts: list[ReplicaPart] | None = None
    if rep is None:
        dropped = drop_held_units(svc, tenant, refs, ForgetDrop(STORED_UNITS.load(row.units),
                                                             STORED_SESSIONS.load(row.sessions)),
                                  request_id=row.request_id)
        svc.state.update_forget(row.request_id, units=STORED_UNITS.dump(dropped.units))
    else:  # every replica drops what it holds (docs/scale-out.md); this one waits for all of them
        rep.publish(row.request_id, "forget", tenant, refs)
        reports = [(t, ForgetDrop(STORED_UNITS.load(t.units), STORED_SESSIONS.load(t.sessions)))
                   for t in rep.settle(row.request_id, until=DROPPED)]
        dropped = ForgetDrop([u for _, d in reports for u in d.units], [x for _, d in reports for x in d.sessions])
        parts = [ReplicaPart(replica=as_id(t.replica), applied_by=as_id(t.applied_by or t.replica),
                             units=len(d.units), sessions=len(d.sessions)) for t, d in reports]
        svc.state.update_forget(row.request_id, units=STORED_UNITS.dump(dropped.units),
                                sessions=STORED_SESSIONS.dump(dropped.sessions))
    units, sessions = dropped.units, dropped.sessions
    fault_point("forget.before_shred")
    for x in linked:  # the other forms first: the row keeps their key ids for a resumed run
        if svc.store.head(x.ref, tenant) is not None:
            svc.store.forget(x.ref, tenant)
    shred = svc.store.forget(ref, tenant)
    key_id = shred.key_id or row.key_id
    kek_version = shred.kek_version if shred.kek_version is not None else row.kek_version
    fault_point("forget.before_completed")
    # a crash between the completion's append and its record below left the event in the log:
    # a resumed forget finds it instead of logging a second one (found by bench/faults.py)
    index = _logged_completion(svc, row) if resumed else None
    if index is None:
        index = svc.audit.append(ForgetCompleted(
            tenant=tenant, request_id=row.request_id, ref=ref, requested_index=row.requested_index,
            units_dropped=units, sessions=[x.logged() for x in sessions], shredded_key_id=key_id,
            kek_version=kek_version,
            shred_status=getattr(shred, "shred_status", None),
            linked_refs=[x.logged() for x in linked] or None,
            replicas=parts,
        ))  # fmt: skip
    fault_point("forget.after_completed")
    # the independent replay of each session's survivors completes the receipt after this returns
    svc.state.update_forget(row.request_id, state="replaying" if sessions else "completed", completed_index=index)
    if rep is not None:
        rep.store.nudge(row.request_id)  # the replicas' replays wait for this (apply_task)
    if sessions:
        row.sessions, row.completed_index = STORED_SESSIONS.dump(sessions), index
        svc.replays.submit(replay_check.ReplayJob(tenant, row.request_id, ref, index,
                                                  replay_check.jobs_from_row(row, dropped.copies),
                                                  resumed=resumed or rep is not None))
    svc.events.publish(ForgetDone(tenant, time.monotonic() - started))
    return ForgetReceipt.from_log(svc.audit, index)


@dataclass(frozen=True)
class ForgetDrop:
    """What a forget's drop has done where it runs (a forget's row, or one replica's task row):
    the units and the sessions, and the survivors' copies of the sessions this run dropped from
    (the replay replays them; a session dropped from before a crash is replayed from its ids)."""

    units: list[DroppedUnit]
    sessions: list[SessionDrop]
    copies: dict[str, replay_check.SessionJob] = field(default_factory=dict)


def drop_held_units(svc: Services, tenant: str, refs: list[str], so_far: ForgetDrop, *, request_id: str,
                    task_of: str | None = None, acting_for: str | None = None) -> ForgetDrop:
    """Drop every unit derived from ``refs`` that this kernel holds, continuing ``so_far`` (what
    the progress row records: a resumed run adds to it); returns all of it. Each session's
    ledger is written with the progress, one transaction each: the row of ``request_id``
    (``task_of``: that replica's task row instead). ``acting_for``: the replica whose sessions
    to visit (a peer that is down: its sessions move here; its caches died with it). None: a
    single process, every session and cache here."""
    rep = svc.replication
    here = acting_for is None or rep is None or acting_for == rep.name
    units, sessions, copies = list(so_far.units), list(so_far.sessions), dict(so_far.copies)

    def unit(kind: UnitKind, unit_id: str, session_id: str | None = None) -> DroppedUnit:
        return records.unit(kind, unit_id, session_id, replica=acting_for)

    if here:  # chunks that attended to the ref go first, so no session is served one while this runs
        units += [unit("pic_chunk", c) for r in refs
                  for c in svc.shared.drop_ref(svc.keys.namespace(tenant), r, prefix=False).pic_chunks]
    found = set().union(*(holders(svc, tenant, r, acting_for) for r in refs))
    # an admission checks for a pending forget inside its session lock, which this waits for
    for sid in sorted(found):
        try:
            ks = svc.sessions.session(tenant, sid)
        except (NotFound, SessionElsewhere):  # deleted since, or a peer's that runs (its own task covers it)
            continue
        # rebuilt without reading what derives from the refs: their bytes may be erased already
        # (a main database restored from a backup taken before this forget's shred)
        with ks.transaction(dropping=refs) as tx:
            if not ks.holds_any(refs):
                continue
            tx.change()
            ev = ks.evict_derived(refs)
            units += [unit("generated_segment" if x.kind is SegmentKind.ASSISTANT else "segment", x.id, sid)
                      for x in ev.segments]
            units += [unit("prefix_node", n) for n in ev.prefix_nodes]
            units += [unit("pic_chunk", c) for c in ev.pic_chunks]
            keyed = svc.keys.audit_fingerprint(tenant, ev.fingerprint)  # keyed: no guess oracle
            ids = [x.id for x in ev.survivors]  # kept until the replay is logged: a crash re-runs it from them
            sessions = [x for x in sessions if x.session_id != sid]
            sessions.append(SessionDrop(session_id=sid, fingerprint_after=keyed, survivors=ids, replica=acting_for))
            copies[sid] = replay_check.SessionJob(sid, keyed, ids, ev.survivors, tx.session)
            progress = ForgetProgress(request_id, task_of, STORED_UNITS.dump(units), STORED_SESSIONS.dump(sessions))
            tx.commit(forget=progress, fingerprint=ev.fingerprint)
        fault_point("forget.after_session")
    if here:  # the gateway sessions running now: the refs leave their forwarded history
        units += [unit("gateway_segment", x, d.session_id)
                  for d in svc.gateways.drop(tenant, refs, SegmentState.FORGOTTEN) for x in d.segment_ids]
        for r in refs:
            gone = svc.shared.drop_ref(svc.keys.namespace(tenant), r)
            units += [unit("prefix_node", n) for n in gone.prefix_nodes]
            units += [unit("pic_chunk", c) for c in gone.pic_chunks]
    return ForgetDrop(units, sessions, copies)


def apply_task(svc: Services, task: WithdrawalTaskRow, acting_for: str) -> None:
    """A replica's part of a forget (``fak.kernel.withdrawal.replicas``): drop what it holds (state
    ``dropped``, with its units and sessions), then, on the next call, replay each session's
    survivors independently (state ``done``, with each replay's fingerprint)."""
    rep = svc.replication
    assert rep is not None
    refs: list[str] = json.loads(task.refs)
    key = (task.request_id, task.replica)
    if task.state == PENDING:
        dropped = drop_held_units(svc, task.tenant, refs, ForgetDrop(STORED_UNITS.load(task.units),
                                                                  STORED_SESSIONS.load(task.sessions)),
                                  request_id=task.request_id, task_of=task.replica, acting_for=acting_for)
        rep.copies[key] = dropped.copies
        rep.store.update(task.request_id, task.replica, state=DROPPED, applied_by=rep.name,
                         units=STORED_UNITS.dump(dropped.units), sessions=STORED_SESSIONS.dump(dropped.sessions))
        return
    forget_row = svc.state.forget_by_request(task.tenant, task.request_id)
    if forget_row is not None and forget_row.state == "requested":
        return  # a replay is a full prefill: it runs once the forget has returned, not beside its last steps
    copies: dict[str, replay_check.SessionJob] = rep.copies.pop(key, {})
    replayed = [x.model_copy(update={"fingerprint_replay": replay_check.replay_session(
                    svc, task.tenant, copies.get(x.session_id) or x.job())})
                for x in STORED_SESSIONS.load(task.sessions)]
    rep.store.finish(task.request_id, task.replica, task.applied_by or rep.name,
                     sessions=STORED_SESSIONS.dump(replayed))


def _logged_completion(svc: Services, row: ForgetRow) -> int | None:
    """The index of this forget's ``ForgetCompleted`` if it is in the log already (the tenant's
    entries after its ``ForgetRequested`` only: a resume, rare, reads that tail once)."""
    for e in svc.audit.entries(row.tenant, start=row.requested_index or 0):
        ev = e.event
        if ev.type == "forget_completed" and ev.request_id == row.request_id:
            return e.index
    return None


@dataclass(frozen=True)
class ForgetState:
    request_id: str
    ref: str
    state: str  # requested | completed (the erasure; the receipt's ``replay`` says if its replay is logged)
    receipt: ForgetReceipt | None  # once completed


def status(svc: Services, tenant: str, request_id: str) -> ForgetState:
    row = svc.state.forget_by_request(check_tenant(tenant), request_id)
    if row is None:  # unknown, or another tenant's: the same answer
        raise NotFound(f"no forget {request_id!r}")
    if row.state in replay_check.DONE and row.completed_index is not None:
        return ForgetState(row.request_id, row.ref, "completed", receipt_of(svc, row))
    return ForgetState(row.request_id, row.ref, row.state, None)


def receipt_of(svc: Services, row: ForgetRow) -> ForgetReceipt:
    """The receipt of a forget whose erasure is done: with its ``ReplayVerified`` once logged."""
    assert row.completed_index is not None
    found = None if row.state == "replaying" else find_replay(svc.audit, row.tenant, row.request_id,
                                                              row.completed_index)
    return ForgetReceipt.from_log(svc.audit, row.completed_index, replay_index=found)


def _linked(svc: Services, tenant: str, ref: str, known: list[LinkedForm]) -> list[LinkedForm]:
    """The refs a forget of ``ref`` erases with it (``known``, then any other live ref linked
    to it by a redaction, ``StateStore.linked_refs``), each with its data key id read before the
    shred."""
    out = list(known)
    have = {x.ref for x in out}
    for r in svc.state.linked_refs(tenant, ref):
        head = svc.store.head(r, tenant)
        if r in have or head is None or head.state != "live":
            continue
        key_id, kek_version = svc.store.key_info(r, tenant)
        out.append(LinkedForm(ref=r, key_id=key_id, kek_version=kek_version))
    return out


def holders(svc: Services, tenant: str, ref: str, acting_for: str | None = None) -> list[str]:
    """Sessions that may hold ``ref``: durable ledgers, and loaded sessions whose latest
    change may not be written yet (the caller takes each one's lock). In a replicated
    deployment, those placed on this replica (or on ``acting_for``, a peer that is down)."""
    rep = svc.replication
    if rep is None:
        return sorted(set(svc.state.sessions_holding(tenant, ref)) | svc.sessions.loaded_session_ids(tenant))
    name = acting_for or rep.name
    found = set(svc.state.sessions_holding(tenant, ref, frozenset({name})))
    if name == rep.name:
        found |= svc.sessions.loaded_session_ids(tenant)
    return sorted(found)
