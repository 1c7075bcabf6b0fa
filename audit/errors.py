"""Audit-layer errors: all are FakErrors, so the CLI prints them without a traceback, each
with a stable ``code`` (see ``fak.errors``)."""

from fak.errors import FakError


class AuditError(FakError, code="audit_error", status=500):
    """Bad input to the audit log or a refused operation."""


class VerificationError(AuditError, code="verification_failed", status=400):
    """A signature, proof, checkpoint or export does not verify."""


class AuditUnverified(AuditError, code="audit_unverified", status=409):
    """The log's signer is in alarm: the database's history disagrees with what it signed, so
    what the database holds is not presented as the log (entries, proofs, exports) until an
    operator resolves it. 409, not 503: retrying does not help, the operator's reset does."""

    def __init__(self, alarm: str, message: str, remembered_size: int | None = None,
                 found_size: int | None = None) -> None:
        super().__init__(message)
        self.alarm = alarm  # the AuditAlarm kind: history_rewritten, signer_state_ahead, ...
        self.remembered_size = remembered_size
        self.found_size = found_size

    def problem_members(self) -> dict[str, object]:
        """Extension members of its problem+json answer (RFC 9457 section 3.2)."""
        return {"alarm": self.alarm, "remembered_size": self.remembered_size, "found_size": self.found_size}
