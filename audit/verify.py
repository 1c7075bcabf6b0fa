"""Offline verification of a log export (see fak.audit.export for the format).

Re-hashes every entry, checks each is canonical and a valid event, recomputes
the tree root at every checkpoint, checks every checkpoint signature and the
consistency proof between consecutive checkpoints, and reports the first bad
line and entry index.

It fails closed, because evidence is only worth what it holds against the people
who run the log: no pinned key, entries after the last signed checkpoint, a key
other than the pinned one, or (with a witness policy) a newest checkpoint without
the witnesses' quorum are failures, not warnings. ``--trust-embedded-key`` and
``--allow-unsigned-tail`` exist for development and say so loudly.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from fak.audit import cosignature, merkle, note
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.events import Event, parse_event

MAGIC = "fak-audit-export/v1"  # an export's first line: MAGIC <origin> <vkey> (written by fak.audit.export)
_ENTRY = re.compile(rb"^e (0|[1-9][0-9]{0,18}) ([0-9a-f]{64}) (\{.*\})$", re.S)
_EXT_TIME = re.compile(r"^timestamp (0|[1-9][0-9]{0,18})$")  # the checkpoint's extension line
NO_KEY = ("no pinned key: pass --pubkey (the log's verifier key, from 'fak audit pubkey' or your "
          "records), or --trust-embedded-key for development only")  # fmt: skip


# ------------------------------------------------------------------------------------------ witnesses


def _verify_cosignature(witness_vkey: str, body: str, line: str) -> int:
    return int(cosignature.verify_cosignature(witness_vkey, body, line))


@dataclass(frozen=True)
class WitnessKey:
    """A witness the auditor trusts: its C2SP vkey (type 0x04, tlog-cosignature/v1)."""

    name: str  # the policy's name for it (the key name when given with --witness)
    key_name: str
    key_id: int
    vkey: str

    @classmethod
    def parse(cls, vkey: str, name: str | None = None) -> WitnessKey:
        key_name, kid, _ = cosignature.parse_witness_vkey(vkey)
        return cls(name or key_name, key_name, kid, vkey.strip())


@dataclass(frozen=True)
class WitnessCheck:
    ok: bool
    quorum: int
    cosigned: dict[str, int]  # witness name -> cosignature timestamp (valid ones only)
    listed: int

    def describe(self) -> str:
        names = ", ".join(sorted(self.cosigned)) or "none"
        return f"{len(self.cosigned)} of {self.listed} listed witnesses cosigned (quorum {self.quorum}): {names}"


@dataclass(frozen=True)
class WitnessPolicy:
    """Which witnesses' cosignatures a checkpoint needs, and how many (C2SP tlog-policy subset).

    Text form, one item per line, ``#`` comments::

        log <vkey> [url]             # optional: pins the log's key
        witness <name> <vkey> [url]  # a witness's cosignature/v1 vkey (type 0x04)
        quorum <N | all | any | none>

    Without a quorum line the quorum is all listed witnesses."""

    witnesses: tuple[WitnessKey, ...] = ()
    quorum: int = 0
    log_key: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.quorum <= len(self.witnesses):
            raise AuditError(f"quorum {self.quorum} is not between 0 and the {len(self.witnesses)} witnesses listed")
        keys = [note.b64decode_strict(w.vkey.split("+", 2)[2])[1:] for w in self.witnesses]  # the public keys
        if len(set(keys)) != len(keys) or len({w.name for w in self.witnesses}) != len(keys):
            raise AuditError("witness policy lists a witness (name or key) twice")

    @classmethod
    def from_keys(cls, vkeys: Iterable[str], quorum: int | None = None) -> WitnessPolicy:
        """``--witness KEY`` (repeatable) and ``--quorum N`` (default: all of them)."""
        try:
            ws = tuple(WitnessKey.parse(_load_text(v, "witness key").strip()) for v in vkeys)
        except VerificationError as exc:
            raise AuditError(f"bad --witness key: {exc}") from None
        return cls(ws, len(ws) if quorum is None else quorum)

    @classmethod
    def parse(cls, text: str) -> WitnessPolicy:
        ws: list[WitnessKey] = []
        quorum: str | None = None
        log_key: str | None = None
        for n, raw in enumerate(text.splitlines(), 1):
            words = raw.split()
            if not words or words[0].startswith("#"):
                continue
            try:
                if words[0] == "log" and len(words) in (2, 3) and log_key is None:
                    log_key = note.Verifier.parse(words[1]).vkey()
                elif words[0] == "witness" and len(words) in (3, 4):
                    ws.append(WitnessKey.parse(words[2], words[1]))
                elif words[0] == "quorum" and len(words) == 2 and quorum is None:
                    quorum = words[1]
                else:
                    raise AuditError(f"expected 'log <vkey>', 'witness <name> <vkey>' or 'quorum <N|all|any|none>' "
                                     f"(groups and several logs are not supported), got {words[0]!r}")
            except AuditError as exc:  # VerificationError too: a bad key
                raise AuditError(f"witness policy line {n}: {exc}") from None
        names = {"all": len(ws), "any": min(1, len(ws)), "none": 0, None: len(ws)}
        if quorum in names:
            q = names[quorum]
        elif quorum is not None and quorum.isdigit():
            q = int(quorum)
        else:
            raise AuditError(f"witness policy: quorum {quorum!r} is not a number, all, any or none")
        return cls(tuple(ws), q, log_key)

    @classmethod
    def load(cls, value: str) -> WitnessPolicy:
        return cls.parse(_load_text(value, "witness policy"))

    def check(self, signed_note: str) -> WitnessCheck:
        """Count valid cosignatures by listed witnesses on a checkpoint note. A cosignature by a
        listed witness that does not verify rejects the note (VerificationError), as signed-note
        says of a known key's bad signature: it is a forgery, not an absence."""
        text, _ = note.split(signed_note)
        block = signed_note[len(text) + 1 :]
        by_id = {(w.key_name, w.key_id): w for w in self.witnesses}
        got: dict[str, int] = {}
        for line in block[:-1].split("\n"):
            name, blob = line[2:].split(" ")
            raw = note.b64decode_strict(blob)
            w = by_id.get((name, int.from_bytes(raw[:4], "big")))
            if w is None:
                continue
            got[w.name] = _verify_cosignature(w.vkey, text, line)
        return WitnessCheck(len(got) >= self.quorum, self.quorum, got, len(self.witnesses))


def checkpoint_time(cp: SignedCheckpoint) -> int | None:
    """The signing time a checkpoint states in an extension line (POSIX seconds), if any.
    Read from the signed text, so it is as trustworthy as the log's key."""
    stated = getattr(cp, "timestamp", None)
    if isinstance(stated, int):
        return stated
    text, _ = note.split(cp.note)
    for line in text.split("\n")[3:]:
        m = _EXT_TIME.match(line)
        if m:
            return int(m.group(1))
    return None


def _when(seconds: int | None, now: float) -> str:
    if seconds is None:
        return "no timestamp"
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} (age {_age(now - seconds)})"


def _age(seconds: float) -> str:
    if seconds < 0:
        return f"{-seconds:.0f} s in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


# ------------------------------------------------------------------------------------------ report


@dataclass
class VerifyReport:
    ok: bool = False
    entries: int = 0
    checkpoints: int = 0
    root: bytes = merkle.EMPTY_ROOT
    signed_size: int = 0  # size of the newest checkpoint trusted (signed, and witnessed when asked)
    trusted_key: bool = False  # False: checked only against the key the export names (--trust-embedded-key)
    first_bad_index: int | None = None
    bad_range: tuple[int, int] | None = None  # [start, end) that holds the change when it is not pinned down
    bad_line: int | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    unsigned_tail: int = 0  # entries after signed_size (accepted only with --allow-unsigned-tail)
    witness_quorum: int | None = None  # None: no witness policy given
    witnesses: dict[str, int] = field(default_factory=dict)  # cosigners of the trusted checkpoint -> time
    checkpoint_time: int | None = None  # the trusted checkpoint's signing time (extension line), s
    age_seconds: float | None = None  # freshness: now minus the newest time known for the trusted checkpoint

    def summary(self) -> str:
        if not self.ok:
            where = []
            if self.bad_line is not None:
                where.append(f"line {self.bad_line}")
            if self.first_bad_index is not None and self.bad_range is None:
                where.append(f"entry index {self.first_bad_index}")
            if self.bad_range is not None:
                where.append(f"entries {self.bad_range[0]}..{self.bad_range[1] - 1}")
            return f"FAILED{' at ' + ', '.join(where) if where else ''}: {self.error}"
        key = "the pinned key" if self.trusted_key else "THE EXPORT'S OWN KEY (--trust-embedded-key: not evidence)"
        lines = [f"OK: {self.entries} entries, {self.checkpoints} checkpoints verified with {key}; "
                 f"root {self.root.hex()} at size {self.signed_size}"]  # fmt: skip
        if self.witness_quorum is None:
            lines.append("witnesses: no policy given (--witness/--policy): a split view is not excluded")
        else:
            names = ", ".join(sorted(self.witnesses)) or "none needed"
            lines.append(f"witnesses: {len(self.witnesses)} cosigned (quorum {self.witness_quorum}): {names}")
        now = time.time()
        stamp = self.checkpoint_time
        lines.append(f"checkpoint time: {_when(stamp, now)}")
        if self.witnesses:
            lines.append(f"newest cosignature: {_when(max(self.witnesses.values()), now)}")
        return "\n".join([*lines, *(f"WARNING: {w}" for w in self.warnings)])


class _Bad(Exception):
    def __init__(self, message: str, index: int | None = None, span: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.span = span
        self.line: int | None = None


def _load_text(value: str, what: str) -> str:
    """A key or note given inline or as a path to a file holding it."""
    if "\n" in value or "+" in value and not Path(value).exists():
        return value
    try:
        return Path(value).read_text()
    except OSError as exc:
        raise AuditError(f"cannot read {what} {value}: {exc.strerror}") from None


def _header(line: bytes, pubkey: str | None, trust_embedded: bool) -> tuple[str, note.Verifier, bool]:
    parts = line.decode("utf-8").split(" ")
    if len(parts) != 3 or parts[0] != MAGIC:
        raise _Bad(f"not a fak audit export (expected '{MAGIC} <origin> <vkey>')")
    origin, named = parts[1], note.Verifier.parse(parts[2])
    if named.name != origin:
        raise _Bad("export's key name does not match its origin")
    if pubkey is None:
        if not trust_embedded:
            raise _Bad(NO_KEY)
        return origin, named, False
    pinned = note.Verifier.parse(_load_text(pubkey, "public key").strip())
    if pinned.vkey() != named.vkey():
        raise _Bad(f"unknown key: the export is signed by {named.vkey()}, not by the pinned {pinned.vkey()}")
    return origin, pinned, True


@dataclass
class _Since:
    cp: SignedCheckpoint
    leaves: list[bytes] | None = None  # an earlier export's leaf hashes: pins a changed entry


def _since(value: str, verifier: note.Verifier, origin: str) -> _Since:
    """``--since``: a signed checkpoint the auditor saw before, or an earlier export file
    (its newest checkpoint, and its entries, which name the exact entry a rewrite changed)."""
    path = Path(value)
    raw = path.read_bytes() if "\n" not in value and path.is_file() else value.encode()
    if not raw.startswith(MAGIC.encode() + b" "):
        try:
            return _Since(open_checkpoint(raw.decode(), verifier, origin))
        except (UnicodeDecodeError, VerificationError) as exc:
            raise AuditError(f"--since checkpoint does not verify: {exc}") from None
    tree, last = merkle.MemoryTree(), None
    try:
        for line in raw.split(b"\n")[1:]:
            if line.startswith(b"e "):
                _entry(line, tree)
            elif line.startswith(b"c "):
                cp = open_checkpoint(note.b64decode_strict(line[2:].decode("ascii")).decode(), verifier, origin)
                if cp.size != tree.size or cp.root != tree.root():
                    raise VerificationError(f"its checkpoint of size {cp.size} does not match its entries")
                last = cp
    except (_Bad, UnicodeDecodeError, VerificationError) as exc:
        raise AuditError(f"--since export does not verify: {exc}") from None
    if last is None:
        raise AuditError("--since export holds no signed checkpoint")
    leaves = [tree.nodes[merkle.node_id(0, i)] for i in range(last.size)]
    return _Since(last, leaves)


# ------------------------------------------------------------------------------------------ verify


def verify_export(
    path: str | Path,
    pubkey: str | None = None,
    since: str | None = None,
    *,
    progress: bool = False,
    trust_embedded_key: bool = False,
    allow_unsigned_tail: bool = False,
    witnesses: WitnessPolicy | None = None,
    max_age: float | None = None,
    now: float | None = None,
) -> VerifyReport:
    """Verify an export file; a bad file gives a report with ok=False, never an exception.

    ``pubkey``: the pinned vkey (string or file); without it the export fails unless
    ``trust_embedded_key``. ``since``: a signed checkpoint (text or file) or an earlier export
    the export must extend. ``witnesses``: the checkpoint trusted is the newest one with the
    policy's quorum of valid cosignatures. Entries after the trusted checkpoint fail unless
    ``allow_unsigned_tail``. ``max_age``: fail when the trusted checkpoint's newest known time
    (its timestamp line, else its newest cosignature) is older, or unknown."""
    report = VerifyReport()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read export {path}: {exc.strerror}") from None
    if witnesses is not None and witnesses.quorum:
        report.witness_quorum = witnesses.quorum
    lines = data.split(b"\n")
    lineno = 1
    tree = merkle.MemoryTree()
    prev: SignedCheckpoint | None = None
    head: SignedCheckpoint | None = None  # newest trusted (signed, witnessed when asked) checkpoint
    head_line = 0  # line of entry head.size, were there one
    last_check: WitnessCheck | None = None
    ref: _Since | None = None
    tseqs: dict[str, int] = {}  # tenant -> entries seen (each numbered one must carry that + 1)
    try:
        try:
            origin, verifier, report.trusted_key = _header(lines[0], pubkey, trust_embedded_key)
        except (UnicodeDecodeError, VerificationError) as exc:
            raise _Bad(f"bad header: {exc}") from None
        if not report.trusted_key:
            report.warnings.append("checked against the key the export names itself (--trust-embedded-key): "
                                   "anyone can make such an export; this is not evidence")  # fmt: skip
        if since is not None:
            ref = _since(since, verifier, origin)
        records: Iterable[bytes] = lines[1:]
        if progress:
            from tqdm import tqdm

            records = tqdm(records, desc="verify", unit="rec", disable=None, leave=False)
        for lineno, line in enumerate(records, start=2):
            if lineno == len(lines) and line == b"":
                break  # the newline that ends the last record
            if lineno == len(lines):
                raise _Bad("export does not end with a newline", tree.size)
            if line.startswith(b"e "):
                event = _entry(line, tree)
                i = tree.size - 1
                _tseq(event, i, tseqs)
                known = ref.leaves if ref is not None and ref.leaves is not None else []
                if i < len(known) and tree.nodes[merkle.node_id(0, i)] != known[i]:
                    raise _Bad(f"entry {i} differs from entry {i} of the --since export, which verified "
                               f"against the signed checkpoint of size {ref.cp.size}", i)  # type: ignore[union-attr]
            elif line.startswith(b"c "):
                cp = _checkpoint(line, verifier, origin, tree, prev)
                report.checkpoints += 1
                prev = cp
                if witnesses is not None and witnesses.quorum:
                    try:
                        last_check = witnesses.check(cp.note)
                    except VerificationError as exc:
                        raise _Bad(f"checkpoint of size {cp.size}: {exc}") from None
                    if not last_check.ok:
                        continue
                    report.witnesses = dict(last_check.cosigned)
                head, head_line = cp, lineno + 1
            else:
                raise _Bad("unknown record (expected 'e ' or 'c ')", tree.size)
            if ref is not None and tree.size == ref.cp.size and tree.root() != ref.cp.root:
                start = prev.size if prev is not None and prev.size < ref.cp.size else 0
                raise _Bad(f"export is not consistent with the --since checkpoint of size {ref.cp.size}: an entry "
                           f"in {start}..{ref.cp.size - 1} changed", start, (start, ref.cp.size))  # fmt: skip
        if ref is not None and tree.size < ref.cp.size:
            raise _Bad(f"export is shorter ({tree.size}) than the --since checkpoint ({ref.cp.size})")
        lineno = None  # type: ignore[assignment]  # the failures below concern the whole export
        if prev is None:
            raise _Bad("export holds no signed checkpoint")
        if head is None:
            assert last_check is not None
            raise _Bad(f"no checkpoint carries the witness quorum; on the newest (size {prev.size}) "
                       f"{last_check.describe()}")  # fmt: skip
        report.unsigned_tail = tree.size - head.size
        if report.unsigned_tail:
            what = "signed and witnessed" if report.witness_quorum else "signed"
            msg = f"entries {head.size}..{tree.size - 1} are not covered by a {what} checkpoint"
            if not allow_unsigned_tail:
                err = _Bad(f"{msg} (anyone with write access could have added them; --allow-unsigned-tail "
                           "accepts them as unverified)", head.size)  # fmt: skip
                err.line = head_line or None
                raise err
            report.warnings.append(f"{msg}: accepted as UNVERIFIED (--allow-unsigned-tail)")
        report.checkpoint_time = checkpoint_time(head)
        times = [t for t in (report.checkpoint_time, *report.witnesses.values()) if t is not None]
        clock = time.time() if now is None else now
        report.age_seconds = clock - max(times) if times else None
        if max_age is not None:
            if report.age_seconds is None:
                raise _Bad("--max-age: the trusted checkpoint carries no timestamp and no cosignature time")
            if report.age_seconds > max_age:
                raise _Bad(f"the trusted checkpoint (size {head.size}) is {_age(report.age_seconds)} old, "
                           f"more than --max-age {max_age:g} s")  # fmt: skip
    except _Bad as bad:
        report.error, report.first_bad_index, report.bad_range = str(bad), bad.index, bad.span
        report.bad_line = bad.line if bad.line is not None else lineno
        report.entries = tree.size
        return report
    report.ok, report.entries, report.root, report.signed_size = True, tree.size, head.root, head.size
    return report


def _tseq(event: Event, index: int, seen: dict[str, int]) -> None:
    """Each tenant's entries carry 1, 2, 3 ... in log order (those logged before ``tseq``
    existed carry none and count by position): a gap or repeat is a log that numbered wrong."""
    n = seen[event.tenant] = seen.get(event.tenant, 0) + 1
    if event.tseq is not None and event.tseq != n:
        raise _Bad(f"entry {index}: tenant {event.tenant!r} sequence {event.tseq}, expected {n} (its sequence "
                   "has a gap or a repeat)", index)


def _entry(line: bytes, tree: merkle.MemoryTree) -> Event:
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
        event = parse_event(body)
    except AuditError as exc:
        raise _Bad(str(exc), index) from None
    tree.append_leaf(leaf)
    return event


def _checkpoint(
    line: bytes, verifier: note.Verifier, origin: str, tree: merkle.MemoryTree, prev: SignedCheckpoint | None
) -> SignedCheckpoint:
    try:
        signed = note.b64decode_strict(line[2:].decode("ascii")).decode("utf-8")
        cp = open_checkpoint(signed, verifier, origin)
    except (UnicodeDecodeError, VerificationError) as exc:
        why = str(exc)
        if "not signed by a trusted key" in why:
            why = f"unknown key: no signature by the pinned key {verifier.vkey()} ({why})"
        raise _Bad(f"checkpoint does not verify: {why}") from None
    if cp.size != tree.size:
        raise _Bad(f"checkpoint of size {cp.size} placed after {tree.size} entries", min(cp.size, tree.size))
    if cp.root != tree.root():
        first = prev.size if prev else 0
        if cp.size - first == 1:  # two signed roots one entry apart: that entry is the one changed
            raise _Bad(f"entry {first} was changed: it does not hash to the signed root of size {cp.size}", first)
        raise _Bad(f"entries {first}..{cp.size - 1} do not hash to the signed root of size {cp.size}: one of them "
                   "changed (an earlier export as --since names which)", first, (first, cp.size))  # fmt: skip
    if prev is not None:
        if cp.size <= prev.size and prev.size != 0:
            raise _Bad("checkpoints are not in increasing size order")
        try:
            merkle.verify_consistency(prev.size, cp.size, prev.root, cp.root, tree.consistency_proof(prev.size))
        except merkle.ProofError as exc:
            raise _Bad(f"checkpoint is not consistent with the previous one: {exc}") from None
    return cp
