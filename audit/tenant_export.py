"""Offline check of a tenant's audit export (``GET /v1/audit/export``, format
``fak-tenant-audit-export/v1``): the first line carries a signed checkpoint, every other
line one of the tenant's events with its inclusion proof against that checkpoint.

It proves that each listed event is in the signed log at its index, byte for byte, and
that it is the tenant's. It cannot prove the list is complete (the other tenants' rows
are not there to count): an auditor who needs completeness compares two exports'
checkpoints with a consistency proof, or verifies the operator's full export."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fak.audit import merkle, note
from fak.audit.checkpoint import open_checkpoint
from fak.audit.errors import AuditError
from fak.audit.events import parse_event

FORMAT = "fak-tenant-audit-export/v1"


@dataclass(frozen=True)
class TenantExportReport:
    ok: bool
    tenant: str = ""
    entries: int = 0
    tree_size: int = 0
    reason: str = ""

    def summary(self) -> str:
        if not self.ok:
            return f"FAILED: {self.reason}"
        return (f"OK: {self.entries} entries of tenant {self.tenant!r}, each included in the signed tree "
                f"of size {self.tree_size} (pinned key)")


def is_tenant_export(path: str | Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT


def verify_tenant_export(path: str | Path, pubkey: str) -> TenantExportReport:
    """Check a tenant export against the pinned verifier key ``pubkey`` (required)."""
    if not pubkey:
        return TenantExportReport(False, reason="a pinned verifier key is required (--pubkey)")
    try:
        verifier = note.Verifier.parse(pubkey)
        with open(path, "rb") as fh:
            head = json.loads(fh.readline())
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                return TenantExportReport(False, reason=f"not a {FORMAT} file")
            cp = open_checkpoint(head["checkpoint"], verifier, verifier.name)
            tenant, count, last = head["tenant"], 0, -1
            for number, raw in enumerate(fh, 2):
                if not raw.strip():
                    continue
                line = json.loads(raw)
                body = line["event"].encode()
                event = parse_event(body)
                index = int(line["index"])
                if event.tenant != tenant:
                    return TenantExportReport(False, reason=f"line {number}: an event of tenant {event.tenant!r}")
                if index <= last or index >= cp.size:
                    return TenantExportReport(False, reason=f"line {number}: index {index} out of order or range")
                hashes = [bytes.fromhex(h) for h in line["hashes"]]
                merkle.verify_inclusion(index, cp.size, merkle.hash_leaf(body), hashes, cp.root)
                last, count = index, count + 1
    except (OSError, ValueError, KeyError, TypeError, AuditError) as exc:
        return TenantExportReport(False, reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return TenantExportReport(True, tenant=tenant, entries=count, tree_size=cp.size)
