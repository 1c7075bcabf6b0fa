"""Forget receipts: portable evidence that a ref was forgotten, checkable offline.

A receipt repeats three logged events as their exact canonical bytes: an
``AdmissionVerdict`` for the ref (same tenant, before the request: the ref existed),
the ``ForgetRequested`` and the ``ForgetCompleted`` of one forget, with the inclusion
proof of each against ONE signed checkpoint (the first that covers the completion,
with whatever witness cosignatures it carries). Anyone holding the log's public key
can check that the log committed to the admission, the request and exactly these
dropped units, session fingerprints and shredded key, and that every session's state
after the drop equals an independent replay of its survivors; with a witness policy,
that the checkpoint is the one the witnesses saw; with their last known checkpoint,
that the receipt's is consistent with it.

A receipt that claims nothing (no unit dropped, no session touched, no key
destroyed) is refused: it is what forgetting a ref that was never stored, or was
already forgotten, would produce, so it proves no erasure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fak.audit import merkle, note
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import (
    MAX_ITEMS,
    AdmissionVerdict,
    Count,
    DroppedUnit,
    ForgetCompleted,
    ForgetRequested,
    LinkedRef,
    ReplayVerified,
    ReplicaPart,
    SessionFingerprints,
    SystemOrTenant,
    parse_event,
)
from fak.audit.proofs import ConsistencyProof, InclusionProof
from fak.audit.verify import WitnessPolicy, checkpoint_time
from fak.types import Digest, Id

if TYPE_CHECKING:
    from fak.audit.log import AuditLog

# receipt fields that repeat the logged ForgetCompleted event's
MIRRORED = ("ref", "request_id", "tenant", "units_dropped", "sessions", "shredded_key_id", "kek_version",
            "requested_index", "shred_status", "linked_refs", "replicas")  # fmt: skip


class ForgetReceipt(BaseModel):
    """What a forget did, with the log's signed proof of it. Travels as JSON
    (``model_dump(mode="json")``); check it with ``verify_receipt``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: Digest
    request_id: Id
    tenant: SystemOrTenant = ""
    units_dropped: list[DroppedUnit] = Field(max_length=MAX_ITEMS)
    sessions: list[SessionFingerprints] = Field(max_length=MAX_ITEMS)
    shredded_key_id: Id | None
    kek_version: Count | None
    requested_index: Count  # log index of ForgetRequested
    log_index: Count  # log index of ForgetCompleted
    event: str  # canonical JSON of the logged ForgetCompleted (its Merkle leaf data)
    inclusion_proof: dict[str, Any]  # Rekor-like JSON (logIndex, treeSize, rootHash, hashes) of ``event``
    requested_event: str  # canonical JSON of the logged ForgetRequested
    requested_inclusion_proof: dict[str, Any]  # of ``requested_event``, in the same tree
    checkpoint: str  # the signed note of the tree the proofs lead to, with any witness cosignatures
    # an AdmissionVerdict naming the ref (same tenant, before the request): None when the log has
    # none, and then the receipt does not verify (a ref never admitted cannot have been forgotten)
    admitted_index: Count | None = None
    admitted_event: str | None = None
    admitted_inclusion_proof: dict[str, Any] | None = None
    # from the auditor's last known tree size to the checkpoint's (``from_log(..., since=)``)
    consistency_proof: dict[str, Any] | None = None
    # the CAS's word on the destroyed key (e.g. destroyed, pending_wal_checkpoint), when logged
    shred_status: Id | None = None
    # the other refs erased with ``ref`` (a REDACTed result's other form) and their shredded keys
    linked_refs: list[LinkedRef] | None = Field(None, max_length=MAX_ITEMS)
    # a replicated deployment's replicas, each with its part (docs/scale-out.md); None: one process
    replicas: list[ReplicaPart] | None = Field(None, max_length=MAX_ITEMS, exclude_if=lambda v: v is None)
    # the independent replay of each session's survivors, logged after the forget returned
    # (``ReplayVerified``, in the same tree as the rest): None while it is pending
    replay_index: Count | None = None
    replay_event: str | None = None
    replay_inclusion_proof: dict[str, Any] | None = None

    @property
    def replay(self) -> str:
        """``verified`` (logged and equal), ``mismatch``, ``pending`` (not logged yet), ``none``
        (no session held the ref) or ``inline`` (an older receipt: the replay's fingerprints are
        in ``sessions``)."""
        if self.replay_event is not None:
            try:
                ev = parse_event(self.replay_event.encode())
            except AuditError:
                return "mismatch"
            return "verified" if isinstance(ev, ReplayVerified) and ev.verified else "mismatch"
        if not self.sessions:
            return "none"
        return "inline" if all(s.fingerprint_replay for s in self.sessions) else "pending"

    @property
    def completed_index(self) -> int:
        """The index of ForgetCompleted (``log_index``, by its older name)."""
        return self.log_index

    @classmethod
    def from_log(cls, log: AuditLog, completed_index: int, *, since: int | None = None,
                 replay_index: int | None = None) -> ForgetReceipt:
        """Build the receipt for the ForgetCompleted entry at ``completed_index`` (and the
        ReplayVerified at ``replay_index``, once logged). Every proof leads to the first signed
        checkpoint covering both (signed now if none does). ``since``: the auditor's last known
        tree size; the receipt then carries a consistency proof from it."""
        entry = log.entry(completed_index)
        ev = entry.event
        if not isinstance(ev, ForgetCompleted):
            raise AuditError(f"audit entry {completed_index} is a {ev.type}, not forget_completed")
        if ev.requested_index >= completed_index:
            raise AuditError(f"forget_completed at {completed_index} names a later request ({ev.requested_index})")
        requested = log.entry(ev.requested_index)
        req = requested.event
        if not isinstance(req, ForgetRequested) or (req.request_id, req.ref, req.tenant) != (
            ev.request_id, ev.ref, ev.tenant,
        ):  # fmt: skip
            raise AuditError(
                f"audit entry {ev.requested_index} is not the forget_requested of request {ev.request_id}"
            )
        replay = None
        if replay_index is not None:
            replay = log.entry(replay_index)
            rv = replay.event
            if not isinstance(rv, ReplayVerified) or (rv.request_id, rv.completed_index) != (
                ev.request_id, completed_index,
            ):  # fmt: skip
                raise AuditError(f"audit entry {replay_index} is not the replay of forget {ev.request_id}")
        top = None if replay_index is None else log.inclusion_proof(replay_index)  # the first checkpoint covering both
        proof = log.inclusion_proof(completed_index, size=None if top is None else top.tree_size)
        if proof.checkpoint is None:  # pragma: no cover - inclusion_proof() always attaches one
            raise AuditError(f"no signed checkpoint covers audit entry {completed_index}")
        req_proof = log.inclusion_proof(ev.requested_index, size=proof.tree_size)
        admitted = find_admission(log, ev.tenant, ev.ref, ev.requested_index)
        adm_proof = None if admitted is None else log.inclusion_proof(admitted[0], size=proof.tree_size)
        consistency = None
        if since is not None:
            if not 0 <= since <= proof.tree_size:
                raise AuditError(f"no consistency proof from size {since} to the receipt's {proof.tree_size}")
            consistency = log.consistency_proof(since, proof.tree_size).to_json()
        return cls(
            ref=ev.ref,
            request_id=ev.request_id,
            tenant=ev.tenant,
            units_dropped=list(ev.units_dropped),
            sessions=list(ev.sessions),
            shredded_key_id=ev.shredded_key_id,
            kek_version=ev.kek_version,
            shred_status=getattr(ev, "shred_status", None),
            linked_refs=ev.linked_refs, replicas=ev.replicas,
            requested_index=ev.requested_index,
            log_index=completed_index,
            event=entry.body.decode(),
            inclusion_proof=_bare(proof),
            requested_event=requested.body.decode(),
            requested_inclusion_proof=_bare(req_proof),
            checkpoint=proof.checkpoint,
            admitted_index=None if admitted is None else admitted[0],
            admitted_event=None if admitted is None else admitted[1].decode(),
            admitted_inclusion_proof=None if adm_proof is None else _bare(adm_proof),
            consistency_proof=consistency,
            replay_index=replay_index,
            replay_event=None if replay is None else replay.body.decode(),
            replay_inclusion_proof=None if top is None else _bare(top),
        )


def find_admission(log: AuditLog, tenant: str, ref: str, before: int) -> tuple[int, bytes] | None:
    """``AuditLog.find_admission`` (the query lives with the log's storage)."""
    return log.find_admission(tenant, ref, before)


def find_replay(log: AuditLog, tenant: str, request_id: str, after: int) -> int | None:
    """``AuditLog.find_replay`` (the query lives with the log's storage)."""
    return log.find_replay(tenant, request_id, after)


def _bare(proof: InclusionProof) -> dict[str, Any]:
    body = proof.to_json()
    body.pop("checkpoint", None)  # the receipt carries the one checkpoint once
    return body


@dataclass(frozen=True)
class ReceiptCheck:
    ok: bool
    reason: str = ""
    detail: str = ""  # when ok: what beyond the log's signature backs it (witnesses, consistency)
    replay: str = ""  # when ok: verified | pending (not logged yet) | none (no session) | inline (older)

    def __bool__(self) -> bool:
        return self.ok


class _Refused(Exception):
    pass


def verify_receipt(
    receipt: ForgetReceipt | dict[str, Any],
    pubkey: str,
    *,
    witnesses: WitnessPolicy | Sequence[str] | None = None,
    quorum: int | None = None,
    last_checkpoint: str | SignedCheckpoint | None = None,
    consistency_proof: dict[str, Any] | ConsistencyProof | None = None,
    require_replay: bool = False,
) -> ReceiptCheck:
    """Check a receipt offline against the log's pinned verifier key (``public_key()``):

    the checkpoint's signature; with ``witnesses`` (a policy, or witness vkeys with ``quorum``,
    default all), at least the quorum of valid cosignatures on it; with ``last_checkpoint`` (the
    newest signed checkpoint the auditor trusts), that the receipt's checkpoint is consistent
    with it (a consistency proof from the receipt or ``consistency_proof``); both forget events
    are canonical, the completion a forget_completed and the request the forget_requested of
    the same request id, ref and tenant at ``requested_index`` (before the completion); an
    admission_verdict of the same tenant naming the ref is logged before the request; the
    receipt's fields equal the logged completion's (``linked_refs`` included: the other form of a
    REDACTed result, erased with it); the completion erases every linked ref the request named;
    every inclusion proof leads to the signed
    root; the forget claims some erasure; every session that lost a segment has fingerprints;
    every session's fingerprint after the drop equals that of the replay of its survivors:
    in ``sessions`` (older receipts) or in the ``ReplayVerified`` event when present (same
    forget, every session, its own inclusion proof). A receipt whose replay is not logged yet
    verifies with ``replay == "pending"`` (the erasure is proven; the replay comes later),
    unless ``require_replay``.
    """
    detail: list[str] = []
    try:
        r = receipt if isinstance(receipt, ForgetReceipt) else ForgetReceipt.model_validate(receipt)
        cp = _checkpoint(r.checkpoint, pubkey)
        policy = _policy(witnesses, quorum)
        if policy is not None and policy.quorum:
            try:
                check = policy.check(r.checkpoint)
            except VerificationError as exc:
                raise _Refused(f"checkpoint cosignature: {exc}") from None
            if not check.ok:
                raise _Refused(f"witness quorum not met on the receipt's checkpoint: {check.describe()}")
            detail.append(f"witnessed by {', '.join(sorted(check.cosigned))} (quorum {check.quorum})")
        if last_checkpoint is not None:
            detail.append(_consistent(r, cp, pubkey, last_checkpoint, consistency_proof))
        done = _event(r.event, ForgetCompleted, "completed")
        asked = _event(r.requested_event, ForgetRequested, "requested")
        for name in MIRRORED:
            if getattr(done, name, None) != getattr(r, name):
                raise _Refused(f"receipt {name} differs from the logged forget_completed")
        if (asked.request_id, asked.ref, asked.tenant) != (done.request_id, done.ref, done.tenant):
            raise _Refused("the requested event is not the request of this forget (request id, ref or tenant)")
        if not r.requested_index < r.log_index:
            raise _Refused("the request is not logged before its completion")
        _linked(asked, done)
        _included(r.inclusion_proof, r.event, r.log_index, cp, "completed event")
        _included(r.requested_inclusion_proof, r.requested_event, r.requested_index, cp, "requested event")
        _admitted(r, done, cp)
        _claims(r)
        replay = _replay(r, done, cp)
        if replay == "pending" and require_replay:
            raise _Refused("the independent replay of the survivors is not in this receipt yet (pending): "
                           "fetch the receipt again once it is logged")
    except _Refused as exc:
        return ReceiptCheck(False, str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "receipt"
        return ReceiptCheck(False, f"malformed receipt: {where}: {err['msg']}")
    except (AuditError, ValueError) as exc:
        return ReceiptCheck(False, str(exc).splitlines()[0])
    stamp = checkpoint_time(cp)
    if stamp is not None:
        detail.append(f"checkpoint signed at {stamp}")
    if r.shred_status not in (None, "destroyed"):
        detail.append(f"the CAS says the destroyed key is not yet scrubbed from storage: {r.shred_status}")
    if replay == "pending":
        detail.append("the independent replay of the survivors is pending (not logged yet)")
    return ReceiptCheck(True, detail="; ".join(detail) or "no witness policy or last checkpoint given",
                        replay=replay)


def _policy(witnesses: WitnessPolicy | Sequence[str] | None, quorum: int | None) -> WitnessPolicy | None:
    if witnesses is None:
        if quorum:
            raise _Refused(f"a quorum of {quorum} needs witnesses")
        return None
    if isinstance(witnesses, WitnessPolicy):
        if quorum is not None and quorum != witnesses.quorum:
            return WitnessPolicy(witnesses.witnesses, quorum, witnesses.log_key)
        return witnesses
    if isinstance(witnesses, str):
        witnesses = [witnesses]
    return WitnessPolicy.from_keys(witnesses, quorum)


def _consistent(
    r: ForgetReceipt,
    cp: SignedCheckpoint,
    pubkey: str,
    last: str | SignedCheckpoint,
    given: dict[str, Any] | ConsistencyProof | None,
) -> str:
    """The receipt's checkpoint and the auditor's last known one are of one history."""
    known = last if isinstance(last, SignedCheckpoint) else None
    if known is None:
        try:
            known = open_checkpoint(str(last), note.Verifier.parse(pubkey.strip()), cp.origin)
        except VerificationError as exc:
            raise _Refused(f"the last known checkpoint does not verify with the pinned key: {exc}") from None
    if known.size == cp.size:
        if known.root != cp.root:
            raise _Refused(f"the receipt's checkpoint is not consistent with the last known one: two roots "
                           f"for size {cp.size} (a split view)")  # fmt: skip
        return f"same tree as the last known checkpoint (size {cp.size})"
    old, new = (known, cp) if known.size < cp.size else (cp, known)
    candidates = [p for p in (given, r.consistency_proof) if p is not None]
    if not candidates:
        raise _Refused(f"the receipt's checkpoint (size {cp.size}) cannot be checked against the last known one "
                       f"(size {known.size}): no consistency proof between them")  # fmt: skip
    for raw in candidates:
        proof = raw if isinstance(raw, ConsistencyProof) else _consistency_json(raw)
        if (proof.size1, proof.size2) != (old.size, new.size):
            continue
        try:
            merkle.verify_consistency(old.size, new.size, old.root, new.root, proof.hashes)
        except merkle.ProofError as exc:
            raise _Refused(f"the receipt's checkpoint is not consistent with the last known one: {exc}") from None
        return f"consistent with the last known checkpoint (size {known.size})"
    raise _Refused(f"the receipt's checkpoint is not consistent with the last known one: no consistency proof "
                   f"from size {old.size} to {new.size}")  # fmt: skip


def _consistency_json(data: dict[str, Any]) -> ConsistencyProof:
    try:
        return ConsistencyProof(size1=int(data["oldSize"]), size2=int(data["treeSize"]),
                                root1=bytes(32), root2=bytes(32),
                                hashes=[bytes.fromhex(h) for h in data["hashes"]])  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise _Refused(f"malformed consistency proof JSON: {exc}") from None


def _admitted(r: ForgetReceipt, done: ForgetCompleted, cp: SignedCheckpoint) -> None:
    if r.admitted_event is None or r.admitted_index is None or r.admitted_inclusion_proof is None:
        raise _Refused(f"no admission of {done.ref} in the log: a ref that was never admitted cannot have "
                       "been forgotten (the receipt carries no admission_verdict and its proof)")  # fmt: skip
    adm = _event(r.admitted_event, AdmissionVerdict, "admission")
    if adm.tenant != done.tenant or done.ref not in (adm.ref, adm.admitted_ref):
        raise _Refused("the admission event is not an admission of this ref by this tenant")
    if not r.admitted_index < r.requested_index:
        raise _Refused("the admission is not logged before the request")
    _included(r.admitted_inclusion_proof, r.admitted_event, r.admitted_index, cp, "admission event")


def _linked(asked: ForgetRequested, done: ForgetCompleted) -> None:
    """Every ref the request said it would erase with the forgotten one is erased (the
    completion may name more: a link recorded while the forget ran), each once, none the ref."""
    erased = [x.ref for x in done.linked_refs or ()]
    if len(set(erased)) != len(erased) or done.ref in erased:
        raise _Refused("the completion's linked_refs repeat a ref or name the forgotten ref itself")
    missing = set(asked.linked_refs or ()) - set(erased)
    if missing:
        raise _Refused(f"the request's linked_refs {sorted(missing)} are not erased by the completion")


def _replay(r: ForgetReceipt, done: ForgetCompleted, cp: SignedCheckpoint) -> str:
    """The replay half: ``inline`` (older receipts: checked by ``_claims``), ``pending``, or the
    logged ``ReplayVerified`` checked against the completion (refused unless every session's
    replay equals its fingerprint after the drop)."""
    if r.replay_event is None:
        if r.replay_index is not None or r.replay_inclusion_proof is not None:
            raise _Refused("the receipt names a replay without its event")
        if not r.sessions:
            return "none"  # no session held the ref: nothing to replay
        return "inline" if all(s.fingerprint_replay for s in r.sessions) else "pending"
    if r.replay_index is None or r.replay_inclusion_proof is None:
        raise _Refused("the replay event comes without its index or inclusion proof")
    rv = _event(r.replay_event, ReplayVerified, "replay")
    if (rv.request_id, rv.ref, rv.tenant, rv.completed_index) != (done.request_id, done.ref, done.tenant, r.log_index):
        raise _Refused("the replay event is not the replay of this forget (request id, ref, tenant or completion)")
    if not r.log_index < r.replay_index:
        raise _Refused("the replay is not logged after the completion")
    _included(r.replay_inclusion_proof, r.replay_event, r.replay_index, cp, "replay event")
    after = {s.session_id: s.fingerprint_after for s in done.sessions}
    got = {s.session_id: s.fingerprint_replay for s in rv.sessions}
    if set(got) != set(after) or len(got) != len(rv.sessions):
        raise _Refused("the replay event does not cover exactly the sessions of the completion")
    for sid, fp in sorted(got.items()):
        if fp is None:
            raise _Refused(f"session {sid}: its survivors could not be replayed (the replay is not verified)")
        if fp != after[sid]:
            raise _Refused(f"session {sid}: state after the drop differs from a replay of its survivors")
    if not rv.verified:
        raise _Refused("the replay event says the replay did not verify")
    return "verified"


def _checkpoint(signed: str, pubkey: str) -> SignedCheckpoint:
    verifier = note.Verifier.parse(pubkey.strip())
    try:
        return open_checkpoint(signed, verifier, verifier.name)
    except VerificationError as exc:
        raise _Refused(f"checkpoint does not verify with the pinned key: {str(exc).splitlines()[0]}") from None


_E = TypeVar("_E", bound=BaseModel)


def _event(raw: str, kind: type[_E], what: str) -> _E:
    try:
        ev = parse_event(raw.encode())
    except AuditError as exc:
        raise _Refused(f"{what} event: {exc}") from None
    if not isinstance(ev, kind):
        want = kind.model_fields["type"].default
        raise _Refused(f"{what} event is a {ev.type}, not {want}")
    return ev


def _included(proof_json: dict[str, Any], raw: str, index: int, cp: SignedCheckpoint, what: str) -> None:
    proof = InclusionProof.from_json(proof_json)
    if proof.log_index != index:
        raise _Refused(f"inclusion proof of the {what} is for index {proof.log_index}, not {index}")
    if proof.tree_size != cp.size or proof.root_hash != cp.root:
        raise _Refused(f"inclusion proof of the {what} does not lead to the signed checkpoint")
    try:
        proof.verify(merkle.hash_leaf(raw.encode()))
    except merkle.ProofError as exc:
        raise _Refused(f"inclusion proof of the {what} does not verify: {exc}") from None


def _claims(r: ForgetReceipt) -> None:
    if not r.units_dropped and not r.sessions and r.shredded_key_id is None:
        raise _Refused(
            "the forget erased nothing (no unit dropped, no session, no key destroyed): "
            "a forget of a ref that was never stored or was already forgotten proves no erasure"
        )
    for s in r.sessions:
        if s.fingerprint_replay is not None and s.fingerprint_after != s.fingerprint_replay:
            raise _Refused(f"session {s.session_id}: state after the drop differs from a replay of its survivors")
    proved = {s.session_id for s in r.sessions}
    for u in r.units_dropped:
        if u.kind in ("segment", "generated_segment") and u.session_id is not None and u.session_id not in proved:
            raise _Refused(f"session {u.session_id} lost {u.kind} {u.id} but the receipt has no fingerprints for it")


__all__ = ["MIRRORED", "ForgetReceipt", "ReceiptCheck", "VerificationError", "find_admission", "find_replay",
           "verify_receipt"]
