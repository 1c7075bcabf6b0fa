"""Who asks: the tenant an operation acts for, the principal the audit log names, and the
rights it holds. Every operation of the REST layer (``fak.kernel.operations``) and of the
OpenAI door (``fak.kernel.openai``) takes a ``Caller`` and checks its right itself, so the
in-process client, which has no API key, acts with the rights it was given and nothing
more; the API maps a key's role to rights (``fak.api.deps.caller``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from fak.errors import Forbidden


class Right(StrEnum):
    """What a caller may do within its tenant."""

    READ = "read"  # list and read sessions, ref metadata, check a receipt
    AGENT = "agent"  # sessions, tool results, generation, quarantine, ref bytes
    AUDIT = "audit"  # the tenant's audit rows, proofs, export, forget status
    ADMIN = "admin"  # forget
    APPROVE = "approve"  # decide a tool call held for a person (never one the caller's own request produced)


@dataclass(frozen=True)
class Caller:
    """Who asks: the tenant acted for, the principal the audit log names, the rights held."""

    tenant: str
    principal: str
    rights: frozenset[Right] = field(default_factory=lambda: frozenset(Right))

    def require(self, right: Right) -> None:
        if right not in self.rights:
            raise Forbidden(f"{self.principal} may not do this (needs the {right.value} right)")


CONTENT = Right.AGENT  # the right that reads content (``reads_content``)


def reads_content(c: Caller) -> bool:
    """The one rule for who reads content: generated text, tool-call arguments, tool-result
    bytes and a chain's instructions. Content may be personal data or secrets, and the audit
    log keeps only keyed digests of it, so it is read with the ``agent`` right: the agent keys
    that produce it and admins (who hold every right). An auditor verifies decisions, digests
    and provenance, not content. Every route, console page and SDK call that could show
    content asks here (docs/api.md, "Who reads content")."""
    return CONTENT in c.rights


def reads_held_call(c: Caller) -> bool:
    """Who reads a held call's arguments and findings: the readers of content, and the person
    who decides it (the ``approve`` right: a call is not decided blind)."""
    return reads_content(c) or Right.APPROVE in c.rights


def require_content(c: Caller) -> None:
    """``Forbidden`` (403) unless ``reads_content(c)``."""
    if not reads_content(c):
        raise Forbidden(f"{c.principal} may not read content (generated text, tool-call arguments, tool results): "
                        f"it needs the {CONTENT.value} right")
