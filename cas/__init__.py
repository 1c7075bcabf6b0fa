"""fak.cas — content-addressed store of tool results (see ../shared/DESIGN.md, CAS).

    store = CasStore.open()                      # data dir, database URL, master secret from fak.config
    ref = store.put(b"...", "text/plain", "acme")  # keyed digest blake3k:..., sealed under its own key
    store.get(ref, "acme")                         # verified bytes
    record = store.forget(ref.digest, "acme")      # key + ciphertext destroyed -> ShredRecord
"""

from fak.cas.digest import Digest, compute, parse_digest
from fak.cas.errors import (
    CasError,
    Forgotten,
    IntegrityError,
    InvalidDigest,
    InvalidInput,
    KeyMismatch,
    NotFound,
    TooLarge,
)
from fak.cas.models import Ref, ShredRecord, Use
from fak.cas.store import DEFAULT_MAX_BLOB, CasStore, FsckReport

__all__ = [
    "DEFAULT_MAX_BLOB",
    "CasError",
    "CasStore",
    "Digest",
    "Forgotten",
    "FsckReport",
    "IntegrityError",
    "InvalidDigest",
    "InvalidInput",
    "KeyMismatch",
    "NotFound",
    "Ref",
    "ShredRecord",
    "TooLarge",
    "Use",
    "compute",
    "parse_digest",
]
