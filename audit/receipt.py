"""Forget receipts: portable evidence that a ref was forgotten, checkable offline.

The receipt repeats the logged ``ForgetCompleted`` event (its exact canonical
bytes), the inclusion proof of that entry and the signed checkpoint the proof
leads to. Anyone holding the log's public key can check that the log
committed to exactly these units, fingerprints and shredded key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from fak.audit import merkle, note
from fak.audit.checkpoint import open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import Digest, DroppedUnit, ForgetCompleted, Id, SystemOrTenant, parse_event
from fak.audit.proofs import InclusionProof

if TYPE_CHECKING:
    from fak.audit.log import AuditLog


class ForgetReceipt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: Digest
    request_id: Id
    tenant: SystemOrTenant = ""
    units_dropped: list[DroppedUnit]
    fingerprint_after: Digest
    fingerprint_replay: Digest
    shredded_key_id: Id
    log_index: int
    event: str  # canonical JSON of the logged ForgetCompleted event (the Merkle leaf data)
    inclusion_proof: dict  # Rekor-like JSON: logIndex, treeSize, rootHash, hashes
    checkpoint: str  # the signed note of the tree the proof leads to

    @classmethod
    def from_log(cls, log: AuditLog, index: int) -> ForgetReceipt:
        """Build the receipt for the ForgetCompleted entry at ``index`` (signs a checkpoint
        covering it if none does yet)."""
        entry = log.entry(index)
        ev = entry.event
        if not isinstance(ev, ForgetCompleted):
            raise AuditError(f"audit entry {index} is a {ev.type}, not forget_completed")
        proof = log.inclusion_proof(index)
        assert proof.checkpoint is not None
        body = proof.to_json()
        body.pop("checkpoint", None)
        return cls(
            ref=ev.ref,
            request_id=ev.request_id,
            tenant=ev.tenant,
            units_dropped=list(ev.units_dropped),
            fingerprint_after=ev.fingerprint_after,
            fingerprint_replay=ev.fingerprint_replay,
            shredded_key_id=ev.shredded_key_id,
            log_index=index,
            event=entry.body.decode(),
            inclusion_proof=body,
            checkpoint=proof.checkpoint,
        )


@dataclass(frozen=True)
class ReceiptCheck:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


_MIRRORED = ("ref", "request_id", "tenant", "units_dropped", "fingerprint_after", "fingerprint_replay",
             "shredded_key_id")


def verify_receipt(receipt: ForgetReceipt | dict, pubkey: str) -> ReceiptCheck:
    """Check signature, inclusion, that the receipt says what the log says, and that the
    state after the drop equals the replay of the survivors."""
    try:
        r = receipt if isinstance(receipt, ForgetReceipt) else ForgetReceipt.model_validate(receipt)
        verifier = note.Verifier.parse(pubkey)
        cp = open_checkpoint(r.checkpoint, verifier, verifier.name)
        ev = parse_event(r.event.encode())
        if not isinstance(ev, ForgetCompleted):
            return ReceiptCheck(False, f"logged event is a {ev.type}, not forget_completed")
        for name in _MIRRORED:
            if getattr(ev, name) != getattr(r, name):
                return ReceiptCheck(False, f"receipt {name} differs from the logged event")
        proof = InclusionProof.from_json(r.inclusion_proof)
        if proof.log_index != r.log_index or proof.tree_size != cp.size or proof.root_hash != cp.root:
            return ReceiptCheck(False, "inclusion proof does not match the index or the signed checkpoint")
        proof.verify(merkle.hash_leaf(r.event.encode()))
    except (AuditError, ValueError) as exc:
        return ReceiptCheck(False, str(exc).splitlines()[0])
    if r.fingerprint_after != r.fingerprint_replay:
        return ReceiptCheck(False, "state after the drop differs from a replay of the survivors")
    return ReceiptCheck(True)


__all__ = ["ForgetReceipt", "ReceiptCheck", "VerificationError", "verify_receipt"]
