"""C2SP signed notes with Ed25519 (https://c2sp.org/signed-note).

Key strings use the Go ``sumdb/note`` encodings so any transparency-log tool
reads them: verifier key ``<name>+<hex key id>+<base64(0x01 || pubkey)>`` and
signer key ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || seed)>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fak.audit.errors import VerificationError

ALG_ED25519 = 0x01
EM_DASH = "\u2014"
_NAME = re.compile(r"^[^\s+]+$")
MAX_SIGNATURES = 16


def b64decode_strict(text: str) -> bytes:
    """Standard base64 that must be canonical: re-encoding gives the same text, so no
    two spellings (padding bits) decode to the same bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VerificationError("malformed base64") from exc
    if base64.b64encode(raw).decode() != text:
        raise VerificationError("non-canonical base64")
    return raw


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def key_id(name: str, public_key: bytes) -> int:
    """SHA-256(name || 0x0A || 0x01 || pubkey)[:4] as a big-endian uint32."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


def _check_name(name: str) -> str:
    if not name or not _NAME.match(name):
        raise VerificationError(f"key name {name!r} must be non-empty, without spaces or '+'")
    return name


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class Verifier:
    name: str
    id: int
    key: Ed25519PublicKey

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """Parse ``<name>+<hex8>+<base64(0x01||pubkey)>``; the id must match the key."""
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3 or not re.fullmatch(r"[0-9a-f]{8}", parts[1]):
            raise VerificationError("verifier key must look like <name>+<8 hex>+<base64 key>")
        name = _check_name(parts[0])
        raw = b64decode_strict(parts[2])
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise VerificationError("verifier key is not an Ed25519 (type 0x01) key")
        if key_id(name, raw[1:]) != int(parts[1], 16):
            raise VerificationError("verifier key id does not match its name and key")
        return cls(name, int(parts[1], 16), Ed25519PublicKey.from_public_bytes(raw[1:]))

    def vkey(self) -> str:
        return f"{self.name}+{self.id:08x}+{b64(bytes([ALG_ED25519]) + _raw_public(self.key))}"

    def verify(self, text: bytes, signature: bytes) -> bool:
        try:
            self.key.verify(signature, text)
            return True
        except InvalidSignature:
            return False


@dataclass(frozen=True)
class Signer:
    name: str
    key: Ed25519PrivateKey

    @property
    def id(self) -> int:
        return key_id(self.name, _raw_public(self.key.public_key()))

    @classmethod
    def generate(cls, name: str) -> Signer:
        return cls(_check_name(name), Ed25519PrivateKey.generate())

    @classmethod
    def parse(cls, skey: str) -> Signer:
        """Parse ``PRIVATE+KEY+<name>+<hex8>+<base64(0x01||seed)>``."""
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or not re.fullmatch(r"[0-9a-f]{8}", parts[3]):
            raise VerificationError("signer key must look like PRIVATE+KEY+<name>+<8 hex>+<base64 seed>")
        name = _check_name(parts[2])
        raw = b64decode_strict(parts[4])
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise VerificationError("signer key is not an Ed25519 (type 0x01) key")
        signer = cls(name, Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if signer.id != int(parts[3], 16):
            raise VerificationError("signer key id does not match its name and key")
        return signer

    def skey(self) -> str:
        seed = self.key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return f"PRIVATE+KEY+{self.name}+{self.id:08x}+{b64(bytes([ALG_ED25519]) + seed)}"

    def verifier(self) -> Verifier:
        return Verifier(self.name, self.id, self.key.public_key())

    def sign_line(self, text: str) -> str:
        sig = self.key.sign(text.encode())
        return f"{EM_DASH} {self.name} {b64(struct.pack('>I', self.id) + sig)}\n"


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise VerificationError("note text must end with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise VerificationError("note contains a control character")


def sign(text: str, *signers: Signer) -> str:
    """Return the signed note: text, blank line, one signature line per signer."""
    _check_text(text)
    return text + "\n" + "".join(s.sign_line(text) for s in signers)


def split(note: str) -> tuple[str, list[tuple[str, int, bytes]]]:
    """Split a note into its text and (name, key id, signature) tuples, checking the syntax."""
    if not note.endswith("\n"):
        raise VerificationError("note must end with a newline")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise VerificationError("note has no blank line before its signatures")
    text, block = note[: cut + 1], note[cut + 2 :]
    _check_text(text)
    sigs = []
    for line in block[:-1].split("\n"):
        if not line.startswith(EM_DASH + " "):
            raise VerificationError("malformed signature line")
        fields = line[2:].split(" ")
        if len(fields) != 2:
            raise VerificationError("malformed signature line")
        name = _check_name(fields[0])
        raw = b64decode_strict(fields[1])
        if len(raw) < 5:
            raise VerificationError("signature is too short")
        sigs.append((name, struct.unpack(">I", raw[:4])[0], raw[4:]))
    if not sigs or len(sigs) > MAX_SIGNATURES:
        raise VerificationError("note must carry 1 to 16 signatures")
    return text, sigs


def open_note(note: str, *verifiers: Verifier) -> str:
    """Return the note text if a known key signed it and no known key's signature fails.
    Signatures from unknown keys (other name or id) are ignored, per the spec."""
    text, sigs = split(note)
    known = {(v.name, v.id): v for v in verifiers}
    good = 0
    for name, kid, sig in sigs:
        v = known.get((name, kid))
        if v is None:
            continue
        if not v.verify(text.encode(), sig):
            raise VerificationError(f"signature by {name} does not verify")
        good += 1
    if not good:
        raise VerificationError("note is not signed by a trusted key")
    return text
