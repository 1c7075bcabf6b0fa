"""What lies on disk, for the tests that scan it for plaintext or key material at rest."""

from __future__ import annotations

from pathlib import Path


def raw_bytes_under(*roots: Path) -> bytes:
    """The bytes of every file below ``roots``, concatenated (files, databases, their WALs)."""
    out = bytearray()
    for root in roots:
        for p in Path(root).rglob("*"):
            if p.is_file():
                out += p.read_bytes()
    return bytes(out)
