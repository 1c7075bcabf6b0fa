"""Blob sealing: each blob is encrypted under its own random AES-256-GCM data key,
in fixed-size chunks so nothing large is ever held in memory.

Layout of a stored blob: a 12-byte header, then the body.
  header = b"FAKCAS" | format(1) | mode(1) | chunk_size(u32 BE)
  mode 1 (sealed): chunk_i = AES-GCM(dek, nonce=0^4|i(u64), aad=CHUNK|blob_id|i|final) for each chunk,
                   then a 16-byte commit tag = AES-GCM(dek, nonce=1^4|0^8, b"", aad=COMMIT|blob_id|digest|size|n).
  mode 0 (plain):  the bytes as they are (only for stores opened with encrypt=False).
The index and the final flag in the AAD detect reordering and truncation; the commit
tag binds the whole ciphertext to the digest (known only once a stream has been read),
so the digest is authenticated as associated data. Nonces are counters: safe because
a data key is never reused (a fresh one per blob, and per revival of a forgotten blob).
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from fak.cas.errors import IntegrityError, KeyMismatch

MAGIC = b"FAKCAS"
FORMAT = 1
MODE_PLAIN, MODE_SEALED = 0, 1
HEADER = struct.Struct(">6sBBI")
TAG = 16
DEFAULT_CHUNK = 64 * 1024
_CHUNK_AAD = b"fak/cas/chunk\x00"
_COMMIT_AAD = b"fak/cas/commit\x00"


def new_data_key() -> bytes:
    return secrets.token_bytes(32)


WRAP_NONCE = 12
WRAPPED_LEN = WRAP_NONCE + 32 + TAG  # a wrapped 32-byte key: nonce | ciphertext | tag


def wrap_key(kek: bytes, key: bytes, aad: bytes) -> bytes:
    """AES-256-GCM key wrap with associated data (random 96-bit nonce): the wrap only
    opens for the same ``aad`` (key id, tenant, KEK id), so a wrapped key copied to
    another row or tenant is useless. RFC 3394 has no associated data, hence GCM."""
    nonce = secrets.token_bytes(WRAP_NONCE)
    return nonce + AESGCM(kek).encrypt(nonce, key, aad)


def unwrap_key(kek: bytes, wrapped: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(kek).decrypt(wrapped[:WRAP_NONCE], wrapped[WRAP_NONCE:], aad)
    except (InvalidTag, ValueError) as exc:
        raise KeyMismatch(
            "cannot unwrap a key: wrong KEK / master secret, or the wrapped key was moved to another key id or tenant"
        ) from exc


def legacy_unwrap_key(kek: bytes, wrapped: bytes) -> bytes:
    """RFC 3394 unwrap of a data key written before format 2 (one-time migration only)."""
    try:
        return aes_key_unwrap(kek, wrapped)
    except InvalidUnwrap as exc:
        raise KeyMismatch("cannot unwrap a legacy data key: the master secret does not match this store") from exc


def legacy_wrap_key(kek: bytes, dek: bytes) -> bytes:
    """RFC 3394 wrap as stores before format 2 did (tests of the migration build one)."""
    return aes_key_wrap(kek, dek)


def header(mode: int, chunk_size: int) -> bytes:
    return HEADER.pack(MAGIC, FORMAT, mode, chunk_size)


def parse_header(raw: bytes) -> tuple[int, int]:
    """Return (mode, chunk_size) or raise IntegrityError."""
    if len(raw) != HEADER.size:
        raise IntegrityError("stored blob is truncated (no complete header)")
    magic, fmt, mode, chunk = HEADER.unpack(raw)
    if magic != MAGIC or fmt != FORMAT or mode not in (MODE_PLAIN, MODE_SEALED) or chunk <= 0:
        raise IntegrityError("stored blob has a corrupt header")
    return mode, chunk


def _nonce(index: int) -> bytes:
    return b"\x00\x00\x00\x00" + index.to_bytes(8, "big")


_COMMIT_NONCE = b"\xff\xff\xff\xff" + bytes(8)


def _chunk_aad(blob_id: bytes, index: int, final: bool) -> bytes:
    return _CHUNK_AAD + blob_id + index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


def _commit_aad(blob_id: bytes, digest: str, size: int, chunks: int) -> bytes:
    return _COMMIT_AAD + blob_id + digest.encode() + struct.pack(">QQ", size, chunks)


def chunk_count(size: int, chunk_size: int) -> int:
    return max(1, -(-size // chunk_size))


def sealed_length(size: int, chunk_size: int) -> int:
    return HEADER.size + size + TAG * chunk_count(size, chunk_size) + TAG


class Sealer:
    """Encrypts one blob chunk by chunk; ``commit`` authenticates the digest."""

    def __init__(self, dek: bytes, blob_id: bytes) -> None:
        self._aead = AESGCM(dek)
        self._blob_id = blob_id

    def seal(self, index: int, data: bytes | memoryview, final: bool) -> bytes:
        return self._aead.encrypt(_nonce(index), data, _chunk_aad(self._blob_id, index, final))

    def open(self, index: int, sealed: bytes, final: bool) -> bytes:
        try:
            return self._aead.decrypt(_nonce(index), sealed, _chunk_aad(self._blob_id, index, final))
        except InvalidTag as exc:
            raise IntegrityError(f"stored blob failed authentication at chunk {index}") from exc

    def commit(self, digest: str, size: int, chunks: int) -> bytes:
        return self._aead.encrypt(_COMMIT_NONCE, b"", _commit_aad(self._blob_id, digest, size, chunks))

    def verify_commit(self, tag: bytes, digest: str, size: int, chunks: int) -> None:
        try:
            self._aead.decrypt(_COMMIT_NONCE, tag, _commit_aad(self._blob_id, digest, size, chunks))
        except InvalidTag as exc:
            raise IntegrityError("stored blob is not bound to this digest (commit tag mismatch)") from exc


Source = bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]


def chunked(source: Source, chunk_size: int) -> Iterator[tuple[bytes | memoryview, bool]]:
    """Yield ``(piece, final)`` with every piece ``chunk_size`` long except the last.
    Empty input yields one empty final piece. Holds at most two chunks in memory."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        n = len(view)
        if n == 0:
            yield view, True
            return
        for start in range(0, n, chunk_size):
            yield view[start : start + chunk_size], start + chunk_size >= n
        return
    pending = b""
    have = False
    for piece in _rechunk(source, chunk_size):
        if have:
            yield pending, False
        pending, have = piece, True
    yield (pending if have else b""), True


def _rechunk(source: BinaryIO | Iterable[bytes], chunk_size: int) -> Iterator[bytes]:
    read: Callable[[int], bytes] | None = getattr(source, "read", None)
    if read is not None:
        pieces: Iterable[bytes] = iter(lambda: read(chunk_size), b"")
    else:
        pieces = source
    buf = bytearray()
    for piece in pieces:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise TypeError(f"a blob stream must yield bytes, got {type(piece).__name__}")
        buf += piece
        while len(buf) >= chunk_size:
            yield bytes(buf[:chunk_size])
            del buf[:chunk_size]
    if buf:
        yield bytes(buf)
