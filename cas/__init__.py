"""fak.cas — content-addressed store of tool results (see docs/design.md, CAS).

    store = CasStore.open()                      # data dir, database URL, master secret: StorageSettings()
    ref = store.put(b"...", "text/plain", "acme")  # keyed digest blake3k:..., sealed under its own key
    store.get(ref, "acme")                         # verified bytes
    record = store.forget(ref.digest, "acme")      # key + ciphertext destroyed -> ShredRecord (shred_status)
    store.rotate(); store.destroy_retired(older_than=7 * 86400)  # backups older than that open nothing forgotten
    store.erase_tenant("acme")                     # all of a tenant's keys destroyed in one step
"""

from fak.cas.digest import Digest, compute, parse_digest
from fak.cas.errors import (
    CasError,
    Forgotten,
    IntegrityError,
    InvalidDigest,
    InvalidInput,
    KeyDestroyed,
    KeyMismatch,
    NotFound,
    TooLarge,
)
from fak.cas.keyring import KekProvider
from fak.cas.models import DestroyResult, KekInfo, Ref, RotationResult, ShredRecord, TenantErasure, Use
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
    "KeyDestroyed",
    "KeyMismatch",
    "KekInfo",
    "KekProvider",
    "RotationResult",
    "DestroyResult",
    "TenantErasure",
    "NotFound",
    "Ref",
    "ShredRecord",
    "TooLarge",
    "Use",
    "compute",
    "parse_digest",
]
