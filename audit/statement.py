"""The statement of a tenant's audit export (fak.audit.tenant_export): a note the log signs
(``AuditLog.tenant_statement``) saying how many entries a tenant has in the tree of one of its
checkpoints and the index of the latest. Its own module, below both the log that writes it and
the export that reads it, so neither imports the other for it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fak.audit import merkle, note
from fak.audit.errors import VerificationError

# The statement's first line holds spaces, so no statement is ever a checkpoint (whose first
# line is the log's origin, which has none) and no checkpoint a statement.
STATEMENT = "fak tenant-audit-export statement/v2"
_FIELDS = ("origin", "size", "root", "tenant", "count", "latest")
_NUMBER = re.compile(r"^(0|[1-9][0-9]{0,18})$")


@dataclass(frozen=True)
class TenantStatement:
    """What the log signs for a tenant's export: in the tree (origin, size, root) the tenant
    has ``count`` entries and the latest is at ``latest`` (None: it has none)."""

    origin: str
    size: int
    root: bytes
    tenant: str  # "" is the system
    count: int
    latest: int | None


def statement_text(origin: str, size: int, root: bytes, tenant: str, count: int, latest: int | None) -> str:
    """The statement's note text (the system tenant "" is written ``-``, never a tenant)."""
    return (f"{STATEMENT}\norigin {origin}\nsize {size}\nroot {note.b64(root)}\ntenant {tenant or '-'}\n"
            f"count {count}\nlatest {'none' if latest is None else latest}\n")


def parse_statement(text: str) -> TenantStatement:
    lines = text.split("\n")
    if len(lines) != len(_FIELDS) + 2 or lines[0] != STATEMENT or lines[-1] != "":
        raise VerificationError(f"not a tenant export statement (expected {STATEMENT!r} and {len(_FIELDS)} fields)")
    got = {}
    for line, name in zip(lines[1:-1], _FIELDS, strict=True):
        key, sep, value = line.partition(" ")
        if key != name or not sep or not value:
            raise VerificationError(f"tenant export statement: expected the field {name!r}")
        got[name] = value
    for name in ("size", "count") + (("latest",) if got["latest"] != "none" else ()):
        if not _NUMBER.match(got[name]):
            raise VerificationError(f"tenant export statement: {name} is not a canonical decimal")
    root = note.b64decode_strict(got["root"])
    if len(root) != merkle.HASH_SIZE:
        raise VerificationError("tenant export statement: root is not 32 bytes")
    latest = None if got["latest"] == "none" else int(got["latest"])
    st = TenantStatement(got["origin"], int(got["size"]), root, "" if got["tenant"] == "-" else got["tenant"],
                         int(got["count"]), latest)
    if (st.count == 0) != (latest is None) or (latest is not None and latest >= st.size):
        raise VerificationError("tenant export statement: count and latest index disagree")
    return st


def open_statement(signed: str, verifier: note.Verifier) -> TenantStatement:
    """Verify a statement note with the log's key and parse it."""
    return parse_statement(note.open_note(signed, verifier))
