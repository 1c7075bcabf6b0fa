"""Audit-layer errors: all are FakErrors, so the CLI prints them without a traceback."""

from fak.errors import FakError


class AuditError(FakError):
    """Bad input to the audit log or a refused operation."""


class VerificationError(AuditError):
    """A signature, proof, checkpoint or export does not verify."""
