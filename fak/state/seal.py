"""Sealing what a ledger keeps of content derived from tool results.

A segment whose content provenance names refs {r1..rk} (a generated turn produced while
they were in attention, an assistant message given while they were live) may repeat their
bytes. What the ledger keeps of it to replay it (token ids, the message's role and text)
is stored as one AES-256-GCM ciphertext under

    key = HKDF-SHA256(ikm = dk(r1) | ... | dk(rk), salt = 16 random bytes,
                      info = "fak/state/segment" | tenant | session | segment | r1..rk)

where dk(r) is the data key of ref r's blob, which lives in the key database only
(``fak.cas``; never in the main database). Forgetting any ri deletes dk(ri): from then on
no copy of the main database, made before or after, opens the segment, with or without
the master secret and the key database. Nothing is stored besides the ciphertext: the key
is derived again from the refs (the row's ``content`` column) when the ledger is read.

A segment without content provenance (system and user text, a turn generated with no
tool result live) is trusted text and stays in the clear; so does one whose refs carry no
data key (the empty blob, a store opened with ``encrypt=False``).
"""

from __future__ import annotations

import base64
import json
import secrets
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fak.errors import FakError

VERSION = b"\x01"
SALT, NONCE = 16, 12
_INFO = b"fak/state/segment"


class SealError(FakError):
    """A sealed segment does not open: wrong keys, or the row was altered."""

    code = "sealed_segment_unreadable"
    status = 500


class ContentKeys(Protocol):
    """What sealing needs of the CAS (``fak.cas.CasStore.content_keys``)."""

    def content_keys(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]: ...


@dataclass(frozen=True)
class Plain:
    """What a ledger row keeps of a text segment: token ids, and its chat message if any."""

    tokens: list[int]
    role: str | None
    text: str | None

    def encode(self) -> bytes:
        packed = array("i", self.tokens).tobytes()
        return json.dumps({"t": base64.b64encode(packed).decode(), "r": self.role, "m": self.text},
                          ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Plain:
        obj = json.loads(raw)
        tokens = array("i")
        tokens.frombytes(base64.b64decode(obj["t"]))
        return cls(tokens.tolist(), obj["r"], obj["m"])


def _context(tenant: str, session_id: str, segment_id: str, refs: list[str]) -> bytes:
    return b"\x00".join([_INFO, tenant.encode(), session_id.encode(), segment_id.encode(), *(r.encode() for r in refs)])


def needs_seal(keys: Mapping[str, bytes]) -> bool:
    """Whether any of the refs carries a data key (else there is nothing to derive from)."""
    return any(keys.values())


def _key(keys: Mapping[str, bytes], refs: list[str], context: bytes, salt: bytes) -> bytes:
    ikm = b"".join(len(keys[r]).to_bytes(2, "big") + keys[r] for r in refs)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=context).derive(ikm)


def seal(keys: Mapping[str, bytes], tenant: str, session_id: str, segment_id: str, plain: Plain) -> bytes:
    """The ciphertext of ``plain`` under the key derived from ``keys`` (ref → data key,
    every ref of the segment's content provenance)."""
    refs = sorted(keys)
    context = _context(tenant, session_id, segment_id, refs)
    salt, nonce = secrets.token_bytes(SALT), secrets.token_bytes(NONCE)
    body = AESGCM(_key(keys, refs, context, salt)).encrypt(nonce, plain.encode(), context)
    return VERSION + salt + nonce + body


def unseal(keys: Mapping[str, bytes], tenant: str, session_id: str, segment_id: str, sealed: bytes) -> Plain:
    refs = sorted(keys)
    if sealed[:1] != VERSION or len(sealed) < 1 + SALT + NONCE + 16:
        raise SealError(f"segment {segment_id} of session {session_id}: not a sealed segment of a known format")
    salt, nonce, body = sealed[1 : 1 + SALT], sealed[1 + SALT : 1 + SALT + NONCE], sealed[1 + SALT + NONCE :]
    context = _context(tenant, session_id, segment_id, refs)
    try:
        return Plain.decode(AESGCM(_key(keys, refs, context, salt)).decrypt(nonce, body, context))
    except InvalidTag:
        raise SealError(f"segment {segment_id} of session {session_id} does not open with the data keys of its "
                        "refs: the row was altered or moved") from None


def open_segment(store: ContentKeys, row: Mapping[str, Any]) -> Plain:
    """Open a sealed ``fak_segments`` row (a mapping of its columns) with the current data
    keys of its refs; ``Forgotten`` / ``NotFound`` / ``KeyDestroyed`` once one is gone."""
    refs = json.loads(row["content"])
    keys = store.content_keys(row["tenant"], refs)
    return unseal(keys, row["tenant"], row["session_id"], row["id"], row["sealed"])
