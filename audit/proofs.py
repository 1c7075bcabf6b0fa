"""Proof objects and their two wire forms: Rekor-like JSON and C2SP tlog-proof text."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from fak.audit import merkle, note
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import VerificationError

TLOG_PROOF_HEADER = "c2sp.org/tlog-proof@v1"
_INDEX = re.compile(r"^index (0|[1-9][0-9]{0,18})$")


def _hexes(values: list[bytes]) -> list[str]:
    return [v.hex() for v in values]


def _unhex(value: object, what: str) -> bytes:
    try:
        raw = bytes.fromhex(str(value))
    except ValueError:
        raise VerificationError(f"{what} is not hex") from None
    if len(raw) != merkle.HASH_SIZE:
        raise VerificationError(f"{what} is not a 32-byte hash")
    return raw


class InclusionProof(BaseModel):
    """Proof that the leaf at ``log_index`` is in the tree of ``tree_size`` with ``root_hash``;
    ``checkpoint`` is the signed note for that tree when the log has one."""

    model_config = ConfigDict(frozen=True)

    log_index: int
    tree_size: int
    root_hash: bytes
    hashes: list[bytes]
    checkpoint: str | None = None

    def verify(self, leaf_hash: bytes) -> None:
        merkle.verify_inclusion(self.log_index, self.tree_size, leaf_hash, self.hashes, self.root_hash)

    def to_json(self) -> dict[str, Any]:
        """Rekor-like: logIndex, treeSize, rootHash, hashes (hex), checkpoint."""
        out: dict[str, Any] = {
            "logIndex": self.log_index,
            "treeSize": self.tree_size,
            "rootHash": self.root_hash.hex(),
            "hashes": _hexes(self.hashes),
        }
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InclusionProof:
        try:
            return cls(
                log_index=int(data["logIndex"]),
                tree_size=int(data["treeSize"]),
                root_hash=_unhex(data["rootHash"], "rootHash"),
                hashes=[_unhex(h, "proof hash") for h in data["hashes"]],
                checkpoint=data.get("checkpoint"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise VerificationError(f"malformed inclusion proof JSON: {exc}") from None

    def to_tlog_proof(self, extra: bytes | None = None) -> str:
        """The C2SP tlog-proof text: header, optional extra, index, hashes, blank, checkpoint."""
        if self.checkpoint is None:
            raise VerificationError("a tlog-proof needs the signed checkpoint of the proof's tree")
        lines = [TLOG_PROOF_HEADER]
        if extra is not None:
            lines.append(f"extra {note.b64(extra)}")
        lines.append(f"index {self.log_index}")
        lines += [note.b64(h) for h in self.hashes]
        return "\n".join(lines) + "\n\n" + self.checkpoint


class ConsistencyProof(BaseModel):
    model_config = ConfigDict(frozen=True)

    size1: int
    size2: int
    root1: bytes
    root2: bytes
    hashes: list[bytes]

    def verify(self) -> None:
        merkle.verify_consistency(self.size1, self.size2, self.root1, self.root2, self.hashes)

    def to_json(self) -> dict[str, Any]:
        return {
            "oldSize": self.size1,
            "treeSize": self.size2,
            "oldRootHash": self.root1.hex(),
            "rootHash": self.root2.hex(),
            "hashes": _hexes(self.hashes),
        }


def parse_tlog_proof(text: str) -> tuple[int, list[bytes], str, bytes | None]:
    """Split a tlog-proof into (index, hashes, checkpoint note, extra)."""
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise VerificationError("tlog-proof has no blank line before its checkpoint")
    lines = head.split("\n")
    if lines[0] != TLOG_PROOF_HEADER:
        raise VerificationError(f"tlog-proof must start with {TLOG_PROOF_HEADER}")
    pos, extra = 1, None
    if len(lines) > 1 and lines[1].startswith("extra "):
        extra = note.b64decode_strict(lines[1][6:])
        pos = 2
    if len(lines) <= pos or not (m := _INDEX.match(lines[pos])):
        raise VerificationError("tlog-proof has no valid index line")
    hashes = [note.b64decode_strict(line) for line in lines[pos + 1 :]]
    if any(len(h) != merkle.HASH_SIZE for h in hashes):
        raise VerificationError("tlog-proof hash is not 32 bytes")
    return int(m.group(1)), hashes, checkpoint, extra


def verify_tlog_proof(
    text: str, vkey: str, leaf_data: bytes, origin: str | None = None
) -> tuple[int, SignedCheckpoint]:
    """Check the checkpoint signature and the inclusion of ``leaf_data``; return (index, checkpoint)."""
    index, hashes, signed, _extra = parse_tlog_proof(text)
    cp = open_checkpoint(signed, note.Verifier.parse(vkey), origin)
    merkle.verify_inclusion(index, cp.size, merkle.hash_leaf(leaf_data), hashes, cp.root)
    return index, cp
