"""A tenant's audit export (``GET /v1/audit/export``, format ``fak-tenant-audit-export/v2``),
written here and checked offline. The first line (the head) carries a signed checkpoint and a
statement signed with the log's key; every other line one of the tenant's events, in index
order, with its inclusion proof against that checkpoint.

Inclusion proofs show that each listed event is in the signed log at its index, byte for byte,
and that it is the tenant's; they cannot show that none is missing (the other tenants' rows are
not there to count). So every event carries its tenant's gap-free sequence number ``tseq``
(assigned by the log at append, inside the hashed bytes), and the statement binds the tenant's
count and the index of its latest entry to the checkpoint (origin, size, root): a removed line,
a cut tail or a head alone fails, naming the missing sequence numbers. A v1 export (no
statement) proves nothing about completeness and fails. Entries logged before ``tseq`` existed
count by position (their numbers are implied by the first numbered entry and the count)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fak.audit import merkle, note
from fak.audit.checkpoint import open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import parse_event
from fak.audit.statement import open_statement, parse_statement

if TYPE_CHECKING:
    from fak.audit.log import AuditLog
    from fak.audit.verify import WitnessPolicy

FORMAT = "fak-tenant-audit-export/v2"
FORMAT_V1 = "fak-tenant-audit-export/v1"  # no statement: refused (see the module's docstring)
PAGE = 500  # entries read per database round trip while writing


# ------------------------------------------------------------------------------------------ writing


def tenant_export_lines(log: AuditLog, tenant: str, page: int = PAGE) -> Iterator[bytes]:
    """The export's lines (each ends with a newline). The checkpoint and the statement are
    signed now, before the first line is produced (an error is raised here, not in the middle
    of a stream); the entries are read lazily, a page per database round trip, so no read
    connection is held while a client is slow."""
    from fak.audit.signer_state import CheckpointSuperseded

    log.require_verified()
    for attempt in range(10):  # the writer may sign again between the two: sign and ask again
        cp = log.checkpoint()  # covers everything logged so far
        try:
            signed = log.tenant_statement(tenant, cp)
            break
        except CheckpointSuperseded:
            if attempt == 9:
                raise
    st = parse_statement(note.split(signed)[0])
    head = {"format": FORMAT, "tenant": tenant, "origin": cp.origin, "tree_size": cp.size,
            "root_hash": cp.root.hex(), "checkpoint": cp.note, "public_key": log.public_key(),
            "count": st.count, "latest_index": st.latest, "statement": signed}
    return _lines(log, tenant, cp.size, head, page)


def _lines(log: AuditLog, tenant: str, size: int, head: dict[str, object], page: int) -> Iterator[bytes]:
    yield _line(head)
    pos = 0
    while pos < size:
        it = log.entries(tenant, pos, size)
        try:
            rows = list(itertools.islice(it, page))
        finally:
            it.close()  # releases the read connection
        if not rows:
            return
        for e in rows:
            proof = log.inclusion_proof(e.index, size=size)
            yield _line({"index": e.index, "type": e.event.type, "event": e.body.decode(),
                         "leaf_hash": e.leaf_hash.hex(), "hashes": [h.hex() for h in proof.hashes]})
        pos = rows[-1].index + 1


def _line(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# ------------------------------------------------------------------------------------------ checking


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
    count: int | None = None  # the tenant's entries in the tree, as the log's signed statement says

    def summary(self) -> str:
        from fak.audit.verify import _when

        if not self.ok:
            at = f" at entry index {self.bad_index}" if self.bad_index is not None else ""
            return f"FAILED{at}: {self.reason}"
        lines = [f"OK: {self.entries} entries of tenant {self.tenant!r}, complete (the log's signed statement "
                 f"counts {self.count}, sequence numbers without a gap), each included in the signed tree "
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
    return isinstance(head, dict) and head.get("format") in (FORMAT, FORMAT_V1)


def _ranges(missing: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}..{b}" for a, b in missing)


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
    failed inclusion proof names the log index of the entry; a removed entry, the tenant's
    sequence numbers that are missing."""
    from fak.audit.verify import _age, _load_text, checkpoint_time

    if not pubkey:
        return TenantExportReport(False, reason="no pinned key: a pinned verifier key is required (--pubkey)")
    quorum = witnesses.quorum if witnesses is not None and witnesses.quorum else None
    index: int | None = None
    cosigned: dict[str, int] = {}

    def failed(reason: str, bad: int | None = None) -> TenantExportReport:
        return TenantExportReport(False, reason=reason, bad_index=bad, witness_quorum=quorum)

    try:
        verifier = note.Verifier.parse(_load_text(pubkey, "public key").strip())
        with open(path, "rb") as fh:
            head = json.loads(fh.readline())
            fmt = head.get("format") if isinstance(head, dict) else None
            if fmt == FORMAT_V1:
                return failed(f"a {FORMAT_V1} file does not prove completeness (any of its lines may have been "
                              f"removed): export it again from the server ({FORMAT})")
            if fmt != FORMAT:
                return failed(f"not a {FORMAT} file")
            try:
                cp = open_checkpoint(head["checkpoint"], verifier, verifier.name)
            except VerificationError as exc:
                raise VerificationError(f"checkpoint does not verify with the pinned key (unknown key?): {exc}") \
                    from None
            if witnesses is not None and quorum:
                check = witnesses.check(cp.note)
                if not check.ok:
                    return failed(f"witness quorum not met: {check.describe()}")
                cosigned = dict(check.cosigned)
            tenant = head["tenant"]
            if not isinstance(tenant, str):
                return failed("the head's tenant is not a string")
            if not isinstance(head.get("statement"), str):
                return failed("the export has no statement (the log's signed count of the tenant's entries)")
            try:
                st = open_statement(head["statement"], verifier)
            except VerificationError as exc:
                return failed(f"the statement does not verify with the pinned key: {exc}")
            if (st.origin, st.size, st.root) != (cp.origin, cp.size, cp.root):
                return failed(f"the statement is for the checkpoint of size {st.size}, not for this export's "
                              f"checkpoint (size {cp.size})")
            if st.tenant != tenant:
                return failed(f"the statement is another tenant's ({st.tenant!r}), not {tenant!r}'s")
            count, last, nxt = 0, -1, 1  # nxt: the tenant sequence number the next entry must carry
            numbered = False  # an entry with a tseq was seen: every later one has one too
            missing: list[tuple[int, int]] = []
            for number, raw in enumerate(fh, 2):
                if not raw.strip():
                    continue
                line = json.loads(raw)
                index = None
                body = line["event"].encode()
                index = int(line["index"])
                event = parse_event(body)
                if event.tenant != tenant:
                    return failed(f"line {number}: an event of tenant {event.tenant!r}", index)
                if index <= last or index >= cp.size:
                    return failed(f"line {number}: index {index} out of order or range", index)
                hashes = [bytes.fromhex(h) for h in line["hashes"]]
                try:
                    merkle.verify_inclusion(index, cp.size, merkle.hash_leaf(body), hashes, cp.root)
                except merkle.ProofError:
                    raise VerificationError(f"line {number}: entry {index} is not in the signed tree of size "
                                            f"{cp.size} (its bytes or its proof were changed)") from None
                seq = event.tseq
                if seq is None and numbered:  # entries logged before tseq existed come first
                    return failed(f"line {number}: an entry without a sequence number after numbered ones "
                                  "(out of order)", index)
                if seq is not None and seq < nxt:
                    return failed(f"line {number}: tenant sequence {seq} out of order (after {nxt - 1})", index)
                if seq is not None and seq > nxt:
                    missing.append((nxt, seq - 1))
                nxt, numbered = (seq or nxt) + 1, numbered or seq is not None
                last, count = index, count + 1
    except (OSError, ValueError, KeyError, TypeError, AuditError) as exc:
        return failed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, index)
    if nxt - 1 < st.count:
        missing.append((nxt, st.count))
    if missing:
        return failed(f"missing tenant sequence {_ranges(missing)}: the export lists {count} of the {st.count} "
                      f"entries the log's signed statement counts for tenant {tenant!r} (lines were removed)")
    if nxt - 1 > st.count or (st.count and last != st.latest):
        return failed(f"the export lists {count} entries ending at index {last}; the log's signed statement "
                      f"counts {st.count} ending at index {st.latest}")
    stamp = checkpoint_time(cp)
    known = [t for t in (stamp, *cosigned.values()) if t is not None]
    age = ((time.time() if now is None else now) - max(known)) if known else None
    if max_age is not None and (age is None or age > max_age):
        why = "carries no time" if age is None else f"is {_age(age)} old"
        return failed(f"the checkpoint {why} (--max-age {max_age:g} s)")
    return TenantExportReport(True, tenant=tenant, entries=count, tree_size=cp.size, witness_quorum=quorum,
                              witnesses=cosigned, checkpoint_time=stamp, age_seconds=age, count=st.count)
