"""Offline check of a tenant's audit export (``GET /v1/audit/export``, format
``fak-tenant-audit-export/v1``): the first line carries a signed checkpoint, every other
line one of the tenant's events with its inclusion proof against that checkpoint.

It proves that each listed event is in the signed log at its index, byte for byte, and
that it is the tenant's. It cannot prove the list is complete (the other tenants' rows
are not there to count): an auditor who needs completeness compares two exports'
checkpoints with a consistency proof, or verifies the operator's full export."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fak.audit import merkle, note
from fak.audit.checkpoint import open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import parse_event

if TYPE_CHECKING:
    from fak.audit.verify import WitnessPolicy

FORMAT = "fak-tenant-audit-export/v1"


@dataclass(frozen=True)
class TenantExportReport:
    ok: bool
    tenant: str = ""
    entries: int = 0
    tree_size: int = 0
    reason: str = ""
    bad_index: int | None = None  # the log index of the entry whose proof failed
    witness_quorum: int | None = None  # None: no witness policy given
    witnesses: dict[str, int] = field(default_factory=dict)  # valid cosigners -> cosignature time
    checkpoint_time: int | None = None  # the checkpoint's signing time (extension line), s
    age_seconds: float | None = None

    def summary(self) -> str:
        from fak.audit.verify import _when

        if not self.ok:
            at = f" at entry index {self.bad_index}" if self.bad_index is not None else ""
            return f"FAILED{at}: {self.reason}"
        lines = [f"OK: {self.entries} entries of tenant {self.tenant!r}, each included in the signed tree "
                 f"of size {self.tree_size} (pinned key)"]  # fmt: skip
        if self.witness_quorum is None:
            lines.append("witnesses: no policy given (--witness/--policy): a split view is not excluded")
        else:
            lines.append(f"witnesses: {len(self.witnesses)} cosigned (quorum {self.witness_quorum}): "
                         f"{', '.join(sorted(self.witnesses)) or 'none needed'}")
        lines.append(f"checkpoint time: {_when(self.checkpoint_time, time.time())}")
        return "\n".join(lines)


def is_tenant_export(path: str | Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT


def verify_tenant_export(
    path: str | Path,
    pubkey: str,
    *,
    witnesses: WitnessPolicy | None = None,
    max_age: float | None = None,
    now: float | None = None,
) -> TenantExportReport:
    """Check a tenant export against the pinned verifier key ``pubkey`` (required: there is no
    trust on first use), and its checkpoint against the witness policy when one is given. A
    failed inclusion proof names the log index of the entry."""
    from fak.audit.verify import _age, _load_text, checkpoint_time

    if not pubkey:
        return TenantExportReport(False, reason="no pinned key: a pinned verifier key is required (--pubkey)")
    quorum = witnesses.quorum if witnesses is not None and witnesses.quorum else None
    index: int | None = None
    cosigned: dict[str, int] = {}
    try:
        verifier = note.Verifier.parse(_load_text(pubkey, "public key").strip())
        with open(path, "rb") as fh:
            head = json.loads(fh.readline())
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                return TenantExportReport(False, reason=f"not a {FORMAT} file")
            try:
                cp = open_checkpoint(head["checkpoint"], verifier, verifier.name)
            except VerificationError as exc:
                raise VerificationError(f"checkpoint does not verify with the pinned key (unknown key?): {exc}") \
                    from None
            if witnesses is not None and quorum:
                check = witnesses.check(cp.note)
                if not check.ok:
                    return TenantExportReport(False, reason=f"witness quorum not met: {check.describe()}",
                                              witness_quorum=quorum)
                cosigned = dict(check.cosigned)
            tenant, count, last = head["tenant"], 0, -1
            for number, raw in enumerate(fh, 2):
                if not raw.strip():
                    continue
                line = json.loads(raw)
                index = None
                body = line["event"].encode()
                index = int(line["index"])
                event = parse_event(body)
                if event.tenant != tenant:
                    return TenantExportReport(False, reason=f"line {number}: an event of tenant {event.tenant!r}",
                                              bad_index=index)
                if index <= last or index >= cp.size:
                    return TenantExportReport(False, reason=f"line {number}: index {index} out of order or range",
                                              bad_index=index)
                hashes = [bytes.fromhex(h) for h in line["hashes"]]
                try:
                    merkle.verify_inclusion(index, cp.size, merkle.hash_leaf(body), hashes, cp.root)
                except merkle.ProofError:
                    raise VerificationError(f"line {number}: entry {index} is not in the signed tree of size "
                                            f"{cp.size} (its bytes or its proof were changed)") from None
                last, count = index, count + 1
    except (OSError, ValueError, KeyError, TypeError, AuditError) as exc:
        return TenantExportReport(False, reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                  bad_index=index, witness_quorum=quorum)
    stamp = checkpoint_time(cp)
    known = [t for t in (stamp, *cosigned.values()) if t is not None]
    age = ((time.time() if now is None else now) - max(known)) if known else None
    if max_age is not None and (age is None or age > max_age):
        why = "carries no time" if age is None else f"is {_age(age)} old"
        return TenantExportReport(False, reason=f"the checkpoint {why} (--max-age {max_age:g} s)",
                                  witness_quorum=quorum)
    return TenantExportReport(True, tenant=tenant, entries=count, tree_size=cp.size, witness_quorum=quorum,
                              witnesses=cosigned, checkpoint_time=stamp, age_seconds=age)
