"""Keys of the CAS, all derived from the server master secret with HKDF under
distinct labels (or a KEK supplied by the operator, e.g. from a KMS):

- per-tenant keyed-digest key: ``derive_key(master, "fak/cas/digest-key", tenant)``;
- key-encryption key version n: ``derive_key(master, "fak/cas/kek", b"v<n>")``.

Only a check value of each KEK is stored, to refuse a wrong master secret with a
clear error instead of failing on the first read."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import blake3

from fak.keys import derive_key

KekProvider = Callable[[int], bytes]


class KeyRing:
    def __init__(self, master: bytes, kek_provider: KekProvider | None = None) -> None:
        self._master = master
        self._kek_provider = kek_provider
        self.digest_key = lru_cache(maxsize=4096)(self._digest_key)
        self.kek = lru_cache(maxsize=64)(self._kek)

    def _digest_key(self, tenant: str) -> bytes:
        return derive_key(self._master, "fak/cas/digest-key", tenant.encode())

    def _kek(self, version: int) -> bytes:
        if self._kek_provider is not None:
            key = self._kek_provider(version)
            if len(key) != 32:
                raise ValueError("a supplied KEK must be 32 bytes")
            return key
        return derive_key(self._master, "fak/cas/kek", f"v{version}".encode())

    def check_value(self, version: int) -> str:
        return blake3.blake3(b"fak/cas/kek-check", key=self.kek(version)).hexdigest()[:32]
