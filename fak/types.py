"""One vocabulary of identifier types, shared by every layer.

A tenant the CAS accepts must be one the audit log can record and the API can
route, so the grammar lives here once. Each type comes twice: as a pydantic
``Annotated`` type (for models and the OpenAPI schema) and as a plain check
function raising ``fak.errors.InvalidInput`` (for code paths without a model).

- ``Tenant``: 1-64 characters from letters, digits and ``. _ @ -``, starting
  alphanumeric. The audit log records system events with the empty tenant; its
  events use their own ``SystemOrTenant`` (``""`` or a Tenant).
- ``Digest``: an OCI-style digest ``<algorithm>:<hex>`` (32-128 lowercase hex
  digits), e.g. ``blake3k:<64 hex>`` or ``sha256:<64 hex>``. The CAS accepts a
  narrower set (``fak.cas.digest``): only the algorithms it computes.
- ``Id``: an identifier or code: 1-128 characters, no spaces, quotes or newlines.

``VerdictKind`` (the gate's admission verdicts) lives here too: the KV ledger records it on
a segment and the policy layer decides it, and neither may import the other.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import StringConstraints

from fak.errors import InvalidInput, shown

TENANT_MAX = 64
TENANT_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._@-]{{0,{TENANT_MAX - 1}}}$"
DIGEST_PATTERN = r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-f]{32,128}$"
ID_PATTERN = r"^[A-Za-z0-9._:@/+=-]{1,128}$"

Tenant = Annotated[str, StringConstraints(strict=True, pattern=TENANT_PATTERN)]
Digest = Annotated[str, StringConstraints(strict=True, pattern=DIGEST_PATTERN)]
Id = Annotated[str, StringConstraints(strict=True, pattern=ID_PATTERN)]

# fullmatch: ``$`` alone would also accept a trailing newline in Python's re
_TENANT = re.compile(TENANT_PATTERN)
_DIGEST = re.compile(DIGEST_PATTERN)
_ID = re.compile(ID_PATTERN)


# How a tool is classified from its schema (kernel/calls/tool_classes.py): what its call does,
# and what each routing argument routes. The policy's ``classes`` and the audit log's
# ``ToolClassRecord`` both speak these words.
ToolEffect = Literal["read", "side_effect"]
RoutingKind = Literal["recipient", "channel", "phone", "url", "account", "amount", "path", "command"]
ClassBasis = Literal["schema", "arguments", "name", "policy"]


class VerdictKind(StrEnum):
    """Admission verdicts, least to most restrictive (see docs/design.md, Verdicts). The values
    are the strings persisted in ledgers and audit events."""

    ALLOW = "ALLOW"
    REDACT = "REDACT"
    QUARANTINE = "QUARANTINE"
    DENY = "DENY"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {VerdictKind.ALLOW: 0, VerdictKind.REDACT: 1, VerdictKind.QUARANTINE: 2, VerdictKind.DENY: 3}

_TENANT_CHAR = re.compile(r"[A-Za-z0-9._@-]")
_ID_CHAR = re.compile(r"[A-Za-z0-9._:@/+=-]")


def _check(
    value: object, pattern: re.Pattern[str], what: str, rule: str, max_len: int | None,
    char: re.Pattern[str] | None = None,
) -> str:  # fmt: skip
    if not isinstance(value, str):
        raise InvalidInput(f"invalid {what}: expected a string, got {type(value).__name__}")
    if pattern.fullmatch(value):
        return value
    bad = next((i for i, c in enumerate(value) if not char.fullmatch(c)), None) if char else None
    if not value:
        problem = "it is empty"
    elif max_len is not None and len(value) > max_len:
        problem = f"it has {len(value)} characters, at most {max_len} are allowed"
    elif bad is not None:
        problem = f"character {value[bad]!r} at position {bad} is not allowed"
    elif what == "tenant" and not value[0].isalnum():
        problem = f"it starts with {value[0]!r}"
    else:
        problem = "it does not match the grammar"
    raise InvalidInput(f"invalid {what} {shown(value)}: {problem}; expected {rule}")


def check_tenant(value: object) -> str:
    """``value`` if it is a Tenant, else ``InvalidInput`` saying what is wrong with it."""
    return _check(
        value, _TENANT, "tenant",
        f"1-{TENANT_MAX} characters from letters, digits and . _ @ -, starting with a letter or digit",
        TENANT_MAX, _TENANT_CHAR,
    )  # fmt: skip


def check_digest(value: object) -> str:
    """``value`` if it is a Digest (``<algorithm>:<32-128 lowercase hex>``), else ``InvalidInput``."""
    rule = "'<algorithm>:<32-128 lowercase hex digits>', e.g. 'blake3:' and 64 hex digits"
    return _check(value, _DIGEST, "digest", rule, None)


def check_id(value: object) -> str:
    """``value`` if it is an Id, else ``InvalidInput``."""
    return _check(value, _ID, "id", "1-128 characters from letters, digits and . _ : @ / + = -", 128, _ID_CHAR)


def as_id(value: str) -> str:
    """``value`` made an Id for the audit log: a character outside the Id alphabet becomes '_',
    the text is cut to 128 characters, and an empty value is '_'. For names the log records
    (tools, rules, principals, reasons) that were never required to be Ids."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "._:@/+=-" else "_" for c in value)[:128] or "_"


__all__ = [
    "MCP_PREFIX",
    "TOOL_DEFINITIONS",
    "is_tools_block",
    "DIGEST_PATTERN",
    "ID_PATTERN",
    "TENANT_MAX",
    "TENANT_PATTERN",
    "Digest",
    "Id",
    "Tenant",
    "VerdictKind",
    "as_id",
    "check_digest",
    "check_id",
    "check_tenant",
]

# The producer of the ref of a request's tool definitions (the OpenAI doors' tools block):
# trusted unless a policy ``tools`` entry names it (the client wrote them, like its system
# prompt; an operator who passes third-party tool descriptions through lists it as untrusted).
TOOL_DEFINITIONS = "fak.tool_definitions"
# The producer of an MCP server's tool definitions (``mcp:<label>``, no tool after it): content
# with the server's trust (docs/mcp.md); like the request's block, rendered in the tools role.
MCP_PREFIX = "mcp:"


def is_tools_block(tool: str | None) -> bool:
    """The producer of a tools block: the request's (``TOOL_DEFINITIONS``) or an MCP server's
    (``mcp:<label>``), which the door admits in the template's tools role and a rebuild renders
    the same way."""
    return tool == TOOL_DEFINITIONS or (tool is not None and tool.startswith(MCP_PREFIX) and "/" not in tool)
