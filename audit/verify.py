"""Offline verification of a log export (see fak.audit.export for the format).

Re-hashes every entry, checks each is canonical and a valid event, recomputes
the tree root at every checkpoint, checks every checkpoint signature and the
consistency proof between consecutive checkpoints, and reports the first bad
line and entry index. Needs nothing but the file and, ideally, the pinned key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fak.audit import merkle, note
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import parse_event
from fak.audit.export import MAGIC

_ENTRY = re.compile(rb"^e (0|[1-9][0-9]{0,18}) ([0-9a-f]{64}) (\{.*\})$", re.S)


@dataclass
class VerifyReport:
    ok: bool = False
    entries: int = 0
    checkpoints: int = 0
    root: bytes = merkle.EMPTY_ROOT
    signed_size: int = 0  # size of the last verified checkpoint
    trusted_key: bool = False  # False: checked only against the key the export names
    first_bad_index: int | None = None
    bad_line: int | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.ok:
            key = "pinned key" if self.trusted_key else "the export's own key (pass --pubkey to pin one)"
            text = (
                f"OK: {self.entries} entries, {self.checkpoints} checkpoints verified with {key}; "
                f"root {self.root.hex()} at size {self.signed_size}"
            )
            return "\n".join([text, *(f"warning: {w}" for w in self.warnings)])
        where = f"line {self.bad_line}" + (
            f", entry index {self.first_bad_index}" if self.first_bad_index is not None else ""
        )
        return f"FAILED at {where}: {self.error}"


class _Bad(Exception):
    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def _load_text(value: str, what: str) -> str:
    """A key or note given inline or as a path to a file holding it."""
    if "\n" in value or "+" in value and not Path(value).exists():
        return value
    try:
        return Path(value).read_text()
    except OSError as exc:
        raise AuditError(f"cannot read {what} {value}: {exc.strerror}") from None


def _header(line: bytes, pubkey: str | None) -> tuple[str, note.Verifier, bool]:
    parts = line.decode("utf-8").split(" ")
    if len(parts) != 3 or parts[0] != MAGIC:
        raise _Bad(f"not a fak audit export (expected '{MAGIC} <origin> <vkey>')")
    origin, named = parts[1], note.Verifier.parse(parts[2])
    if named.name != origin:
        raise _Bad("export's key name does not match its origin")
    if pubkey is None:
        return origin, named, False
    pinned = note.Verifier.parse(_load_text(pubkey, "public key").strip())
    if pinned.vkey() != named.vkey():
        raise _Bad("export names a different key than the pinned one")
    return origin, pinned, True


def verify_export(
    path: str | Path, pubkey: str | None = None, since: str | None = None, *, progress: bool = False
) -> VerifyReport:
    """Verify an export file; a bad file gives a report with ok=False, never an exception.
    ``pubkey``: vkey string or file; ``since``: a signed checkpoint (text or file) the
    export must extend; ``progress``: a progress bar on stderr (when it is a terminal)."""
    report = VerifyReport()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read export {path}: {exc.strerror}") from None
    lines = data.split(b"\n")
    lineno = 1
    tree = merkle.MemoryTree()
    prev: SignedCheckpoint | None = None
    since_cp: SignedCheckpoint | None = None
    try:
        try:
            origin, verifier, report.trusted_key = _header(lines[0], pubkey)
        except (UnicodeDecodeError, VerificationError) as exc:
            raise _Bad(f"bad header: {exc}") from None
        if since is not None:
            try:
                since_cp = open_checkpoint(_load_text(since, "checkpoint"), verifier, origin)
            except VerificationError as exc:
                raise AuditError(f"--since checkpoint does not verify: {exc}") from None
        records = lines[1:]
        if progress:
            from tqdm import tqdm

            records = tqdm(records, desc="verify", unit="rec", disable=None, leave=False)
        for lineno, line in enumerate(records, start=2):
            if lineno == len(lines) and line == b"":
                break  # the newline that ends the last record
            if lineno == len(lines):
                raise _Bad("export does not end with a newline", tree.size)
            if line.startswith(b"e "):
                _entry(line, tree)
            elif line.startswith(b"c "):
                cp = _checkpoint(line, verifier, origin, tree, prev)
                report.checkpoints += 1
                prev = cp
            else:
                raise _Bad("unknown record (expected 'e ' or 'c ')", tree.size)
            if since_cp is not None and tree.size == since_cp.size and tree.root() != since_cp.root:
                raise _Bad(f"export is not consistent with the --since checkpoint of size {since_cp.size}")
        if since_cp is not None and tree.size < since_cp.size:
            raise _Bad(f"export is shorter ({tree.size}) than the --since checkpoint ({since_cp.size})")
        if prev is None:
            raise _Bad("export holds no signed checkpoint")
    except _Bad as bad:
        report.error, report.bad_line, report.first_bad_index = str(bad), lineno, bad.index
        report.entries = tree.size
        return report
    report.ok, report.entries, report.root, report.signed_size = True, tree.size, prev.root, prev.size
    if tree.size > prev.size:
        report.warnings.append(f"entries {prev.size}..{tree.size - 1} are not covered by a signed checkpoint")
    return report


def _entry(line: bytes, tree: merkle.MemoryTree) -> None:
    index = tree.size
    m = _ENTRY.match(line)
    if not m:
        raise _Bad("malformed entry record", index)
    if int(m.group(1)) != index:
        raise _Bad(f"entry says index {int(m.group(1))}, expected {index} (gap or reordering)", index)
    body = m.group(3)
    leaf = merkle.hash_leaf(body)
    if leaf.hex().encode() != m.group(2):
        raise _Bad("entry bytes do not hash to the recorded leaf hash", index)
    try:
        parse_event(body)
    except AuditError as exc:
        raise _Bad(str(exc), index) from None
    tree.append_leaf(leaf)


def _checkpoint(
    line: bytes, verifier: note.Verifier, origin: str, tree: merkle.MemoryTree, prev: SignedCheckpoint | None
) -> SignedCheckpoint:
    try:
        signed = note.b64decode_strict(line[2:].decode("ascii")).decode("utf-8")
        cp = open_checkpoint(signed, verifier, origin)
    except (UnicodeDecodeError, VerificationError) as exc:
        raise _Bad(f"checkpoint does not verify: {exc}") from None
    if cp.size != tree.size:
        raise _Bad(f"checkpoint of size {cp.size} placed after {tree.size} entries", min(cp.size, tree.size))
    if cp.root != tree.root():
        first = prev.size if prev else 0
        raise _Bad(f"entries {first}..{cp.size - 1} do not hash to the signed root of size {cp.size}", first)
    if prev is not None:
        if cp.size <= prev.size and prev.size != 0:
            raise _Bad("checkpoints are not in increasing size order")
        try:
            merkle.verify_consistency(prev.size, cp.size, prev.root, cp.root, tree.consistency_proof(prev.size))
        except merkle.ProofError as exc:
            raise _Bad(f"checkpoint is not consistent with the previous one: {exc}") from None
    return cp
