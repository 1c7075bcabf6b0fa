"""Forget receipts: portable evidence that a ref was forgotten, checkable offline.

A receipt repeats the two logged events of one forget, ``ForgetRequested`` and
``ForgetCompleted``, as their exact canonical bytes, with the inclusion proof of
each against ONE signed checkpoint (the first that covers the completion).
Anyone holding the log's public key can check that the log committed to the
request and to exactly these dropped units, session fingerprints and shredded
key, and that every session's state after the drop equals an independent replay
of its survivors.

A receipt that claims nothing (no unit dropped, no session touched, no key
destroyed) is refused: it is what forgetting a ref that was never stored, or was
already forgotten, would produce, so it proves no erasure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fak.audit import merkle, note
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import (
    MAX_ITEMS,
    Count,
    Digest,
    DroppedUnit,
    ForgetCompleted,
    ForgetRequested,
    Id,
    SessionFingerprints,
    SystemOrTenant,
    parse_event,
)
from fak.audit.proofs import InclusionProof

if TYPE_CHECKING:
    from fak.audit.log import AuditLog

# receipt fields that repeat the logged ForgetCompleted event's
MIRRORED = ("ref", "request_id", "tenant", "units_dropped", "sessions", "shredded_key_id", "kek_version",
            "requested_index")  # fmt: skip


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
    inclusion_proof: dict  # Rekor-like JSON (logIndex, treeSize, rootHash, hashes) of ``event``
    requested_event: str  # canonical JSON of the logged ForgetRequested
    requested_inclusion_proof: dict  # of ``requested_event``, in the same tree
    checkpoint: str  # the signed note of the tree both proofs lead to

    @classmethod
    def from_log(cls, log: AuditLog, completed_index: int) -> ForgetReceipt:
        """Build the receipt for the ForgetCompleted entry at ``completed_index``. Both
        proofs lead to the first signed checkpoint covering it (signed now if none does)."""
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
        proof = log.inclusion_proof(completed_index)
        if proof.checkpoint is None:  # pragma: no cover - inclusion_proof() always attaches one
            raise AuditError(f"no signed checkpoint covers audit entry {completed_index}")
        req_proof = log.inclusion_proof(ev.requested_index, size=proof.tree_size)
        return cls(
            ref=ev.ref,
            request_id=ev.request_id,
            tenant=ev.tenant,
            units_dropped=list(ev.units_dropped),
            sessions=list(ev.sessions),
            shredded_key_id=ev.shredded_key_id,
            kek_version=ev.kek_version,
            requested_index=ev.requested_index,
            log_index=completed_index,
            event=entry.body.decode(),
            inclusion_proof=_bare(proof),
            requested_event=requested.body.decode(),
            requested_inclusion_proof=_bare(req_proof),
            checkpoint=proof.checkpoint,
        )


def _bare(proof: InclusionProof) -> dict:
    body = proof.to_json()
    body.pop("checkpoint", None)  # the receipt carries the one checkpoint once
    return body


@dataclass(frozen=True)
class ReceiptCheck:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class _Refused(Exception):
    pass


def verify_receipt(receipt: ForgetReceipt | dict, pubkey: str) -> ReceiptCheck:
    """Check a receipt offline against the log's pinned verifier key (``public_key()``):

    the checkpoint's signature; both events are canonical, the completion a
    forget_completed and the request the forget_requested of the same request id, ref
    and tenant at ``requested_index`` (before the completion); the receipt's fields
    equal the logged completion's; both inclusion proofs lead to the signed root; the
    forget claims some erasure; every session's fingerprint after the drop equals that
    of the replay of its survivors, and every session that lost a segment has them.
    """
    try:
        r = receipt if isinstance(receipt, ForgetReceipt) else ForgetReceipt.model_validate(receipt)
        cp = _checkpoint(r.checkpoint, pubkey)
        done = _event(r.event, ForgetCompleted, "completed")
        asked = _event(r.requested_event, ForgetRequested, "requested")
        for name in MIRRORED:
            if getattr(done, name) != getattr(r, name):
                raise _Refused(f"receipt {name} differs from the logged forget_completed")
        if (asked.request_id, asked.ref, asked.tenant) != (done.request_id, done.ref, done.tenant):
            raise _Refused("the requested event is not the request of this forget (request id, ref or tenant)")
        if not r.requested_index < r.log_index:
            raise _Refused("the request is not logged before its completion")
        _included(r.inclusion_proof, r.event, r.log_index, cp, "completed event")
        _included(r.requested_inclusion_proof, r.requested_event, r.requested_index, cp, "requested event")
        _claims(r)
    except _Refused as exc:
        return ReceiptCheck(False, str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "receipt"
        return ReceiptCheck(False, f"malformed receipt: {where}: {err['msg']}")
    except (AuditError, ValueError) as exc:
        return ReceiptCheck(False, str(exc).splitlines()[0])
    return ReceiptCheck(True)


def _checkpoint(signed: str, pubkey: str) -> SignedCheckpoint:
    verifier = note.Verifier.parse(pubkey.strip())
    try:
        return open_checkpoint(signed, verifier, verifier.name)
    except VerificationError as exc:
        raise _Refused(f"checkpoint does not verify with the pinned key: {str(exc).splitlines()[0]}") from None


def _event(raw: str, kind: type, what: str):  # noqa: ANN202
    try:
        ev = parse_event(raw.encode())
    except AuditError as exc:
        raise _Refused(f"{what} event: {exc}") from None
    if not isinstance(ev, kind):
        want = kind.model_fields["type"].default
        raise _Refused(f"{what} event is a {ev.type}, not {want}")
    return ev


def _included(proof_json: dict, raw: str, index: int, cp: SignedCheckpoint, what: str) -> None:
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
        if s.fingerprint_after != s.fingerprint_replay:
            raise _Refused(f"session {s.session_id}: state after the drop differs from a replay of its survivors")
    proved = {s.session_id for s in r.sessions}
    for u in r.units_dropped:
        if u.kind in ("segment", "generated_segment") and u.session_id is not None and u.session_id not in proved:
            raise _Refused(f"session {u.session_id} lost {u.kind} {u.id} but the receipt has no fingerprints for it")


__all__ = ["MIRRORED", "ForgetReceipt", "ReceiptCheck", "VerificationError", "verify_receipt"]
