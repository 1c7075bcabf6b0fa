"""Digest strings in the OCI grammar: ``blake3:<64 hex>`` for public content and
``blake3k:<64 hex>`` for BLAKE3 keyed with a per-tenant key, so nobody without the
server secret can confirm a guess about a tool result by hashing it."""

from __future__ import annotations

import re
from typing import Annotated

import blake3
from pydantic import AfterValidator

from fak.cas.errors import InvalidDigest

PUBLIC = "blake3"
KEYED = "blake3k"
ALGORITHMS = (PUBLIC, KEYED)
_HEX = re.compile(r"[0-9a-f]{64}")
# OCI image-spec grammar: algorithm-component ([+._-] algorithm-component)* ":" encoded
_OCI = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")


def parse_digest(value: object) -> str:
    """Return ``value`` if it is a digest fak accepts, else raise InvalidDigest saying why."""
    if not isinstance(value, str):
        raise InvalidDigest(f"a digest must be a string, got {type(value).__name__}")
    shown = value if len(value) <= 80 else value[:77] + "..."
    if not _OCI.fullmatch(value):
        raise InvalidDigest(f"malformed digest {shown!r}: expected '<algorithm>:<hex>'")
    algorithm, encoded = value.split(":", 1)
    if algorithm not in ALGORITHMS:
        raise InvalidDigest(f"unsupported digest algorithm {algorithm!r} in {shown!r}: use blake3 or blake3k")
    if not _HEX.fullmatch(encoded):
        raise InvalidDigest(f"malformed digest {shown!r}: expected 64 lowercase hex digits after '{algorithm}:'")
    return value


def _validate(value: str) -> str:
    try:
        return parse_digest(value)
    except InvalidDigest as exc:  # pydantic turns ValueError into a ValidationError with this text
        raise ValueError(str(exc)) from None


Digest = Annotated[str, AfterValidator(_validate)]
"""A digest field for pydantic models (strictly parsed)."""


def is_keyed(digest: str) -> bool:
    return digest.startswith(KEYED + ":")


class Hasher:
    """Incremental digest of a byte stream, public or keyed."""

    def __init__(self, key: bytes | None = None) -> None:
        self.algorithm = KEYED if key is not None else PUBLIC
        self._h = blake3.blake3(key=key) if key is not None else blake3.blake3()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)

    def digest(self) -> str:
        return f"{self.algorithm}:{self._h.hexdigest()}"


def compute(data: bytes | bytearray | memoryview, key: bytes | None = None) -> str:
    """Digest of ``data``: keyed (``blake3k``) when a 32-byte key is given."""
    h = Hasher(key)
    h.update(data)
    return h.digest()
