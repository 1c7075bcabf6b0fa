"""C2SP tlog-checkpoint bodies (origin, size, base64 root) inside signed notes.

Why a timestamp extension line (``timestamp <POSIX seconds>``, after the root): an
auditor holding a checkpoint can see how fresh it is from the log's own signature,
without trusting the transport. Extension lines are opaque to C2SP tooling, so older
checkpoints without one stay valid, and unknown extension lines are kept, not refused.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from fak.audit import note
from fak.audit.errors import VerificationError
from fak.audit.merkle import HASH_SIZE

_SIZE = re.compile(r"^(0|[1-9][0-9]{0,18})$")
_TIMESTAMP = re.compile(r"^timestamp (0|[1-9][0-9]{0,18})$")
TIMESTAMP_PREFIX = "timestamp "


class CheckpointBody(NamedTuple):
    origin: str
    size: int
    root: bytes
    timestamp: int | None  # POSIX seconds from the ``timestamp`` extension line, if any
    extensions: tuple[str, ...] = ()  # every extension line, verbatim


class SignedCheckpoint(BaseModel):
    """A signed tree head: the note text is what was signed; the fields are parsed from it.
    ``note`` may carry witnesses' cosignature lines after the log's signature."""

    model_config = ConfigDict(frozen=True)

    origin: str
    size: int
    root: bytes
    note: str
    timestamp: int | None = None  # when the log signed it (POSIX seconds), from the extension line

    @property
    def text(self) -> str:
        """The signed note text (what the log and every witness signed)."""
        return note.split(self.note)[0]


def body(origin: str, size: int, root: bytes, timestamp: int | None = None) -> str:
    if not origin or any(c.isspace() for c in origin):
        raise VerificationError("checkpoint origin must be non-empty without spaces")
    if len(root) != HASH_SIZE or size < 0:
        raise VerificationError("checkpoint needs a size >= 0 and a 32-byte root")
    ext = "" if timestamp is None else f"{TIMESTAMP_PREFIX}{int(timestamp)}\n"
    return f"{origin}\n{size}\n{note.b64(root)}\n{ext}"


def parse_body(text: str) -> CheckpointBody:
    """Parse a checkpoint note text: origin, size, root, then optional extension lines
    (a ``timestamp <seconds>`` line is read; others are kept verbatim)."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise VerificationError("checkpoint body needs at least three non-empty lines")
    origin, size, root = lines[0], lines[1], lines[2]
    if not _SIZE.match(size):
        raise VerificationError("checkpoint size is not a canonical decimal")
    raw = note.b64decode_strict(root)
    if len(raw) != HASH_SIZE:
        raise VerificationError("checkpoint root is not 32 bytes")
    extensions = tuple(lines[3:-1])
    timestamp = None
    for line in extensions:
        if line.startswith(TIMESTAMP_PREFIX):
            m = _TIMESTAMP.match(line)
            if m is None or timestamp is not None:
                raise VerificationError("checkpoint timestamp line is malformed or repeated")
            timestamp = int(m.group(1))
    return CheckpointBody(origin, int(size), raw, timestamp, extensions)


def sign_checkpoint(
    signer: note.Signer, origin: str, size: int, root: bytes, timestamp: int | None = None
) -> SignedCheckpoint:
    text = body(origin, size, root, timestamp)
    return SignedCheckpoint(origin=origin, size=size, root=root, note=note.sign(text, signer), timestamp=timestamp)


def from_note(signed: str) -> SignedCheckpoint:
    """Parse (without verifying) a checkpoint note the log itself stored."""
    parsed = parse_body(note.split(signed)[0])
    return SignedCheckpoint(origin=parsed.origin, size=parsed.size, root=parsed.root, note=signed,
                            timestamp=parsed.timestamp)


def open_checkpoint(signed: str, verifier: note.Verifier, origin: str | None = None) -> SignedCheckpoint:
    """Verify a checkpoint note with ``verifier`` and parse it; the origin must match when given."""
    text = note.open_note(signed, verifier)
    parsed = parse_body(text)
    if origin is not None and parsed.origin != origin:
        raise VerificationError(f"checkpoint origin {parsed.origin!r} is not {origin!r}")
    return SignedCheckpoint(origin=parsed.origin, size=parsed.size, root=parsed.root, note=signed,
                            timestamp=parsed.timestamp)
