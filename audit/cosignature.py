"""C2SP tlog-cosignature/v1 (Ed25519, signed-note key type 0x04): witness keys, cosigning,
verifying, and the note helpers that move cosignature lines on and off a checkpoint.
https://c2sp.org/tlog-cosignature

Why a module of its own: the log (asking witnesses), the witness (signing) and the
offline verifier (checking a quorum) must agree on these bytes exactly, and any tlog
witness (Go ``litewitness``, sigsum) emits the same ones:

* signature line ``— <name> base64(key id[4] || timestamp u64 BE || Ed25519 sig[64])``
* signed message ``cosignature/v1\\ntime <timestamp>\\n`` || the checkpoint note text
  (extension lines included, signature lines not)
* key id ``SHA-256(name || 0x0A || 0x04 || pubkey)[:4]``; vkey ``<name>+<hex id>+base64(0x04 || pubkey)``
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fak.audit import note
from fak.audit.errors import VerificationError

ALG_COSIGNATURE_V1 = 0x04
HEADER = "cosignature/v1"
MAX_TIMESTAMP = 2**63 - 1
_HEX8 = re.compile(r"[0-9a-f]{8}")


def cosigner_key_id(name: str, public_key: bytes) -> int:
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ALG_COSIGNATURE_V1]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def witness_vkey(name: str, key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    pub = _raw(key.public_key() if isinstance(key, Ed25519PrivateKey) else key)
    return f"{name}+{cosigner_key_id(name, pub):08x}+{note.b64(bytes([ALG_COSIGNATURE_V1]) + pub)}"


def parse_witness_vkey(vkey: str) -> tuple[str, int, Ed25519PublicKey]:
    """``<name>+<hex8>+<base64(0x04 || pubkey)>`` -> (name, key id, key); the id must match."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or not _HEX8.fullmatch(parts[1]) or not parts[0] or any(c.isspace() for c in parts[0]):
        raise VerificationError("witness key must look like <name>+<8 hex>+<base64 key>")
    raw = note.b64decode_strict(parts[2])
    if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
        raise VerificationError("witness key is not a cosignature/v1 (type 0x04) Ed25519 key")
    if cosigner_key_id(parts[0], raw[1:]) != int(parts[1], 16):
        raise VerificationError("witness key id does not match its name and key")
    return parts[0], int(parts[1], 16), Ed25519PublicKey.from_public_bytes(raw[1:])


@dataclass(frozen=True)
class CosignerKey:
    """A witness's private key and name. Stored as ``PRIVATE+KEY+<name>+<hex id>+base64(0x04 || seed)``
    (the Go note signer-key layout with the cosignature key type)."""

    name: str
    key: Ed25519PrivateKey

    @classmethod
    def generate(cls, name: str) -> CosignerKey:
        if not name or any(c.isspace() or c == "+" for c in name):
            raise VerificationError(f"witness name {name!r} must be non-empty, without spaces or '+'")
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def parse(cls, skey: str) -> CosignerKey:
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or not _HEX8.fullmatch(parts[3]):
            raise VerificationError("witness key must look like PRIVATE+KEY+<name>+<8 hex>+<base64 seed>")
        raw = note.b64decode_strict(parts[4])
        if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
            raise VerificationError("witness private key is not a cosignature/v1 (type 0x04) key")
        key = cls(parts[2], Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if key.id != int(parts[3], 16):
            raise VerificationError("witness private key id does not match its name and key")
        return key

    @property
    def id(self) -> int:
        return cosigner_key_id(self.name, _raw(self.key.public_key()))

    def skey(self) -> str:
        seed = self.key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
        return f"PRIVATE+KEY+{self.name}+{self.id:08x}+{note.b64(bytes([ALG_COSIGNATURE_V1]) + seed)}"

    def vkey(self) -> str:
        return witness_vkey(self.name, self.key)


def signed_message(checkpoint_body: str, timestamp: int) -> bytes:
    return f"{HEADER}\ntime {timestamp}\n{checkpoint_body}".encode()


def cosign(witness_private_key: CosignerKey, checkpoint_body: str, timestamp: int) -> str:
    """The cosignature line (newline included) over a checkpoint's note text at ``timestamp``."""
    if not 0 < timestamp <= MAX_TIMESTAMP:
        raise VerificationError("cosignature timestamp must be in 1 .. 2^63-1")
    sig = witness_private_key.key.sign(signed_message(checkpoint_body, timestamp))
    blob = struct.pack(">IQ", witness_private_key.id, timestamp) + sig
    return f"{note.EM_DASH} {witness_private_key.name} {note.b64(blob)}\n"


def parse_signature_line(line: str) -> tuple[str, int, bytes]:
    """``— <name> <base64>`` -> (name, key id, the bytes after the key id)."""
    line = line.rstrip("\n")
    fields = line[2:].split(" ") if line.startswith(note.EM_DASH + " ") else []
    if len(fields) != 2 or not fields[0]:
        raise VerificationError("malformed signature line")
    raw = note.b64decode_strict(fields[1])
    if len(raw) < 5:
        raise VerificationError("signature is too short")
    return fields[0], struct.unpack(">I", raw[:4])[0], raw[4:]


def verify_cosignature(witness_vkey: str, checkpoint_body: str, signature_line: str) -> int:
    """Check one cosignature line over ``checkpoint_body`` (the note text, extension lines
    included); return its timestamp (POSIX seconds). Raises VerificationError."""
    name, kid, key = parse_witness_vkey(witness_vkey)
    got_name, got_id, rest = parse_signature_line(signature_line)
    if got_name != name or got_id != kid or len(rest) != 8 + 64:
        raise VerificationError(f"cosignature line is not by witness {name}")
    timestamp = int.from_bytes(rest[:8], "big")
    if timestamp > MAX_TIMESTAMP:
        raise VerificationError("cosignature timestamp out of range")
    try:
        key.verify(rest[8:], signed_message(checkpoint_body, timestamp))
    except InvalidSignature:
        raise VerificationError(f"cosignature by {name} does not verify") from None
    return timestamp


def split_note(signed_note: str) -> tuple[str, list[str]]:
    """A signed note's text and its signature lines (each with its newline), syntax checked."""
    text, _ = note.split(signed_note)
    block = signed_note[len(text) + 1 :]
    return text, [line + "\n" for line in block[:-1].split("\n")]


def matches(witness_vkey: str, signature_line: str) -> bool:
    """Whether a signature line names this witness key (name and key id): the lines a
    verifier must check; all others it ignores, per signed-note."""
    name, kid, _ = parse_witness_vkey(witness_vkey)
    try:
        got_name, got_id, _ = parse_signature_line(signature_line)
    except VerificationError:
        return False
    return (got_name, got_id) == (name, kid)


def cosignatures(signed_note: str, witness_vkeys: list[str]) -> dict[str, int]:
    """Valid cosignatures on a note by the given witnesses: {vkey: timestamp}. A line that
    names a listed witness but does not verify raises (a forgery, not an absence)."""
    text, lines = split_note(signed_note)
    out: dict[str, int] = {}
    for vkey in witness_vkeys:
        for line in lines:
            if matches(vkey, line):
                out[vkey] = verify_cosignature(vkey, text, line)
    return out


def add_lines(signed_note: str, lines: list[str]) -> str:
    """The note with extra signature lines appended (duplicates skipped)."""
    _, have = split_note(signed_note)
    extra = [ln if ln.endswith("\n") else ln + "\n" for ln in lines]
    return signed_note + "".join(ln for ln in extra if ln not in have)
