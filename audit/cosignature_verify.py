"""C2SP tlog-cosignature/v1 (Ed25519) checking, as the verifier needs it: a witness's
vkey, the cosigned checkpoint body and one signature line in, the cosignature's
timestamp out. https://c2sp.org/tlog-cosignature

Why here: the offline verifier must check witnesses' cosignatures with nothing but
the spec; this is the byte format any tlog witness (Go ``litewitness``, sigsum) emits:
``— <name> base64(key id[4] || timestamp u64 BE || Ed25519 signature[64])`` over
``cosignature/v1\\ntime <timestamp>\\n`` followed by the checkpoint body, key id
``SHA-256(name || 0x0A || 0x04 || pubkey)[:4]``.
"""

from __future__ import annotations

import hashlib
import re
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fak.audit import note
from fak.audit.errors import VerificationError

ALG_COSIGNATURE_V1 = 0x04
HEADER = "cosignature/v1"
MAX_TIMESTAMP = 2**63 - 1


def cosigner_key_id(name: str, public_key: bytes) -> int:
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ALG_COSIGNATURE_V1]) + public_key).digest()
    return struct.unpack(">I", digest[:4])[0]


def parse_witness_vkey(vkey: str) -> tuple[str, int, Ed25519PublicKey]:
    """``<name>+<hex8>+<base64(0x04 || pubkey)>`` -> (name, key id, key); the id must match."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or not re.fullmatch(r"[0-9a-f]{8}", parts[1]) or not parts[0] or " " in parts[0]:
        raise VerificationError("witness key must look like <name>+<8 hex>+<base64 key>")
    raw = note.b64decode_strict(parts[2])
    if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
        raise VerificationError("witness key is not a cosignature/v1 (type 0x04) Ed25519 key")
    if cosigner_key_id(parts[0], raw[1:]) != int(parts[1], 16):
        raise VerificationError("witness key id does not match its name and key")
    return parts[0], int(parts[1], 16), Ed25519PublicKey.from_public_bytes(raw[1:])


def signed_message(checkpoint_body: str, timestamp: int) -> bytes:
    return f"{HEADER}\ntime {timestamp}\n{checkpoint_body}".encode()


def verify_cosignature(witness_vkey: str, checkpoint_body: str, signature_line: str) -> int:
    """Check one cosignature line over ``checkpoint_body`` (the note text, extension lines
    included); return its timestamp (POSIX seconds). Raises VerificationError."""
    name, kid, key = parse_witness_vkey(witness_vkey)
    line = signature_line.rstrip("\n")
    if not line.startswith(note.EM_DASH + " ") or len(line[2:].split(" ")) != 2:
        raise VerificationError("malformed cosignature line")
    got_name, blob = line[2:].split(" ")
    raw = note.b64decode_strict(blob)
    if got_name != name or len(raw) != 4 + 8 + 64 or struct.unpack(">I", raw[:4])[0] != kid:
        raise VerificationError(f"cosignature line is not by witness {name}")
    (timestamp,) = struct.unpack(">Q", raw[4:12])
    if timestamp > MAX_TIMESTAMP:
        raise VerificationError("cosignature timestamp out of range")
    try:
        key.verify(raw[12:], signed_message(checkpoint_body, timestamp))
    except InvalidSignature:
        raise VerificationError(f"cosignature by {name} does not verify") from None
    return timestamp


def witness_vkey(name: str, key: Ed25519PrivateKey) -> str:
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{name}+{cosigner_key_id(name, pub):08x}+{note.b64(bytes([ALG_COSIGNATURE_V1]) + pub)}"


def cosign(name: str, key: Ed25519PrivateKey, checkpoint_body: str, timestamp: int) -> str:
    """The cosignature line (with its newline) a witness appends to the checkpoint note."""
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    sig = key.sign(signed_message(checkpoint_body, timestamp))
    blob = struct.pack(">IQ", cosigner_key_id(name, pub), timestamp) + sig
    return f"{note.EM_DASH} {name} {note.b64(blob)}\n"
