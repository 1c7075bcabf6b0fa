"""Audit-layer errors: all are FakErrors, so the CLI prints them without a traceback, each
with a stable ``code`` (see ``fak.errors``)."""

from fak.errors import FakError


class AuditError(FakError):
    """Bad input to the audit log or a refused operation."""

    code = "audit_error"
    status = 500


class VerificationError(AuditError):
    """A signature, proof, checkpoint or export does not verify."""

    code = "verification_failed"
    status = 400
