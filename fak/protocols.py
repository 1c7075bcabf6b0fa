"""The seams the kernel talks through, typed instead of ``Any``.

``ContentStore`` is the part of ``fak.cas.CasStore`` the kernel uses (``Services.store``),
``AuditSink`` the part of ``fak.audit.AuditLog`` that only appends (the API-key store, the
key operations), ``Gate`` the shape of ``fak.policy.gate`` (``Services.gate``). A test
double, a remote store or another log implements the same methods and the kernel does
not notice. The Protocols are ``runtime_checkable``: ``isinstance(x, ContentStore)``
checks that the methods exist (not their signatures; the type checker does that).

Importing this module imports no layer: the model types are named for the type
checker only.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fak.audit.checkpoint import SignedCheckpoint
    from fak.audit.log_reads import LogEntry
    from fak.audit.proofs import InclusionProof
    from fak.cas.models import Ref, ShredRecord, TenantErasure, Use
    from fak.policy.policy import Policy
    from fak.policy.verdict import GateContext, Verdict


@runtime_checkable
class ContentStore(Protocol):
    """Content-addressed, per-tenant storage of tool results (``fak.cas.CasStore``)."""

    def put(self, data: bytes, media_type: str, tenant: str) -> Ref:
        """Store bytes (idempotent); the keyed ref."""
        ...

    def head(self, digest: str, tenant: str) -> Ref | None:
        """The ref (live or forgotten), or None if this tenant never held it."""
        ...

    def get(self, ref_or_digest: Ref | str, tenant: str) -> bytes:
        """The verified bytes (``NotFound`` / ``Forgotten`` otherwise)."""
        ...

    def set_taint(self, digest: str, tenant: str, taint: str) -> Ref: ...

    def record_use(self, digest: str, tenant: str, unit_kind: str, unit_id: str) -> Use:
        """Record that a KV unit references the ref."""
        ...

    def release_use(self, digest: str, tenant: str, unit_kind: str, unit_id: str) -> bool: ...

    def where_used(self, digest: str, tenant: str) -> list[Use]: ...

    def key_info(self, digest: str, tenant: str) -> tuple[str | None, int | None]: ...

    def content_keys(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]:
        """The data keys of live refs, to seal what derives from them (``fak.state.seal``)."""
        ...

    def digest_of(self, data: bytes, tenant: str, *, keyed: bool = True) -> str: ...

    def forget(self, digest: str, tenant: str) -> ShredRecord:
        """Destroy the ref's data key and ciphertext; what was destroyed."""
        ...

    def erase_tenant(self, tenant: str) -> TenantErasure:
        """Crypto-erase a whole tenant: every key it has and every ref of it (``Kernel.erase_tenant``)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AuditSink(Protocol):
    """The append-only signed log every decision lands in (``fak.audit.AuditLog``)."""

    def append(self, event: object) -> int:
        """Append an event (a model or a dict); its gap-free index once durable."""
        ...

    def submit(self, event: object) -> Future[int]:
        """Queue an event; the future resolves to its index once durable."""
        ...

    def checkpoint(self) -> SignedCheckpoint: ...

    def entry(self, index: int) -> LogEntry: ...

    def inclusion_proof(self, index: int, size: int | None = None) -> InclusionProof: ...

    def public_key(self) -> str:
        """The verifier key auditors pin."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Gate(Protocol):
    """The admission gate (``fak.policy.gate``): a verdict on a tool result's bytes."""

    def __call__(self, policy: Policy, tool: str, data: bytes, context: GateContext | None = None, /) -> Verdict: ...


__all__ = ["AuditSink", "ContentStore", "Gate"]
