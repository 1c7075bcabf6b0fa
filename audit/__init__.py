"""fak.audit — a signed, verifiable RFC 9162 Merkle log of every decision.

See docs/audit.md. Main entry points::

    log = AuditLog.open()                 # shared fak database, key in the data dir
    i = log.append(AdmissionVerdict(...)) # durable, gap-free index
    log.inclusion_proof(i).to_tlog_proof()
    verify_export(path, pubkey=log.public_key())

Imports are lazy so ``import fak.audit`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AuditLog": "fak.audit.log",
    "LogEntry": "fak.audit.log_reads",
    "SignedCheckpoint": "fak.audit.checkpoint",
    "InclusionProof": "fak.audit.proofs",
    "ConsistencyProof": "fak.audit.proofs",
    "verify_tlog_proof": "fak.audit.proofs",
    "parse_tlog_proof": "fak.audit.proofs",
    "VerifyReport": "fak.audit.verify",
    "verify_export": "fak.audit.verify",
    "ForgetReceipt": "fak.audit.receipt",
    "ReceiptCheck": "fak.audit.receipt",
    "verify_receipt": "fak.audit.receipt",
    "AuditError": "fak.audit.errors",
    "VerificationError": "fak.audit.errors",
    "AdmissionVerdict": "fak.audit.events",
    "Eviction": "fak.audit.events",
    "Materialisation": "fak.audit.events",
    "ForgetRequested": "fak.audit.events",
    "ForgetCompleted": "fak.audit.events",
    "DroppedUnit": "fak.audit.events",
    "SessionFingerprints": "fak.audit.events",
    "MaterialisedPiece": "fak.audit.events",
    "RefQuarantined": "fak.audit.events",
    "RefExpired": "fak.audit.events",
    "ToolCallDecision": "fak.audit.events",
    "ToolCallApproval": "fak.audit.events",
    "TenantEraseRequested": "fak.audit.events",
    "TenantErased": "fak.audit.events",
    "SessionRebuilt": "fak.audit.events",
    "ChangeRolledBack": "fak.audit.events",
    "SystemOrTenant": "fak.audit.events",
    "to_event": "fak.audit.events",
    "parse_event": "fak.audit.events",
    "PolicyLoaded": "fak.audit.events",
    "JudgeScope": "fak.audit.events",
    "KeyRotated": "fak.audit.events",
    "KeysDestroyed": "fak.audit.events",
    "AuthFailure": "fak.audit.events",
    "AuthFailures": "fak.audit.events",
    "KeyCreated": "fak.audit.events",
    "KeyRevoked": "fak.audit.events",
    "KeyAlarm": "fak.audit.events",
    "AuditAlarm": "fak.audit.events",
    "ReplayVerified": "fak.audit.events",
    "WitnessEndpoint": "fak.audit.witness",
    "Event": "fak.audit.events",
    "canonical": "fak.audit.events",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fak.audit' has no attribute {name!r}")
