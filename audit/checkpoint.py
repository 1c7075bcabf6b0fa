"""C2SP tlog-checkpoint bodies (origin, size, base64 root) inside signed notes."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from fak.audit import note
from fak.audit.errors import VerificationError
from fak.audit.merkle import HASH_SIZE

_SIZE = re.compile(r"^(0|[1-9][0-9]{0,18})$")


class SignedCheckpoint(BaseModel):
    """A signed tree head: the note text is what was signed; the fields are parsed from it."""

    model_config = ConfigDict(frozen=True)

    origin: str
    size: int
    root: bytes
    note: str

    @property
    def text(self) -> str:
        return body(self.origin, self.size, self.root)


def body(origin: str, size: int, root: bytes) -> str:
    if not origin or any(c.isspace() for c in origin):
        raise VerificationError("checkpoint origin must be non-empty without spaces")
    if len(root) != HASH_SIZE or size < 0:
        raise VerificationError("checkpoint needs a size >= 0 and a 32-byte root")
    return f"{origin}\n{size}\n{note.b64(root)}\n"


def parse_body(text: str) -> tuple[str, int, bytes]:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise VerificationError("checkpoint body needs at least three non-empty lines")
    origin, size, root = lines[0], lines[1], lines[2]
    if not _SIZE.match(size):
        raise VerificationError("checkpoint size is not a canonical decimal")
    raw = note.b64decode_strict(root)
    if len(raw) != HASH_SIZE:
        raise VerificationError("checkpoint root is not 32 bytes")
    return origin, int(size), raw


def sign_checkpoint(signer: note.Signer, origin: str, size: int, root: bytes) -> SignedCheckpoint:
    text = body(origin, size, root)
    return SignedCheckpoint(origin=origin, size=size, root=root, note=note.sign(text, signer))


def open_checkpoint(signed: str, verifier: note.Verifier, origin: str | None = None) -> SignedCheckpoint:
    """Verify a checkpoint note with ``verifier`` and parse it; the origin must match when given."""
    text = note.open_note(signed, verifier)
    got_origin, size, root = parse_body(text)
    if origin is not None and got_origin != origin:
        raise VerificationError(f"checkpoint origin {got_origin!r} is not {origin!r}")
    return SignedCheckpoint(origin=got_origin, size=size, root=root, note=signed)
